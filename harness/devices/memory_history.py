"""`torch.cuda.memory`'s allocator history on the virtual device: `_record_memory_history` and `_dump_snapshot`,
which SGLang's `--enable-profile-cuda-graph` calls around capture and which raise on a machine without a GPU.

The virtual device has no caching allocator, so there is no history to keep: each call is logged in `LOG` (what
was asked, whether history was on at the time, whether a graph capture was in progress), so a check can tell that
history was switched on before capture, the snapshot dumped while it was on, and history switched off after.
The snapshot itself is not written: SGLang names a path relative to the working directory."""
from __future__ import annotations

import dataclasses

import pytest
import torch


@dataclasses.dataclass(frozen=True)
class MemoryHistoryCall:
    name: str  # "record" or "dump"
    argument: object  # record: `enabled` ("all", "state", None = off); dump: the file name
    recording: bool  # whether history was on after the call (record) or at it (dump)
    capturing: bool


LOG: list[MemoryHistoryCall] = []
_STATE = {"recording": False, "capturing": lambda: False}


def _capturing() -> bool:
    return bool(_STATE["capturing"]())


def record_memory_history(enabled="all", *args, **kwargs) -> None:
    _STATE["recording"] = enabled is not None
    LOG.append(MemoryHistoryCall("record", enabled, _STATE["recording"], _capturing()))


def dump_snapshot(filename: str = "dump_snapshot.pickle") -> None:
    LOG.append(MemoryHistoryCall("dump", filename, _STATE["recording"], _capturing()))


def recording() -> bool:
    return _STATE["recording"]


def reset() -> None:
    LOG.clear()
    _STATE["recording"] = False


def install(patches: pytest.MonkeyPatch, capturing) -> None:
    """Plug the stand-ins into `torch.cuda.memory` on the device's patch set; history starts off. `capturing`:
    the device's `is_current_stream_capturing`."""
    reset()
    _STATE["capturing"] = capturing
    patches.setattr(torch.cuda.memory, "_record_memory_history", record_memory_history)
    patches.setattr(torch.cuda.memory, "_dump_snapshot", dump_snapshot)
