"""The prefill suite on every SGLang release environment under .venvs/ (and the default .venv): pass/fail, the
first failing oracle with its diagnosis, the time, and whether that matches the release history of known bug 2
(MIXED is normalised before the piecewise replay from 0.5.10: 0.5.9 must fail, later releases pass).

    python bench/bench_releases.py [--suite suites/test_prefill_pcg.py] [--only 0.5.9 0.5.10] [--out FILE.json]
                                   [-- extra pytest args]

Each release runs in a fresh process with its own environment's Python (`<env>/bin/python -m pytest ...`), the
gate profile (seed 0 unless --hypothesis-seed is passed through).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from harness.record import read_records  # noqa: E402

SUITE = "suites/test_prefill_pcg.py"
BUG2_ORACLES = ("no-recompile", "capture-stream", "graph-replay")
FIXED_IN = (0, 5, 10)  # first release that maps MIXED to EXTEND before the piecewise replay (SGLang PR #20441)


def environments() -> list[tuple[str, Path]]:
    """(label, python) for .venv and every .venvs/<name>/ that has a Python."""
    found = []
    default = REPO / ".venv" / "bin" / "python"
    if default.exists():
        found.append((".venv", default))
    for env in sorted((REPO / ".venvs").glob("*")):
        python = env / "bin" / "python"
        if python.exists():
            found.append((env.name, python))
    return found


def sglang_version(python: Path) -> str | None:
    done = subprocess.run([str(python), "-c", "import importlib.metadata as m; print(m.version('sglang'))"],
                          capture_output=True, text=True, timeout=120)
    return done.stdout.strip() or None if done.returncode == 0 else None


def _version_tuple(version: str) -> tuple[int, ...]:
    return tuple(int(n) for n in re.findall(r"\d+", version)[:3])


def expected(version: str) -> str:
    """'fail' where known bug 2 is in the release, 'pass' where it is fixed."""
    return "fail" if _version_tuple(version) < FIXED_IN else "pass"


def run_release(python: Path, *, suite: str = SUITE, extra: tuple[str, ...] = (), timeout: float = 1800,
                report_dir: Path | None = None) -> dict:
    """Run `suite` with `python` in a fresh process; the verdict, the first failure record and the time."""
    report_dir = report_dir or Path(tempfile.mkdtemp(prefix="bench-release-"))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]).rstrip(
        os.pathsep))
    for name in ("PYTEST_XDIST_WORKER", "PYTEST_CURRENT_TEST", "HARNESS_CONDITIONS", "HARNESS_MUTANT",
                 "HARNESS_RUN_ID", "HARNESS_SEED"):
        env.pop(name, None)
    command = [str(python), "-m", "pytest", "-p", "no:cacheprovider", suite, "-q", "-rs",
               "--report-dir", str(report_dir), *extra]
    started = time.time()
    try:
        done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout)
        code, output = done.returncode, done.stdout + done.stderr
    except subprocess.TimeoutExpired:
        code, output = 124, f"timed out after {timeout} s"
    wall = time.time() - started
    failures = read_records(report_dir / "failures.jsonl")
    counts = re.findall(r"^(?:=+ )?(\d+ (?:passed|failed|skipped|xfailed|xpassed|error)[^\n=]*)", output, re.M)
    first = failures[0] if failures else {}
    return {"exit": code, "verdict": "pass" if code == 0 else "fail", "wall_s": round(wall, 1),
            "counts": counts[-1].strip() if counts else output.strip().splitlines()[-1:] or "",
            "first_test": first.get("test"), "first_oracle": first.get("oracle"),
            "first_diagnosis": (first.get("diagnosis") or "")[:300], "first_drawn": first.get("drawn"),
            "failures": [{"test": f.get("test"), "oracle": f.get("oracle"), "drawn": f.get("drawn"),
                          "diagnosis": (f.get("diagnosis") or "")[:300]} for f in failures],
            "report_dir": str(report_dir), "command": " ".join(command)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--suite", default=SUITE)
    parser.add_argument("--only", nargs="*", help="SGLang versions to run (default: every environment)")
    parser.add_argument("--out", help="also write the rows as JSON here")
    args, extra = parser.parse_known_args(argv)
    extra = [a for a in extra if a != "--"]
    rows = []
    print(f"{'env':<16}{'sglang':<10}{'expect':<8}{'got':<6}{'wall s':>8}  first failing oracle / counts")
    for label, python in environments():
        version = sglang_version(python)
        if version is None or (args.only and version not in args.only):
            continue
        row = {"env": label, "sglang": version, "expected": expected(version),
               **run_release(python, suite=args.suite, extra=tuple(extra))}
        row["as_expected"] = row["verdict"] == row["expected"] and (
            row["verdict"] == "pass" or row["first_oracle"] in BUG2_ORACLES)
        rows.append(row)
        detail = (f"[{row['first_oracle']}] {row['first_diagnosis'][:110]}" if row["first_oracle"]
                  else row["counts"])
        mark = "" if row["as_expected"] else "  <-- UNEXPECTED"
        print(f"{label:<16}{version:<10}{row['expected']:<8}{row['verdict']:<6}{row['wall_s']:>8.1f}  "
              f"{detail}{mark}", flush=True)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(rows, indent=2, default=repr))
    return 0 if rows and all(r["as_expected"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
