"""Stream ordering on the virtual device: a happens-before checker over its streams and events, in the spirit of
PyTorch's CUDA Sanitizer (`torch.cuda._sanitizer`, `TORCH_CUDA_SANITIZER=1`), whose bookkeeping classes it reuses
(`StreamSynchronizations`: per stream, the last sequence number of every stream it is ordered after; `Access`,
`TensorInfo`: per storage, the last write and the reads since).

Each aten op outside a capture is one "kernel" on the current virtual stream: it reads its inputs and writes its
mutated arguments and fresh outputs. An access on stream B to a storage last written (or, for a write, last read)
on stream A, with no event record + wait, `wait_stream` or synchronisation ordering A's access before it, is a
race: `RACES` gets one `Race` naming both streams, the tensor, both ops and both sites. On a GPU that is a data
race; the CPU, which runs everything in program order, would never show it.

Host memory is not on any stream: every virtual-device tensor is a CPU tensor, so the checker learns which are host
memory where a GPU would make them so, `Tensor.cpu()` and pinning (`mark_host`), and an op whose tensors are all host
memory is host work, its results host memory too, filed on no stream (SGLang's LoRA overlap loader slices an
adapter's host weights on its load stream). An op mixing the two (a copy to the device) files its device accesses
only.

What it does not see, and why: ops inside inductor's fused kernels (they bypass the dispatcher); work inside a
capture (a captured graph runs at replay, where its ops are seen again on the replaying stream); accesses from
outside torch (numpy views, `data_ptr` kernels). A host read of a device value (`.item()`) waits for its stream, as
on a GPU, and orders that stream's work before everything after it. A device synchronisation orders everything
before it, so the per-storage history is dropped there (it can no longer race), which keeps the checker cheap.
`HARNESS_STREAM_ORDER=off` turns the checker off, and so does a torch before 2.11 (`off_reason()` says why).
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
import weakref
from collections.abc import Iterator
from typing import Any

import torch
from torch.cuda._sanitizer import DEFAULT_STREAM_ID, Access, AccessType, StreamSynchronizations, TensorInfo
from torch.utils._python_dispatch import TorchDispatchMode

import harness.devices.host_memory as host_memory
import harness.devices.legality as legality

SWITCH = "HARNESS_STREAM_ORDER"
MAX_RACES = 20


def off_reason() -> str | None:
    """Why the checker is off in this process, or None when it is on."""
    if os.environ.get(SWITCH, "on").lower() in ("off", "0", "false", "no"):
        return f"{SWITCH}=off"
    if tuple(int(p) for p in torch.__version__.split(".")[:2]) < (2, 11):
        # checked on torch 2.9.1 (SGLang 0.5.9, 0.5.10): with any dispatch mode active, Dynamo hands SGLang's
        # piecewise backend graphs whose pieces are never captured (0 graphs instead of 9); 2.11 and later do not
        return f"torch {torch.__version__} (before 2.11, a dispatch mode changes what Dynamo compiles)"
    return None


def enabled() -> bool:
    return off_reason() is None


@dataclasses.dataclass
class Race:
    tensor: str  # dtype and shape of the tensor the second access touched
    storage: int  # its storage's address
    stream: int  # the stream of the second access
    operator: str
    site: str
    access: str  # "reading from" / "writing to"
    previous_stream: int
    previous_operator: str
    previous_site: str
    previous_access: str

    def describe(self) -> str:
        return (f"stream {self.stream} {self.access} {self.tensor} (storage {self.storage:#x}) in {self.operator} "
                f"at {self.site}, last {'written' if self.previous_access.startswith('writing') else 'read'} on stream "
                f"{self.previous_stream} in "
                f"{self.previous_operator} at {self.previous_site}, with no event record + wait, wait_stream or "
                "synchronize ordering the two")


# storage address -> weakref to a storage in host memory: a property of the memory, so kept across `reset()`
_HOST: dict[int, Any] = {}


class _Checker:
    def __init__(self) -> None:
        self.syncs = StreamSynchronizations()
        self.accesses: dict[int, tuple[Any, TensorInfo]] = {}  # storage address -> (weakref to it, history)
        self.seq_num = 0
        self.races: list[Race] = []
        self.streams = {DEFAULT_STREAM_ID}  # streams that ran work or were ordered, for the record
        self.events_recorded = 0
        self.waits = 0


_checker = _Checker()


def reset() -> None:
    """Forget every stream's history and every race (an example starts)."""
    global _checker
    _checker = _Checker()


def summary() -> dict:
    """What the checker saw since `reset()`: streams that ran work, events recorded, waits, races."""
    return {"streams": len(_checker.streams), "events_recorded": _checker.events_recorded,
            "waits": _checker.waits, "races": len(_checker.races)}


def races() -> list[Race]:
    return list(_checker.races)


# -- what streams and events report (streams.py) ----------------------------------------------------------------
def _ordering_counts() -> bool:
    return legality.capturing() is None  # inside a capture, records and waits become graph edges, not work


def stream_created(stream) -> None:
    if stream.stream_id != DEFAULT_STREAM_ID:
        _checker.syncs.create_stream(stream.stream_id)


def event_created(event) -> None:
    _checker.syncs.create_event(event.event_id)


def event_recorded(event, stream) -> None:
    if _ordering_counts():
        _checker.syncs.record_state(event.event_id, stream.stream_id)
        _checker.events_recorded += 1


def event_waited(event, stream) -> None:
    if _ordering_counts():
        _checker.syncs.stream_wait_for_event(stream.stream_id, event.event_id)
        _checker.waits += 1


def event_synchronized(event) -> None:
    _checker.syncs.all_streams_wait_for_event(event.event_id)


def stream_synchronized(stream) -> None:
    _checker.syncs.all_streams_wait_for_stream(stream.stream_id)


def device_synchronized() -> None:
    _checker.syncs.sync_all_streams()
    _checker.accesses.clear()  # everything before is ordered before everything after: no access can race now


# -- host memory ------------------------------------------------------------------------------------------------
def mark_host(tensor: torch.Tensor) -> torch.Tensor:
    """`tensor`'s storage is host memory (a `.cpu()` result, pinned memory): its accesses are on no stream."""
    if type(tensor) in (torch.Tensor, torch.nn.Parameter) and tensor.device.type == "cpu":
        storage = tensor.untyped_storage()
        if storage.data_ptr():
            _HOST[storage.data_ptr()] = weakref.ref(storage)
    return tensor


def is_host(tensor: torch.Tensor) -> bool:
    """Marked host memory, or pinned host memory (`harness.devices.host_memory`)."""
    storage = tensor.untyped_storage()
    entry = _HOST.get(storage.data_ptr())
    return (entry is not None and entry() is storage) or host_memory.is_pinned_host(tensor)


@contextlib.contextmanager
def host_copies() -> Iterator[None]:
    """`Tensor.cpu()` marks what it returns as host memory (on the virtual device it returns the tensor itself)."""
    original = torch.Tensor.cpu

    def cpu(self, *args, **kwargs):
        return mark_host(original(self, *args, **kwargs))

    torch.Tensor.cpu = cpu
    try:
        yield
    finally:
        torch.Tensor.cpu = original


# -- accesses ---------------------------------------------------------------------------------------------------
def _storage(value) -> torch.Tensor | None:
    if type(value) not in (torch.Tensor, torch.nn.Parameter) or value.device.type != "cpu":
        return None  # fake, meta and functional tensors of compilation carry no data
    return value


def _tensors(value):
    if isinstance(value, torch.Tensor):
        found = _storage(value)
        return [found] if found is not None else []
    if isinstance(value, (list, tuple)):
        return [t for v in value if isinstance(v, torch.Tensor) for t in _tensors(v)]
    return []


def _access(tensor: torch.Tensor, kind: AccessType, stream: int, operator: str, site: str, fresh: bool) -> None:
    storage = tensor.untyped_storage()
    address = storage.data_ptr()
    if not address:
        return
    checker = _checker
    entry = checker.accesses.get(address)
    if fresh or entry is None or entry[0]() is not storage:  # new, or the address was freed and reused
        entry = (weakref.ref(storage), TensorInfo(None))
        checker.accesses[address] = entry
    info = entry[1]
    access = Access(kind, checker.seq_num, stream, operator, [], False, site)
    previous = info.reads if kind is AccessType.WRITE and info.reads else [info.write]
    for before in previous:
        if before is not None and before.stream != stream and not checker.syncs.is_ordered_after(
                stream, before.seq_num, before.stream) and len(checker.races) < MAX_RACES:
            checker.races.append(Race(f"{str(tensor.dtype).removeprefix('torch.')}{list(tensor.shape)}", address,
                                      stream, operator, site, str(kind), before.stream, before.operator,
                                      before.stack_trace, str(before.type)))
    if kind is AccessType.WRITE:
        info.write, info.reads = access, []
    else:
        info.reads.append(access)


@functools.cache
def _plan(func) -> tuple[str, tuple[tuple[int, str, AccessType], ...], tuple[int, ...]]:
    """What an operator's schema says once, not per call: its name; per argument it touches, (position, name,
    READ or WRITE; views skipped: metadata only); the positions of the results it allocates (fresh storage)."""
    schema = func._schema
    arguments = tuple((position, argument.name, AccessType.READ if argument.alias_info is None else AccessType.WRITE)
                      for position, argument in enumerate(schema.arguments)
                      if argument.alias_info is None or argument.alias_info.is_write)
    fresh = tuple(position for position, result in enumerate(schema.returns) if result.alias_info is None)
    return f"aten.{func.overloadpacket.__name__}", arguments, fresh


class StreamOrderMode(TorchDispatchMode):
    """Sees every aten op outside a capture and files its accesses on the current stream. Dynamo keeps compiling
    under it (`ignore_compile_internals`), so compiled code and its guards run as without it."""

    def __init__(self, current_stream) -> None:
        super().__init__()
        self.current_stream = current_stream

    @classmethod
    def ignore_compile_internals(cls) -> bool:
        return True

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if legality.capturing() is not None:
            return out
        try:
            self._file(func, args, kwargs, out)
        except Exception as error:  # noqa: BLE001 - an op the checker cannot read is noted, never a crash
            legality.ADVISORIES.append(f"stream-order could not read {func}: {type(error).__name__}: {error}")
        return out

    def _file(self, func, args, kwargs, out) -> None:
        operator, arguments, fresh_returns = _plan(func)
        stream = self.current_stream().stream_id
        checker = _checker
        checker.seq_num += 1
        checker.syncs.update_seq_num(stream, checker.seq_num)
        if stream != DEFAULT_STREAM_ID:
            checker.streams.add(stream)
        site = legality.caller_site(3)  # the caller of __torch_dispatch__, outside torch
        touched = [(tensor, kind) for position, name, kind in arguments
                   for tensor in _tensors(args[position] if position < len(args) else kwargs.get(name))]
        returns = out if isinstance(out, (tuple, list)) else (out,)
        results = [tensor for position in fresh_returns if position < len(returns)
                   for tensor in _tensors(returns[position])]
        host = [is_host(tensor) for tensor, _ in touched]
        if touched and all(host):  # host work: on no stream, and what it makes is host memory too
            for tensor in results:
                mark_host(tensor)
            return
        for (tensor, kind), on_host in zip(touched, host):
            if not on_host:
                _access(tensor, kind, stream, operator, site, fresh=False)
        for tensor in results:
            _access(tensor, AccessType.WRITE, stream, operator, site, fresh=True)
        if func is torch.ops.aten._local_scalar_dense.default:
            # `.item()` (and `bool()`, `int()` of a device tensor) copies to the host and waits for the stream: all
            # of the stream's work so far is before whatever the host enqueues next, on any stream
            stream_synchronized(self.current_stream())
