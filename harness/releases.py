"""SGLang release environments: one virtualenv per release, built by harness.sh from
requirements/sglang-<version>.txt, and a suite run there in a fresh process. Shared by the release self-tests
and bench/bench_releases.py.

The environments live in $HARNESS_RELEASE_ENVS/sglang-<version> (CI points it at a cache outside the clone),
by default REPO/.venvs/sglang-<version>.
"""
from __future__ import annotations

import os
import re
import subprocess
import tempfile
import time
from pathlib import Path

from harness.checkout import REPO_ROOT
from harness.record import read_records
from harness.versions import parse

REPO = REPO_ROOT
RELEASE_LIST = REPO / "requirements" / "releases.txt"
ENVS_VARIABLE = "HARNESS_RELEASE_ENVS"
SUITE = "suites/test_prefill_pcg.py"
BUG2_ORACLES = ("no-recompile", "capture-stream", "graph-replay")
FIXED_IN = (0, 5, 10)  # first release that maps MIXED to EXTEND before the piecewise replay (SGLang PR #20441)
# Variables a parent harness run sets that must not leak into the release's run.
_PARENT_ONLY = ("PYTEST_XDIST_WORKER", "PYTEST_CURRENT_TEST", "HARNESS_CONDITIONS", "HARNESS_MUTANT",
                "HARNESS_SEED")


def checked_releases() -> tuple[str, ...]:
    """The releases CI checks (requirements/releases.txt), oldest first, each with its pins file."""
    versions = tuple(line.strip() for line in RELEASE_LIST.read_text().splitlines()
                     if line.strip() and not line.startswith("#"))
    missing = [v for v in versions if not (REPO / "requirements" / f"sglang-{v}.txt").exists()]
    if missing:
        raise ValueError(f"{RELEASE_LIST} lists {missing} without requirements/sglang-<version>.txt")
    return tuple(sorted(versions, key=parse))


def envs_dir() -> Path:
    """The folder holding the release environments (sglang-<version>/)."""
    return Path(os.environ.get(ENVS_VARIABLE) or REPO / ".venvs")


def release_python(version: str) -> Path:
    """The Python of SGLang `version`'s environment (it may not exist)."""
    return envs_dir() / f"sglang-{version}" / "bin" / "python"


def build_command(version: str) -> str:
    """The command that builds (or reuses) SGLang `version`'s environment."""
    return (f"HARNESS_VENV={envs_dir() / f'sglang-{version}'} SGLANG_REQUIREMENTS=requirements/sglang-{version}.txt "
            "TORCH_REQUIREMENTS=none ./harness.sh targets")


def sglang_version(python: Path) -> str | None:
    """The SGLang release that interpreter `python` has installed (None: none, or it cannot say)."""
    done = subprocess.run([str(python), "-c", "import importlib.metadata as m; print(m.version('sglang'))"],
                          capture_output=True, text=True, timeout=120)
    return done.stdout.strip() or None if done.returncode == 0 else None


def expected(version: str) -> str:
    """'fail' where known bug 2 is in the release, 'pass' where it is fixed."""
    return "fail" if parse(version) < FIXED_IN else "pass"


def release_env() -> dict:
    """This process's environment for a run in a release environment: the harness importable from REPO, and
    nothing of a parent harness run (seed, run id, mutant, xdist worker)."""
    env = {name: value for name, value in os.environ.items() if name not in _PARENT_ONLY}
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return env


def run_release(python: Path, *, suite: str = SUITE, extra: tuple[str, ...] = (), timeout: float = 1800,
                report_dir: Path | None = None) -> dict:
    """Run `suite` with `python` in a fresh process; the verdict, the failure records and the time."""
    report_dir = report_dir or Path(tempfile.mkdtemp(prefix="bench-release-"))
    command = [str(python), "-m", "pytest", "-p", "no:cacheprovider", suite, "-q", "-rs",
               "--report-dir", str(report_dir), *extra]
    started = time.time()
    try:
        done = subprocess.run(command, cwd=REPO, env=release_env(), capture_output=True, text=True,
                              timeout=timeout)
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
