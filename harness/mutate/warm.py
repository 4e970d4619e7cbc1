"""Warm mutant runs (as mutmut forks its mutants): one parent process imports torch, Hypothesis, pytest and the
harness's plugin once, never an sglang module, and forks a child per run; the child puts the mutated copy first on
sys.path (and PYTHONPATH, for what it starts), so what SGLang it imports is the copy's, and runs pytest in-process.
Each child starts from the parent's state, never from an earlier child's: nothing a mutant run does leaks into the
next. A run past its time is killed with its process group (exit 124, as `run_pytest`).

The parent reads one JSON request a line on stdin (`args`, `sglang_root`, `mutant`, `timeout`, `output`) and answers
one line `{"code": N}`; `WarmWorker` is its client.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Optional

from harness.errors import HarnessError

REPO_ROOT = Path(__file__).resolve().parent.parent.parent


def _warm_up() -> None:
    """What every mutant run would import again: torch, Hypothesis, pytest, the harness's plugin and records."""
    import hypothesis  # noqa: F401
    import pytest  # noqa: F401
    import torch  # noqa: F401

    import harness.profiles  # noqa: F401
    import harness.pytest_plugin  # noqa: F401
    import harness.record  # noqa: F401

    loaded = sorted(m for m in sys.modules if m == "sglang" or m.startswith("sglang."))
    if loaded:
        raise HarnessError(f"the warm parent imported {loaded[:3]}: a child would see that SGLang, not its copy")


def _child(request: dict) -> None:
    """In the forked child: the copy first on the path, output to the request's file, pytest in this process."""
    os.setsid()  # its own process group: a timeout kills what it started too
    with open(request["output"], "wb") as out, open(os.devnull, "rb") as nothing:
        os.dup2(nothing.fileno(), 0)  # the parent's requests are not the child's to read
        os.dup2(out.fileno(), 1)
        os.dup2(out.fileno(), 2)
    root = request.get("sglang_root")
    if root:
        sys.path.insert(0, root)
        os.environ["PYTHONPATH"] = os.pathsep.join([root, str(REPO_ROOT), os.environ.get("PYTHONPATH", "")])
    os.environ["HARNESS_MUTANT"] = request.get("mutant", "")
    os.chdir(REPO_ROOT)
    import pytest

    code = 1
    try:
        code = int(pytest.main(["-p", "no:cacheprovider", *request["args"]]))
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def _wait(pid: int, timeout: float) -> int:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.2)
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    os.waitpid(pid, 0)
    return 124


def serve() -> None:
    """The warm parent: requests on stdin, one forked child each, answers on stdout."""
    _warm_up()
    answers = sys.stdout
    sys.stdout = sys.stderr  # nothing else may write to the answer channel
    print("ready", file=answers, flush=True)
    for line in sys.stdin:
        request = json.loads(line)
        pid = os.fork()
        if pid == 0:
            _child(request)
        print(json.dumps({"code": _wait(pid, float(request["timeout"]))}), file=answers, flush=True)


class WarmWorker:
    """One warm parent; `run` has `run_pytest`'s contract (exit code, output). One run at a time per worker."""

    def __init__(self, python: Optional[str] = None):
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO_ROOT), os.environ.get("PYTHONPATH", "")]))
        env.pop("PYTEST_XDIST_WORKER", None)
        env.pop("PYTEST_CURRENT_TEST", None)
        self.process = subprocess.Popen([python or sys.executable, "-m", "harness.mutate.warm"], cwd=REPO_ROOT,
                                        env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.lock = threading.Lock()
        if self.process.stdout.readline().strip() != "ready":
            raise HarnessError(f"the warm mutant parent did not start (exit {self.process.poll()})")

    def run(self, args: list[str], *, sglang_root: Optional[Path], timeout: float, mutant: str,
            output: Path) -> tuple[int, str]:
        output.parent.mkdir(parents=True, exist_ok=True)
        request = {"args": args, "sglang_root": str(sglang_root) if sglang_root else None, "mutant": mutant,
                   "timeout": timeout, "output": str(output)}
        with self.lock:
            self.process.stdin.write(json.dumps(request) + "\n")
            self.process.stdin.flush()
            answer = self.process.stdout.readline()
        if not answer:
            raise HarnessError(f"the warm mutant parent died (exit {self.process.poll()})")
        text = output.read_text(errors="replace") if output.exists() else ""
        code = json.loads(answer)["code"]
        return code, text + (f"\n[harness] pytest timed out after {timeout} s" if code == 124 else "")

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.stdin.close()
            self.process.wait(timeout=30)


if __name__ == "__main__":
    serve()
