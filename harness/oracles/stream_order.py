"""Oracle `stream-order`: no access on one virtual stream to data last touched on another without an event record
and wait, a `wait_stream` or a synchronisation ordering them (`harness.devices.stream_order`, after PyTorch's CUDA
Sanitizer). Each example's record says what the checker saw (streams, events, waits) or that it was off; an
example whose code used one stream and no event passes trivially, and the record says so.
"""
from __future__ import annotations

import contextlib
from collections.abc import Iterator

from harness.devices import cpu, stream_order
from harness.oracles import OracleFailure

ORACLE = "stream-order"


def describe_run(seen: dict) -> str:
    if not stream_order.enabled():
        return f"off ({stream_order.off_reason()})"
    if not cpu.installed():
        return "not run: the virtual device is not installed (real hardware, or no device at all)"
    if seen["streams"] <= 1 and not seen["events_recorded"]:
        return "trivially ordered: one stream, no events"
    return (f"checked: {seen['streams']} streams ran work, {seen['events_recorded']} event records, "
            f"{seen['waits']} waits")


def failure() -> OracleFailure | None:
    races = stream_order.races()
    if not races:
        return None
    first = races[0]
    return OracleFailure(ORACLE, f"unordered access across streams: {first.describe()}",
                         streams=f"{first.previous_stream} -> {first.stream}", tensor=first.tensor,
                         site=first.site, previous_site=first.previous_site,
                         more=[r.describe() for r in races[1:4]])


@contextlib.contextmanager
def checking(ex) -> Iterator[None]:
    """Around one example: a race inside it fails the example once the example's own code is done."""
    stream_order.reset()
    yield
    ex.note("stream_order", describe_run(stream_order.summary()))
    found = failure()
    if found is not None:
        raise found
