"""Stand-ins that let SGLang take its NPU code paths on the cpu virtual device (the "npu" personality).

Installed by `harness.devices.cpu.install(personality="npu")`, restored on exit:
- `torch.npu`: a device module whose graph primitives are the virtual device's (`NPUGraph` is `VirtualGraph`, with
  `update(cpu_update_input=...)` recorded), streams/events/synchronize are `torch.cpu`'s, `is_available()` is True.
- `torch_npu`, `torch_npu.profiler`, `torch_npu._C`: modules whose every other attribute is a callable that raises
  `AscendKernelCalled` naming it -- an Ascend kernel really called on the virtual device fails loudly.
- `torchair` (what `sglang.srt.utils.get_compiler_backend` imports for NPU): the stand-in of
  `harness.personalities.ascend`, whose backends run the captured FX graph eagerly (npugraph_ex's `run_eagerly`).
- `npugraph_ex_backend`: the platform's compile backend on this personality; counts its compiles in
  `NPU_BACKEND_COMPILES`, so a suite can see which backend compiled a forward.
- SGLang's platform object (`sglang.srt.platforms.current_platform`), only its hooks: `is_out_of_tree()` True,
  `get_full_graph_backend_cls()` SGLang's own `NPUCudaGraphBackend` (the decode backend SGLang picks on an NPU device;
  `resolve_decode_backend` picks it by `model_runner.device == "npu"`, which a CPU tensor device cannot be, so the
  platform's full-graph-backend hook is the plug point), `get_compile_backend(mode)` the torchair stand-in above.
  Releases up to 0.5.13 have neither the platform object nor that backend: nothing to patch there.
"""
from __future__ import annotations

import types
from typing import Any

import torch

NPU_BACKEND_COMPILES: list[dict] = []
NPU_FULL_GRAPH_BACKEND_MODULE = "sglang.srt.hardware_backend.npu.graph_runner.npu_cudagraph_backend"  # 0.5.14+
# SGLang's NPU modules imported before the stand-ins go in (those the installed release has)
NPU_MODULES = ("sglang.srt.hardware_backend.npu.graph_runner.npu_graph_runner", NPU_FULL_GRAPH_BACKEND_MODULE,
               "sglang.srt.model_executor.runner.decode_cuda_graph_runner",
               "sglang.srt.model_executor.cuda_graph_runner")


class AscendKernelCalled(RuntimeError):
    """An Ascend-only function was really called on the cpu virtual device."""


class _StandinModule(types.ModuleType):
    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        qualified = f"{self.__name__}.{name}"

        def ascend_only(*args, **kwargs):
            raise AscendKernelCalled(
                f"{qualified} is Ascend-only and was called on the cpu virtual device (npu personality); "
                "run this case with --device npu on Ascend hardware, or keep the code path off the kernel")

        ascend_only.__name__ = name
        ascend_only.__qualname__ = qualified
        return ascend_only


def _npu_device_module() -> types.ModuleType:
    from harness.devices import cpu

    module = _StandinModule("torch.npu", "virtual NPU device module (harness.devices.npu_standin)")
    for name in ("Stream", "Event", "stream", "current_stream", "synchronize", "current_device", "set_device",
                 "device_count"):
        setattr(module, name, getattr(torch.cpu, name))
    module.is_available = lambda: True
    module.NPUGraph = cpu.VirtualGraph
    module.graph = cpu.graph
    module.graph_pool_handle = cpu.graph_pool_handle
    module.is_current_stream_capturing = cpu.is_current_stream_capturing
    module.empty_cache = lambda: None
    return module


def npugraph_ex_backend(gm: torch.fx.GraphModule, example_inputs, **kwargs):
    NPU_BACKEND_COMPILES.append({"nodes": len(gm.graph.nodes)})
    return gm.forward


def install_into(patches) -> None:
    """Install the stand-ins through `patches` (the cpu device's undo log).

    SGLang's NPU modules (and through them transformers) are imported first, in the real environment: libraries
    probe `importlib.util.find_spec("torch_npu")` at import, which a stand-in must not answer.
    """
    import importlib

    from harness.versions import module_exists

    for name in NPU_MODULES:
        if module_exists(name):  # each release has some of them
            importlib.import_module(name)
    patches.setattr(torch, "npu", _npu_device_module())
    torch_npu = _StandinModule("torch_npu", "torch_npu stand-in (harness.devices.npu_standin)")
    for sub in ("profiler", "_C"):
        module = _StandinModule(f"torch_npu.{sub}")
        setattr(torch_npu, sub, module)
        patches.setmodule(f"torch_npu.{sub}", module)
    from harness.devices import cpu

    torch_npu._C._weak_ref_tensor = cpu.weak_ref_tensor
    patches.setmodule("torch_npu", torch_npu)
    from harness.personalities.ascend import torchair_modules

    for name, module in torchair_modules().items():
        patches.setmodule(name, module)

    if not (module_exists("sglang.srt.platforms") and module_exists(NPU_FULL_GRAPH_BACKEND_MODULE)):
        return  # up to 0.5.13: no platform object nor full-graph backend; the NPU runner is chosen by class
    from sglang.srt.hardware_backend.npu.graph_runner.npu_cudagraph_backend import NPUCudaGraphBackend
    from sglang.srt.platforms import current_platform

    patches.setattr(current_platform, "is_out_of_tree", lambda: True)
    patches.setattr(current_platform, "get_full_graph_backend_cls", lambda: NPUCudaGraphBackend)
    patches.setattr(current_platform, "get_compile_backend", lambda mode=None: npugraph_ex_backend)
    patches.setattr(current_platform, "get_device_total_memory", lambda *a, **k: None)
