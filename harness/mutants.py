"""Mutants: re-introduce a bug into a scratch copy of the installed SGLang and run a suite against it.

The copy is a tree of real directories whose files are links to the installed ones, except the edited files,
which are real copies with the edit applied. An edit whose `old` text is not in the file raises, so a mutant
can never silently apply to nothing (a new SGLang release that moved the code fails loudly here).
"""
from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
from collections.abc import Iterable
from pathlib import Path

from harness.checkout import REPO_ROOT
from harness.errors import HarnessError
from harness.versions import require_sglang

Edit = tuple[str, str, str]  # (path inside the sglang package, old text, new text)
DEVICE_VARIABLE = "HARNESS_SELFTEST_DEVICE"  # the device mutant runs drive (default: the cpu virtual device)


def device_args() -> list[str]:
    """`--device NAME` for a mutant run when HARNESS_SELFTEST_DEVICE names one (the nightly GPU run sets cuda)."""
    name = os.environ.get(DEVICE_VARIABLE)
    return ["--device", name] if name else []


def _link_tree(source: Path, target: Path) -> None:
    for root, dirs, files in os.walk(source):
        dirs[:] = [d for d in dirs if d != "__pycache__"]
        relative = Path(root).relative_to(source)
        (target / relative).mkdir(parents=True, exist_ok=True)
        for name in files:
            os.symlink(Path(root) / name, target / relative / name)


def scratch_sglang(edits: Iterable[Edit], *, base: str | None = None) -> Path:
    """Return a directory holding a mutated `sglang` package (cached per edit set for this machine)."""
    edits = list(edits)
    source = Path(base or require_sglang())
    digest = hashlib.sha256(repr((str(source), edits)).encode()).hexdigest()[:16]
    root = Path(tempfile.gettempdir()) / "harness-mutants" / digest
    if (root / ".complete").exists():
        return root
    package = root / "sglang"
    if root.exists():
        subprocess.run(["rm", "-rf", str(root)], check=True)
    _link_tree(source, package)
    for relative, old, new in edits:
        path = package / relative
        if not path.exists():
            raise HarnessError(f"mutant edit targets {relative}, which this SGLang ({source}) does not have")
        text = path.read_text()
        if old not in text:
            raise HarnessError(f"mutant edit of {relative}: text to replace not found:\n{old}")
        path.unlink()
        path.write_text(text.replace(old, new))
    (root / ".complete").write_text("\n".join(e[0] for e in edits))
    return root


def pytest_command(args: list[str], *, sglang_root: Path | None = None, mutant: str = "", env: dict | None = None,
                   python: str | None = None) -> tuple[list[str], dict]:
    """The command line and environment `run_pytest` runs (for a caller that watches the run as it goes)."""
    environment = dict(os.environ, **(env or {}))
    paths = ([str(sglang_root)] if sglang_root else []) + [str(REPO_ROOT)]
    environment["PYTHONPATH"] = os.pathsep.join(paths + [environment.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    environment["HARNESS_MUTANT"] = mutant
    environment.pop("PYTEST_XDIST_WORKER", None)
    environment.pop("PYTEST_CURRENT_TEST", None)
    return [python or sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args], environment


def run_pytest(args: list[str], *, sglang_root: Path | None = None, timeout: float = 600,
               mutant: str = "", env: dict | None = None, python: str | None = None) -> tuple[int, str]:
    """Run pytest in a fresh process (SGLang keeps process-wide state), with `sglang_root` first on the path;
    `python`: another environment's interpreter (default: this one)."""
    command, environment = pytest_command(args, sglang_root=sglang_root, mutant=mutant, env=env, python=python)
    try:
        done = subprocess.run(command, cwd=REPO_ROOT, env=environment, capture_output=True, text=True,
                              timeout=timeout)
    except subprocess.TimeoutExpired as expired:
        output = (expired.stdout or b"").decode() if isinstance(expired.stdout, bytes) else (expired.stdout or "")
        return 124, output + f"\n[harness] pytest timed out after {timeout} s"
    return done.returncode, done.stdout + done.stderr
