"""Which lines of SGLang's targeted files the gate campaign executed: the coverage data its `--sglang-coverage`
run leaves in REPORT_DIR/.sglang-coverage (see harness/sglang_coverage.py). A mutant on a line no suite ever
runs cannot be killed, so it is reported as unreached without spending a run on it."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Optional

from harness.errors import HarnessError
from harness.record import read_records
from harness.mutants import REPO_ROOT

DATA = ".sglang-coverage"


def campaign_sglang(report_dir: Path) -> Optional[str]:
    """The sglang directory a campaign in `report_dir` ran against (None: no campaign with coverage there)."""
    if not (report_dir / DATA).exists():
        return None
    for path in sorted(report_dir.glob("examples*.jsonl")):
        for row in read_records(path)[:1]:
            return row.get("sglang_path")
    return None


def ensure_campaign(report_dir: Path, sglang_dir: Path, sglang_root: Optional[Path]) -> None:
    """Run the gate campaign (coverage on) into `report_dir` unless one against `sglang_dir` is there already (one
    of another SGLang there is a usage error: its coverage says nothing of this one's lines);
    `sglang_root`: the folder holding a source tree's `sglang`, imported ahead of the installed one."""
    found = campaign_sglang(report_dir)
    if found and Path(found).resolve() == sglang_dir.resolve():
        return
    if found:
        raise HarnessError(f"{report_dir} holds a campaign of the SGLang at {found}, not {sglang_dir}: pass another "
                           "--report-dir")
    paths = ([str(sglang_root)] if sglang_root else []) + [str(REPO_ROOT), os.environ.get("PYTHONPATH", "")]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(paths).rstrip(os.pathsep))
    print(f"[mutate] no campaign coverage for {sglang_dir} in {report_dir}: running the gate campaign first")
    done = subprocess.run([sys.executable, "-m", "harness", "campaign", "--report-dir", str(report_dir)],
                          cwd=REPO_ROOT, env=env)
    if not (report_dir / DATA).exists():
        raise HarnessError(f"the gate campaign (exit {done.returncode}) left no coverage data in {report_dir}")


def executed(report_dir: Path, sglang_dir: Path) -> dict[str, set[int]]:
    """Path inside the sglang package -> the lines the campaign executed there."""
    import coverage

    data = coverage.CoverageData(basename=str(report_dir / DATA))
    data.read()
    root = sglang_dir.resolve()
    lines = {}
    for measured in data.measured_files():
        try:
            relative = Path(measured).resolve().relative_to(root).as_posix()
        except ValueError:
            continue
        lines[relative] = set(data.lines(measured) or ())
    return lines
