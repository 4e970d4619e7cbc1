"""The parent side of a world: start one process per rank, collect their records, reap them all.

`run_world(case)` starts the ranks, forked from a fork server that imported torch and SGLang once
(multiprocessing's for the installed SGLang, one of its own for a mutant's scratch copy), one Pipe each and each
rank's output in its own log file, then waits for every record within `timeout` seconds. Nothing is lost and
nothing is left behind:
- a rank that exits without a record crashed: `WorldOutcome.crashed` names it with its exit code and log tail;
- a rank still running at the deadline hangs (a collective its peers never joined): each such rank is asked for
  its threads' stacks (SIGUSR1, written to its log) before it is killed, and `WorldOutcome.hung` names it;
- once one rank has sent a failure record, the others get `grace` seconds to finish (they may be blocked in a
  collective the failed rank left), then are killed the same way.
Every rank process is killed and joined before `run_world` returns, whatever happened.
"""
from __future__ import annotations

import dataclasses
import multiprocessing
import os
import signal
import socket
import tempfile
import time
from multiprocessing import forkserver
from multiprocessing.connection import wait
from pathlib import Path

import pytest

from harness.targets.worlds.rank import Job, main
from harness.worlds.record import RankRecord
from harness.worlds.world import WorldCase

DEFAULT_TIMEOUT = 240.0  # seconds for a whole world once its ranks started: their build, capture, program
GRACE = 15.0
PRELOAD = "harness.targets.worlds.preload"
START_VARIABLE = "HARNESS_WORLD_START"  # "spawn": every rank a fresh interpreter (the default forks a fork server)


@dataclasses.dataclass
class WorldOutcome:
    records: dict[int, RankRecord]  # by rank, for the ranks that sent one
    crashed: dict[int, str]  # rank -> what is known (exit code, log tail)
    hung: dict[int, str]  # rank -> its stacks (log tail)
    seconds: float
    logs: dict[int, str]
    pids: dict[int, int]  # every rank's process, reaped

    def leftover(self) -> list[int]:
        """Rank processes still alive (none, after `run_world`)."""
        return [rank for rank, pid in self.pids.items() if Path(f"/proc/{pid}").exists()]

    @property
    def complete(self) -> bool:
        return not self.crashed and not self.hung


def _start_method():
    """How ranks start: forked from a fork server that imported torch and SGLang once (`preload`): multiprocessing's
    own for the installed SGLang, one of the root's for a mutant's scratch copy (`_root_server`)."""
    if os.environ.get(START_VARIABLE) == "spawn":
        return multiprocessing.get_context("spawn")
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload([PRELOAD])
    return context


_ROOT_SERVER: dict[str, forkserver.ForkServer] = {}  # the one fork server of a scratch root this process holds


def _root_server(sglang_root: str) -> forkserver.ForkServer:
    """A fork server whose preload imported `sglang_root`'s SGLang (PYTHONPATH names it first when it starts, as
    a spawned rank's would): its ranks start with the mutant imported, as the installed SGLang's do, instead of
    each importing torch and SGLang anew (about 15 s a rank on 2 cores). The server of another root is stopped
    first: one idle server (about 1 GiB) at a time."""
    for root in [r for r in _ROOT_SERVER if r != sglang_root]:
        _ROOT_SERVER.pop(root)._stop()
    if sglang_root not in _ROOT_SERVER:
        server = forkserver.ForkServer()
        server.set_forkserver_preload([PRELOAD])
        with pytest.MonkeyPatch.context() as patches:
            patches.setenv("PYTHONPATH", os.pathsep.join([sglang_root, os.environ.get("PYTHONPATH", "")])
                           .rstrip(os.pathsep))
            server.ensure_running()
        _ROOT_SERVER[sglang_root] = server
    return _ROOT_SERVER[sglang_root]


def _launch(context, job: Job, connection):
    """Start `job`'s rank: (its process, the context the next rank starts from). When no fork server can start the
    first rank (its preload died importing the mutant), the world's ranks are spawned, and each meets the import
    error itself: its record says so."""
    def rank_process(context):
        return context.Process(target=main, args=(job, connection), name=f"harness-rank{job.rank}", daemon=True)

    process = rank_process(context)
    try:
        _start(process, job.sglang_root)
    except (OSError, EOFError):
        if job.rank or context.get_start_method() == "spawn":
            raise
        context = multiprocessing.get_context("spawn")
        process = rank_process(context)
        process.start()
    return process, context


def _start(process, sglang_root: str | None) -> None:
    """Start a rank: from the root's fork server for a mutant (multiprocessing reads the module's
    `connect_to_new_process` at each start, so the rank comes from that server), else as its context starts it."""
    if sglang_root is None or not isinstance(process, multiprocessing.context.ForkServerProcess):
        process.start()
        return
    with pytest.MonkeyPatch.context() as patches:
        patches.setattr(forkserver, "connect_to_new_process", _root_server(sglang_root).connect_to_new_process)
        try:
            process.start()
        except (OSError, EOFError):  # the server died in its preload: the mutant's import raised (not ImportError)
            _ROOT_SERVER.pop(sglang_root)._stop()
            raise


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _cpus(ranks: int) -> str:
    """One core per rank, round robin over this machine's cores (SGLang's CPU engine binds each rank's threads)."""
    cores = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))
    return "|".join(str(cores[rank % len(cores)]) for rank in range(ranks))


def _tail(path: str, chars: int = 4000) -> str:
    try:
        return Path(path).read_text(errors="replace")[-chars:]
    except OSError:
        return ""


def run_world(case: WorldCase, checkpoint: str, *, timeout: float = DEFAULT_TIMEOUT, grace: float = GRACE,
              log_dir: str | None = None, stream_order: bool = True, coverage: dict | None = None,
              sglang_root: str | None = None) -> WorldOutcome:
    """Run `case` on `case.world.ranks` processes (module docstring); `sglang_root`: a folder whose `sglang` the
    ranks import first (a mutant's scratch copy)."""
    started = time.monotonic()
    log_dir = log_dir or tempfile.mkdtemp(prefix="harness-world-")
    context = _start_method()
    port, cpus = _free_port(), _cpus(case.world.ranks)
    processes, connections, logs, records = {}, {}, {}, {}
    try:
        for rank in range(case.world.ranks):
            logs[rank] = os.path.join(log_dir, f"rank{rank}.log")
            parent_end, child_end = context.Pipe(duplex=False)
            job = Job(case, rank, checkpoint, port, logs[rank], cpus, stream_order, coverage, sglang_root)
            process, context = _launch(context, job, child_end)
            child_end.close()
            processes[rank], connections[rank] = process, parent_end
        # the deadline counts from the ranks' start: a fork server's one-time preload (the first rank's start waits
        # for it, 15-25 s on a loaded 2-core machine) is not the world's work
        records.update(_collect(processes, connections, time.monotonic() + timeout, grace))
    finally:
        hung = _reap(processes, logs, records)
    crashed = {rank: f"exit code {processes[rank].exitcode}; log tail:\n{_tail(logs[rank])}"
               for rank in processes if rank not in records and rank not in hung}
    return WorldOutcome(records, crashed, hung, time.monotonic() - started, logs,
                        {rank: process.pid for rank, process in processes.items()})


def _collect(processes: dict, connections: dict, deadline: float, grace: float) -> dict[int, RankRecord]:
    """Each rank's record as it arrives, until all are in, the deadline passes, or `grace` after a failure."""
    records: dict[int, RankRecord] = {}
    pending = dict(connections)
    while pending and time.monotonic() < deadline:
        ready = set(wait([*pending.values(), *(processes[rank].sentinel for rank in pending)],
                         timeout=max(0.0, deadline - time.monotonic())))
        for rank, connection in list(pending.items()):
            if connection not in ready and processes[rank].sentinel not in ready:
                continue
            if connection.poll():
                try:
                    records[rank] = connection.recv()
                except (EOFError, OSError):
                    pass  # the pipe closed without a record: the rank died
                pending.pop(rank)
            elif not processes[rank].is_alive():
                pending.pop(rank)
        if any(record.failure for record in records.values()):
            deadline = min(deadline, time.monotonic() + grace)
    return records


def _reap(processes: dict, logs: dict, records: dict) -> dict[int, str]:
    """Kill what still runs without having sent its record (after asking it for its stacks) and join every
    process; returns those hung ranks with their log tails."""
    alive = {rank: p for rank, p in processes.items() if p.is_alive()}
    stuck = {rank: p for rank, p in alive.items() if rank not in records}
    for process in stuck.values():
        try:
            os.kill(process.pid, signal.SIGUSR1)
        except OSError:
            pass
    if stuck:
        time.sleep(1.0)
    for process in alive.values():
        process.kill()
    for process in processes.values():
        process.join(timeout=10)
    return {rank: _tail(logs[rank]) for rank in stuck}
