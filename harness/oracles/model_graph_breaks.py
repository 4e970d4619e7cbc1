"""Oracle `graph-break`, for a real model's compiled forward: SGLang's `patch_model` compiles the model's forward
(`--enable-torch-compile`, fullgraph off), so a construct Dynamo cannot trace does not fail, it splits the graph,
once per layer, at every compiled size: a lock, `torch.cuda.get_device_name`, an `lru_cache` wrapper, an object
Dynamo cannot build. Users meet these as slow compiled serving, or as failures once fullgraph or another backend is
asked. Breaks are allowed only where SGLang declares one: a function it wraps in `torch.compiler.disable` (the
Triton backend's attention kernels, `DECLARED`), and the breaks the virtual device itself causes (`DEVICE`: each
Triton launch Triton's CPU interpreter runs is opaque to Dynamo; on a GPU Dynamo wraps a real launch natively).
Every other break fails, with Dynamo's reason and the debug context naming the function or class.

Findings on SGLang 0.5.23, held as strict expected failures where their test says so, never silently allowed:
`FINDINGS` (each a pattern of the break text and why it is one)."""
from __future__ import annotations

import collections
import contextlib
import re
from collections.abc import Iterator

from harness.oracles import OracleFailure

ORACLE = "graph-break"
DECLARED = ("Skip calling `torch.compiler.disable()`d function",)
DEVICE = ("Triton's CPU interpreter",)  # the reason `harness.devices.triton_interpreter` gives its launches
CONTRIBUTION = r"\bContribution\b"
MLA_OUTPUT_BMM = r"non-contiguous `out=` tensor[\s\S]*?self\.value=<built-in method bmm\b"
FINDINGS = {  # break text pattern -> the finding
    CONTRIBUTION: "SGLang's residual stream (`layer_boundary/residual/stream.py`) builds and mutates a "
    "`Contribution` per layer, which Dynamo can neither construct (`object.__new__` of a user class) nor set "
    "attributes on: each decoder layer's compiled graph splits",
    r"UserDefinedObjectVariable\(RLock\)": "SGLang's layer boundary reads `ExitPolicy` through a "
    "`functools.cached_property` (`layer_boundary/construction.py`), whose `__get__` takes an RLock on Python 3.11 "
    "(3.12 dropped the lock): Dynamo cannot enter it, the graph splits at the first read per layer",
    r"\bExitDecision\b": "SGLang's layer-boundary exit (`layer_boundary/exit.py`) builds an `ExitDecision` Dynamo "
    "cannot construct: the compiled graph splits at the model's last layer",
    MLA_OUTPUT_BMM: "SGLang's MLA absorbed attention (`deepseek_common/attention_forward_methods/forward_mla.py`, "
    "the output projection's branch for a w_vc that is neither fp8 nor on DeepGEMM or MUSA: any device) writes "
    "`torch.bmm(..., out=<a transposed view>)`, which Dynamo refuses (a non-contiguous `out=`): every compiled MLA "
    "decoder layer splits its graph there",
}
HOLD_FINDINGS = ""  # a pattern of `FINDINGS`: that finding's break fails too (each strict-xfail test holds its own)


class BreakTally:
    """The graph breaks Dynamo counted while the block ran (its own counters), by reason text."""

    def __init__(self) -> None:
        self.new: dict[str, int] = {}

    @contextlib.contextmanager
    def counting(self) -> Iterator[BreakTally]:
        from torch._dynamo.utils import counters

        before = collections.Counter(counters["graph_break"])
        try:
            yield self
        finally:
            after = collections.Counter(counters["graph_break"])
            self.new = {reason: n - before.get(reason, 0) for reason, n in after.items() if n > before.get(reason, 0)}


def _short(reason: str) -> str:
    lines = [line.strip() for line in reason.splitlines() if line.strip()]
    context = next((line for line in lines if line.startswith("Developer debug context")), "")
    return f"{lines[0] if lines else reason} ({context})" if context else (lines[0] if lines else reason)


def classify(new: dict[str, int]) -> dict[str, dict[str, int]]:
    """{'device': ..., 'declared': ..., 'finding': ..., 'undeclared': ...}, each reason (shortened) -> count."""
    found = {"device": {}, "declared": {}, "finding": {}, "undeclared": {}}
    for reason, count in new.items():
        kind = "device" if any(d in reason for d in DEVICE) else "declared" if any(d in reason for d in DECLARED) else \
            "finding" if any(re.search(p, reason) for p in FINDINGS) else "undeclared"
        found[kind][_short(reason)[:300]] = count
    return found


def check(new: dict[str, int], *, where: str) -> dict[str, dict[str, int]]:
    """Raise on an undeclared break (a finding's too under HOLD_FINDINGS); return the classification for the record."""
    found = classify(new)
    held = {reason: count for reason, count in found["finding"].items()
            if HOLD_FINDINGS and re.search(HOLD_FINDINGS, reason)}
    failing = {**found["undeclared"], **held}
    if failing:
        reason, count = next(iter(failing.items()))
        raise OracleFailure(ORACLE, f"Dynamo broke the compiled graph of {where} where SGLang declares no break "
                            f"({len(failing)} reason(s)); the first, {count} time(s): {reason}",
                            breaks=failing, declared=found["declared"])
    return found
