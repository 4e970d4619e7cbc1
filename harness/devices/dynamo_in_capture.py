"""What Dynamo would do inside a record-mode capture, as it does inside a CUDA stream capture.

On CUDA a capture runs the compiled code of a `torch.compile`d region: every frame's cache is looked up, and a frame
whose guards all fail compiles there, inside the capture. The virtual device records a capture with a
`TorchDispatchMode`, and under a dispatch mode Dynamo runs every frame eagerly instead (its convert-frame callback
skips with "non-infra torch dispatch mode present"), so a guard that fails in a capture was never seen.

While a capture records, `watching` wraps Dynamo's convert-frame callback: for each frame a `torch.compile`
wrapper enters that Dynamo already compiled, it checks the frame's cached guards against the frame's locals, as
the cache lookup on CUDA would, and notes a frame none of them accepts with Dynamo's own text of the failed guard.
What runs is left as it was (eager, recorded). Frames entered below one (continuations after a graph break, the
helpers a compiled frame had inlined) are not judged: under the eager parent they may see other locals than on
CUDA, or not be entered there at all. Relies on Dynamo internals (the callback class and the cache entries); where
a release lacks them, `watching` notes nothing and `unavailable` says why.
"""
from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator


def unavailable() -> str | None:
    """Why this torch cannot be watched (a name moved), or None."""
    try:
        from torch._dynamo import convert_frame, eval_frame, guards
    except ImportError as error:
        return f"torch._dynamo cannot be imported: {error}"
    from torch.utils import _python_dispatch

    for module, name in ((convert_frame, "CatchErrorsWrapper"), (eval_frame, "_debug_get_cache_entry_list"),
                         (guards, "get_guard_fail_reason"), (_python_dispatch, "_disable_current_modes")):
        if not hasattr(module, name):
            return f"this torch's {module.__name__} has no {name}"
    return None


@contextlib.contextmanager
def watching(misses: list[str]) -> Iterator[None]:
    """Within the block, each frame Dynamo's callback sees whose cache would miss appends a line to `misses`:
    the frame's function, file and line, and the guard that failed."""
    if unavailable():
        yield
        return
    import pytest
    from torch._dynamo.convert_frame import CatchErrorsWrapper

    original = CatchErrorsWrapper.__call__

    def call(self, frame, cache_entry, frame_state, *args, **kwargs):
        miss = _cache_miss(frame) if _entered_by_torch_compile() else None
        if miss:
            misses.append(miss)
        return original(self, frame, cache_entry, frame_state, *args, **kwargs)

    with pytest.MonkeyPatch.context() as patches:
        patches.setattr(CatchErrorsWrapper, "__call__", call)
        yield


def _entered_by_torch_compile() -> bool:
    """Whether the frame being entered is one a `torch.compile` wrapper calls (its caller is Dynamo's own wrapper
    in `eval_frame.py`): its locals are the caller's, as on CUDA. A frame entered from a region that runs eagerly
    here but compiled on CUDA may see other locals (a continuation, an inlined helper) and is not judged."""
    caller = sys._getframe(2)  # 0: this function, 1: `call`, 2: the frame that enters the new one
    return caller.f_code.co_filename.replace("\\", "/").endswith("torch/_dynamo/eval_frame.py")


def _cache_miss(frame) -> str | None:
    """The frame's cache lookup as CUDA would make it: None on a hit or where Dynamo holds no entry for the code."""
    from torch._dynamo.eval_frame import _debug_get_cache_entry_list
    from torch._dynamo.guards import get_guard_fail_reason
    from torch.utils._python_dispatch import _disable_current_modes

    code = frame.f_code
    entries = _debug_get_cache_entry_list(code)
    if not entries:
        return None
    reasons = []
    with _disable_current_modes():  # the recorder's own mode is in the dispatch state the global guard reads
        for entry in entries:
            if entry.guard_manager.check(frame.f_locals):
                return None
            reasons.append(get_guard_fail_reason(entry.guard_manager, entry.code, frame.f_locals, entry.compile_id,
                                                 None, skip_logging=True))
    return f"{code.co_name} ({code.co_filename}:{code.co_firstlineno}): " + "; ".join(r for r in reasons if r)
