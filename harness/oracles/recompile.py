"""No recompilation after capture: once a graph is captured (or a compile warmed up), Dynamo must not compile again.

A compile at serve time means a guard failed on a value that differs from its capture-time value (known bug 2:
`forward_mode` MIXED against a capture in EXTEND); the new frame then runs outside the capture session. The
count of Dynamo compiles is `harness.counter`'s (`num_dynamo_frames_compiled`); the watcher adds the evidence,
the guard-failure text Dynamo logs on its `recompiles` artifact, so the report names the guard that failed.

Nor inside a capture: a runner warms each size up on the very inputs it then captures, so a compile in the capture's
call is a guard that fails on every call (a counter, a global or a grad mode that changes per call); every later
call of the compiled region compiles again, and on CUDA the compile would run inside the stream capture.
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
        self._captures_at_entry = 0  # `cpu.CAPTURES` when entered

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
        from harness.devices import cpu

        self._captures_at_entry = len(cpu.CAPTURES)
        return self

    def __exit__(self, *exc) -> None:
        self._exited = counter.clone()
        logging.getLogger(_RECOMPILE_LOGGER).removeHandler(self._handler)

    def _compiles(self, start: Counter | None, end: Counter | None) -> int:
        if start is None:
            return 0
        return getattr(end or counter, _COMPILES) - getattr(start, _COMPILES)

    def arm(self) -> None:
        """From now on every Dynamo compile is a failure; guard text logged before arming is dropped. First, the
        captures made since entering (on the virtual device) must have compiled nothing (`check_captures`)."""
        self.check_captures()
        self._armed = counter.mark()
        self.guard_failures.clear()

    def check_captures(self) -> None:
        """No capture made since entering compiled a Dynamo frame or missed its cache: its warm-up ran the same
        call on the same inputs (the module docstring). Names each graph, its capture site and the failed guard."""
        from harness.devices import cpu

        compiled = [record for record in cpu.CAPTURES[self._captures_at_entry:]
                    if record.compiles or record.cache_misses]
        if not compiled:
            return
        misses = [miss for record in compiled for miss in record.cache_misses]
        guard = misses[0] if misses else (
            self.guard_failures[-1] if self.guard_failures else "(Dynamo logged no guard failure: a new frame)")
        graphs = ", ".join(f"graph {record.graph_id} ({record.compiles + len(record.cache_misses)} at {record.site})"
                           for record in compiled)
        raise OracleFailure(
            ORACLE,
            f"Dynamo compiled (or, recording, would compile) frame(s) of {self.what} inside a graph capture, after "
            f"the warm-up ran the same call on the same inputs: {graphs}; a guard that fails on every call compiles "
            f"at serve time too",
            compiles_in_capture=sum(record.compiles + len(record.cache_misses) for record in compiled),
            failing_guard=guard)

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

