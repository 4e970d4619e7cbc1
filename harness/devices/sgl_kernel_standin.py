"""A stand-in for `sgl_kernel` on a machine where the real package cannot load (no CUDA driver), for older SGLang.

SGLang 0.5.9 to 0.5.13 import `sgl_kernel` unconditionally on every platform that is not NPU or XPU: their
`srt/mem_cache/memory_pool_host.py` runs `from sgl_kernel.kvcacheio import transfer_kv_...` at import time, and
the model runner and both graph runners reach that module. The real package is built for CUDA only.

What this provides: exactly the import-time names of those releases (`IMPORT_TIME_NAMES`), nothing else, so
SGLang's own `try: from sgl_kernel... except ImportError` fallbacks still take their fallback (a module that
answered every name would send SGLang down kernel paths). Each name is a function that raises
`SglKernelStandInCalled` naming the call: no kernel is faked. The stand-in is installed only when
`import sgl_kernel` fails; where the real package loads, it is left alone.

    from harness.devices import sgl_kernel_standin
    sgl_kernel_standin.ensure()      # before SGLang's graph runners are imported; idempotent; process-wide

Process-wide rather than scoped: the names are bound into SGLang's modules at their import, which outlives any
block; nothing here changes behaviour unless one of those kernels is called, and then it raises.
"""
from __future__ import annotations

import importlib
import sys
import types
from typing import Optional

# module -> names imported from it at import time by SGLang 0.5.9-0.5.13 on a CPU machine (found by importing
# the model runner, the piecewise graph runner, the compile path and the server args with a recording module).
IMPORT_TIME_NAMES: dict[str, tuple[str, ...]] = {
    "sgl_kernel": (),
    "sgl_kernel.kvcacheio": (
        "transfer_kv_all_layer", "transfer_kv_all_layer_direct_lf_pf", "transfer_kv_all_layer_lf_pf",
        "transfer_kv_all_layer_lf_ph", "transfer_kv_all_layer_mla", "transfer_kv_all_layer_mla_lf_pf",
        "transfer_kv_direct", "transfer_kv_per_layer", "transfer_kv_per_layer_direct_pf_lf",
        "transfer_kv_per_layer_mla", "transfer_kv_per_layer_mla_pf_lf", "transfer_kv_per_layer_pf_lf",
        "transfer_kv_per_layer_ph_lf",
    ),
}
MARKER = "__harness_standin__"
_state: dict[str, Optional[str]] = {"installed": None}


class SglKernelStandInCalled(RuntimeError):
    """A real sgl_kernel kernel was called while the harness's import-time stand-in is installed."""


def _kernel(module: str, name: str):
    def kernel(*args, **kwargs):
        raise SglKernelStandInCalled(
            f"{module}.{name}() was called, but sgl_kernel is the harness's import-time stand-in "
            "(harness.devices.sgl_kernel_standin: the real package needs the CUDA driver). The code path that "
            "called it needs a real GPU, or a CPU implementation in the harness's device layer.")

    kernel.__name__ = kernel.__qualname__ = name
    kernel.__module__ = module
    return kernel


def _module(name: str) -> types.ModuleType:
    module = types.ModuleType(name, f"harness stand-in for {name} (import-time names only; calls raise)")
    module.__file__ = __file__
    setattr(module, MARKER, True)
    if name == "sgl_kernel":
        module.__path__ = []  # a package, so `sgl_kernel.kvcacheio` resolves to the stand-in below
        module.__version__ = "0.0.0+harness-standin"
    for attribute in IMPORT_TIME_NAMES[name]:
        setattr(module, attribute, _kernel(name, attribute))
    return module


def real_sgl_kernel_error() -> Optional[str]:
    """None when the real `sgl_kernel` imports; otherwise why not (the stand-in's reason)."""
    module = sys.modules.get("sgl_kernel")
    if module is not None:
        return "stand-in installed" if getattr(module, MARKER, False) else None
    try:
        importlib.import_module("sgl_kernel")
        return None
    except Exception as error:  # noqa: BLE001 - ImportError, OSError (missing libcuda), anything the import raises
        for name in [m for m in sys.modules if m == "sgl_kernel" or m.startswith("sgl_kernel.")]:
            del sys.modules[name]
        return f"{type(error).__name__}: {error}"


def ensure() -> Optional[str]:
    """Install the stand-in if the real package does not import; returns why it was needed (None: real)."""
    if _state["installed"] is not None:
        return _state["installed"]
    reason = real_sgl_kernel_error()
    if reason is None:
        return None
    root = _module("sgl_kernel")
    sys.modules["sgl_kernel"] = root
    for name in IMPORT_TIME_NAMES:
        if name != "sgl_kernel":
            sys.modules[name] = _module(name)
            setattr(root, name.rpartition(".")[2], sys.modules[name])
    _state["installed"] = reason
    return reason


def installed() -> bool:
    return _state["installed"] is not None
