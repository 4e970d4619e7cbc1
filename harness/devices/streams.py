"""Streams and events of the virtual device: objects with identity, so that what orders work between streams can
be checked, and so that synchronising during a capture fails as on CUDA.

The CPU runs all work in program order, so nothing here ever waits. What these objects do is tell the two checkers
what a GPU would do: `legality` refuses synchronisation while a capture is open; `stream_order` (when active)
learns which stream ran each op and which event record / wait / stream wait / synchronisation ordered them.
API as `torch.cuda`'s: `Stream(device=None, priority=0)` with `wait_event`, `wait_stream`, `record_event`,
`query`, `synchronize`; `Event(enable_timing=False, blocking=False, interprocess=False, external=False)` with
`record`, `wait`, `query`, `synchronize`, `elapsed_time`; `current_stream()`, `default_stream()`,
`set_stream(s)`, `stream(s)` (a context manager; None leaves the stream as it is), `synchronize()`.
"""
from __future__ import annotations

import itertools
import threading

import torch

import harness.devices.legality as legality
import harness.devices.stream_order as stream_order

_stream_ids = itertools.count(1)
_event_ids = itertools.count(1)
_current = threading.local()  # .stream


class _Waitable:
    """`query()` and `synchronize()`, refused while a capture is open, as on CUDA; `_synchronized()` tells the
    stream-order checker what the host now waited for."""

    def query(self) -> bool:
        legality.check_sync(f"torch.cuda.{type(self).__name__}.query")
        return True

    def synchronize(self) -> None:
        legality.check_sync(f"torch.cuda.{type(self).__name__}.synchronize")
        self._synchronized()


class Stream(_Waitable):
    """A stream with identity; `cuda_stream` / `stream_id` give its number (0: the default stream)."""

    def __init__(self, device=None, priority: int = 0, *, _stream_id: int | None = None, **ignored) -> None:
        self.stream_id = next(_stream_ids) if _stream_id is None else _stream_id
        self.priority = priority
        self.device = torch.device("cpu")
        self.device_index = 0
        self.device_type = 1  # what torch.Stream reports for a CPU stream
        stream_order.stream_created(self)

    @property
    def cuda_stream(self) -> int:
        return self.stream_id

    def wait_event(self, event: Event) -> None:
        event.wait(self)

    def wait_stream(self, stream: Stream) -> None:
        if stream is not self:
            self.wait_event(stream.record_event())

    def record_event(self, event: Event | None = None) -> Event:
        event = Event() if event is None else event
        event.record(self)
        return event

    def _synchronized(self) -> None:
        stream_order.stream_synchronized(self)

    def __enter__(self) -> Stream:  # `with stream:` as torch.Stream allows
        self._previous = current_stream()
        set_stream(self)
        return self

    def __exit__(self, *exc) -> None:
        set_stream(self._previous)

    def __repr__(self) -> str:
        return f"<virtual stream {self.stream_id}{' (default)' if self.stream_id == 0 else ''}>"


DEFAULT = Stream(_stream_id=0)


class Event(_Waitable):
    """An event with identity; record / wait order streams for the stream-order checker."""

    def __init__(self, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False,
                 external: bool = False, **ignored) -> None:
        self.event_id = next(_event_ids)
        self.recorded_on: Stream | None = None
        stream_order.event_created(self)

    def record(self, stream: Stream | None = None) -> None:
        self.recorded_on = current_stream() if stream is None else stream
        stream_order.event_recorded(self, self.recorded_on)

    def wait(self, stream: Stream | None = None) -> None:
        stream_order.event_waited(self, current_stream() if stream is None else stream)

    def _synchronized(self) -> None:
        stream_order.event_synchronized(self)

    def elapsed_time(self, end_event: Event) -> float:
        return 0.0

    def __repr__(self) -> str:
        return f"<virtual event {self.event_id}>"


def current_stream(device=None) -> Stream:
    return getattr(_current, "stream", DEFAULT)


def default_stream(device=None) -> Stream:
    return DEFAULT


def set_stream(stream: Stream) -> None:
    _current.stream = stream


class StreamContext:
    """`torch.cuda.stream(s)` (torch's `StreamContext`): work inside runs on `s` (None: unchanged). An object, not a
    generator, so that it can be entered again and again, as torch's is (SGLang's LoRA overlap loader keeps one)."""

    def __init__(self, target: Stream | None) -> None:
        self.target, self._previous = target, []

    def __enter__(self) -> None:
        if self.target is not None:
            self._previous.append(current_stream())
            set_stream(self.target)

    def __exit__(self, *exc) -> None:
        if self.target is not None:
            set_stream(self._previous.pop())


def stream(target: Stream | None) -> StreamContext:
    return StreamContext(target)


def synchronize(device=None) -> None:
    legality.check_sync("torch.cuda.synchronize")
    stream_order.device_synchronized()


# What the virtual device puts in place of torch.cpu's / torch.cuda's names (`install` in cpu.py)
NAMES = {"Stream": Stream, "Event": Event, "current_stream": current_stream, "default_stream": default_stream,
         "set_stream": set_stream, "stream": stream, "synchronize": synchronize}
