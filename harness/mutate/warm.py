"""Warm mutant runs (as mutmut forks its mutants): one parent process imports torch, Hypothesis, pytest and the
harness's plugin once, never an sglang module, and forks a child per run; the child puts the mutated copy first on
sys.path (and PYTHONPATH, for what it starts), so what SGLang it imports is the copy's, and runs pytest in-process.
Each child starts from the parent's state, never from an earlier child's: nothing a mutant run does leaks into the
next. A run past its time is killed with its process group (exit 124, as `run_pytest`).

The parent also imports what SGLang imports, less SGLang (transformers, openai, pydantic, Inductor...): five sixths
of a cold `import sglang` (13 s of 16 on this 2-core machine), so a child's SGLang import is its own modules alone.
That list comes from a probe process that imports the suites' targeted modules and names everything else loaded;
it is kept per environment and SGLang install (`warm_imports`). Stand-ins the harness installs (`sgl_kernel`,
`torch_npu`, `torchair`) and torchvision (which `harness.compat` prepares) are never imported by the parent.

The parent reads one JSON request a line on stdin (`args`, `sglang_root`, `mutant`, `timeout`, `output`) and answers
one line `{"code": N}`; `WarmWorker` is its client.
"""
from __future__ import annotations

import gc
import hashlib
import importlib
import importlib.metadata
import importlib.util
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from pathlib import Path

from harness.checkout import REPO_ROOT
from harness.errors import HarnessError

NEVER_WARM = ("sglang", "sgl_kernel", "torch_npu", "torchair", "torchvision", "harness", "suites", "tests",
              "conftest", "__main__", "_cython_")


def _probe() -> None:
    """In the probe process: import the suites' targeted SGLang modules (each may fail on some release; what it
    imported before failing still counts) and print, one a line, every other module then loaded, in the order their
    imports began (`sys.modules` keeps it). The parent imports them in that order, so each package initialises as it
    did here; in another order (alphabetical did) a submodule imported before its package's own import chain can
    hit a circular import, fail half-initialised and be dropped: `torch._inductor.codegen.cpp_gemm_template` first
    left `torch._inductor.kernel.bmm` unregistered, and every Inductor compile of a `bmm` in a warm child failed
    ("both a fallback and a decomp for same op: aten.bmm.default")."""
    warnings.simplefilter("ignore")
    from harness import registry
    from harness.devices import sgl_kernel_standin

    sgl_kernel_standin.ensure("cpu")  # as the virtual device does, so releases that import it get further
    files = {entry.split("::")[0] for suite in registry.SUITES
             for entry in (*suite.coverage, *(e for paths in suite.personality_coverage.values() for e in paths))}
    for name in sorted({"sglang.srt.model_executor.model_runner",
                        *("sglang." + f.removesuffix(".py").replace("/", ".") for f in files)}):
        try:
            importlib.import_module(name)
        except Exception:  # noqa: BLE001 - a release without the module, or one that needs a GPU at import
            pass
    print("\n".join(name for name in sys.modules if not name.startswith(NEVER_WARM)))


def warm_imports() -> list[str]:
    """What SGLang imports beyond itself in this environment (cached per interpreter prefix and SGLang install)."""
    spec = importlib.util.find_spec("sglang")  # finds the package without running it
    if spec is None:
        return []
    try:
        version = importlib.metadata.version("sglang")
    except importlib.metadata.PackageNotFoundError:
        version = "source"
    origin = Path(spec.origin or "")
    # "import order": lists probed before the order was kept (alphabetical) are not reused
    key = f"{sys.prefix}|{origin}|{version}|{origin.stat().st_mtime if origin.exists() else 0}|import order"
    cache = Path(tempfile.gettempdir()) / "harness-warm" / (hashlib.sha256(key.encode()).hexdigest()[:16] + ".txt")
    if not cache.exists():
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO_ROOT), os.environ.get("PYTHONPATH", "")]))
        done = subprocess.run([sys.executable, "-c", "from harness.mutate.warm import _probe; _probe()"],
                              cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=600)
        if done.returncode != 0:
            return []  # a cold child then imports them itself: slower, never wrong
        cache.parent.mkdir(parents=True, exist_ok=True)
        partial = cache.with_suffix(f".{os.getpid()}")
        partial.write_text(done.stdout)
        partial.replace(cache)
    return cache.read_text().split()


def _warm_up() -> None:
    """What every mutant run would import again: torch, Hypothesis, pytest, the harness's plugin and records, and
    the modules SGLang imports from other packages."""
    import hypothesis  # noqa: F401
    import pytest  # noqa: F401
    import torch  # noqa: F401

    import harness.profiles  # noqa: F401
    import harness.pytest_plugin  # noqa: F401
    import harness.record  # noqa: F401

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name in warm_imports():
            try:
                importlib.import_module(name)
            except Exception:  # noqa: BLE001 - one that imports only in SGLang's order: the child imports it then
                pass
    gc.collect()
    gc.freeze()  # before the forks: a child's collections (SGLang's capture runs two) never scan this heap
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
        if request.get("import_only"):  # does the copy's sglang import at all (bisect's first question)
            import traceback

            try:
                importlib.import_module("sglang")
                code = 0
            except BaseException:  # noqa: BLE001 - any failure to import is the answer, with its traceback
                traceback.print_exc()
        else:
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

    def __init__(self, python: str | None = None):
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO_ROOT), os.environ.get("PYTHONPATH", "")]))
        env.pop("PYTEST_XDIST_WORKER", None)
        env.pop("PYTEST_CURRENT_TEST", None)
        self.process = subprocess.Popen([python or sys.executable, "-m", "harness.mutate.warm"], cwd=REPO_ROOT,
                                        env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.lock = threading.Lock()
        if self.process.stdout.readline().strip() != "ready":
            raise HarnessError(f"the warm mutant parent did not start (exit {self.process.poll()})")

    def run(self, args: list[str], *, sglang_root: Path | None, timeout: float, mutant: str,
            output: Path, import_only: bool = False) -> tuple[int, str]:
        """pytest with `args` in a child forked from the warm parent (`import_only`: only `import sglang`)."""
        output.parent.mkdir(parents=True, exist_ok=True)
        request = {"args": args, "sglang_root": str(sglang_root) if sglang_root else None, "mutant": mutant,
                   "timeout": timeout, "output": str(output), "import_only": import_only}
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
