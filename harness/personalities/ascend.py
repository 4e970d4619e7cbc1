"""The npu personality: stand-ins for Ascend-only modules, so SGLang takes its NPU code paths on a CPU.

They answer the questions SGLang asks to choose a path (`torch.npu.is_available()`), and provide `torchair`,
whose backend runs the captured FX graph as traced (what torchair does with `debug.run_eagerly`). Any other
Ascend name can be imported or referenced, but calling it raises `AscendUnavailable` naming it: an Ascend
kernel really called here fails loudly, never a silent fake. Two scopes, one set of stand-ins:

- `ascend_standins()`: path selection only (`torch.npu`, `torchair`), for code that never captures a graph.
- `install_on_virtual_device(patches)`: the npu personality of the cpu virtual device (`get_device("cpu")
  .install("npu")`), added to the device's patch set. On top of the above: `torch.npu`'s graph primitives are the
  virtual device's (`NPUGraph` a `VirtualGraph` with the real signatures, `graph` its capture; both, and the
  `graph_task_*` entry points, held to the torch_npu wheel by `npu_contract`), its streams, events and
  `synchronize` are `torch.cpu`'s; it holds `VIRTUAL_NPUS` devices, each thread on its own (`current_device`,
  `set_device`, also `torch.cpu`'s, the module SGLang's NPU runners hold);
  `torch_npu` (with `_C`, and `profiler` on torch's own profiler, also bound in SGLang's NPU runner module as an
  NPU import would have bound it) is provided; and SGLang's platform object (0.5.14+) answers as an
  out-of-tree platform whose full-graph backend is SGLang's own `NPUCudaGraphBackend` (the decode backend SGLang
  picks on an NPU; `resolve_decode_backend` picks it by `model_runner.device == "npu"`, which a CPU tensor
  device cannot be, so the platform's hook is the plug point) and whose compile backend is `npugraph_ex_backend`.
  Both compile backends bump `counter.num_platform_backend_compiles`.
"""
from __future__ import annotations

import contextlib
import functools
import importlib
import inspect
import sys
import threading
import types
from typing import Any
from collections.abc import Iterator

import pytest
import torch

from harness.counter import counter
from harness.devices.cpu import VirtualGraph, graph, graph_pool_handle, is_current_stream_capturing, weak_ref_tensor
import harness.devices.streams as streams
from harness.versions import module_exists

NPU_FULL_GRAPH_BACKEND_MODULE = "sglang.srt.hardware_backend.npu.graph_runner.npu_cudagraph_backend"  # 0.5.14+
# SGLang's NPU modules imported before the stand-ins go in (those the installed release has)
NPU_MODULES = ("sglang.srt.hardware_backend.npu.graph_runner.npu_graph_runner", NPU_FULL_GRAPH_BACKEND_MODULE,
               "sglang.srt.model_executor.runner.decode_cuda_graph_runner",
               "sglang.srt.model_executor.cuda_graph_runner")


class AscendUnavailable(RuntimeError):
    """An Ascend-only function was really called on a machine without an NPU."""


class _AscendOnly(types.ModuleType):
    """A module answering every name it was not given with a function that raises `AscendUnavailable`."""

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        qualified = f"{self.__name__}.{name}"

        def ascend_only(*args, **kwargs):
            raise AscendUnavailable(
                f"{qualified} is Ascend-only and was called on a machine without an NPU (the harness's npu "
                "personality); run this case with --device npu on Ascend hardware, or keep the code path off it")

        ascend_only.__name__ = name
        ascend_only.__qualname__ = qualified
        return ascend_only


# The virtual device's NPUs: a server's rank runs on one of several (`torch.npu.set_device(rank)`), so code that
# loses track of its device (a worker thread left on device 0) is visible where the runner is on another.
VIRTUAL_NPUS = 2
_ordinal = threading.local()  # .index: this thread's current NPU; a new thread starts on 0, as on an NPU


def current_device() -> int:
    """`torch.npu.current_device()`: this thread's NPU."""
    return getattr(_ordinal, "index", 0)


def set_device(device) -> None:
    """`torch.npu.set_device(device)` for this thread: an index, "npu:N" or a torch.device; one past the virtual
    NPUs raises as torch_npu does."""
    index = device.index if isinstance(device, torch.device) else \
        int(device.rpartition(":")[2] or 0) if isinstance(device, str) else int(device)
    if not 0 <= (index or 0) < VIRTUAL_NPUS:
        raise RuntimeError(f"Invalid device argument: device {device} of {VIRTUAL_NPUS} virtual NPUs")
    _ordinal.index = index or 0


class NPUGraph(VirtualGraph):
    """`torch.npu.NPUGraph` on the virtual device: the virtual graph with the real class's signatures (held to
    the torch_npu wheel by `npu_contract`); as the real one, `update` refuses a graph not captured with
    `auto_dispatch_capture=True`. The NPU a graph is captured on (`device`) and the one each update is made from
    (`update_devices`, beside `updates`) are recorded: an update from a thread on another NPU rebinds nothing of
    this graph's on hardware (`npu-graph-update` judges)."""

    def __init__(self):
        super().__init__()
        self.auto_dispatch_capture = False
        self.device: int | None = None
        self.update_devices: list[int] = []
        self._capture_frame = None  # the `with` site, set by `npu_graph`, so a rerun capture finds its block

    def capture_begin(self, pool=None, capture_error_mode="global"):
        frame, self._capture_frame = self._capture_frame or sys._getframe(1), None
        self.device = current_device()
        super().capture_begin(pool, capture_error_mode, _frame=frame)

    def update(self, cpu_update_input):
        if not self.auto_dispatch_capture:  # the real one's refusal, as torch_npu words it
            raise RuntimeError("The current graph configuration does not support update,Try to capture by setting "
                               "auto_dispatch_capture=True during capture")
        self.update_devices.append(current_device())
        super().update(cpu_update_input)

    def debug_dump(self, debug_path):
        return super().debug_dump(debug_path)


class npu_graph(graph):  # noqa: N801 - mirrors torch.npu.graph
    """`torch.npu.graph` with the real signature: the virtual device's capture into an `NPUGraph`."""

    def __init__(self, npu_graph, pool=None, stream=None, auto_dispatch_capture=False,
                 capture_error_mode: str = "global"):
        super().__init__(npu_graph, pool=pool, stream=stream, capture_error_mode=capture_error_mode)
        self.capture_error_mode = capture_error_mode
        npu_graph.auto_dispatch_capture = auto_dispatch_capture

    def __enter__(self):
        streams.synchronize()
        self._stream_ctx = streams.stream(self.stream)
        self._stream_ctx.__enter__()
        self.cuda_graph._capture_frame = sys._getframe(1)
        self.cuda_graph.capture_begin(*(() if self.pool is None else (self.pool,)),
                                      capture_error_mode=self.capture_error_mode)


def _task_group_only(name: str, signature_of):
    """A `torch.npu.graph_task_*` entry point with the real signature: task groups (updating captured tasks in
    place) are not emulated, so a call raises `AscendUnavailable` naming it, after Python has bound the arguments."""

    @functools.wraps(signature_of)
    def entry(*args, **kwargs):
        inspect.signature(signature_of).bind(*args, **kwargs)
        raise AscendUnavailable(f"torch.npu.{name}: NPU graph task groups are not emulated on the virtual device; "
                                "run this case with --device npu on Ascend hardware")

    entry.__name__ = entry.__qualname__ = name
    return entry


def _graph_task_group_begin(stream): ...
def _graph_task_group_end(stream): ...
def _graph_task_update_begin(stream, handle): ...
def _graph_task_update_end(stream): ...


GRAPH_TASK_API = {name: _task_group_only(name, signature) for name, signature in (
    ("graph_task_group_begin", _graph_task_group_begin), ("graph_task_group_end", _graph_task_group_end),
    ("graph_task_update_begin", _graph_task_update_begin), ("graph_task_update_end", _graph_task_update_end))}


def _torch_npu(virtual_device: bool) -> types.ModuleType:
    """`torch.npu`: available, one device; on the virtual device also its graph primitives and torch.cpu's streams."""
    module = _AscendOnly("torch.npu", "torch.npu stand-in (harness.personalities.ascend)")
    module.is_available = lambda: True
    module.device_count = lambda: VIRTUAL_NPUS if virtual_device else 1
    if virtual_device:
        for name in ("Stream", "Event", "stream", "current_stream", "synchronize"):
            setattr(module, name, getattr(torch.cpu, name))
        module.current_device, module.set_device = current_device, set_device
        module.NPUGraph = NPUGraph
        module.graph = npu_graph
        module.__dict__.update(GRAPH_TASK_API)
        module.graph_pool_handle = graph_pool_handle
        module.is_current_stream_capturing = is_current_stream_capturing
        module.empty_cache = lambda: None
    return module


class CompilerConfig:
    """torchair.configs.compiler_config.CompilerConfig: the fields SGLang sets."""

    def __init__(self):
        self.mode = "max-autotune"
        self.debug = types.SimpleNamespace(run_eagerly=False)


class NpuBackendStandIn:
    """The object torchair.get_npu_backend() returns: a torch.compile backend that runs the FX graph as traced."""

    def __init__(self, compiler_config: CompilerConfig):
        self.compiler_config = compiler_config

    def __call__(self, graph_module, example_inputs):
        counter.num_platform_backend_compiles += 1
        return graph_module.forward

    def __repr__(self):
        return f"<torchair npu backend stand-in mode={self.compiler_config.mode}>"


def npugraph_ex_backend(gm: torch.fx.GraphModule, example_inputs, **kwargs):
    """The platform's compile backend on the virtual device (`get_compile_backend`): runs the FX graph as traced."""
    counter.num_platform_backend_compiles += 1
    return gm.forward


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


def _install_path_selection(patches: pytest.MonkeyPatch, *, virtual_device: bool) -> None:
    patches.setattr(torch, "npu", _torch_npu(virtual_device), raising=False)
    for name, module in torchair_modules().items():
        patches.setitem(sys.modules, name, module)


@contextlib.contextmanager
def ascend_standins() -> Iterator[None]:
    """`torch.npu` and `torchair` stand-ins for the duration of the block (path selection only), then undone."""
    with pytest.MonkeyPatch.context() as patches:
        _install_path_selection(patches, virtual_device=False)
        yield


def _npu_profiler_on_torch_profiler(module: types.ModuleType) -> None:
    """`torch_npu.profiler` as torch's own profiler on the CPU: `profile` drops the NPU activity, the
    experimental config (Ascend's export options) and the deprecated `use_cuda`, `tensorboard_trace_handler` is
    torch's (one trace file per profiling pass, in the folder named; no Ascend analysis); both with the real
    signatures (`npu_contract`); its config enums are plain names."""

    def profile(*, activities=None, schedule=None, on_trace_ready=None, record_shapes=False, profile_memory=False,
                with_stack=False, with_flops=False, with_modules=False, experimental_config=None,
                execution_trace_observer=None, custom_trace_id_callback=None, use_cuda=None):
        return torch.profiler.profile(
            activities=[a for a in activities or () if a != "NPU"], schedule=schedule, on_trace_ready=on_trace_ready,
            record_shapes=record_shapes, profile_memory=profile_memory, with_stack=with_stack, with_flops=with_flops,
            with_modules=with_modules, execution_trace_observer=execution_trace_observer,
            custom_trace_id_callback=custom_trace_id_callback)

    def tensorboard_trace_handler(dir_name=None, worker_name=None, analyse_flag=True, async_mode=False):
        return torch.profiler.tensorboard_trace_handler(dir_name, worker_name)

    module.profile = profile
    module.tensorboard_trace_handler = tensorboard_trace_handler
    module.ProfilerActivity = types.SimpleNamespace(CPU=torch.profiler.ProfilerActivity.CPU, NPU="NPU")
    module._ExperimentalConfig = lambda **options: types.SimpleNamespace(**options)
    module.ExportType = types.SimpleNamespace(Text="Text", Db="Db")
    module.ProfilerLevel = types.SimpleNamespace(Level0="Level0", Level1="Level1", Level2="Level2")


def _torch_npu_package() -> types.ModuleType:
    """`torch_npu` on the virtual device: `_C` with SGLang's weak-reference kernel, `profiler` on torch's."""
    torch_npu = _AscendOnly("torch_npu", "torch_npu stand-in (harness.personalities.ascend)")
    for sub in ("profiler", "_C"):
        setattr(torch_npu, sub, _AscendOnly(f"torch_npu.{sub}"))
    torch_npu._C._weak_ref_tensor = weak_ref_tensor
    _npu_profiler_on_torch_profiler(torch_npu.profiler)
    return torch_npu


def standin_modules() -> dict[str, types.ModuleType]:
    """The virtual device's stand-ins, built afresh and installed nowhere, by the real module each stands for
    (what `npu_contract` holds against the torch_npu wheel)."""
    torch_npu = _torch_npu_package()
    return {"torch.npu": _torch_npu(virtual_device=True), "torch_npu": torch_npu,
            "torch_npu.profiler": torch_npu.profiler, "torch_npu._C": torch_npu._C}


def install_on_virtual_device(patches: pytest.MonkeyPatch) -> None:
    """Add the npu personality to the cpu virtual device's patch set (`harness.devices.cpu.install()` yields it).

    SGLang's NPU modules (and through them transformers) are imported first, in the real environment: libraries
    probe `importlib.util.find_spec("torch_npu")` at import, which a stand-in must not answer.
    """
    for name in NPU_MODULES:
        if module_exists(name):  # each release has some of them
            importlib.import_module(name)
    _install_path_selection(patches, virtual_device=True)
    # the device module SGLang's NPU runners hold is the cpu's (`torch.get_device_module(runner.device)`)
    patches.setattr(torch.cpu, "current_device", current_device)
    patches.setattr(torch.cpu, "set_device", set_device)
    torch_npu = _torch_npu_package()
    for sub in ("profiler", "_C"):
        patches.setitem(sys.modules, f"torch_npu.{sub}", getattr(torch_npu, sub))
    patches.setitem(sys.modules, "torch_npu", torch_npu)
    runner = sys.modules.get(NPU_MODULES[0])
    if runner is not None:  # the names it binds at import only on an NPU (`if is_npu: import torch_npu ...`)
        for name, value in (("torch_npu", torch_npu), ("profile", torch_npu.profiler.profile),
                            ("ProfilerActivity", torch_npu.profiler.ProfilerActivity)):
            patches.setattr(runner, name, value, raising=False)

    if not (module_exists("sglang.srt.platforms") and module_exists(NPU_FULL_GRAPH_BACKEND_MODULE)):
        return  # up to 0.5.13: no platform object nor full-graph backend; the NPU runner is chosen by class
    from sglang.srt.hardware_backend.npu.graph_runner.npu_cudagraph_backend import NPUCudaGraphBackend
    from sglang.srt.platforms import current_platform

    hooks = {"is_out_of_tree": lambda: True, "get_full_graph_backend_cls": lambda: NPUCudaGraphBackend,
             "get_compile_backend": lambda mode=None: npugraph_ex_backend,
             "get_device_total_memory": lambda *a, **k: None}
    for name, hook in hooks.items():  # instance attributes over the class's methods; undo removes them again
        patches.setitem(vars(current_platform), name, hook)
