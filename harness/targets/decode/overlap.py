"""The overlap scheduler's streams around the decode runner: who writes the scheduler-shared table, who waits.

With overlap scheduling (0.5.2x `Scheduler.event_loop_overlap`) the schedule stream stages the next batch while
the forward stream still runs the current one. Buffers both sides use (the request-to-token table a backend's
metadata reads) are fenced by a write-after-read barrier: the decode runner publishes, per replay, the event
after which its shared reads are done (`model_runner.shared_read_done_event`, recorded where the backend's
`shared_read_ends(mode)` says: before the replay, in it, or after it), and SGLang's own
`Scheduler._apply_war_barrier` makes the schedule stream wait on that event (or on the whole forward stream when
none was published) before it writes again.

The harness plays the scheduler's part in the order `event_loop_overlap` and `run_batch` use: stage batch k's rows
of the shared table on the schedule stream, `forward_stream.wait_stream(schedule_stream)`, replay k on the forward
stream, then `_apply_war_barrier` (SGLang's, unbound). The attention double reads the table where it declares:
out of the graph always, inside the graph unless it declared PRE_REPLAY. The virtual device's stream-order
checker then judges the events: a read-done event recorded before the graph's reads, or none waited for, is a race
between the graph's read and the next staging write, reported with both streams and ops.
"""
from __future__ import annotations

from types import SimpleNamespace
from collections.abc import Callable

import torch

from harness.targets.sglang_plumbing import load
from harness.versions import sglang_version

SCHEDULER_MODULE = "sglang.srt.managers.scheduler"
READ_ENDS = ("PRE_REPLAY", "IN_REPLAY", "POST_REPLAY", "UNKNOWN")  # SharedReadEnds names a backend may declare
TABLE_ROWS = 256  # the shared table's rows: more than any pool row a batch draws


def missing() -> str | None:
    """Why the installed SGLang has no write-after-read barrier to drive (naming what it lacks), or None."""
    try:
        scheduler = load(SCHEDULER_MODULE).Scheduler
        base = load("sglang.srt.layers.attention.base_attn_backend")
    except ImportError as error:  # a release whose scheduler imports what this environment lacks
        return f"SGLang {sglang_version()} has no importable {SCHEDULER_MODULE} here ({error}): no overlap WAR barrier"
    if not hasattr(scheduler, "_apply_war_barrier"):
        return f"SGLang {sglang_version()} has no Scheduler._apply_war_barrier: no overlap WAR barrier to drive"
    if not hasattr(base, "SharedReadEnds"):
        return f"SGLang {sglang_version()} has no SharedReadEnds: backends declare no read ends"
    return None


def shared_table(device: str) -> torch.Tensor:
    """The scheduler-shared table (one int32 column per pool row, as a slice of `req_to_token`)."""
    return torch.zeros((TABLE_ROWS, 1), dtype=torch.int32, device=device)


class OverlapLoop:
    """Replays through the runner in the overlap scheduler's stream order (module docstring)."""

    def __init__(self, target) -> None:
        self.device_module = torch.get_device_module(target.device)
        self.table = target.attn_backend.shared_table
        self.forward_stream = self.device_module.current_stream()
        self.schedule_stream = self.device_module.Stream()
        # What `_apply_war_barrier` reads of the scheduler: the worker's last shared-reading runner, both streams.
        self.scheduler = SimpleNamespace(
            _war_barrier_enabled=True, schedule_stream=self.schedule_stream, forward_stream=self.forward_stream,
            model_worker=SimpleNamespace(last_shared_read_runner=target.model_runner))
        self.barrier = load(SCHEDULER_MODULE).Scheduler._apply_war_barrier
        self.published: list[str] = []  # per replay: "event" (the runner's read-done event) or "none" (coarse)

    def stage(self, batch) -> None:
        """The schedule stream writes the batch's rows of the shared table (the next step's token slot)."""
        with self.device_module.stream(self.schedule_stream):
            rows = torch.tensor(batch.pool_rows, dtype=torch.int64, device=self.table.device)
            self.table[rows, 0] = torch.tensor(batch.cache_slots[: len(batch.pool_rows)], dtype=torch.int32,
                                               device=self.table.device)

    def wrap(self, replay: Callable) -> Callable:
        """`replay(batch, step) -> (output, batch replayed)` played in the overlap order."""
        def overlapped(batch, step):
            self.stage(batch)
            self.forward_stream.wait_stream(self.schedule_stream)  # run_batch: the forward waits for the staging
            with self.device_module.stream(self.forward_stream):
                result = replay(batch, step)
            runner = self.scheduler.model_worker.last_shared_read_runner
            self.published.append("event" if runner.shared_read_done_event is not None else "none")
            self.barrier(self.scheduler)  # SGLang's WAR barrier, as the loop calls it after run_batch
            return result
        return overlapped
