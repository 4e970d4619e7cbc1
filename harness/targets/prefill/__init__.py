"""The prefill (piecewise) graph-runner path. `load()` picks the installed SGLang's layout (or raises
`PathMissing`).

| layout module | SGLang | runner |
| --- | --- | --- |
| `v0_5_14` | 0.5.14 and later; main trees of mid-2026 | `runner/prefill_cuda_graph_runner.py` `PrefillCudaGraphRunner` |
| `v0_5_9` | 0.5.9 to 0.5.13 | `piecewise_cuda_graph_runner.py` `PiecewiseCudaGraphRunner` |

A new release's layout is one module (a `detect()` and a `LAYOUT` whose target subclasses `base.PrefillTarget`)
plus one line in `LAYOUTS`.
"""
from __future__ import annotations

from harness.errors import PathMissing
from harness.targets.prefill import v0_5_9, v0_5_14
from harness.targets.prefill.base import (  # noqa: F401 - the path's public names
    BACKENDS, Batch, KvCache, Layout, PrefillCase, PrefillTarget, Request,
)
from harness.versions import require_sglang, sglang_version

LAYOUTS = (v0_5_14, v0_5_9)  # newest first


def load() -> Layout:
    """The installed SGLang's prefill layout; PathMissing with the reason when it has none this harness drives."""
    require_sglang()
    for module in LAYOUTS:
        layout = module.detect()
        if layout is not None:
            return layout
    raise PathMissing(f"SGLang {sglang_version()}: no prefill graph runner found at "
                      f"{', '.join(module.RUNNER_MODULE for module in LAYOUTS)}")
