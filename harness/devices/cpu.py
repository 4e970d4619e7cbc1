"""The `cpu` virtual device: CUDA-graph semantics on the CPU, so graph bugs show up without a GPU.

Graph primitives (the public API; other suites may import these, nothing else here is public):

- `VirtualGraph()` -- stands in for `torch.cuda.CUDAGraph` / `torch.npu.NPUGraph`.
  `capture_begin(pool=None, ...)`, `capture_end()`, `replay()`, `reset()`, `pool()`, `update(cpu_update_input=...)`
  (the NPUGraph call; recorded in `graph.updates`). After capture: `graph.mode` ("record" or "rerun"),
  `graph.num_ops` (recorded aten ops, record mode), `graph.capture_site` ("file:line").
- `graph(cuda_graph, pool=None, stream=None, capture_error_mode=None, **ignored)` -- the `torch.cuda.graph` context
  manager: the block inside is captured into `cuda_graph`.
- `graph_pool_handle()` -> a `VirtualPoolHandle` (opaque, unique per call), `is_current_stream_capturing()` -> bool.
  Streams and events are `harness.devices.streams`' (objects with identity, in place of torch.cpu's and, with no
  GPU, torch.cuda's); `synchronize` is its `synchronize`.
- `weak_ref_tensor(t)` / `weak_ref_tensors(x)` -- SGLang's weak references: a tensor aliasing the same storage.
- `capture_mode(mode)` -- context manager choosing how captures made inside it work: "record" or "rerun".
- `CAPTURES` -- a list of `CaptureRecord(graph_id, mode, num_ops, site, num_launches)`, one per capture, in order;
  `reset_log()`. `num_launches`: the Triton kernel launches a record-mode capture kept (`record_launch`).
  Counts (graphs created, captured, replayed) are bumped on `harness.counter.counter`.
- `record_launch(name, run)` -- a kernel launch that is not an aten op (a Triton kernel run by the interpreter,
  `harness.devices.triton_interpreter`): outside a record-mode capture `run()` just runs; inside one it runs with
  the dispatch modes paused (the interpreter's own host copies are not the captured work, so neither the
  legality rules nor the stream-order checker see inside a launch) and is kept as one step, launched again at
  replay in order with the recorded aten ops, on the same tensors, scalars baked in.
- `install()` -- context manager that plugs all of the above in where SGLang looks (below) and undoes it on exit;
  it yields its `pytest.MonkeyPatch`, so a personality installed on top joins the same patch set. `installed()`
  says whether it is active.

What a capture means, in the two modes:
- "record": a `TorchDispatchMode` is active while the captured block runs; every aten op, its arguments and its
  outputs are kept. `replay()` runs the recorded ops again on the *same tensor objects*: functional ops recompute and
  copy into the tensors produced at capture, in-place / out= ops mutate their (static) arguments again, views are not
  re-run (they still alias the same storage), Python scalars passed to ops are baked in, as a CUDA graph bakes its
  kernel arguments (host reads of device values, `.item()`, `.tolist()`, are refused inside a capture, as CUDA
  refuses them: `harness.devices.legality`). Python branches, side effects
  and prints inside the block happen at capture only. Caveat (checked on torch 2.14): Dynamo does not run compiled
  frames while a dispatch mode is active, so a compiled function captured in record mode records its eager ops;
  inductor kernels bypass the dispatcher and could not be recorded anyway.
- "rerun": replay executes the captured `with` block's statements again (read from the source of the frame that
  entered the capture) in a snapshot of that frame's variables taken when the block ended, then copies every tensor
  the block assigned into the tensors it assigned at capture, so outputs still land in the same tensors. Right for
  compiled code (Dynamo guards are evaluated and inductor kernels run at each replay); Python in the block does run
  again, so frozen-branch bugs are not visible in this mode.
In both modes a capture must run on a side stream (`graph` without a stream uses a shared one, as torch's does, and
synchronises the device first), and while it is open `harness.devices.legality` refuses what CUDA refuses during
stream capture, with CUDA's text (its docstring lists the rules enforced and not). Outside captures, while
installed, `harness.devices.stream_order` files every op's accesses on the current virtual stream and reports
accesses across streams that no event, stream wait or synchronisation orders.

Where it plugs in (`install`): `torch.cpu` gains `graph`, `CUDAGraph`, `graph_pool_handle`,
`is_current_stream_capturing` (the runners take `torch.get_device_module(model_runner.device)`);
`torch.cuda.CUDAGraph`, `torch.cuda.graph`, `torch.cuda.graph_pool_handle` and
`torch.cuda.is_current_stream_capturing`, the stream and event names (`Stream`, `Event`, `current_stream`,
`default_stream`, `set_stream`, `stream`, `synchronize`, on both `torch.cpu` and `torch.cuda`) and the CUDA
generator's seed and state calls are swapped while no real GPU is present (SGLang's full-graph and piecewise
backends name them directly); `torch.get_device_module` is wrapped (`functools.wraps`, so `__wrapped__` exists) to
map a call without a device to `torch.cpu`, as `GroupCoordinator.graph_capture` makes; SGLang's `weak_ref_tensor`
module (which raises at import on a CPU) is provided under both of its names. The npu personality
(`harness.personalities.ascend`) is built on top of this module; this module knows nothing of it.
"""
from __future__ import annotations

import ast
import contextlib
import dataclasses
import functools
import gc
import itertools
import linecache
import sys
import types
from typing import Any
from collections.abc import Iterator

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from harness.counter import counter
from harness.devices.collectives import wait_for_tensors, wait_for_work
import harness.devices.dynamo_in_capture as dynamo_in_capture
import harness.devices.legality as legality
import harness.devices.memory_history as memory_history
import harness.devices.stream_order as stream_order
import harness.devices.streams as streams

__all__ = [
    "VirtualGraph", "VirtualPoolHandle", "graph", "graph_pool_handle", "is_current_stream_capturing",
    "weak_ref_tensor", "weak_ref_tensors", "capture_mode", "replaying", "CAPTURES", "CaptureRecord", "reset_log",
    "install", "installed", "GraphCaptureError", "record_launch",
]

MODES = ("record", "rerun")


class GraphCaptureError(RuntimeError):
    """A capture or replay the virtual device cannot honour (as a real CUDA graph could not)."""


@dataclasses.dataclass
class CaptureRecord:
    graph_id: int
    mode: str
    num_ops: int
    site: str
    num_launches: int = 0  # Triton kernel launches recorded (record mode)
    # Dynamo inside the capture (`oracles.recompile`): frames compiled (rerun mode), and frames whose cache would
    # miss, each with its failed guard (record mode, where Dynamo runs them eagerly: `dynamo_in_capture`)
    compiles: int = 0
    cache_misses: tuple[str, ...] = ()


CAPTURES: list[CaptureRecord] = []
_device = types.SimpleNamespace(capture_mode="record", installs=0)  # set only through MonkeyPatch, so undone
_graph_ids = itertools.count(1)
_pool_ids = itertools.count(1)


def reset_log() -> None:
    CAPTURES.clear()
    memory_history.reset()


@contextlib.contextmanager
def capture_mode(mode: str) -> Iterator[None]:
    """Captures started inside this block use `mode` ("record" or "rerun")."""
    if mode not in MODES:
        raise ValueError(f"capture mode {mode!r} is not one of {MODES}")
    with pytest.MonkeyPatch.context() as patches:
        patches.setattr(_device, "capture_mode", mode)
        yield


_REPLAYING: list = []  # the rerun-mode graphs whose captured block is running again now (innermost last)


def replaying() -> bool:
    """Whether a rerun-mode replay is re-running its captured block now: the Python there sees the capture's frozen
    host values beside the live buffers, as a CUDA graph's kernels would (checks of the hand-offs skip it)."""
    return bool(_REPLAYING)


def current_capture_mode() -> str:
    return _device.capture_mode


def is_current_stream_capturing() -> bool:
    return legality.capturing() is not None


@dataclasses.dataclass(frozen=True)
class VirtualPoolHandle:
    """Opaque memory-pool handle, as `graph_pool_handle()` returns on CUDA."""
    pool_id: int


def graph_pool_handle() -> VirtualPoolHandle:
    return VirtualPoolHandle(next(_pool_ids))


# What `torch.cuda.get_device_properties` answers for the virtual device: an H100's SM count, which SGLang's Triton
# kernels size their launch grids by (the gated RMSNorm of the linear-attention layers). Nothing else: a caller
# choosing a code path by compute capability or memory gets an AttributeError naming what it read.
DEVICE_PROPERTIES = types.SimpleNamespace(name="virtual device (cpu)", multi_processor_count=132)


def get_device_properties(device: Any = None) -> types.SimpleNamespace:
    return DEVICE_PROPERTIES


@contextlib.contextmanager
def device_guard(index: Any = None) -> Iterator[None]:
    """`torch.cuda.device(index)`'s twin for the one virtual device (SGLang's `device_context` enters it around
    kernel launches: `torch.get_device_module(tensor.device).device(tensor.device.index)`)."""
    yield


def weak_ref_tensor(tensor: Any) -> Any:
    """A tensor sharing `tensor`'s storage (what SGLang's kernel returns), non-tensors unchanged."""
    if isinstance(tensor, torch.Tensor):
        return tensor.detach()
    return tensor


def weak_ref_tensors(tensors: Any) -> Any:
    if isinstance(tensors, torch.Tensor):
        return weak_ref_tensor(tensors)
    if isinstance(tensors, list):
        return [weak_ref_tensor(t) for t in tensors]
    if isinstance(tensors, tuple):
        return tuple(weak_ref_tensor(t) for t in tensors)
    raise ValueError("Invalid type for tensors")


# --------------------------------------------------------------------------------------------------------------
# Tensor leaves of outputs (tensors inside tuples, lists, dicts, dataclasses such as LogitsProcessorOutput)
# --------------------------------------------------------------------------------------------------------------
def _tensor_leaves(value: Any, depth: int = 0) -> list[torch.Tensor]:
    if depth > 6:
        return []
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, dict):
        return [t for v in value.values() for t in _tensor_leaves(v, depth + 1)]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _tensor_leaves(v, depth + 1)]
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return [t for f in dataclasses.fields(value) for t in _tensor_leaves(getattr(value, f.name), depth + 1)]
    tensors = getattr(value, "tensors", None)  # PPProxyTensors
    if isinstance(tensors, dict):
        return _tensor_leaves(tensors, depth + 1)
    return []


# --------------------------------------------------------------------------------------------------------------
# Record mode
# --------------------------------------------------------------------------------------------------------------
_SKIP_AT_REPLAY = {"empty", "empty_strided", "empty_like", "new_empty", "new_empty_strided"}


@dataclasses.dataclass
class _Step:
    func: Any
    args: tuple
    kwargs: dict
    outputs: list  # captured output tensors (functional ops)
    kind: str  # "compute" | "mutate" | "launch" (func: a kernel launch closure, `record_launch`)


def _storage_key(t: torch.Tensor):
    try:
        return t.untyped_storage().data_ptr()
    except Exception:  # noqa: BLE001 - tensors without storage
        return None


class _Recorder(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.steps: list[_Step] = []
        self.host_reads = 0
        self.views = 0
        self.launches = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        schema = func._schema
        mutates = any(a.alias_info is not None and a.alias_info.is_write for a in schema.arguments)
        if mutates or func.namespace == "c10d":  # a collective writes the tensors it returns (no alias marks)
            self.steps.append(_Step(func, args, kwargs, [], "mutate"))
            return out
        outs = _tensor_leaves(out)
        if not outs:
            self.host_reads += 1  # .item(), .tolist(), sizes: the value is baked into what follows
            return out
        inputs = {_storage_key(t) for t in _tensor_leaves((args, kwargs))}
        if any(r.alias_info is not None for r in schema.returns) or any(
                _storage_key(t) in inputs for t in outs):
            self.views += 1  # a view keeps aliasing the same storage: nothing to redo
            return out
        if func.overloadpacket.__name__ in _SKIP_AT_REPLAY:
            return out
        self.steps.append(_Step(func, args, kwargs, outs, "compute"))
        return out


def record_launch(name: str, run: Any) -> Any:
    """Run the kernel launch `run()`; inside a record-mode capture, also keep it for replay (module docstring)."""
    graph_ = legality.capturing()
    recorder = getattr(graph_, "_recorder", None)
    if recorder is None:
        return run()
    from torch.utils._python_dispatch import _disable_current_modes

    with _disable_current_modes():
        result = run()
    run.__name__ = f"launch:{name}"
    recorder.steps.append(_Step(run, (), {}, [], "launch"))
    recorder.launches += 1
    return result


def _replay_steps(steps: list[_Step]) -> None:
    for step in steps:
        if step.kind == "launch":
            from torch.utils._python_dispatch import _disable_current_modes

            with _disable_current_modes():  # as at capture: the launch's host copies are not filed as work
                step.func()
            continue
        result = step.func(*step.args, **step.kwargs)
        if step.kind == "mutate":
            wait_for_work(result)  # a collective (c10d op) finishes before the next step reads it
            continue
        if step.func.namespace == "_c10d_functional":  # a functional collective's output is ready once waited
            result = wait_for_tensors(result)
        fresh = _tensor_leaves(result)
        if len(fresh) != len(step.outputs):
            raise GraphCaptureError(
                f"replay of {step.func} produced {len(fresh)} outputs, captured {len(step.outputs)}")
        for captured, new in zip(step.outputs, fresh):
            if captured.shape != new.shape:
                raise GraphCaptureError(
                    f"replay of {step.func} produced shape {tuple(new.shape)}, captured {tuple(captured.shape)}: "
                    "a data-dependent shape cannot be captured in a graph")
            captured.copy_(new)


# --------------------------------------------------------------------------------------------------------------
# Rerun mode: the `with` block that entered the capture, read from source
# --------------------------------------------------------------------------------------------------------------
@functools.lru_cache(maxsize=256)
def _module_tree(filename: str) -> ast.Module | None:
    source = "".join(linecache.getlines(filename))
    if not source:
        return None
    return ast.parse(source, filename)


def _with_block(frame: types.FrameType) -> tuple[Any, list[str]]:
    """The compiled body of the innermost `with` statement whose item is being entered at `frame.f_lineno`."""
    filename, line = frame.f_code.co_filename, frame.f_lineno
    tree = _module_tree(filename)
    if tree is None:
        raise GraphCaptureError(f"rerun capture needs the source of {filename}")
    best = None
    for node in ast.walk(tree):
        if isinstance(node, ast.With) and node.lineno <= line <= max(
                item.context_expr.end_lineno for item in node.items):
            if best is None or node.lineno >= best.lineno:
                best = node
    if best is None:
        raise GraphCaptureError(f"rerun capture: no `with` statement at {filename}:{line}")
    body = ast.Module(body=best.body, type_ignores=[])
    assigned = sorted({n.id for n in ast.walk(body) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)})
    code = compile(body, f"<rerun of {filename}:{best.lineno}>", "exec")
    return code, assigned


class VirtualGraph:
    """A CUDA-graph stand-in; see the module docstring."""

    def __init__(self, *args, **kwargs) -> None:
        self.graph_id = next(_graph_ids)
        self.mode: str | None = None
        self.num_ops = 0
        self.num_launches = 0
        self.capture_site = ""
        self.updates: list = []
        self.replays = 0  # this graph's replays (which graph a runner picked: `oracles.graph_key`)
        self._pool = None
        self._steps: list[_Step] = []
        self._recorder: _Recorder | None = None
        self._rerun: tuple | None = None
        self._frame: types.FrameType | None = None
        self._captured = False
        counter.num_graphs_created += 1

    # -- capture ------------------------------------------------------------------------------------------------
    def capture_begin(self, pool=None, capture_error_mode=None, *, _frame=None) -> None:
        if is_current_stream_capturing():
            raise GraphCaptureError("a graph capture is already in progress on this thread")
        if streams.current_stream() is streams.DEFAULT:
            legality.refuse("default-stream", "CUDAGraph.capture_begin", legality.DEFAULT_STREAM)
        self._pool = pool if pool is not None else graph_pool_handle()
        self.mode = current_capture_mode()
        self._frame = _frame if _frame is not None else sys._getframe(1)
        self.capture_site = f"{self._frame.f_code.co_filename}:{self._frame.f_lineno}"
        legality.begin(self)
        self._compiles_at_begin = counter.num_dynamo_frames_compiled
        self._cache_misses: list[str] = []
        if self.mode == "record":
            self._dynamo_watch = dynamo_in_capture.watching(self._cache_misses)
            self._dynamo_watch.__enter__()
            self._recorder = _Recorder()
            self._recorder.__enter__()

    def capture_end(self) -> None:
        try:
            if self.mode == "record" and self._recorder is not None:
                self._dynamo_watch.__exit__(None, None, None)
                self._recorder.__exit__(None, None, None)
                self._steps = self._recorder.steps
                self.num_launches = self._recorder.launches
                self.num_ops = len(self._steps) - self.num_launches
                self._recorder = None
            elif self.mode == "rerun":
                code, assigned = _with_block(self._frame)
                snapshot = dict(self._frame.f_locals)
                self._rerun = (code, self._frame.f_globals, snapshot, assigned)
        finally:
            legality.end()
            self._frame = None
        self._captured = True
        counter.num_graphs_captured += 1
        CAPTURES.append(CaptureRecord(self.graph_id, self.mode, self.num_ops, self.capture_site, self.num_launches,
                                      counter.num_dynamo_frames_compiled - self._compiles_at_begin,
                                      tuple(self._cache_misses)))

    def _abort(self) -> None:
        if self._recorder is not None:
            self._dynamo_watch.__exit__(None, None, None)
            self._recorder.__exit__(None, None, None)
            self._recorder = None
        legality.end()
        self._frame = None

    # -- replay -------------------------------------------------------------------------------------------------
    def replay(self) -> None:
        if not self._captured:
            raise GraphCaptureError("replay() of a graph that was never captured")
        if self.mode == "record":
            with torch.no_grad():
                _replay_steps(self._steps)
        else:
            code, globals_, snapshot, assigned = self._rerun
            namespace = dict(snapshot)
            _REPLAYING.append(self)
            try:
                exec(code, globals_, namespace)  # noqa: S102 - re-running captured source is the point of this mode
            finally:
                _REPLAYING.pop()
            for name in assigned:
                old, new = _tensor_leaves(snapshot.get(name)), _tensor_leaves(namespace.get(name))
                if len(old) != len(new):
                    raise GraphCaptureError(f"rerun of {self.capture_site}: `{name}` changed structure")
                with torch.no_grad():
                    for captured, fresh in zip(old, new):
                        if captured is not fresh:
                            captured.copy_(fresh)
        self.replays += 1
        counter.num_graph_replays += 1

    def update(self, cpu_update_input=None, **kwargs) -> None:
        """NPUGraph.update: rebinds host-side kernel arguments. Recorded; the static buffers already carry them."""
        self.updates.append(cpu_update_input if cpu_update_input is not None else kwargs)

    def reset(self) -> None:
        self._steps, self._rerun, self._captured = [], None, False

    def pool(self):
        return self._pool

    def enable_debug_mode(self) -> None:  # torch.cuda.CUDAGraph API
        pass

    def debug_dump(self, path: str) -> None:
        with open(path, "w") as f:
            f.write("\n".join(str(s.func) for s in self._steps))

    def __repr__(self) -> str:
        return f"VirtualGraph(id={self.graph_id}, mode={self.mode}, ops={self.num_ops})"


def held_graphs(owner: object) -> set[int]:
    """Ids of the captured graphs (not `reset()`) that `owner` still reaches through its attributes and
    containers: what a backend's cleanup must release (CUDA frees a graph's memory on reset or when the last
    reference goes) while the runner itself stays referenced. Modules, classes and functions are not walked."""
    seen, held, todo = set(), set(), [owner]
    while todo:
        obj = todo.pop()
        if id(obj) in seen or isinstance(obj, (types.ModuleType, type, types.FunctionType, torch.Tensor)):
            continue
        seen.add(id(obj))
        if isinstance(obj, VirtualGraph):
            if obj._captured:
                held.add(obj.graph_id)
            continue
        todo.extend(gc.get_referents(obj))
    return held


class graph:  # noqa: N801 - mirrors torch.cuda.graph
    """`with graph(g, pool=..., stream=...):` captures the block into `g` (a `VirtualGraph`). As torch's: without a
    stream it captures on one side stream shared by all such captures, and it synchronises the device first."""

    default_capture_stream: streams.Stream | None = None

    def __init__(self, cuda_graph, pool=None, stream=None, capture_error_mode=None, **ignored) -> None:
        if not isinstance(cuda_graph, VirtualGraph):
            raise GraphCaptureError(f"the virtual device cannot capture into a {type(cuda_graph).__name__}")
        if stream is None and graph.default_capture_stream is None:
            graph.default_capture_stream = streams.Stream()
        self.cuda_graph = cuda_graph
        self.pool = pool
        self.stream = stream if stream is not None else graph.default_capture_stream
        self._stream_ctx = None

    def __enter__(self):
        streams.synchronize()
        self._stream_ctx = streams.stream(self.stream)
        self._stream_ctx.__enter__()
        self.cuda_graph.capture_begin(self.pool, _frame=sys._getframe(1))
        return None

    def __exit__(self, exc_type, exc, tb):
        try:
            if exc_type is None:
                self.cuda_graph.capture_end()
            else:
                self.cuda_graph._abort()
        finally:
            self._stream_ctx.__exit__(exc_type, exc, tb)
        return False


# --------------------------------------------------------------------------------------------------------------
# Installation
# --------------------------------------------------------------------------------------------------------------
WEAK_REF_MODULES = (
    "sglang.srt.model_executor.runner_backend_utils.weak_ref_tensor",  # 0.5.14 and later
    "sglang.srt.compilation.weak_ref_tensor",  # older releases
)


def installed() -> bool:
    return _device.installs > 0


def _weak_ref_module(name: str) -> types.ModuleType:
    module = types.ModuleType(name, "harness.devices.cpu: SGLang's weak_ref_tensor on the virtual device")
    module.weak_ref_tensor = weak_ref_tensor
    module.weak_ref_tensors = weak_ref_tensors
    module.__file__ = __file__
    return module


def _own_copy(value):
    """A function of its own wrapping `value` (classes as they are)."""
    if isinstance(value, type):
        return value

    @functools.wraps(value)
    def call(*args, **kwargs):
        return value(*args, **kwargs)

    return call


def _wrap_get_device_module(original):
    @functools.wraps(original)
    def get_device_module(device=None):
        if device is None:
            return torch.cpu
        return original(device)

    return get_device_module


def _record_stream(original):
    @functools.wraps(original)
    def record_stream(self, stream):
        """On a virtual stream: CUDA's caching allocator would keep the tensor's memory from reuse until the work
        queued on `stream` is done; the virtual device runs a stream's work as it is issued, so nothing is kept."""
        if isinstance(stream, streams.Stream):
            return None
        return original(self, stream)

    return record_stream


@contextlib.contextmanager
def install() -> Iterator[pytest.MonkeyPatch]:
    """Plug the virtual device into torch and SGLang for the duration of the block; nests; undone on exit.

    Yields the block's patch set: patches a personality adds to it are undone with the device's, as one unit."""
    if torch.cuda.is_available():
        raise GraphCaptureError("the cpu virtual device would shadow a real GPU; use --device cuda")
    with pytest.MonkeyPatch.context() as patches:
        for name, value in (("graph", graph), ("CUDAGraph", VirtualGraph), ("graph_pool_handle", graph_pool_handle),
                            ("is_current_stream_capturing", is_current_stream_capturing)):
            patches.setattr(torch.cpu, name, value, raising=False)
            patches.setattr(torch.cuda, name, value)
        patches.setattr(torch.cuda, "get_device_properties", get_device_properties)
        patches.setattr(torch.cpu, "device", device_guard, raising=False)
        for name, value in streams.NAMES.items():
            patches.setattr(torch.cpu, name, value, raising=False)
            patches.setattr(torch.cuda, name, _own_copy(value))  # Dynamo keys handlers by function: one each
        legality.install_generator_rules(patches)
        memory_history.install(patches, is_current_stream_capturing)
        patches.setattr(torch, "get_device_module", _wrap_get_device_module(torch.get_device_module))
        patches.setattr(torch.Tensor, "record_stream", _record_stream(torch.Tensor.record_stream))
        for name in WEAK_REF_MODULES:
            patches.setitem(sys.modules, name, _weak_ref_module(name))
            parent, _, leaf = name.rpartition(".")
            if parent in sys.modules:
                patches.setattr(sys.modules[parent], leaf, sys.modules[name], raising=False)
        patches.setattr(_device, "installs", _device.installs + 1)
        with _stream_order_checked():
            yield patches


@contextlib.contextmanager
def _stream_order_checked() -> Iterator[None]:
    """The stream-order checker's dispatch mode while the device is installed (unless `HARNESS_STREAM_ORDER=off`);
    nested installs share the outer one's."""
    if not stream_order.enabled() or _device.installs > 1:
        yield
        return
    with stream_order.StreamOrderMode(streams.current_stream), stream_order.host_copies():
        yield
