"""No "capture stream is not set" in any form, nor any other "capture/graph state not set" signature.

Known bug 2 ends, after a Dynamo recompile at serve time, in a piece that tries to capture outside the capture
session. SGLang reports that in two forms: up to 0.5.15 an `AssertionError: PCG capture stream is not set,
please check if runtime recompilation happened`; from 0.5.16 a once-only warning ("PCG capture stream is not
set ... falling back to eager execution") through `print_warning_once` (`logger.warning`), after which the piece
runs eagerly. `CaptureStreamWatcher` classifies every log record (any logger), every Python warning and every
exception that passes through it against `SIGNATURES`; `check()` raises `OracleFailure("capture-stream", ...)`.

`print_warning_once` is an `lru_cache`d function: SGLang prints each message once per process. The watcher
clears that cache when it starts watching, so every watched example can see the warning again (otherwise only
the first example of a process would).
"""
from __future__ import annotations

import contextlib
import dataclasses
import logging
import re
import warnings

from harness.oracles import OracleFailure

ORACLE = "capture-stream"

# (name, pattern): what is matched against log messages, warnings and exception text.
SIGNATURES: tuple[tuple[str, re.Pattern], ...] = (
    ("pcg-capture-stream-not-set", re.compile(r"capture stream is not set", re.I)),
    ("runtime-recompilation", re.compile(r"runtime recompilation happened", re.I)),
    ("stream-not-set", re.compile(r"\bstream (is |was )?not (set|initiali[sz]ed)\b", re.I)),
    ("outside-capture", re.compile(r"outside (of )?(the )?(cuda ?graph |graph |pcg )?capture", re.I)),
    ("capture-not-active", re.compile(r"capture (session |context )?(is )?not (active|started|set)", re.I)),
    ("operation-not-permitted-capturing", re.compile(r"operation not permitted when stream is capturing", re.I)),
    ("capture-invalidated", re.compile(r"cudaErrorStreamCaptureInvalidated|capture (was )?invalidated", re.I)),
)

_ONCE_ONLY_LOGGERS = ("sglang.srt.utils.common.print_warning_once", "sglang.srt.utils.common.print_info_once")


@dataclasses.dataclass
class Sighting:
    signature: str
    form: str  # "log" | "warning" | "exception"
    text: str
    where: str = ""


def classify(text: str) -> str | None:
    """The name of the first signature `text` matches, or None."""
    for name, pattern in SIGNATURES:
        if pattern.search(text or ""):
            return name
    return None


class _Handler(logging.Handler):
    def __init__(self, watcher: CaptureStreamWatcher):
        super().__init__(level=logging.DEBUG)
        self.watcher = watcher

    def emit(self, record: logging.LogRecord) -> None:
        try:
            message = record.getMessage()
        except Exception:  # noqa: BLE001 - a malformed record is not ours to fix
            return
        self.watcher._see(message, "log", f"{record.name} {record.pathname}:{record.lineno}")


def _clear_once_caches() -> None:
    import importlib

    for dotted in _ONCE_ONLY_LOGGERS:
        module_name, _, name = dotted.rpartition(".")
        try:
            function = getattr(importlib.import_module(module_name), name)
        except (ImportError, AttributeError):
            continue
        clear = getattr(function, "cache_clear", None)
        if clear is not None:
            clear()


class CaptureStreamWatcher:
    """`with CaptureStreamWatcher("prefill capture") as w: ...; w.check()`.

    Watches logs (a handler on the root logger, which every SGLang logger propagates to, and on the loggers that
    do not propagate) while entered, Python warnings inside `watching_warnings()` blocks, and exceptions
    leaving either (classified and re-raised; `check()` afterwards reports them as this oracle's failure).
    """

    def __init__(self, what: str = "model"):
        self.what = what
        self.sightings: list[Sighting] = []
        self._handler = _Handler(self)
        self._loggers: list[logging.Logger] = []
        self._levels: list[tuple[logging.Logger, int]] = []

    def _see(self, text: str, form: str, where: str = "") -> None:
        signature = classify(text)
        if signature:
            self.sightings.append(Sighting(signature, form, text.strip()[:600], where))

    def __enter__(self) -> CaptureStreamWatcher:
        _clear_once_caches()
        self._loggers = [logging.getLogger()] + [
            logger for logger in logging.Logger.manager.loggerDict.values()
            if isinstance(logger, logging.Logger) and not logger.propagate]
        for logger in self._loggers:
            logger.addHandler(self._handler)
        sglang = logging.getLogger("sglang")
        if sglang.getEffectiveLevel() > logging.WARNING:
            self._levels.append((sglang, sglang.level))
            sglang.setLevel(logging.WARNING)
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        for logger in self._loggers:
            logger.removeHandler(self._handler)
        for logger, level in self._levels:
            logger.setLevel(level)
        if exc is not None:
            self._see(f"{type(exc).__name__}: {exc}", "exception")
        return False

    @contextlib.contextmanager
    def watching_warnings(self):
        """Record Python warnings raised inside the block (scoped, so pytest's own per-test warning capture
        is left as it was); exceptions leaving the block are classified and re-raised."""
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                yield
            except Exception as error:
                self._see(f"{type(error).__name__}: {error}", "exception")
                raise
            finally:
                for item in caught:
                    self._see(str(item.message), "warning", f"{item.filename}:{item.lineno}")

    def check(self, context: str = "") -> None:
        if not self.sightings:
            return
        first = self.sightings[0]
        forms = sorted({s.form for s in self.sightings})
        raise OracleFailure(
            ORACLE,
            f"{first.signature} during {self.what}{': ' + context if context else ''} "
            f"({len(self.sightings)} sighting(s), as {'/'.join(forms)}): a piece ran outside the capture session "
            "(capture stream missing, e.g. after a Dynamo recompile at serve time) and fell back to eager or failed",
            first=first.text, where=first.where, signatures=sorted({s.signature for s in self.sightings}),
        )
