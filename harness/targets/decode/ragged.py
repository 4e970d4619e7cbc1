"""The compact ragged verify layout (`SGLANG_RAGGED_VERIFY_MODE=compact`, SGLang 0.5.2x): a DSPARK target worker's
TARGET_VERIFY batches where each request verifies its own number of tokens (1 to the draft-token count). The decode
runner then captures one graph per token tier (captured batch size x draft tokens) with `min(tier, max_bs)` request
slots, admits a batch by its tier and request count, and before each replay copies the batch's
`RaggedVerifyLayout` (verify_lens, qo_indptr), padded to the tier's slots, into the layout the graph was captured
with.

What the harness derives from the case, never from the runner (`RaggedVerify`):
    grid       = sorted(bs * draft_tokens for bs in the captured sizes)      (patch_contract.expected_sizes)
    tier       = the smallest grid point >= sum(verify_lens)
    slots      = min(tier, max captured bs)
    servable   = the backend declares ragged graphs and batch_size <= slots  (else the batch runs eagerly)
The planner hands the batch over padded to its tier: `tier` token rows, rows past sum(verify_lens) zero; only the
real rows (the first sum(verify_lens)) are compared, as only those reach the sampler.
"""
from __future__ import annotations

import contextlib
import dataclasses
import os
from unittest import mock

import torch

from harness.targets.decode.base import DecodeBatch, Layout, make_attention_backend_class
from harness.targets.sglang_plumbing import load

RAGGED_MODULE = "sglang.srt.speculative.ragged_verify"
REFUSAL = "Compact ragged verify does not support"  # the runner's ValueError for LoRA, TBO, padding disabled


def ragged_missing(layout: Layout) -> str | None:
    """Why this release cannot run the compact ragged verify (naming the release and the missing name), or None."""
    from harness.versions import module_exists, sglang_version

    if not module_exists(RAGGED_MODULE) or not hasattr(load(RAGGED_MODULE), "RaggedVerifyLayout"):
        return f"SGLang {sglang_version()} has no {RAGGED_MODULE}.RaggedVerifyLayout: no ragged verify graphs"
    if not hasattr(load(layout.runner_module, layout.runner_class), "_capture_ragged_verify_layout"):
        return (f"SGLang {sglang_version()} has no {layout.runner_module}.{layout.runner_class}."
                "_capture_ragged_verify_layout: no ragged verify graphs")
    algorithm = getattr(load("sglang.srt.speculative.spec_info", "SpeculativeAlgorithm"), "DSPARK", None)
    if algorithm is None or not algorithm.supports_ragged_verify():
        return f"SGLang {sglang_version()} has no SpeculativeAlgorithm.DSPARK verifying ragged batches"
    return None


def compact_mode():
    """SGLang's switch, restored however the block ends (`EnvField.override` leaves it set on an exception)."""
    return mock.patch.dict(os.environ, {"SGLANG_RAGGED_VERIFY_MODE": "compact"})


def stacked(*managers) -> contextlib.ExitStack:
    """One context of `managers`, entered now, left together (a target's patches and this path's own)."""
    stack = contextlib.ExitStack()
    for manager in managers:
        stack.enter_context(manager)
    return stack


def round_up(total: int, grid) -> int:
    return min(g for g in grid if g >= total)


@dataclasses.dataclass
class RaggedBatch(DecodeBatch):
    """A ragged verify batch: `verify_lens` per request, token rows padded to the tier of `grid` (the case's)."""

    verify_lens: list[int] | None = None
    grid: tuple[int, ...] = ()

    @property
    def tier(self) -> int:
        return round_up(sum(self.verify_lens), self.grid)

    @property
    def real_tokens(self) -> int:
        return sum(self.verify_lens)

    def verify_input(self, device: str, spec):
        """SGLang's DFLASH verify input carrying SGLang's own `RaggedVerifyLayout` for the batch (as the DSPARK
        worker builds it: `from_verify_lens` on the runner's grid)."""
        from sglang.srt.speculative.dflash_info import DFlashVerifyInput
        from sglang.srt.speculative.ragged_verify import RaggedVerifyLayout

        layout = RaggedVerifyLayout.from_verify_lens(verify_lens_cpu=self.verify_lens, device=torch.device(device),
                                                     grid=list(self.grid))
        return DFlashVerifyInput(
            draft_token=torch.tensor(self.input_ids, dtype=torch.int64, device=device),
            positions=torch.tensor(self.positions, dtype=torch.int64, device=device),
            draft_token_num=spec.num_draft_tokens, ragged_verify_layout=layout)


def padded_verify_lens(verify_lens: list[int], tier: int, slots: int, cap: int) -> list[int]:
    """The layout a tier's graph must see (SGLang's `padded_to_bucket` contract, capped at the draft width): the
    tier's leftover tokens (tier - sum) spread over the padding slots, the first `leftover % pads` one more, or
    added to the last row when there is no padding slot; each row at most `cap`. E.g. [3, 1], tier 8, 4 slots,
    cap 3: leftover 4 over 2 pads -> [3, 1, 2, 2]."""
    leftover, pads = tier - sum(verify_lens), slots - len(verify_lens)
    if pads:
        rows = list(verify_lens) + [leftover // pads + (k < leftover % pads) for k in range(pads)]
    else:
        rows = list(verify_lens[:-1]) + [verify_lens[-1] + leftover]
    return [min(v, cap) for v in rows]


def ragged_attention_class():
    """The attention double declaring ragged verify graphs (`supports_ragged_verify_graph`), as FlashAttention,
    TRT-LLM and FlashInfer-MLA do."""
    return _ragged_classes()[True]


def flat_attention_class():
    """The attention double of a backend without ragged verify graphs (SGLang's default): every ragged batch eager."""
    return _ragged_classes()[False]


_CLASSES: dict = {}


def _ragged_classes() -> dict:
    if not _CLASSES:
        base = make_attention_backend_class()
        _CLASSES.update({flag: type(f"RaggedAttentionDouble{flag}", (base,), {"supports_ragged_verify_graph": flag})
                         for flag in (True, False)})
    return _CLASSES


def ragged_layout(layout: Layout, *, backend_graphs: bool = True) -> Layout:
    """`layout` whose target runs the compact ragged verify (`RaggedVerify` over the layout's own target)."""
    target = type(f"Ragged{layout.target_class.__name__}", (RaggedVerify, layout.target_class), {
        "attention_backend_class": staticmethod(ragged_attention_class if backend_graphs else flat_attention_class),
        "backend_graphs": backend_graphs})
    return dataclasses.replace(layout, target_class=target)


class RaggedVerify:
    """Mixin over a layout's target: SGLang's compact mode switched on while the runner is built and driven, and
    what the oracles expect of a ragged batch, from the case (see the module docstring)."""

    backend_graphs = True

    def construction_patches(self):
        return stacked(super().construction_patches(), compact_mode())

    def replay_context(self):
        return stacked(super().replay_context(), compact_mode())

    @property
    def grid(self) -> tuple[int, ...]:
        from harness.oracles.patch_contract import expected_sizes

        return tuple(sorted({bs * self.case.tokens_per_request for bs in expected_sizes(self.case)[0]}))

    def slots(self, batch: RaggedBatch) -> int:
        from harness.oracles.patch_contract import expected_sizes

        return min(batch.tier, max(expected_sizes(self.case)[0]))

    def expected_servable(self, batch) -> bool:
        """A ragged batch replays when the backend declares ragged graphs and its requests fit its tier's slots; a
        TARGET_VERIFY batch without a layout never does in compact mode; IDLE does."""
        if batch.verify_lens is None:
            return batch.forward_mode != "TARGET_VERIFY"
        return self.backend_graphs and batch.batch_size <= self.slots(batch)

    def padded_extent(self, batch) -> tuple[int, int]:
        """(request rows, token rows) the static buffers hold for the batch: its tier's slots, the tier."""
        return self.slots(batch), batch.tier

    def stale_layout(self, batch) -> str:
        """Where the layout the tier's graph reads differs from the batch's, padded (`padded_verify_lens`): checked
        at every replay (`decode_replay.check_padding_promises`) and named in an eager-equality diagnosis."""
        captured = getattr(self.runner, "_captured_ragged_layouts", {}).get(batch.tier)
        if captured is None or batch.verify_lens is None:
            return ""
        want = padded_verify_lens(batch.verify_lens, batch.tier, self.slots(batch), self.case.tokens_per_request)
        indptr = [sum(want[:k]) for k in range(len(want) + 1)]
        wrong = [f"`{name}` holds {held.tolist()} where the batch's verify_lens {batch.verify_lens} padded to tier "
                 f"{batch.tier} has {list(expected)}"
                 for name, held, expected in (("verify_lens", captured.verify_lens, want),
                                              ("qo_indptr", captured.qo_indptr_device, indptr))
                 if held.tolist() != list(expected)]
        return ("; the tier's ragged layout: " + "; ".join(wrong)) if wrong else ""
