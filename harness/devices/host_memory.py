"""Pinned host memory on the virtual device.

SGLang stages host-side metadata in pinned memory (`torch.tensor(..., pin_memory=True)`, `tensor.pin_memory()`:
LoRA's batch info and its layers' offsets, among others) so that a copy to the GPU can be asynchronous and legal
during a capture. torch built without CUDA refuses pinning outright ("Found no NVIDIA driver"). On the virtual
device every tensor, host or device, is a CPU tensor, so pinned host memory is plain host memory:
`pinned_host_memory()` honours `pin_memory=True` in any factory call and `Tensor.pin_memory()` as that, for the
block only (a `TorchFunctionMode`: torch functions called while it is active pass through it, nothing else changes).

A tensor made that way is host memory on a GPU too, so reading it during a capture is legal there (SGLang's LoRA
layers read their pinned `output_offset_cpu` with `.item()` in a captured forward). Every virtual-device tensor is a
CPU tensor, so the capture-legality rules cannot tell it from a device tensor by its device: `is_pinned_host(t)`
says whether `t` views storage pinned here, and those rules let such reads pass (`harness.devices.legality`). A
tensor computed from a pinned one (a host op's result on a GPU) is not known as host memory: its read is refused.

Scoped rather than part of `cpu.install()`: a function mode sits on every torch call in its block, and only the
targets whose SGLang code pins memory (the real-model LoRA target) need it.
"""
from __future__ import annotations

import weakref

import torch
from torch.overrides import TorchFunctionMode

__all__ = ["pinned_host_memory", "is_pinned_host"]

_PINNED: dict[int, weakref.ref] = {}  # storage address -> a tensor holding that storage, pinned in a block


def _pin(tensor: torch.Tensor) -> torch.Tensor:
    key = tensor.untyped_storage().data_ptr()

    def forget(ref: weakref.ref) -> None:  # the tensor is gone: its entry too, unless the address was pinned again
        if _PINNED.get(key) is ref:
            del _PINNED[key]

    _PINNED[key] = weakref.ref(tensor, forget)
    return tensor


def is_pinned_host(tensor: torch.Tensor) -> bool:
    """Whether `tensor` views storage pinned in a `pinned_host_memory` block (and still alive: a freed address
    reused by another tensor does not count)."""
    ref = _PINNED.get(tensor.untyped_storage().data_ptr())
    return ref is not None and ref() is not None


class pinned_host_memory(TorchFunctionMode):  # noqa: N801 - used as a context manager, named like one
    """`with pinned_host_memory(): ...` -- see the module docstring."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.Tensor.pin_memory:
            return _pin(args[0])
        if kwargs.get("pin_memory"):
            return _pin(func(*args, **{**kwargs, "pin_memory": False}))
        return func(*args, **kwargs)
