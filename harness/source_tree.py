"""An SGLang source checkout given on the command line (`gate`, `mutate --tree`, `bisect`'s exported trees)."""
from __future__ import annotations

from pathlib import Path

from harness.errors import HarnessError


def source_root(path: str) -> Path:
    """The folder holding the `sglang` package of a source checkout (PATH/python or PATH itself)."""
    tree = Path(path).resolve()
    for root in (tree / "python", tree):
        if (root / "sglang" / "__init__.py").exists():
            return root
    raise HarnessError(f"{path} is not an SGLang source tree: neither {tree / 'python' / 'sglang'} nor "
                       f"{tree / 'sglang'} holds an __init__.py. Pass the root of a checkout of SGLang.")
