"""Environment fixes that let SGLang import on a CPU-only machine, applied before SGLang is imported.

PyPI's torchvision is a CUDA build: beside a CPU-only torch (SGLang 0.5.19's pin, torch 2.13.0+cpu) its
kernels do not load, and its import dies registering fake kernels for `torchvision::nms`/`qnms`, which then do
not exist ("operator torchvision::nms does not exist"); transformers imports torchvision, so every
`import sglang` fails. Load it for real first (beside a CUDA-build torch it works, and defining the schemas
again would abort the process); only if that fails this way, define the two schemas and import again. The
operators stay without kernels: calling one raises, nothing is faked.
"""
from __future__ import annotations

import sys

_SCHEMAS = {
    "nms": "nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
    "qnms": "qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
}
_library = None  # kept alive: the schemas live as long as the library object


def prepare_torchvision() -> str:
    """Import torchvision; returns "real", "schemas defined" or "absent"."""
    global _library
    try:
        import torchvision  # noqa: F401
        return "real"
    except ImportError:
        return "absent"
    except RuntimeError as error:
        if "torchvision::nms does not exist" not in str(error):
            raise
    import torch

    for name in [m for m in sys.modules if m == "torchvision" or m.startswith("torchvision.")]:
        del sys.modules[name]
    _library = torch.library.Library("torchvision", "DEF")
    for schema in _SCHEMAS.values():
        _library.define(schema)
    import torchvision  # noqa: F401,F811
    return "schemas defined"
