"""Garbage collection around SGLang's captures, kept cheap.

SGLang captures inside `freeze_gc` (`runner/base_cuda_graph_runner.py`): `gc.collect()`, `gc.freeze()`, the
capture, `gc.unfreeze()`, `gc.collect()`. With torch, transformers and SGLang imported the heap holds millions of
objects, and each of those full collections took 0.73 s on the 2-core development machine (28 of them were 20.5 of
the 29.6 s six NPU decode examples took): more than the captures themselves, in every example of every suite.

So the harness collects and freezes the heap once a session starts (`freeze_heap`) and keeps it frozen across
SGLang's `gc.unfreeze()`, which would put every frozen object back for the next collection to scan: after the
first capture SGLang's collections scan only what was made since. Frozen objects are still freed by reference
counting; only cyclic garbage made before a freeze outlives it, which the virtual device (no device memory to
defragment) does not miss. On real hardware, where a capture's memory pool may care, and under `HARNESS_GC=sglang`,
SGLang's collections stay as they are.
"""
from __future__ import annotations

import gc
import os

ENV = "HARNESS_GC"
_thaw = {"original": None}


def freeze_heap(device: str) -> str:
    """On the virtual device (`device` "cpu"): collect, freeze what survives and keep it frozen through SGLang's
    `gc.unfreeze()`. Returns the records' note of the policy in force."""
    if device != "cpu":
        return "SGLang's own (real hardware)"
    if os.environ.get(ENV) == "sglang":
        return "SGLang's own (HARNESS_GC=sglang)"
    gc.collect()
    gc.freeze()
    if _thaw["original"] is None:
        _thaw["original"] = gc.unfreeze
        gc.unfreeze = _stay_frozen
    return "heap frozen at session start, kept frozen through SGLang's gc.unfreeze"


def _stay_frozen() -> None:
    """SGLang's `gc.unfreeze()`: what it froze for its capture stays frozen with the rest."""
    gc.freeze()


def restore() -> None:
    """`gc.unfreeze` as it was (the frozen objects stay frozen: thawing them would cost the collection saved)."""
    if _thaw["original"] is not None:
        gc.unfreeze, _thaw["original"] = _thaw["original"], None
