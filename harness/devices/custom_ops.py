"""CPU kernels for SGLang custom ops.

SGLang registers its custom ops (`sglang.srt.utils.custom_op.register_custom_op`, which ends in
`sglang.srt.utils.common.direct_register_custom_op`) with a kernel for one device key only: CUDA on a CUDA
build, PrivateUse1 for NPU and out-of-tree platforms, XPU, MUSA. On the virtual CPU device the tensors are
CPU tensors, so the dispatcher needs a CPU kernel too. This module adds it, for the op SGLang registered,
without changing how SGLang registered it: the schema, the fake kernel and the CUDA kernel stay SGLang's.
"""
from __future__ import annotations

from collections.abc import Callable

import torch

_added: set[str] = set()


def _sglang_library():
    from sglang.srt.utils.common import sglang_lib

    return sglang_lib


def has_cpu_kernel(op_name: str) -> bool:
    """Whether `torch.ops.sglang.<op_name>` has a CPU kernel already."""
    packet = getattr(torch.ops.sglang, op_name, None)
    if packet is None:
        return False
    return torch._C._dispatch_has_kernel_for_dispatch_key(packet.default.name(), "CPU")


def add_cpu_kernel(op_name: str, kernel: Callable) -> None:
    """Register `kernel` as the CPU implementation of the SGLang custom op `op_name`.

    The op must already be registered by SGLang's own helper (`register_custom_op`); this never defines
    an op. Idempotent: a second call for the same name is a no-op, so a suite may call it per test.
    """
    if op_name in _added or has_cpu_kernel(op_name):
        _added.add(op_name)
        return
    if not hasattr(torch.ops.sglang, op_name):
        raise RuntimeError(
            f"torch.ops.sglang.{op_name} is not registered: register it with SGLang's "
            "register_custom_op first, then add its CPU kernel")
    _sglang_library().impl(op_name, kernel, "CPU")
    _added.add(op_name)


