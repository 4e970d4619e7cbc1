"""Judge one mutant: apply it to a scratch copy of SGLang (never the installed package) and run, in a fresh process
with `-x`, either the test items the campaign's line map says execute its line, fastest first (fast mode), or the
gate profile of each suite that drives its file (thorough); read the verdict from the run's failures.jsonl: killed
(with the oracle, diagnosis and test that fired), survived, or timed out."""
from __future__ import annotations

import shutil
import time
from pathlib import Path
from collections.abc import Sequence

from harness.errors import HarnessError
from harness.mutants import device_args, run_pytest, scratch_sglang
from harness.mutate.operators import Mutant
from harness.record import read_records
from harness.registry import Suite

KILLED, SURVIVED, TIMED_OUT, UNREACHED = "killed", "survived", "timed out", "unreached"
FAST, THOROUGH = "fast", "thorough"
USAGE_ERROR = 4  # pytest's exit status for a node id it cannot find
COLLECTION_ERROR = "ERROR collecting"  # ... also when the module holding it fails to import


def record(mutant: Mutant, verdict: str, **fields) -> dict:
    """The JSONL line of one judged mutant."""
    return {"id": mutant.id, "file": mutant.file, "function": mutant.function, "line": mutant.line,
            "operator": mutant.operator, "original": mutant.original, "mutated": mutant.mutated,
            "verdict": verdict, **fields}


def _crash_line(output: str) -> str:
    """What a run that failed without a failure record printed last (a collection error, a crash)."""
    lines = [line for line in output.strip().splitlines() if line.strip()]
    errors = [line for line in lines if "Error" in line or "error" in line]
    return (errors or lines or ["no output"])[-1][:300]


def _run(mutant: Mutant, root: Path, paths: Sequence[str], report_dir: Path, timeout: float,
         python: str | None, warm=None) -> tuple[str | None, dict]:
    """One pytest run of `paths` with `-x` on the mutated copy at `root`: (verdict or None if it passed, fields);
    `warm`: a `warm.WarmWorker` to fork the run from (default: a fresh interpreter)."""
    shutil.rmtree(report_dir, ignore_errors=True)  # a rerun after a killed run reads only its own records
    args = [*paths, "-x", "-q", "--profile=gate", "--report-dir", str(report_dir), *device_args()]
    if warm is not None:
        code, output = warm.run(args, sglang_root=root, timeout=timeout, mutant=mutant.id,
                                output=report_dir.parent / f"{report_dir.name}.out")
    else:
        code, output = run_pytest(args, sglang_root=root, mutant=mutant.id, timeout=timeout, python=python)
    if code == 124:
        return TIMED_OUT, {}
    failures = read_records(report_dir / "failures.jsonl")
    if failures:
        first = failures[0]
        return KILLED, {"test": first.get("test"), "oracle": first.get("oracle"),
                        "diagnosis": str(first.get("diagnosis"))[:500]}
    if code == USAGE_ERROR and COLLECTION_ERROR not in output:
        raise HarnessError(f"pytest refused the tests of mutant {mutant.id} ({_crash_line(output)}): the line map "
                           "names tests this harness lacks; rerun the gate campaign into a fresh --report-dir")
    if code != 0:  # a crash, or SGLang no longer imports (pytest exits 4 when the module of a named item fails)
        return KILLED, {"oracle": "crash", "diagnosis": _crash_line(output)}
    return None, {}


def judge(mutant: Mutant, text: str, sglang_dir: Path, suites: tuple[Suite, ...], work: Path,
          timeout: float, python: str | None = None, warm=None) -> dict:
    """Thorough: run the suites on `mutant` applied to `text` (its file's text in `sglang_dir`); its record."""
    started = time.monotonic()
    root = scratch_sglang([(mutant.file, text, mutant.apply(text))], base=str(sglang_dir))
    for suite in suites:
        verdict, fields = _run(mutant, root, suite.paths, work / mutant.id / suite.name, timeout, python, warm)
        if verdict:
            return record(mutant, verdict, mode=THOROUGH, suite=suite.name, **fields,
                          seconds=round(time.monotonic() - started, 1))
    return record(mutant, SURVIVED, mode=THOROUGH, suite=",".join(s.name for s in suites),
                  seconds=round(time.monotonic() - started, 1))


def judge_tests(mutant: Mutant, text: str, sglang_dir: Path, tests: Sequence[str], work: Path,
                timeout: float, python: str | None = None, warm=None) -> dict:
    """Fast: run only `tests` (the items that execute the mutated line, fastest first) in one process, stopping at
    the first kill; the record names the items given, those that ran and the one that killed it."""
    started = time.monotonic()
    root = scratch_sglang([(mutant.file, text, mutant.apply(text))], base=str(sglang_dir))
    verdict, fields = _run(mutant, root, tests, work / mutant.id / FAST, timeout, python, warm)
    killer = fields.get("test")
    ran = list(tests[: tests.index(killer) + 1]) if killer in tests else list(tests)
    return record(mutant, verdict or SURVIVED, mode=FAST, tests=list(tests), ran=len(ran), **fields,
                  seconds=round(time.monotonic() - started, 1))
