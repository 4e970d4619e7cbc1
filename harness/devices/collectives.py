"""Collectives on the virtual device: what NCCL is to a GPU, gloo is to the CPU ranks of a harness world.

SGLang picks its collective per mode, and the choice is part of what a world tests: in eager its
`GroupCoordinator` calls `torch.distributed` on the device group, and inside `graph_capture` it switches its
PyNccl communicator on (`change_state(enable=True)`), so a captured graph holds NCCL kernels. On the CPU there is
no NCCL: `VirtualNccl` stands in for SGLang's `PyNcclCommunicator` (its class, `change_state` and
`disabled`/`available` flags SGLang's own), each NCCL call done by gloo on the group SGLang handed it, with NCCL's
own checks kept (a tensor on another device than the communicator's is refused, as NCCL would fault).

A captured collective replays: the virtual device records `torch.distributed`'s ops (`c10d.*`) and SGLang's
collective custom ops like any op and runs them again at replay, every rank replaying in step, as CUDA graphs
holding NCCL kernels do; `wait_for_work` makes a replayed asynchronous gloo op finish before the next step reads
its output (the stream order a captured NCCL kernel has).

SGLang registers its collective custom ops (`sglang::reg_all_gather_into_tensor`, `inplace_all_reduce`, ...) with a
CUDA kernel only; `add_collective_kernels` gives each the same Python function as its CPU kernel.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

PYNCCL_MODULE = "sglang.srt.distributed.device_communicators.pynccl"
PARALLEL_STATE_MODULE = "sglang.srt.distributed.parallel_state"


def virtual_nccl_class():
    """`VirtualNccl`: a subclass of the installed SGLang's `PyNcclCommunicator`, made on demand (SGLang is imported
    late)."""
    import importlib

    base = importlib.import_module(PYNCCL_MODULE).PyNcclCommunicator
    return type("VirtualNccl", (_VirtualNcclMethods, base), {"__doc__": _VirtualNcclMethods.__doc__})


class _VirtualNcclMethods:
    """NCCL's collectives by gloo over the communicator's group (module docstring)."""

    def __init__(self, group, device, library_path=None, is_symmetric_memory_enabled=False, cta_policy=None,
                 **ignored):
        self.group = group
        self.rank = dist.get_rank(group)
        self.world_size = dist.get_world_size(group)
        self.device = torch.device("cpu") if isinstance(device, int) else torch.device(device)
        self.available = self.world_size > 1
        self.disabled = True  # as SGLang's: off in eager, switched on by graph_capture's change_state

    def _check(self, *tensors: torch.Tensor) -> None:
        for tensor in tensors:
            if tensor.device != self.device:
                raise RuntimeError(f"this nccl communicator is created to work on {self.device}, but a tensor is on "
                                   f"{tensor.device} (on a GPU: an illegal memory access)")

    def all_reduce(self, tensor, op=dist.ReduceOp.SUM):
        if self.disabled:
            return
        self._check(tensor)
        dist.all_reduce(tensor, op=op, group=self.group)

    def outplace_all_reduce(self, in_tensor, out_tensor=None, op=dist.ReduceOp.SUM):
        if self.disabled:
            return None
        self._check(in_tensor)
        out_tensor = in_tensor.clone() if out_tensor is None else out_tensor.copy_(in_tensor)
        dist.all_reduce(out_tensor, op=op, group=self.group)
        return out_tensor

    def all_gather(self, output_tensor, input_tensor, sizes=None):
        if self.disabled:
            return
        self._check(output_tensor, input_tensor)
        if sizes is None:
            dist.all_gather_into_tensor(output_tensor, input_tensor, group=self.group)
            return
        offset = 0
        for root, size in enumerate(sizes):  # NCCL's grouped broadcasts, one root at a time
            part = output_tensor[offset:offset + size]
            if root == self.rank:
                part.copy_(input_tensor[:size])
            dist.broadcast(part, group_src=root, group=self.group)
            offset += size

    def reduce_scatter(self, output_tensor, input_tensor, op=dist.ReduceOp.SUM, sizes=None):
        if self.disabled:
            return
        self._check(output_tensor, input_tensor)
        reduced = input_tensor.clone()  # gloo has no reduce-scatter: reduce all, keep this rank's rows
        dist.all_reduce(reduced, op=op, group=self.group)
        sizes = sizes or [input_tensor.shape[0] // self.world_size] * self.world_size
        start = sum(sizes[:self.rank])
        output_tensor.copy_(reduced[start:start + sizes[self.rank]].reshape(output_tensor.shape))

    def send(self, tensor, dst):
        if self.disabled:
            return
        self._check(tensor)
        dist.send(tensor, group_dst=dst, group=self.group)

    def recv(self, tensor, src):
        if self.disabled:
            return
        self._check(tensor)
        dist.recv(tensor, group_src=src, group=self.group)

    def broadcast(self, tensor, src):
        if self.disabled:
            return
        self._check(tensor)
        dist.broadcast(tensor, group_src=src, group=self.group)

    def all_to_all_single(self, output_tensor, input_tensor):
        if self.disabled:
            return
        self._check(output_tensor, input_tensor)
        dist.all_to_all_single(output_tensor, input_tensor, group=self.group)

    def group_start(self):
        pass

    def group_end(self):
        pass


def add_collective_kernels() -> list[str]:
    """A CPU kernel for each collective custom op SGLang's parallel state registers (its own Python function, which
    `register_custom_op` keeps as `__wrapped__`); returns their names."""
    import importlib

    from harness.devices.custom_ops import add_cpu_kernel

    module = importlib.import_module(PARALLEL_STATE_MODULE)
    added = []
    for name, value in vars(module).items():
        function = getattr(value, "__wrapped__", None)
        if callable(function) and getattr(value, "__module__", None) == module.__name__ and \
                hasattr(torch.ops.sglang, name):
            add_cpu_kernel(name, function)
            added.append(name)
    return added


def install(patches) -> None:
    """On `patches` (a `pytest.MonkeyPatch`): SGLang's groups get `VirtualNccl` for their PyNccl communicator, and its
    collective custom ops a CPU kernel. Before SGLang builds its groups."""
    import importlib

    patches.setattr(importlib.import_module(PYNCCL_MODULE), "PyNcclCommunicator", virtual_nccl_class())
    add_collective_kernels()


def wait_for_work(result) -> None:
    """Wait on every `torch.distributed` work handle in a replayed op's result (a c10d op returns its outputs and the
    work, a TorchScript object; `torch.distributed`'s Python API waits itself, a replay of the bare op must)."""
    if not dist.is_available():
        return
    work_type = torch._C._distributed_c10d.Work
    stack = [result]
    while stack:
        item = stack.pop()
        if isinstance(item, torch.ScriptObject):
            item = work_type.unbox(item)
        if isinstance(item, work_type):
            item.wait()
        elif isinstance(item, (list, tuple)):
            stack.extend(item)


def wait_for_tensors(result):
    """A replayed functional collective's outputs (`_c10d_functional.*`), each waited on (`wait_tensor`)."""
    if isinstance(result, torch.Tensor):
        return torch.ops._c10d_functional.wait_tensor(result)
    if isinstance(result, (list, tuple)):
        return type(result)(wait_for_tensors(item) for item in result)
    return result
