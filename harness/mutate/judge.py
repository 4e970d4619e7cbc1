"""Judge one mutant: apply it to a scratch copy of SGLang (never the installed package), run in a fresh process
the gate profile of each suite that drives its file, stop at the first failure (`-x`), and read the verdict from
the run's failures.jsonl: killed (with the oracle, diagnosis and test that fired), survived, or timed out."""
from __future__ import annotations

import time
from pathlib import Path
from typing import Optional

from harness.mutants import device_args, run_pytest, scratch_sglang
from harness.mutate.operators import Mutant
from harness.record import read_records
from harness.registry import Suite

KILLED, SURVIVED, TIMED_OUT, UNREACHED = "killed", "survived", "timed out", "unreached"


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


def judge(mutant: Mutant, text: str, sglang_dir: Path, suites: tuple[Suite, ...], work: Path,
          timeout: float, python: Optional[str] = None) -> dict:
    """Run the suites on `mutant` applied to `text` (its file's text in `sglang_dir`); the mutant's record."""
    started = time.monotonic()
    root = scratch_sglang([(mutant.file, text, mutant.apply(text))], base=str(sglang_dir))
    for suite in suites:
        report_dir = work / mutant.id / suite.name
        code, output = run_pytest([*suite.paths, "-x", "-q", "--profile=gate", "--report-dir", str(report_dir),
                                   *device_args()],
                                  sglang_root=root, mutant=mutant.id, timeout=timeout, python=python)
        seconds = round(time.monotonic() - started, 1)
        if code == 124:
            return record(mutant, TIMED_OUT, suite=suite.name, seconds=seconds)
        failures = read_records(report_dir / "failures.jsonl")
        if failures:
            first = failures[0]
            return record(mutant, KILLED, suite=suite.name, test=first.get("test"), oracle=first.get("oracle"),
                          diagnosis=str(first.get("diagnosis"))[:500], seconds=seconds)
        if code != 0:
            return record(mutant, KILLED, suite=suite.name, oracle="crash", diagnosis=_crash_line(output),
                          seconds=seconds)
    return record(mutant, SURVIVED, suite=",".join(s.name for s in suites),
                  seconds=round(time.monotonic() - started, 1))
