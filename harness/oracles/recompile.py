"""No recompilation after capture: once a graph is captured (or a compile warmed up), Dynamo must not compile again.

A compile at serve time means a guard failed on a value that differs from its capture-time value (known bug 2:
`forward_mode` MIXED against a capture in EXTEND); the new frame then runs outside the capture session. The
watcher counts every Dynamo compile start through torch's compile callbacks and keeps the guard-failure text
that Dynamo logs on its `recompiles` artifact, so the report names the guard that failed.
"""
from __future__ import annotations

import logging
import threading

import torch
import torch._dynamo
import torch._logging

from harness.oracles import OracleFailure

ORACLE = "no-recompile"
_RECOMPILE_LOGGER = "torch._dynamo.guards.__recompiles"


class _GuardTextHandler(logging.Handler):
    def __init__(self, sink: list[str]):
        super().__init__(level=logging.DEBUG)
        self.sink = sink

    def emit(self, record: logging.LogRecord) -> None:
        self.sink.append(record.getMessage())


class RecompileWatcher:
    """Context manager: `arm()` after capture or warm-up; `check()` raises if Dynamo compiled since.

    Compiles before `arm()` are counted in `warmup_compiles` (expected: the capture itself compiles).
    """

    _enable_lock = threading.Lock()
    _artifact_enabled = False

    def __init__(self, what: str = "model"):
        self.what = what
        self.compile_ids: list[str] = []
        self.guard_failures: list[str] = []
        self.armed = False
        self.warmup_compiles = 0
        self._handler = _GuardTextHandler(self.guard_failures)

    @classmethod
    def _enable_recompile_log(cls) -> None:
        with cls._enable_lock:
            if not cls._artifact_enabled:
                torch._logging.set_logs(recompiles=True)
                # Keep Dynamo's own stderr copy off: the watcher's report carries the text.
                logging.getLogger(_RECOMPILE_LOGGER).propagate = False
                cls._artifact_enabled = True

    def _on_compile_start(self, args) -> None:
        trigger = getattr(getattr(args, "callback_trigger", None), "name", "DYNAMO")
        if trigger != "DYNAMO":
            return
        if self.armed:
            self.compile_ids.append(str(getattr(args, "compile_id", "?")))
        else:
            self.warmup_compiles += 1

    def __enter__(self) -> "RecompileWatcher":
        self._enable_recompile_log()
        logger = logging.getLogger(_RECOMPILE_LOGGER)
        logger.setLevel(logging.DEBUG)
        logger.addHandler(self._handler)
        torch._dynamo.callback.callback_handler.register_start_callback(self._on_compile_start)
        return self

    def __exit__(self, *exc) -> None:
        torch._dynamo.callback.callback_handler.remove_start_callback(self._on_compile_start)
        logging.getLogger(_RECOMPILE_LOGGER).removeHandler(self._handler)

    def arm(self) -> None:
        """From now on every Dynamo compile is a failure; guard text logged before arming is dropped."""
        self.armed = True
        self.guard_failures.clear()

    @property
    def compiles_after_arm(self) -> int:
        return len(self.compile_ids)

    def check(self, context: str = "") -> None:
        if not self.compile_ids:
            return
        guard = self.guard_failures[-1] if self.guard_failures else "(Dynamo logged no guard failure: a new frame)"
        raise OracleFailure(
            ORACLE,
            f"Dynamo compiled {len(self.compile_ids)} frame(s) of {self.what} after capture{': ' + context if context else ''}",
            compile_ids=self.compile_ids,
            failing_guard=guard,
        )
