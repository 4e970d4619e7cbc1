"""The `build_torch_compile_kwargs` path. `load()` picks the installed SGLang's layout (or raises `PathMissing`).

| layout module | SGLang | function |
| --- | --- | --- |
| `v0_5_19` | 0.5.19 and later | `multimodal_gen/runtime/utils/torch_compile.py` `build_torch_compile_kwargs` |

A new release's layout is one module with a `detect()` plus one line in `LAYOUTS`.
"""
from __future__ import annotations

import functools

from harness.targets import first_layout
from harness.targets.compile_kwargs import v0_5_19
from harness.targets.compile_kwargs.v0_5_19 import (  # noqa: F401 - the path's public names
    PLATFORM_KINDS, CompileKwargsPath, call, platform_scope,
)

LAYOUTS = (v0_5_19,)  # newest first


def load() -> CompileKwargsPath:
    """The installed SGLang's layout of this path; PathMissing with the reason when it has none."""
    return first_layout(LAYOUTS, f"no {v0_5_19.MODULE}; build_torch_compile_kwargs arrived in 0.5.19 "
                                 "(PR #36249): target 0.5.19 or later")


@functools.lru_cache(maxsize=1)
def capabilities() -> dict:
    """What the installed release's path accepts, for the strategies: its entry points, the comm-overlap flag."""
    path = load()
    return {"entries": path.entries, "comm_overlap": path.comm_overlap}
