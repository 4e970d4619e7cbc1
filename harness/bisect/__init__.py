"""`python -m harness bisect`: the first commit of a user's SGLang checkout where a failure appears.

Each step exports one commit's sglang package (`checkout`), imports it ahead of the installed release as `gate`
does, and runs the failing test in the gate profile (or the standalone script `repro` wrote) in the chosen
environment (`--python`): the import check and the test in a child forked from one warm parent
(`harness.mutate.warm`, which never imports sglang), so a step pays its own SGLang import, not torch's; the script
in a fresh process. A commit whose tree cannot be imported, or where the test only skips, is
skipped as `git bisect skip` would. The good revision must pass and the bad one fail, or nothing is named.
"""
from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from collections.abc import Callable, Sequence

from harness.bisect.checkout import Checkout, Commit
from harness.errors import HarnessError
from harness.mutants import REPO_ROOT, device_args
from harness.mutate.warm import WarmWorker
from harness.record import read_records, write_to

GOOD, BAD, SKIP = "good", "bad", "skip"


@dataclasses.dataclass(frozen=True)
class Step:
    commit: Commit
    verdict: str
    seconds: float
    why: str  # the oracle and diagnosis of a bad step, the reason of a skipped one

    def line(self) -> str:
        return f"{self.verdict:<5} {self.seconds:7.1f} s  {self.commit}" + (f"\n        {self.why}" if self.why else "")


@dataclasses.dataclass(frozen=True)
class Request:
    tree: str
    good: str
    bad: str
    test: str | None  # a pytest node id in the harness (or None with `repro`)
    repro: str | None  # a standalone script `python -m harness repro` wrote
    python: str
    report_dir: Path
    timeout: float
    extra: Sequence[str] = ()  # more pytest options (e.g. --personality npu)


def _last_error(output: str) -> str:
    lines = [line for line in output.strip().splitlines() if line.strip()]
    return next((line for line in reversed(lines) if "Error" in line), lines[-1] if lines else "no output")[:300]


def _imports(warm: WarmWorker, root: Path, work: Path) -> str | None:
    """None when `import sglang` works from `root` in the warm worker's environment, else why it does not."""
    code, output = warm.run([], sglang_root=root, timeout=300, mutant="", output=work / "import.txt",
                            import_only=True)
    return None if code == 0 else _last_error(output)


def _env(root: Path) -> dict:
    return dict(os.environ, PYTHONPATH=os.pathsep.join([str(root), str(REPO_ROOT)]))


def run_test(request: Request, root: Path, work: Path, warm: WarmWorker) -> tuple[str, str]:
    """(verdict, why) of the test or the repro script on the tree whose `sglang` is in `root`."""
    if request.repro:
        try:
            done = subprocess.run([request.python, request.repro], capture_output=True, text=True, cwd=REPO_ROOT,
                                  env=_env(root), timeout=request.timeout)
        except subprocess.TimeoutExpired:
            return SKIP, f"the repro script ran past {request.timeout:.0f} s"
        output = done.stdout + done.stderr
        if done.returncode == 0:
            return GOOD, ""
        reproduced = [line for line in output.splitlines() if line.startswith("reproduced:")]
        return (BAD, reproduced[0][:300]) if reproduced else (SKIP, f"the script crashed: {_last_error(output)}")
    code, output = warm.run([request.test, "-q", "-x", "-rs", "--profile=gate", "--report-dir", str(work),
                             *device_args(), *request.extra], sglang_root=root, timeout=request.timeout,
                            mutant="", output=work / "pytest-output.txt")
    failures = read_records(work / "failures.jsonl")
    if failures:
        first = failures[0]
        return BAD, f"[{first.get('oracle')}] {str(first.get('diagnosis'))[:300]}"
    if code == 124:
        return SKIP, f"the test ran past {request.timeout:.0f} s"
    if code == 0 and " passed" in output:
        return GOOD, ""
    if code == 0 or code == 5:
        return SKIP, f"the test ran nothing here (skipped or not collected): {_last_error(output)}"
    if code == 1:
        return BAD, f"failed without a failure record: {_last_error(output)}"
    return SKIP, f"pytest exited {code} (collection error): {_last_error(output)}"


def step(checkout: Checkout, commit: Commit, request: Request, warm: WarmWorker) -> Step:
    """Export `commit` to a folder of ours, judge it there (in a child of the warm parent), remove the folder."""
    started = time.monotonic()
    work = Path(tempfile.mkdtemp(prefix=f"bisect-{commit.hash[:10]}-"))
    try:
        root = checkout.export(commit, work / "tree")
        if root is None:
            verdict, why = SKIP, "no sglang package in this commit (neither python/sglang nor sglang)"
        elif (broken := _imports(warm, root, work)) is not None:
            verdict, why = SKIP, f"its sglang does not import: {broken}"
        else:
            verdict, why = run_test(request, root, work / "report", warm)
            shutil.rmtree(request.report_dir / commit.hash[:10], ignore_errors=True)
            if (work / "report").exists():
                shutil.copytree(work / "report", request.report_dir / commit.hash[:10])
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return Step(commit, verdict, round(time.monotonic() - started, 1), why)


def search(commits: list[Commit], judge: Callable[[Commit], Step]) -> tuple[list[Commit], list[Step]]:
    """Binary search over `commits` (oldest first; the last is the bad one, the one before the first is good):
    the candidates for the first bad commit (one, unless skipped commits leave several) and the steps taken."""
    steps, skipped = [], set()
    low, high = -1, len(commits) - 1  # commits[low] good (-1: the good revision), commits[high] bad
    while high - low > 1:
        testable = [i for i in range(low + 1, high) if i not in skipped]
        if not testable:
            break
        middle = (low + high) // 2
        pick = min(testable, key=lambda i: (abs(i - middle), i))
        done = judge(commits[pick])
        steps.append(done)
        if done.verdict == GOOD:
            low = pick
        elif done.verdict == BAD:
            high = pick
        else:
            skipped.add(pick)
    return commits[low + 1:high + 1], steps


def bisect(request: Request) -> tuple[list[Commit], list[Step]]:
    """Check the two ends, then search between them; every step is printed and written to bisect.jsonl."""
    checkout = Checkout(request.tree)
    good, bad = checkout.commit(request.good), checkout.commit(request.bad)
    commits = checkout.between(good, bad)
    request.report_dir.mkdir(parents=True, exist_ok=True)
    out = request.report_dir / "bisect.jsonl"
    out.unlink(missing_ok=True)
    print(f"[bisect] {len(commits)} commits after good {good} up to bad {bad.hash[:10]}; "
          f"about {max(1, len(commits)).bit_length()} steps besides the two ends")

    warm = WarmWorker(python=request.python)  # torch, pytest and SGLang's dependencies imported once, not a step
    try:
        return _bisect(checkout, good, bad, commits, request, out, warm)
    finally:
        warm.close()


def _bisect(checkout: Checkout, good: Commit, bad: Commit, commits: list[Commit], request: Request, out: Path,
            warm: WarmWorker) -> tuple[list[Commit], list[Step]]:
    def judged(commit: Commit) -> Step:
        done = step(checkout, commit, request, warm)
        write_to(out, {**dataclasses.asdict(done.commit), "verdict": done.verdict, "seconds": done.seconds,
                       "why": done.why})
        print(f"[bisect] {done.line()}", flush=True)
        return done

    ends = [judged(good)]
    if ends[0].verdict != GOOD:
        raise HarnessError(f"the good revision {good} does not pass ({ends[0].verdict}: {ends[0].why}); give a "
                           "revision where the test passes")
    ends.append(judged(bad))
    if ends[1].verdict != BAD:
        raise HarnessError(f"the bad revision {bad} does not fail ({ends[1].verdict}: {ends[1].why or 'it passes'})"
                           "; give a revision where the test fails")
    candidates, steps = search(commits, judged)
    return candidates, ends + steps
