"""The prefill (piecewise) graph-runner path. `load()` picks the installed SGLang's layout (or raises
`PathMissing`).

| layout module | SGLang | runner |
| --- | --- | --- |
| `v0_5_14` | 0.5.14 onward; main trees of mid-2026 | `runner/prefill_cuda_graph_runner.py` `PrefillCudaGraphRunner` |
| `v0_5_9` | 0.5.9 to 0.5.13 | `piecewise_cuda_graph_runner.py` `PiecewiseCudaGraphRunner` |

A new release's layout is one module (a `detect()` and a `LAYOUT` whose target subclasses `base.PrefillTarget`)
plus one line in `LAYOUTS`.
"""
from __future__ import annotations

from harness.targets import first_layout
from harness.targets.prefill import v0_5_9, v0_5_14
from harness.targets.prefill.base import (  # noqa: F401 - the path's public names
    BACKEND_ADMISSION, BACKENDS, CAPTURE_FAILURE_MESSAGE, CONTEXT_LIMITS, DEEPSTACK_WARMUP, EXECUTE_HIDDEN_GUARD,
    FEATURES,
    LORA_CAPTURE, MIXED_CHUNK_CHECK, POOLED_OUTPUT, Batch, KvCache, Layout, PrefillCase, PrefillTarget, Request,
)

LAYOUTS = (v0_5_14, v0_5_9)  # newest first


def load() -> Layout:
    """The installed SGLang's prefill layout; PathMissing with the reason when it has none this harness drives."""
    return first_layout(LAYOUTS, "no prefill graph runner found at "
                                 f"{', '.join(module.RUNNER_MODULE for module in LAYOUTS)}")
