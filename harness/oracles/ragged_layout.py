"""SGLang's compact ragged verify layouts, built from drawn requests, against the arithmetic the case gives.

A DSPARK verify batch reaches its graph as a `RaggedVerifyLayout`: the token tier (the smallest grid entry that
holds the batch's verify tokens, or its floor), per-request `verify_lens` and their prefix sums (`qo_indptr`,
`extend_start_loc`); a capture builds its placeholder lens with `build_capture_verify_lens`, and an attention
backend reads the layout through `build_ragged_target_verify_geometry` (FlashAttention's and TRT-LLM's ragged
verify: KV lengths with the verify tokens, their prefix sums, the longest query). A layout SGLang must refuse
(no request, a request verifying nothing, a row past its cap, totals that disagree, a batch past the last tier,
an empty grid, a capture that cannot pack its tokens, an unknown `SGLANG_RAGGED_VERIFY_MODE`) must be a
ValueError, never a layout a graph then reads out of bounds. Each expectation is computed here from the drawn
numbers (`expected_*`), never read back from SGLang.
"""
from __future__ import annotations

import dataclasses
import itertools

from harness.oracles import OracleFailure

ORACLE = "ragged-layout"
MODULE = "sglang.srt.speculative.ragged_verify"


def _prefix(values: list[int]) -> list[int]:
    return [0, *itertools.accumulate(values)]


@dataclasses.dataclass(frozen=True)
class LayoutRequest:
    """What a worker hands `RaggedVerifyLayout.from_verify_lens`: per-request verify lengths, the runner's token
    grid and a floor for the tier."""

    verify_lens: list[int]
    grid: list[int]
    floor: int = 0

    def refusal(self) -> str | None:
        """Why SGLang must refuse this layout, or None when it must build one."""
        if not self.grid:
            return "an empty token grid"
        if max(sum(self.verify_lens), self.floor) > self.grid[-1]:
            return f"{max(sum(self.verify_lens), self.floor)} tokens past the last tier {self.grid[-1]}"
        if not self.verify_lens:
            return "no request"
        if min(self.verify_lens) < 1:
            return f"a request verifying nothing ({self.verify_lens})"
        return None

    def tier(self) -> int:
        needed = max(sum(self.verify_lens), self.floor)
        return min(g for g in self.grid if g >= needed)


def _refused(build, why: str, what: str, **drawn) -> None:
    try:
        built = build()
    except ValueError:
        return
    raise OracleFailure(ORACLE, f"SGLang built {what} for {why}: it must refuse it (ValueError); a graph would read "
                                f"the layout out of bounds", built=repr(built)[:300], **drawn)


def check_from_verify_lens(request: LayoutRequest, device: str = "cpu") -> str:
    """`from_verify_lens` builds the tier and prefix sums the request implies, or refuses what it must."""
    import importlib

    import torch

    layout_class = importlib.import_module(MODULE).RaggedVerifyLayout
    drawn = dataclasses.asdict(request)

    def build():
        return layout_class.from_verify_lens(verify_lens_cpu=request.verify_lens, device=torch.device(device),
                                             grid=request.grid, graph_num_tokens_floor=request.floor)

    why = request.refusal()
    if why:
        _refused(build, why, "a ragged verify layout", **drawn)
        return f"refused: {why}"
    layout = build()
    got = {"graph_num_tokens": layout.graph_num_tokens, "verify_lens": layout.verify_lens.tolist(),
           "qo_indptr": layout.qo_indptr_device.tolist(), "extend_start_loc": layout.extend_start_loc.tolist(),
           "total_verify_tokens": layout.total_verify_tokens}
    prefix = _prefix(request.verify_lens)
    want = {"graph_num_tokens": request.tier(), "verify_lens": request.verify_lens, "qo_indptr": prefix,
            "extend_start_loc": prefix[:-1], "total_verify_tokens": sum(request.verify_lens)}
    wrong = {k: (got[k], want[k]) for k in want if got[k] != want[k]}
    if wrong:
        raise OracleFailure(ORACLE, "the ragged verify layout differs from the request's arithmetic: " + "; ".join(
            f"{k} {g} (expected {w})" for k, (g, w) in wrong.items()), **drawn)
    return f"tier {layout.graph_num_tokens}"


def check_struct_validation(fields: dict) -> str:
    """The layout's own validation (`RaggedVerifyLayout(...)` with host-side lens): refuses exactly the drawn
    combinations its contract names (none, a zero row, a row past `cap`, `total_verify_tokens` not their sum or
    past `graph_num_tokens`)."""
    import importlib

    import torch

    layout_class = importlib.import_module(MODULE).RaggedVerifyLayout
    lens, cap, total, tier = fields["verify_lens_cpu"], fields["cap"], fields["total_verify_tokens"], \
        fields["graph_num_tokens"]
    why = ("no request" if not lens else f"a request verifying nothing ({lens})" if min(lens) < 1 else
           f"a row past cap {cap} ({lens})" if cap is not None and max(lens) > cap else
           f"total_verify_tokens {total} != sum {sum(lens)}" if total != sum(lens) else
           f"total_verify_tokens {total} past graph_num_tokens {tier}" if total > tier else None)
    tensor = torch.tensor(lens or [0], dtype=torch.int32)
    prefix = torch.tensor(_prefix(lens), dtype=torch.int32)

    def build():
        return layout_class(verify_lens=tensor, graph_num_tokens=tier, extend_start_loc=prefix[:-1],
                            qo_indptr_device=prefix, verify_lens_cpu=lens, total_verify_tokens=total, cap=cap)

    if why:
        _refused(build, why, "a ragged verify layout", **fields)
        return f"refused: {why}"
    try:
        build()
    except ValueError as error:
        raise OracleFailure(ORACLE, f"SGLang refused a well-formed ragged verify layout: {error}", **fields) from error
    return "accepted"


def check_capture_lens(num_tokens: int, num_slots: int, num_draft_tokens: int) -> str:
    """`build_capture_verify_lens`: a capture's placeholder rows fill `num_tokens` over `num_slots` rows, as even
    as they go (the first `num_tokens % num_slots` one longer), none wider than the draft; or a refusal where
    they cannot (fewer tokens than slots, no slot, more tokens than the slots hold)."""
    import importlib

    build_lens = importlib.import_module(MODULE).build_capture_verify_lens
    drawn = dict(num_tokens=num_tokens, num_slots=num_slots, num_draft_tokens=num_draft_tokens)

    def build():
        return build_lens(**drawn)

    why = ("no slot" if num_slots < 1 else f"{num_tokens} tokens for {num_slots} slots" if num_tokens < num_slots
           else f"{num_tokens} tokens past {num_slots} x {num_draft_tokens}"
           if num_tokens > num_slots * num_draft_tokens else None)
    if why:
        _refused(build, why, "capture verify lens", **drawn)
        return f"refused: {why}"
    base, longer = divmod(num_tokens, num_slots)
    want = [base + 1] * longer + [base] * (num_slots - longer)
    got = list(build())
    if got != want:
        raise OracleFailure(ORACLE, f"capture verify lens {got} for {num_tokens} tokens over {num_slots} slots "
                                    f"(expected {want})", **drawn)
    return "built"


def check_geometry(verify_lens: list[int], seq_lens: list[int], grid: list[int]) -> str:
    """`build_ragged_target_verify_geometry`, what a ragged-verify attention backend reads: per-request KV
    lengths with the verify tokens (seq_len + verify_len), their prefix sums from 0, the query prefix sums of the
    layout and the longest query."""
    import importlib

    import torch

    module = importlib.import_module(MODULE)
    layout = module.RaggedVerifyLayout.from_verify_lens(verify_lens_cpu=verify_lens, device=torch.device("cpu"),
                                                        grid=grid)
    geometry = module.build_ragged_target_verify_geometry(seq_lens=torch.tensor(seq_lens, dtype=torch.int64),
                                                          layout=layout)
    kv = [s + v for s, v in zip(seq_lens, verify_lens)]
    want = {"cache_seqlens_int32": kv, "cu_seqlens_k": _prefix(kv), "cu_seqlens_q": _prefix(verify_lens),
            "max_seq_len_q": max(verify_lens)}
    got = {"cache_seqlens_int32": geometry.cache_seqlens_int32.tolist(),
           "cu_seqlens_k": geometry.cu_seqlens_k.tolist(), "cu_seqlens_q": geometry.cu_seqlens_q.tolist(),
           "max_seq_len_q": geometry.max_seq_len_q}
    wrong = {k: (got[k], want[k]) for k in want if got[k] != want[k]}
    if wrong:
        raise OracleFailure(ORACLE, "the ragged verify attention geometry differs from the batch's arithmetic: "
                            + "; ".join(f"{k} {g} (expected {w})" for k, (g, w) in wrong.items()),
                            verify_lens=verify_lens, seq_lens=seq_lens)
    int32 = {k: str(getattr(geometry, k).dtype) for k in ("cache_seqlens_int32", "cu_seqlens_k", "cu_seqlens_q")}
    if set(int32.values()) != {"torch.int32"}:
        raise OracleFailure(ORACLE, f"the ragged verify geometry's index tensors must be int32 (the kernels' type): "
                                    f"{int32}", verify_lens=verify_lens, seq_lens=seq_lens)
    return "geometry"


def check_unknown_mode(value: str) -> str:
    """An `SGLANG_RAGGED_VERIFY_MODE` SGLang does not know is SGLang's ValueError naming it, not a silent mode."""
    import importlib
    import os
    from unittest import mock

    module = importlib.import_module(MODULE)
    with mock.patch.dict(os.environ, {"SGLANG_RAGGED_VERIFY_MODE": value}):
        try:
            mode = module.read_ragged_verify_mode()
        except ValueError as error:
            if value not in str(error):
                raise OracleFailure(ORACLE, f"SGLang refused SGLANG_RAGGED_VERIFY_MODE={value!r} without naming "
                                            f"it: {error}") from error
            return "refused"
    raise OracleFailure(ORACLE, f"SGLANG_RAGGED_VERIFY_MODE={value!r} (no such mode) was read as {mode}: a typo "
                                "silently picks a verify layout")
