"""What a real layer asks about the capture it runs in, logged for the capture-context oracle.

Real layers branch, during forward, on two answers: SGLang's capture-mode query (`get_is_capture_mode()`: LoRA
kernel recording, `dispose_tensor` off, `compile_in_capture_mode`) and the device module's
`is_current_stream_capturing()` (alt-stream KV writes, dual-stream paths, LoRA workspaces). The tiny models ask
both where a real layer would (each decode forward, each prefill layer) and log the answers here with the site and
the phase the harness is in (capturing: the target is being built, which captures; serving: the harness's eager
references and replays). `harness.oracles.capture_context` judges the log.

Nothing is logged while Dynamo traces (`torch.compiler.is_compiling()`): a trace is not a run, and a compiled
frame asks nothing at run time. A replay in record mode runs no Python, so it asks nothing either, as a CUDA graph.
"""
from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable, Iterator

import torch


@dataclasses.dataclass(frozen=True)
class Answer:
    site: str
    phase: str  # "capturing" or "serving"
    capture_mode: bool | None  # SGLang's get_is_capture_mode() (None: the release has no such query)
    stream_capturing: bool  # the device module's is_current_stream_capturing()


# Where releases keep the capture-mode query: 0.5.14+, then the old runner module (up to 0.5.13).
QUERY_HOMES = ("sglang.srt.model_executor.runner_utils.capture_mode", "sglang.srt.model_executor.cuda_graph_runner")


def _installed_query() -> Callable[[], bool] | None:
    """The release's query, looked up on its module at each call (so a patched module is what answers)."""
    import importlib

    for home in QUERY_HOMES:
        try:
            module = importlib.import_module(home)
        except ImportError:
            continue
        if hasattr(module, "get_is_capture_mode"):
            return lambda: module.get_is_capture_mode()
    return None


# The release's capture-mode query, resolved at the first recording (None: the release has none).
_query: dict = {}
_log: list[Answer] = []
_phase: dict = {"now": None}  # None: no recording open, nothing logged


def ask(site: str, device: torch.device) -> None:
    """Ask both questions as a layer at `site` running on `device` would, and log the answers."""
    if torch.compiler.is_compiling() or _phase["now"] is None:  # in this order: Dynamo reads no state
        return
    stream_capturing = bool(torch.get_device_module(device).is_current_stream_capturing())
    query = _query["capture_mode"]
    _log.append(Answer(site, _phase["now"], None if query is None else bool(query()), stream_capturing))


def answers() -> list[Answer]:
    return list(_log)


@contextlib.contextmanager
def recording() -> Iterator[list[Answer]]:
    """A fresh log for the block, in the capturing phase until `serving()` is called; yields the live log."""
    _log.clear()
    if "capture_mode" not in _query:
        _query["capture_mode"] = _installed_query()
    _phase["now"] = "capturing"
    try:
        yield _log
    finally:
        _phase["now"] = None


def serving() -> None:
    """From now on the harness serves (eager references, replays): no capture of the target's is running."""
    _phase["now"] = "serving"
