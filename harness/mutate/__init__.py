"""`python -m harness mutate`: which lines of SGLang's targeted code no check guards.

Mutants of the registry's targeted functions (`operators`, `targets`) are drawn with a seed; one on a line the
gate campaign never executed is unreached (`reach`); each other one is applied to a scratch copy of SGLang and
judged by the suites that drive its file (`judge`), K at a time. Records go to REPORT_DIR/mutants.jsonl as they
finish, so a killed run keeps what it did and a rerun with the same seed skips what is judged already.
"""
from __future__ import annotations

import concurrent.futures
import dataclasses
import json
import threading
import time
from pathlib import Path
from typing import Optional, Sequence

from harness import record as records
from harness.mutate import reach, report
from harness.mutate.judge import UNREACHED, judge, record
from harness.mutate.targets import mutants, narrow, sample, targeted_functions

RECORDS = "mutants.jsonl"


@dataclasses.dataclass
class Request:
    sglang_dir: Path  # the sglang package mutated (installed, or a tree's)
    sglang_root: Optional[Path]  # the folder holding a tree's sglang (None: the installed release)
    report_dir: Path
    count: Optional[int]
    seed: int
    functions: Sequence[str]
    workers: int
    budget: Optional[float]
    timeout: float


def judged_before(path: Path) -> list[dict]:
    """The records of an earlier run (a torn last line of a killed run is dropped: that mutant runs again)."""
    rows = []
    for line in path.read_text(encoding="utf-8").splitlines() if path.exists() else []:
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return rows


def mutate(request: Request) -> list[dict]:
    """Judge the drawn mutants not judged yet (records written line by line); every record of this draw."""
    found = narrow(targeted_functions(request.sglang_dir), request.functions)
    texts = {t.file: t.text for t in found}
    suites = {t.file: t.suites for t in found}
    drawn = sample(mutants(found), texts, request.count, request.seed)
    out = request.report_dir / RECORDS
    request.report_dir.mkdir(parents=True, exist_ok=True)
    done = {row["id"]: row for row in judged_before(out)}
    todo = [m for m in drawn if m.id not in done]
    print(f"[mutate] {len(drawn)} mutants drawn (seed {request.seed}) of {len(found)} functions; "
          f"{len(drawn) - len(todo)} judged before, {len(todo)} to judge")
    if todo:
        reach.ensure_campaign(request.report_dir, request.sglang_dir, request.sglang_root)
        executed = reach.executed(request.report_dir, request.sglang_dir)
    lock = threading.Lock()

    def keep(row: dict) -> None:
        with lock:
            records.write_to(out, row)
            done[row["id"]] = row
            judged = sum(m.id in done for m in drawn)
            print(f"[mutate] {judged}/{len(drawn)} {row['verdict']:<9} {row['file']}:{row['line']} {row['operator']}"
                  f" ({row.get('oracle') or ''} {row.get('seconds', 0)} s)", flush=True)

    runnable = []
    for mutant in todo:
        if mutant.line in executed.get(mutant.file, ()):
            runnable.append(mutant)
        else:
            keep(record(mutant, UNREACHED))
    started = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(max(1, request.workers)) as pool:
        pending = set()
        for mutant in runnable:
            if request.budget is not None and time.monotonic() - started > request.budget:
                print(f"[mutate] budget of {request.budget:.0f} s spent: the rest waits for a rerun")
                break
            while len(pending) >= max(1, request.workers):
                finished, pending = concurrent.futures.wait(pending, return_when=concurrent.futures.FIRST_COMPLETED)
                for future in finished:
                    keep(future.result())
            pending.add(pool.submit(judge, mutant, texts[mutant.file], request.sglang_dir, suites[mutant.file],
                                    request.report_dir / "mutants", request.timeout))
        for future in concurrent.futures.as_completed(pending):
            keep(future.result())
    judged = [done[m.id] for m in drawn if m.id in done]
    text = report.summary(judged)
    (request.report_dir / "mutate.md").write_text(f"# Mutants (seed {request.seed})\n\n```\n{text}\n```\n")
    print(text)
    return judged
