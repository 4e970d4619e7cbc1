"""No recompilation after capture: once a graph is captured (or a compile warmed up), Dynamo must not compile again.

A compile at serve time means a guard failed on a value that differs from its capture-time value (known bug 2:
`forward_mode` MIXED against a capture in EXTEND); the new frame then runs outside the capture session. The
count of Dynamo compiles is `harness.counter`'s (`num_dynamo_frames_compiled`); the watcher adds the evidence,
the guard-failure text Dynamo logs on its `recompiles` artifact, so the report names the guard that failed.
"""
from __future__ import annotations

import logging
import re
import threading

import torch._logging

from harness.counter import Counter, counter
from harness.oracles import OracleFailure

ORACLE = "no-recompile"
_RECOMPILE_LOGGER = "torch._dynamo.guards.__recompiles"
_COMPILES = "num_dynamo_frames_compiled"


class _GuardTextHandler(logging.Handler):
    def __init__(self, sink: list[str]):
        super().__init__(level=logging.DEBUG)
        self.sink = sink

    def emit(self, record: logging.LogRecord) -> None:
        self.sink.append(record.getMessage())


class RecompileWatcher:
    """Context manager: `arm()` after capture or warm-up; `check()` raises if Dynamo compiled since (while entered).

    Compiles before `arm()` are `warmup_compiles` (expected: the capture itself compiles).
    """

    _enable_lock = threading.Lock()
    _artifact_enabled = False

    def __init__(self, what: str = "model"):
        self.what = what
        self.guard_failures: list[str] = []
        self._handler = _GuardTextHandler(self.guard_failures)
        self._entered: Counter | None = None
        self._armed: Counter | None = None
        self._exited: Counter | None = None

    @classmethod
    def _enable_recompile_log(cls) -> None:
        with cls._enable_lock:
            if not cls._artifact_enabled:
                torch._logging.set_logs(recompiles=True)
                # Keep Dynamo's own stderr copy off: the watcher's report carries the text.
                logging.getLogger(_RECOMPILE_LOGGER).propagate = False
                cls._artifact_enabled = True

    def __enter__(self) -> RecompileWatcher:
        self._enable_recompile_log()
        logger = logging.getLogger(_RECOMPILE_LOGGER)
        logger.setLevel(logging.DEBUG)
        logger.addHandler(self._handler)
        self._entered = counter.mark()
        return self

    def __exit__(self, *exc) -> None:
        self._exited = counter.clone()
        logging.getLogger(_RECOMPILE_LOGGER).removeHandler(self._handler)

    def _compiles(self, start: Counter | None, end: Counter | None) -> int:
        if start is None:
            return 0
        return getattr(end or counter, _COMPILES) - getattr(start, _COMPILES)

    def arm(self) -> None:
        """From now on every Dynamo compile is a failure; guard text logged before arming is dropped."""
        self._armed = counter.mark()
        self.guard_failures.clear()

    @property
    def warmup_compiles(self) -> int:
        return self._compiles(self._entered, self._armed or self._exited)

    def check(self, context: str = "") -> None:
        compiles = self._compiles(self._armed, self._exited)
        if not compiles:
            return
        guard = self.guard_failures[-1] if self.guard_failures else "(Dynamo logged no guard failure: a new frame)"
        raise OracleFailure(
            ORACLE,
            f"Dynamo compiled {compiles} frame(s) of {self.what} after capture{': ' + context if context else ''}",
            compiles_after_capture=compiles,
            failing_guard=guard,
        )


_ZERO_ONE_GUARD = re.compile(r"2 <= [\w.\[\]']+\.size\(\)\[\d+\]")  # a dynamic frame refusing a size 0 or 1
_STATIC_ONE_GUARD = re.compile(r"size mismatch at index \d+\. expected 1, actual")  # a size-1 frame refusing more
_VIEW_BASE_GUARD = re.compile(r"\._base\.size\(\)\[\d+\] == ")  # a frame for a view refusing another base


def size_class_compile(guard_text: str) -> bool:
    """Whether a logged recompile is one of the few variants a `dynamic=True` function compiles once per process:
    every failing guard it lists is Dynamo's 0/1 specialisation (a dynamic frame refusing a size 1, or the size-1
    frame refusing a larger size) or its view guard (a frame traced on a view refusing another base size): at most
    size {1, more} x {view, not} frames. A frame for any other size (a function compiled static, a guard on a
    value) lists another guard."""
    failures = [line for line in guard_text.splitlines() if line.strip().startswith("- ")]
    return bool(failures) and all(_ZERO_ONE_GUARD.search(line) or _STATIC_ONE_GUARD.search(line)
                                  or _VIEW_BASE_GUARD.search(line) for line in failures)

