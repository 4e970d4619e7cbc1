"""Which SGLang, torch and Hypothesis this run drives: every record and failure carries them."""
from __future__ import annotations

import functools
import importlib.metadata
import importlib.util
import os
import platform
import sys
from pathlib import Path

from harness.errors import HarnessError

INSTALL_HINT = ("install the harness environment with `./harness.sh selftest` (or `pip install --no-deps "
                "sglang==0.5.23 -r requirements/sglang-0.5.23.txt`); for a source checkout "
                "`pip install --no-deps -e PATH/python`")


def require_sglang() -> str:
    """Return the directory of the importable `sglang` package, or raise a HarnessError that says how to get one."""
    spec = importlib.util.find_spec("sglang")
    if spec is None or not spec.submodule_search_locations:
        raise HarnessError(f"SGLang is not installed in {sys.executable}: {INSTALL_HINT}")
    return list(spec.submodule_search_locations)[0]


def module_exists(name: str) -> bool:
    """Whether the installed SGLang has module `name`; False also when a parent package fails to import."""
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def _dist_version(name: str) -> str:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


@functools.lru_cache(maxsize=1)
def sglang_version() -> str:
    """The installed release's version; for a source tree imported ahead of it (the pre-merge gate), which has
    no version of its own, "source tree" (its metadata lookup would name the installed wheel instead)."""
    package = Path(require_sglang())
    installed = any(package.parent.glob("sglang-*.dist-info"))
    if not installed and not os.environ.get("HARNESS_MUTANT"):
        return "source tree"
    return _dist_version("sglang")


def parse(version: str) -> tuple[int, ...]:
    """'0.5.13.post1' -> (0, 5, 13); enough to order SGLang releases."""
    parts = []
    for piece in version.split("."):
        digits = "".join(ch for ch in piece if ch.isdigit())
        if not digits or not piece[0].isdigit():
            break
        parts.append(int(digits))
    return tuple(parts)


@functools.lru_cache(maxsize=1)
def versions() -> dict:
    import torch
    import hypothesis

    return {
        "sglang": sglang_version(),
        "sglang_path": require_sglang(),
        "sglang_mutant": os.environ.get("HARNESS_MUTANT", ""),
        "torch": str(torch.__version__),  # a TorchVersion: plain str so records cross process boundaries
        "hypothesis": hypothesis.__version__,
        "python": platform.python_version(),
    }
