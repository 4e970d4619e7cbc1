"""One JSONL line per finished example, written and flushed as it finishes, so a killed run keeps what it did.

Suites wrap each Hypothesis example body in `example(suite, **drawn)`; the verdict is
`pass`, `fail` (an oracle fired), `error` (anything else raised: a crash of SGLang or of the harness),
`expected-error` (SGLang refused the case as its contract says it should), or `skip`.
"""
from __future__ import annotations

import contextlib
import dataclasses
import enum
import faulthandler
import json
import os
import time
import traceback
from pathlib import Path
from typing import Any

from harness.errors import HarnessError
from harness.oracles import OracleFailure, batch_consistency, capture_legality, observed, stream_order


@dataclasses.dataclass
class Sink:
    """Where this process's records go: `path` (None: nowhere), the run-wide `context` each record carries, the
    report directory for the in-flight marker, `timeout` seconds (0: none) before a hung example ends its process,
    and the `process` name (`main`, or the xdist worker's id) in the marker's and the hang dump's file names."""
    path: Path | None = None
    context: dict = dataclasses.field(default_factory=dict)
    dir: Path | None = None
    timeout: float = 0.0
    process: str = "main"


# Suites call `example()` without a fixture, so the sink the plugin configured is kept here for them.
_sink = Sink()


def configure(report_dir: Path | None, context: dict, example_timeout: float = 0.0,
              worker: str | None = None) -> None:
    """Point the writer at `report_dir` (None: records are kept in memory only) with run-wide `context`;
    `example_timeout` seconds (0: none) after which a hung example ends its process (see `example`); `worker`:
    the xdist worker this process is (its records go to examples.WORKER.jsonl)."""
    global _sink
    path = None
    if report_dir is not None:
        report_dir.mkdir(parents=True, exist_ok=True)
        path = report_dir / (f"examples.{worker}.jsonl" if worker else "examples.jsonl")
    _sink = Sink(path, dict(context), report_dir, example_timeout, worker or "main")


def inflight_path(report_dir: Path, process: str) -> Path:
    """The example a process is running, kept while it runs: what is left after a crash or a hang."""
    return Path(report_dir) / f"inflight.{process}.json"


def hang_path(report_dir: Path, process: str) -> Path:
    return Path(report_dir) / f"hang.{process}.txt"


@contextlib.contextmanager
def _guarded(record: dict):
    """Mark the example in flight and arm the watchdog: a hang past the limit dumps every thread's stack to
    hang.PROCESS.txt and ends the process, which xdist reports and replaces (the campaign goes on)."""
    sink = _sink
    if sink.dir is None:
        yield
        return
    inflight = inflight_path(sink.dir, sink.process)
    inflight.write_text(json.dumps({**record, "started": time.time(), **sink.context}, default=repr))
    hang_file = None
    if sink.timeout > 0:
        hang_file = open(hang_path(sink.dir, sink.process), "w")
        faulthandler.dump_traceback_later(sink.timeout, exit=True, file=hang_file)
    try:
        yield
    finally:
        if hang_file is not None:
            faulthandler.cancel_dump_traceback_later()
            hang_file.close()
            hang_path(sink.dir, sink.process).unlink(missing_ok=True)
        inflight.unlink(missing_ok=True)


def jsonable(value: Any) -> Any:
    """Drawn values as JSON: plain data stays, enums by name, tensors by shape, anything else by repr."""
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    if isinstance(value, enum.Enum):
        return value.name
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [jsonable(v) for v in value]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)}
    shape = getattr(value, "shape", None)
    if shape is not None and hasattr(value, "dtype"):
        return f"tensor{tuple(shape)} {value.dtype}"
    return repr(value)


class Example:
    """The record of one example; `note()` adds facts the report should show."""

    def __init__(self, suite: str, drawn: dict):
        self.suite = suite
        self.drawn = drawn
        self.notes: dict[str, Any] = {}
        self.behaviour: dict[str, list] = {}  # what the oracles observed (`harness.oracles.observed`)
        self.verdict = "pass"
        self.reason = ""
        self.rule: str | None = None

    def note(self, key: str, value: Any) -> None:
        self.notes[key] = value

    def expected_error(self, reason: str, *, rule: str) -> None:
        """SGLang refused this case the way its contract says it must: recorded, not a failure. `rule`: the short
        stable name of the rule that predicted the refusal from the case before the run (the summary counts
        expected errors per rule); a refusal no rule predicted is a failure, never an expected error."""
        if not rule:
            raise HarnessError("expected_error(reason, rule=...) needs the name of the rule that predicted the "
                               "refusal from the case before the run")
        self.verdict, self.reason, self.rule = "expected-error", reason, rule

    def audit_refusal(self, rule, *, refused: str | None, oracle: str, what: str, **evidence) -> None:
        """Judge SGLang's answer against `rule` (a (name, reason) computed from the case before the run, None: the
        rules call the case valid). `refused`: SGLang's refusal in words, None when it served the case. Refused and
        predicted: an expected error under the rule's name; refused unpredicted, or predicted and served: a failure
        of `oracle`."""
        if refused is not None and rule is not None:
            self.expected_error(f"{rule[1]}: SGLang refused it ({refused[:160]})", rule=rule[0])
        elif refused is not None:
            raise OracleFailure(oracle, f"SGLang refused a case the rules call valid: {what}: {refused[:300]}",
                                **evidence)
        elif rule is not None:
            raise OracleFailure(oracle, f"the rules predict SGLang refuses {what} ({rule[0]}: {rule[1]}), but SGLang "
                                "served it", expected_rule=rule[0], **evidence)


def _is_final_run() -> bool:
    try:
        from hypothesis.control import current_build_context

        return bool(current_build_context().is_final)
    except Exception:
        return False


def write(record: dict) -> None:
    if _sink.path is not None:
        write_to(_sink.path, record)


def write_to(path: Path, record: dict) -> None:
    """Append one JSON line and flush it: a run killed after this line still has it."""
    with open(path, "a", encoding="utf-8") as stream:
        stream.write(json.dumps(record, default=repr) + "\n")
        stream.flush()


def read_records(path: Path) -> list[dict]:
    """The records `write_to` appended to `path`, in order; none when the file does not exist."""
    path = Path(path)
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line] \
        if path.exists() else []


@contextlib.contextmanager
def example(suite: str, **drawn):
    """Wrap one example: yields an `Example`; on exit writes its record, then lets any exception through."""
    ex = Example(suite, drawn)
    started = time.perf_counter()
    record = {"suite": suite, "test": os.environ.get("PYTEST_CURRENT_TEST", "").rsplit(" ", 1)[0],
              "drawn": jsonable(drawn)}
    try:
        with _guarded(record), capture_legality.checking(ex), stream_order.checking(ex), \
                batch_consistency.checking(ex), observed.observing(ex.behaviour):
            yield ex
    except OracleFailure as failure:
        record.update(verdict="fail", oracle=failure.oracle, diagnosis=failure.diagnosis,
                      details=jsonable(failure.details))
        setattr(failure, _RECORD, record)
        raise
    except Exception as error:  # a crash of the target: recorded with its traceback, then re-raised
        record.update(verdict="error", oracle="crash", diagnosis=f"{type(error).__name__}: {error}"[:2000],
                      details={"traceback": traceback.format_exc(limit=12)[-4000:]})
        setattr(error, _RECORD, record)
        raise
    except BaseException as other:  # pytest.skip, Hypothesis control flow
        if type(other).__name__ == "Skipped":
            record.update(verdict="skip", diagnosis=str(other))
        else:
            record = {}
        raise
    else:
        record.update(verdict=ex.verdict, diagnosis=ex.reason)
        if ex.rule is not None:
            record["expected_rule"] = ex.rule
    finally:
        if record:
            record.update(notes=jsonable(ex.notes), behaviour=jsonable(ex.behaviour),
                          seconds=round(time.perf_counter() - started, 4), final=_is_final_run(), ts=time.time(),
                          **_sink.context)
            if "personality" in drawn:  # the one the example ran under (a suite may fix it, whatever the run's)
                record["personality"] = drawn["personality"]
            write(record)


_RECORD = "harness_record"


def record_of(error: BaseException) -> dict:
    """The record of the failing example that raised `error` (the first such one in an exception group): what
    Hypothesis re-raises is the final, shrunk example's exception. {} when no example raised it."""
    found = getattr(error, _RECORD, None)
    if found is not None:
        return found
    for inner in getattr(error, "exceptions", ()):
        found = record_of(inner)
        if found:
            return found
    return {}
