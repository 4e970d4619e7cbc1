"""Stand-ins for Ascend-only modules (`torch.npu`, `torchair`), so SGLang's NPU branches run on a CPU.

They answer the questions SGLang asks to choose a path (`torch.npu.is_available()`), and build a graph
compiler that runs the captured FX graph as it is (what torchair does with `debug.run_eagerly`). Anything
that would need a real Ascend device raises `AscendUnavailable` naming the call, never a silent fake.
"""
from __future__ import annotations

import contextlib
import sys
import types

import torch


class AscendUnavailable(RuntimeError):
    pass


class _TorchNpuStandIn(types.ModuleType):
    """`torch.npu` for path selection only: is_available() is True, any other call fails loudly."""

    def __init__(self):
        super().__init__("torch.npu")

    @staticmethod
    def is_available() -> bool:
        return True

    @staticmethod
    def device_count() -> int:
        return 1

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        raise AscendUnavailable(f"torch.npu.{name} was used, but this is the Ascend stand-in on a machine "
                                f"without an NPU: run with --device npu on Ascend hardware")


class CompilerConfig:
    """torchair.configs.compiler_config.CompilerConfig: the fields SGLang sets."""

    def __init__(self):
        self.mode = "max-autotune"
        self.debug = types.SimpleNamespace(run_eagerly=False)


class NpuBackendStandIn:
    """The object torchair.get_npu_backend() returns: a torch.compile backend that runs the FX graph as traced."""

    instances: list["NpuBackendStandIn"] = []

    def __init__(self, compiler_config: CompilerConfig):
        self.compiler_config = compiler_config
        self.graphs_compiled = 0
        NpuBackendStandIn.instances.append(self)

    def __call__(self, graph_module, example_inputs):
        self.graphs_compiled += 1
        return graph_module.forward

    def __repr__(self):
        return f"<torchair npu backend stand-in mode={self.compiler_config.mode}>"


def _module(name: str, **attrs) -> types.ModuleType:
    module = types.ModuleType(name)
    module.__dict__.update(attrs)
    return module


def torchair_modules() -> dict[str, types.ModuleType]:
    """`torchair` and the submodules SGLang imports, by dotted name, for `sys.modules`."""
    names = {
        "torchair": _module("torchair", get_npu_backend=lambda compiler_config=None: NpuBackendStandIn(
            compiler_config or CompilerConfig())),
        "torchair.configs.compiler_config": _module("torchair.configs.compiler_config",
                                                    CompilerConfig=CompilerConfig),
    }
    chain = ["torchair.configs", "torchair.ge_concrete_graph", "torchair.ge_concrete_graph.ge_converter",
             "torchair.ge_concrete_graph.ge_converter.experimental",
             "torchair.ge_concrete_graph.ge_converter.experimental.patch_for_hcom_allreduce"]
    for name in chain:
        names.setdefault(name, _module(name))
    for name, module in names.items():  # parents expose their children as attributes, as real packages do
        parent, _, child = name.rpartition(".")
        if parent:
            setattr(names[parent], child, module)
    return names


@contextlib.contextmanager
def ascend_standins():
    """Install `torch.npu` and `torchair` stand-ins for the duration of the block, then restore."""
    modules = torchair_modules()
    saved_modules = {name: sys.modules.get(name) for name in modules}
    had_npu, saved_npu = hasattr(torch, "npu"), getattr(torch, "npu", None)
    sys.modules.update(modules)
    torch.npu = _TorchNpuStandIn()
    try:
        yield
    finally:
        for name, module in saved_modules.items():
            if module is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = module
        if had_npu:
            torch.npu = saved_npu
        else:
            del torch.npu
