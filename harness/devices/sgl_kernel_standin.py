"""A stand-in for `sgl_kernel` where the real package cannot load, so SGLang's graph runners import.

Two cases need it:
- a CPU machine, SGLang 0.5.9 to 0.5.13: they import `sgl_kernel` on every platform that is not NPU or XPU
  (`srt/mem_cache/memory_pool_host.py` runs `from sgl_kernel.kvcacheio import transfer_kv_...` at import time);
- a GPU machine without the package (the nightly device image carries torch but not sgl_kernel's GB of kernels):
  on CUDA, 0.5.23's graph runners import norm, activation, MoE and quantisation kernels at import time.

What this provides:
- on a CPU machine, exactly the import-time names of those releases (`IMPORT_TIME_NAMES`), nothing else, so
  SGLang's own `try: from sgl_kernel... except ImportError` fallbacks still take their fallback (a module that
  answered every name would send SGLang down kernel paths);
- on a GPU, where SGLang treats sgl_kernel as present (its `try` fallbacks are for older kernel releases), every
  name of `sgl_kernel` and of the kernel submodules it imports from (`GPU_SUBMODULES`), at import time or lazily
  at run time; other submodules stay missing, so SGLang's fallbacks for non-kernel ones (`sgl_kernel.scalar_type`,
  `sgl_kernel.allreduce` for a one-rank group) are still taken.
Each name is a function that raises `SglKernelStandInCalled` naming the call: no kernel is faked. The one exception
is `weak_ref_tensor`, which CUDA graph capture calls on captured outputs: the device layer supplies it (a tensor
aliasing the same storage, as on the virtual device; it keeps the storage alive, which only costs memory). The
stand-in is installed only when `import sgl_kernel` fails; where the real package loads, it is left alone.

    from harness.devices import sgl_kernel_standin
    sgl_kernel_standin.ensure()      # before SGLang's graph runners are imported; idempotent; process-wide

Process-wide rather than scoped: the names are bound into SGLang's modules at their import, which outlives any
block; nothing here changes behaviour unless one of those kernels is called, and then it raises.
"""
from __future__ import annotations

import importlib
import sys
import types

# module -> names SGLang 0.5.9-0.5.13 import from it at import time on a CPU machine (found by importing the model
# runner, the piecewise graph runner, the compile path and the server args with a recording module).
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
GPU_SUBMODULES = ("sgl_kernel.kvcacheio", "sgl_kernel.quantization")
MARKER = "__harness_standin__"
_state: dict[str, str | None] = {"installed": None}


class SglKernelStandInCalled(RuntimeError):
    """A real sgl_kernel kernel was called while the harness's import-time stand-in is installed."""


def _kernel(module: str, name: str):
    def kernel(*args, **kwargs):
        raise SglKernelStandInCalled(
            f"{module}.{name}() was called, but sgl_kernel is the harness's stand-in "
            "(harness.devices.sgl_kernel_standin: the real package did not load here). The code path that "
            "called it needs a real GPU, or a CPU implementation in the harness's device layer.")

    kernel.__name__ = kernel.__qualname__ = name
    kernel.__module__ = module
    return kernel


def weak_ref_tensor(tensor):
    """The device layer's `sgl_kernel.weak_ref_tensor`: a tensor sharing `tensor`'s storage."""
    from harness.devices.cpu import weak_ref_tensor as aliasing

    return aliasing(tensor)


class _AnyName(types.ModuleType):
    """A stand-in module answering every name with a kernel that raises (GPU machines)."""

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        kernel = weak_ref_tensor if name == "weak_ref_tensor" else _kernel(self.__name__, name)
        setattr(self, name, kernel)
        return kernel


def _module(name: str, names: tuple[str, ...] = (), any_name: bool = False) -> types.ModuleType:
    module = (_AnyName if any_name else types.ModuleType)(
        name, f"harness stand-in for {name} ({'every name' if any_name else 'import-time names only'}; calls raise)")
    module.__file__ = __file__
    module.__path__ = []  # a package, so submodules resolve to stand-ins
    setattr(module, MARKER, True)
    if name == "sgl_kernel":
        module.__version__ = "0.0.0+harness-standin"
    for attribute in names:
        setattr(module, attribute, _kernel(name, attribute))
    return module


def real_sgl_kernel_error() -> str | None:
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


def ensure(platform: str = "cpu") -> str | None:
    """Install the stand-in for `platform` ("cpu": the import-time names; "cuda": every name) if the real package
    does not import; returns why it was needed (None: the real package)."""
    if _state["installed"] is not None:
        return _state["installed"]
    reason = real_sgl_kernel_error()
    if reason is None:
        return None
    any_name = platform != "cpu"
    root = _module("sgl_kernel", IMPORT_TIME_NAMES["sgl_kernel"], any_name=any_name)
    sys.modules["sgl_kernel"] = root
    for name in {*IMPORT_TIME_NAMES, *(GPU_SUBMODULES if any_name else ())} - {"sgl_kernel"}:
        sys.modules[name] = _module(name, IMPORT_TIME_NAMES.get(name, ()), any_name=any_name)
        object.__setattr__(root, name.rpartition(".")[2], sys.modules[name])
    _state["installed"] = reason
    return reason
