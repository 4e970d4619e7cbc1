"""The pre-merge gate (`python -m harness gate TREE`): the gate profile of the suites against a pull request's
SGLang tree, imported ahead of the installed release. `--base TREE` runs the same drawn examples on the base too and
reports what behaves differently (`behaviour`); `--select DIR` runs only the tests whose recorded coverage touches
the changed lines (`select`)."""
from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

from harness.errors import writable
from harness.mutants import REPO_ROOT
from harness.source_tree import source_root


@dataclasses.dataclass
class Request:
    tree: str
    device: str = "cpu"
    report_dir: Path = Path("reports/gate")
    base: str | None = None  # a base tree: compare behaviour, and the changed lines for --select
    no_behaviour_change: bool = False
    select: Path | None = None  # the base campaign's report dir (line_tests.json), built there when missing
    rtol: float = 1e-4
    suites: list[str] = dataclasses.field(default_factory=lambda: ["suites"])  # what a full gate runs
    extra: tuple[str, ...] = ()


def _run(root: Path, args: list[str], report_dir: Path, extra: tuple[str, ...]) -> int:
    """The gate profile of `args` (suites or test items) with `root`'s sglang first on the path, into `report_dir`."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(root), str(REPO_ROOT), os.environ.get("PYTHONPATH", "")]))
    command = [sys.executable, "-m", "pytest", *args, "--profile=gate", f"--report-dir={report_dir}",
               f"--junitxml={report_dir / 'junit.xml'}", "-q", "-rfEs", *extra]
    print(f"[harness] gate on {root / 'sglang'}: {' '.join(command[3:])}", flush=True)
    return subprocess.run(command, cwd=REPO_ROOT, env=env).returncode


def _writable(report_dir: Path) -> Path:
    return writable(report_dir, "the report folder")


def _selection(request: Request, head: Path) -> list[str]:
    """The pytest arguments of a selected gate (printing what was chosen and why, and what no test executes)."""
    from harness.gate.changes import tree_changes
    from harness.gate.select import select
    from harness.mutate.reach import ensure_campaign, line_map
    from harness.versions import require_sglang

    base_root = source_root(request.base) if request.base else None
    base_sglang = base_root / "sglang" if base_root else Path(require_sglang())
    changes = tree_changes(base_sglang, head / "sglang")
    _writable(request.select)
    ensure_campaign(request.select, base_sglang, base_root)
    found, why = line_map(request.select, base_sglang)
    if found is None:
        print(f"[harness] gate --select: {why}; every suite of a changed targeted file runs whole")
    chosen = select(changes, found, base_sglang)
    print(f"[harness] gate --select: {len(changes)} changed file(s), {len(chosen.untargeted)} not targeted; "
          f"{len(chosen.items)} test item(s) and {len(chosen.suites)} whole suite(s) chosen")
    for name, reason in chosen.why.items():
        print(f"  {name}  <- {reason}")
    for file, lines in chosen.unexecuted.items():
        print(f"  changed statements no test executed: {file}: {', '.join(map(str, lines))}")
    return chosen.args


def run_gate(request: Request) -> int:
    """Exit status: the pull request's gate (non-zero on any failure), or 1 for a behaviour change under
    `no_behaviour_change`; HarnessError for bad input (the caller prints it, exit 2)."""
    head = source_root(request.tree)
    base = source_root(request.base) if request.base else None
    report_dir = _writable(Path(request.report_dir))
    args = _selection(request, head) if request.select else list(request.suites)
    if not args:
        print("[harness] gate --select: no test executes the changed lines; nothing to run")
        return 0
    code = _run(head, args, report_dir, request.extra)
    if base is not None:
        code = max(code, _behaviour(request, base, args, report_dir))
    print(f"[harness] gate {'passed' if code == 0 else 'FAILED'} for {request.tree}; JUnit XML: "
          f"{report_dir.resolve() / 'junit.xml'}")
    return code


def _behaviour(request: Request, base: Path, args: list[str], report_dir: Path) -> int:
    """Run the same examples on `base` (into REPORT_DIR/base), compare, write the table; 1 for a change when the
    request forbids one."""
    from harness.gate import behaviour
    from reports.html import render
    from reports.summary import load

    base_dir = _writable(report_dir / "base")
    base_code = _run(base, args, base_dir, request.extra)
    if base_code not in (0, 1):
        print(f"[harness] gate --base: the base run ended with exit {base_code}; compared what it recorded")
    differences, compared = behaviour.compare(load(base_dir, "examples"), load(report_dir, "examples"), request.rtol)
    behaviour.write(report_dir, differences, compared, request.rtol, request.no_behaviour_change)
    head_examples = load(report_dir, "examples")
    if head_examples:
        render(report_dir, head_examples[0]["run_id"])
    print(behaviour.table(differences, compared, request.rtol))
    return 1 if differences and request.no_behaviour_change else 0
