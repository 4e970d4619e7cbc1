"""Which lines of SGLang's targeted files the gate campaign executed: the coverage data its `--sglang-coverage`
run leaves in REPORT_DIR/.sglang-coverage (see harness/sglang_coverage.py). A mutant on a line no suite ever
runs cannot be killed, so it is reported as unreached without spending a run on it. The campaign's line map
(REPORT_DIR/line_tests.json) says which test items executed each line, and how long each took: the fast mode
runs only those."""
from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path
from collections.abc import Iterable

from harness.errors import HarnessError
from harness.record import read_records
from harness.mutants import REPO_ROOT
from harness.sglang_coverage import LINE_TESTS, LINE_TESTS_FORMAT, harness_commit, package_version, targets_digest

DATA = ".sglang-coverage"


def campaign_sglang(report_dir: Path) -> str | None:
    """The sglang directory a campaign in `report_dir` ran against (None: no campaign with coverage there)."""
    if not (report_dir / DATA).exists():
        return None
    for path in sorted(report_dir.glob("examples*.jsonl")):
        for row in read_records(path)[:1]:
            return row.get("sglang_path")
    return None


def ensure_campaign(report_dir: Path, sglang_dir: Path, sglang_root: Path | None) -> None:
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


@dataclasses.dataclass
class LineMap:
    """The campaign's `file -> line -> [nodeid]` map and each item's seconds (see SGLangCoverage.write_line_tests).
    A line present with no items ran outside every item (at import or collection)."""
    files: dict[str, dict[str, list[str]]]
    durations: dict[str, float]

    def tests(self, file: str, lines: Iterable[int]) -> list[str] | None:
        """The items that executed any of `lines` of `file`, fastest first; [] when only code outside every item
        did (an import: the fastest item of the file's tests is enough to show a crash); None when nothing did."""
        by_line = self.files.get(file, {})
        hits = [by_line[str(line)] for line in lines if str(line) in by_line]
        if not hits:
            return None
        found = {nodeid for items in hits for nodeid in items}
        return sorted(found, key=lambda n: (self.durations.get(n, float("inf")), n))

    def fastest_of(self, file: str) -> list[str]:
        """The fastest item that executed anything in `file` (for a line reached only at import)."""
        found = {n for items in self.files.get(file, {}).values() for n in items}
        return sorted(found, key=lambda n: (self.durations.get(n, float("inf")), n))[:1]


def line_map(report_dir: Path, sglang_dir: Path) -> tuple[LineMap | None, str]:
    """The campaign's line map and '' when it fits `sglang_dir` and this harness; else None and why not (missing,
    another format, another SGLang path, release or text of the targeted files, another harness commit)."""
    path = report_dir / LINE_TESTS
    if not path.exists():
        return None, f"no line map ({LINE_TESTS}) in {report_dir}: its campaign predates per-test coverage"
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as error:
        return None, f"{path} is unreadable ({error})"
    if not isinstance(data, dict) or data.get("format") != LINE_TESTS_FORMAT:
        return None, f"{path} has another format than {LINE_TESTS_FORMAT}"
    if Path(str(data.get("sglang_path"))).resolve() != Path(sglang_dir).resolve():
        return None, f"the line map in {path} is of the SGLang at {data.get('sglang_path')}, not {sglang_dir}"
    now = {"sglang": package_version(sglang_dir),
           "targets_digest": targets_digest(sglang_dir), "harness_commit": harness_commit()}
    for key, value in now.items():
        if data.get(key) != value:
            return None, f"the line map in {path} is stale: its {key} is {data.get(key)!r}, now {value!r}"
    return LineMap(data["files"], data.get("durations", {})), ""
