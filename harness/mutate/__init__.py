"""`python -m harness mutate`: which lines of SGLang's targeted code no check guards.

Mutants of the registry's targeted functions (`operators`, `targets`) are drawn with a seed, or given as text edits
(`--edits`, `edits`); one on a line the gate campaign never executed is unreached (`reach`). Each other one is
applied to a scratch copy of SGLang and judged (`judge`), K at a time: by default (fast, as PIT does) only the test
items the campaign's line map says execute its line, fastest first, stopping at the first kill; with `--thorough`
(or when the map is missing or stale, which is said) by every suite that drives its file. Records go to
REPORT_DIR/mutants.jsonl as they finish, so a killed run keeps what it did and a rerun with the same seed and mode
skips what is judged already. Each run is forked from a warm parent per worker (`warm`; `--cold`: a fresh
interpreter per run).
"""
from __future__ import annotations

import concurrent.futures
import contextlib
import dataclasses
import json
import queue
import threading
import time
from pathlib import Path
from collections.abc import Sequence

from harness import record as records
from harness.mutate import edits as given_edits, reach, report, warm as warm_runs
from harness.mutate.judge import FAST, THOROUGH, UNREACHED, judge, judge_tests, record
from harness.mutate.targets import mutants, narrow, sample, targeted_functions
from harness.registry import SUITES

RECORDS = "mutants.jsonl"


@dataclasses.dataclass
class Request:
    sglang_dir: Path  # the sglang package mutated (installed, or a tree's)
    sglang_root: Path | None  # the folder holding a tree's sglang (None: the installed release)
    report_dir: Path
    count: int | None
    seed: int
    functions: Sequence[str]
    workers: int
    budget: float | None
    timeout: float
    thorough: bool = False  # every suite that drives the file, not only the items reaching the line
    edits: Path | None = None  # a JSON list of {"file", "old", "new"} judged instead of drawn mutants
    warm: bool = True  # fork each run from a warm parent (`warm`) instead of starting a fresh interpreter


def judged_before(path: Path) -> list[dict]:
    """The records of an earlier run (a torn last line of a killed run is dropped: that mutant runs again)."""
    rows = []
    for line in path.read_text(encoding="utf-8").splitlines() if path.exists() else []:
        try:
            rows.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return rows


def _draw(request: Request) -> tuple[list, dict[str, str], dict[str, tuple], str]:
    """(mutants, file -> text, file -> the suites that drive it, what was judged): drawn, or the given edits (whose
    thorough judge is the gate: the suites owning the file first, then every other)."""
    if request.edits is not None:
        drawn = given_edits.load(request.edits, request.sglang_dir)
        texts = {m.file: (request.sglang_dir / m.file).read_text(encoding="utf-8") for m in drawn}
        suites = {}
        for file in texts:
            owners = tuple(s for s in SUITES if any(e.split("::")[0] == file for e in s.coverage))
            suites[file] = owners + tuple(s for s in SUITES if s not in owners)
        return drawn, texts, suites, f"{len(drawn)} edits from {request.edits}"
    found = narrow(targeted_functions(request.sglang_dir), request.functions)
    drawn = sample(mutants(found), {t.file: t.text for t in found}, request.count, request.seed)
    return (drawn, {t.file: t.text for t in found}, {t.file: t.suites for t in found},
            f"{len(drawn)} mutants drawn (seed {request.seed}) of {len(found)} functions")


def _lines(mutant) -> tuple[int, ...]:
    """The lines whose execution reaches `mutant` (a given edit may span several)."""
    return getattr(mutant, "lines", (mutant.line,))


def mutate(request: Request) -> list[dict]:
    """Judge the mutants not judged yet in this mode (records written line by line); every record of this draw."""
    drawn, texts, suites, what = _draw(request)
    out = request.report_dir / RECORDS
    request.report_dir.mkdir(parents=True, exist_ok=True)
    mode, why = (THOROUGH, "--thorough") if request.thorough else (FAST, "")
    line_map = None
    if mode == FAST and not (request.report_dir / reach.DATA).exists():
        reach.ensure_campaign(request.report_dir, request.sglang_dir, request.sglang_root)  # it writes the map
    if mode == FAST:
        line_map, problem = reach.line_map(request.report_dir, request.sglang_dir)
        if line_map is None:
            mode, why = THOROUGH, f"fallback: {problem}"
            print(f"[mutate] {problem}: falling back to --thorough (every suite that drives the file); a gate "
                  "campaign into a fresh --report-dir builds a fresh map")
    done = {row["id"]: row for row in judged_before(out) if row.get("mode", THOROUGH) == mode}
    todo = [m for m in drawn if m.id not in done]
    print(f"[mutate] {what}; mode {mode}{f' ({why})' if why else ''}; {len(drawn) - len(todo)} judged before, "
          f"{len(todo)} to judge")
    if todo and mode == THOROUGH:
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

    runnable = []  # (mutant, the items to run, fastest first; None: the suites)
    for mutant in todo:
        if mode == FAST:
            tests = line_map.tests(mutant.file, _lines(mutant))
            if tests == []:  # reached only outside every item (at import): any item of the file shows a crash
                tests = line_map.fastest_of(mutant.file)
            if tests:
                runnable.append((mutant, tests))
            elif mutant.file not in line_map.files and request.edits is not None:
                runnable.append((mutant, None))  # a file the campaign does not measure: the gate decides
            else:
                keep(record(mutant, UNREACHED, mode=mode, tests=[]))
        elif any(line in executed.get(mutant.file, ()) for line in _lines(mutant)):
            runnable.append((mutant, None))
        else:
            keep(record(mutant, UNREACHED, mode=mode))
    started = time.monotonic()
    work = request.report_dir / "mutants"
    with _warm_workers(request.warm and bool(runnable), max(1, request.workers)) as warm, \
            concurrent.futures.ThreadPoolExecutor(max(1, request.workers)) as pool:
        pending = set()
        for mutant, tests in runnable:
            if request.budget is not None and time.monotonic() - started > request.budget:
                print(f"[mutate] budget of {request.budget:.0f} s spent: the rest waits for a rerun")
                break
            while len(pending) >= max(1, request.workers):
                finished, pending = concurrent.futures.wait(pending, return_when=concurrent.futures.FIRST_COMPLETED)
                for future in finished:
                    keep(future.result())
            if tests is None:
                pending.add(pool.submit(_with_worker, warm, _thorough, mutant, texts[mutant.file], request,
                                        suites[mutant.file], work, mode))
            else:
                pending.add(pool.submit(_with_worker, warm, judge_tests, mutant, texts[mutant.file],
                                        request.sglang_dir, tests, work, request.timeout))
        for future in concurrent.futures.as_completed(pending):
            keep(future.result())
    judged = [done[m.id] for m in drawn if m.id in done]
    text = report.summary(judged, mode, why)
    (request.report_dir / "mutate.md").write_text(f"# Mutants ({what})\n\n```\n{text}\n```\n")
    print(text)
    return judged


@contextlib.contextmanager
def _warm_workers(wanted: bool, count: int):
    """A queue of `count` warm parents (None when not wanted), closed at the end."""
    if not wanted:
        yield None
        return
    workers = queue.Queue()
    started = []
    try:
        with concurrent.futures.ThreadPoolExecutor(count) as pool:  # each parent's imports take seconds: at once
            for future in [pool.submit(warm_runs.WarmWorker) for _ in range(count)]:
                started.append(future.result())
                workers.put(started[-1])
        yield workers
    finally:
        for worker in started:
            worker.close()


def _with_worker(workers, judging, *args, **kwargs) -> dict:
    """`judging(*args)` with a warm parent taken from `workers` for its run (a fresh interpreter when None)."""
    if workers is None:
        return judging(*args, **kwargs)
    worker = workers.get()
    try:
        row = judging(*args, **kwargs, warm=worker)
        row["warm"] = True
        return row
    finally:
        workers.put(worker)


def _thorough(mutant, text: str, request: Request, suites: tuple, work: Path, mode: str, warm=None) -> dict:
    """Every suite of the file; in fast mode (a given edit of a file the map does not measure) said in the record."""
    row = judge(mutant, text, request.sglang_dir, suites, work, request.timeout, warm=warm)
    if mode == FAST:
        row.update(mode=FAST, tests=[], reach="file not in the line map: every suite ran")
    return row
