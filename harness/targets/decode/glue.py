"""An attention backend double SGLang's metadata glue graph may capture (`SGLANG_ENABLE_METADATA_GLUE_GRAPH`).

The glue graph records the device ops of `init_forward_metadata_out_graph` once per replay key and replays them,
re-installing the `forward_metadata` objects it saw at capture; it is only right for a backend whose prep is
pointer-stable device work (SGLang's contract, `metadata_glue_graph.py`). The suite's own double reads host
values (the verify mask, `seq_lens_sum`), which a capture refuses, so glue cases use this one: on the runner's
replay view it copies the view's seq_lens (the runner's static buffer) into its own metadata buffer by device ops
only, and publishes views of that buffer. The model reads those seq_lens, so a glue replay that was skipped,
replayed the wrong key, or re-installed stale metadata gives a wrong output. A DSPARK target verify batch is
prepped the same way, its draft block causal (DFLASH's block drafting: row j of a request sees j + 1 drafts, a
constant of the replay key's width, never read from the batch's own mask tensor, which the glue would replay
stale), and the double declares that prep host-free (`glue_target_verify_metadata`, and a draft's, maskless:
`glue_draft_metadata`), as DeepSeek V4's backend does, but only the one its worker's role serves (`role`), so a
runner asking the other declaration is told no and serves no glue;
an EAGLE verify mask's per-row counts are host work, so those batches take the base double's eager prep."""
from __future__ import annotations

import functools
from types import SimpleNamespace

import torch

from harness.targets.decode.base import make_attention_backend_class


def make_glue_attention_backend_class(role: str = "target"):
    """`role`: "target" (declares target verify prep host-free) or "draft" (declares the draft's)."""
    from sglang.srt.model_executor.forward_batch_info import ForwardBatch

    class GlueableAttentionDouble(make_attention_backend_class()):
        def init_forward_metadata_out_graph(self, forward_batch, in_capture: bool = False) -> None:
            spec_info = getattr(forward_batch, "spec_info", None)
            block = type(spec_info).__name__ == "DFlashVerifyInput"
            if self.graph is None or isinstance(forward_batch, ForwardBatch) or (spec_info is not None and not block):
                return super().init_forward_metadata_out_graph(forward_batch, in_capture)
            self.metadata_inits += 1
            bs = forward_batch.seq_lens.shape[0]
            self.graph.seq_lens[:bs].copy_(forward_batch.seq_lens)
            self.graph.visible_drafts.zero_()
            if block and spec_info.custom_mask is not None:  # a target's verify; a draft's has no mask
                rows = bs * spec_info.draft_token_num
                self.graph.visible_drafts[:rows].copy_(torch.arange(rows, device=self.device)
                                                       % spec_info.draft_token_num + 1)
            self.graph.sum_gap.zero_()
            self.forward_metadata = SimpleNamespace(seq_lens=self.graph.seq_lens[:bs],
                                                    visible_drafts=self.graph.visible_drafts,
                                                    sum_gap=self.graph.sum_gap)

        def enable_early_verify_metadata(self) -> None:
            """SGLang's target verify runner under SGLANG_OPT_DSV41_TARGET_METADATA_EARLY: DeepSeek V4's backend
            then builds the verify metadata outside the graph; this double's prep is the same either way."""
            self.builds_verify_metadata_early = True

        def glue_target_verify_metadata(self) -> str:
            return "" if role == "target" else "a draft worker's backend declares no target verify prep"

        def glue_draft_metadata(self) -> str:  # a draft's verify input has no mask
            return "" if role == "draft" else "a target worker's backend declares no draft prep"

    return GlueableAttentionDouble


# one factory per role, so `shared_parts` (keyed by factory) keeps one model and backend per role
GLUE_BACKEND_FOR_ROLE = {role: functools.partial(make_glue_attention_backend_class, role)
                         for role in ("target", "draft")}
