"""A draft worker's decode runner (`model_runner.is_draft_worker`): SGLang builds it for algorithms whose drafts
verify like a target (`supports_target_verify_for_draft`: DFLASH), capturing TARGET_VERIFY graphs of draft-token
width that read the embeddings the draft worker hands over (`ForwardBatch.input_embeds`, copied into the runner's
static `input_embeds` and passed to the forward), with no verify mask and no hidden states. Any other algorithm's
draft runner is refused at construction ("This should not happen", a RuntimeError).

`DraftWorker` is a mixin over a layout's target (as `ragged.RaggedVerify`); `compact` builds it under
SGLANG_RAGGED_VERIFY_MODE=compact, which a draft runner must ignore (ragged verify is the target's).
"""
from __future__ import annotations

import dataclasses

import torch

from harness.targets.decode.base import DecodeBatch, Layout
from harness.targets.decode.ragged import compact_mode, stacked

REFUSAL = "This should not happen"


def draft_missing(layout: Layout) -> str | None:
    """Why this release has no draft verify runner (naming the release and the missing name), or None."""
    from harness.versions import sglang_version
    from harness.targets.sglang_plumbing import load

    algorithm = load("sglang.srt.speculative.spec_info", "SpeculativeAlgorithm")
    if not hasattr(algorithm, "supports_target_verify_for_draft"):
        return f"SGLang {sglang_version()} has no SpeculativeAlgorithm.supports_target_verify_for_draft: no draft " \
               "verify graphs"
    return None


@dataclasses.dataclass
class DraftBatch(DecodeBatch):
    """A draft worker's verify batch: `input_embeds` per token (HIDDEN values each), no verify mask."""

    input_embeds: list[list[float]] | None = None

    def to_forward_batch(self, device: str = "cpu", spec=None):
        from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode

        fb = super().to_forward_batch(device, spec)
        fb.capture_hidden_mode = CaptureHiddenMode.NULL
        fb.input_embeds = torch.tensor(self.input_embeds, dtype=torch.float32, device=device)
        return fb

    def verify_input(self, device: str, spec):
        """SGLang's DFLASH verify input as the draft worker builds it: no custom mask, no hidden states."""
        from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode
        from sglang.srt.speculative.dflash_info import DFlashVerifyInput

        return DFlashVerifyInput(
            draft_token=torch.tensor(self.input_ids, dtype=torch.int64, device=device),
            positions=torch.tensor(self.positions, dtype=torch.int64, device=device),
            draft_token_num=spec.num_draft_tokens, capture_hidden_mode=CaptureHiddenMode.NULL)


def draft_layout(layout: Layout, *, compact: bool = False) -> Layout:
    """`layout` whose target is a draft worker's (`DraftWorker` over the layout's own target)."""
    target = type(f"Draft{layout.target_class.__name__}", (DraftWorker, layout.target_class), {"compact": compact})
    return dataclasses.replace(layout, target_class=target)


class DraftWorker:
    compact = False
    is_draft_worker = True  # the oracles' view: this target's runner serves a draft worker

    def make_model_runner(self, case, device: str):
        model_runner = super().make_model_runner(case, device)
        model_runner.is_draft_worker = True  # read at call time by SGLang's decode_num_tokens_per_req too
        return model_runner

    def construction_patches(self):
        return stacked(super().construction_patches(), *([compact_mode()] if self.compact else []))
