"""The decode graph-runner path. `load()` picks the installed SGLang's layout (or raises `PathMissing`).

| layout module | SGLang | runner |
| --- | --- | --- |
| `v0_5_14` | 0.5.14 onward; main trees from May 2026 | `runner/decode_cuda_graph_runner.py` `DecodeCudaGraphRunner` |
| `v0_5_9` | 0.5.9 to 0.5.13 | `cuda_graph_runner.py` `CudaGraphRunner` |

A new release's layout is one module (a `detect()` and a `LAYOUT` whose target subclasses `base.DecodeTarget`)
plus one line in `LAYOUTS`.
"""
from __future__ import annotations

from harness.targets import first_layout
from harness.targets.decode import v0_5_9, v0_5_14
from harness.targets.decode.base import (  # noqa: F401 - the path's public names
    DecodeBatch, DecodeCase, DecodeTarget, DllmSettings, Layout, SpecSettings, fresh_dynamo_when_compiler_changes,
)

LAYOUTS = (v0_5_14, v0_5_9)  # newest first


def load() -> Layout:
    """The installed SGLang's decode layout; PathMissing with the reason when it has none this harness drives."""
    return first_layout(LAYOUTS, "no decode graph runner found at "
                                 f"{', '.join(module.RUNNER_MODULE for module in LAYOUTS)}")
