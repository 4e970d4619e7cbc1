"""The process of one rank: the virtual device, gloo collectives, then the rank's server and its program.

`main(job, connection)` runs in a fresh interpreter (multiprocessing's spawn: no state inherited from the parent's
SGLang, as each rank of a real server is its own process). What the rank prints goes to its log file; on SIGUSR1
it writes every thread's stack there (the parent asks before it kills a rank that hangs). It sends back one
`RankRecord`; an exception of SGLang's (a configuration it refuses, a crash in a capture) comes back as the
record's failure, with the traceback.
"""
from __future__ import annotations

import dataclasses
import os
import sys
import traceback


@dataclasses.dataclass
class Job:
    case: object  # WorldCase
    rank: int
    checkpoint: str
    dist_port: int
    log: str
    cpus: str  # SGLANG_CPU_OMP_THREADS_BIND: the cores of each rank, "|"-separated
    stream_order: bool = True
    coverage: dict | None = None  # `SGLangCoverage.child`: measure this rank's SGLang code into the run's data
    sglang_root: str | None = None  # a folder whose `sglang` this rank imports first (a mutant's scratch copy)


def _redirect_output(path: str) -> None:
    import faulthandler
    import signal

    log = open(path, "a", buffering=1)  # noqa: SIM115 - the process's stdout and stderr until it exits
    os.dup2(log.fileno(), 1)
    os.dup2(log.fileno(), 2)
    sys.stdout = sys.stderr = log
    faulthandler.register(signal.SIGUSR1, file=log, all_threads=True)


def main(job: Job, connection) -> None:
    _redirect_output(job.log)
    if job.sglang_root:
        sys.path.insert(0, job.sglang_root)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    # SGLang's CPU engine binds each rank's OpenMP threads to its cores (numa_utils): one core each here
    os.environ["SGLANG_CPU_OMP_THREADS_BIND"] = job.cpus
    if not job.stream_order:
        os.environ["HARNESS_STREAM_ORDER"] = "off"
    from harness.worlds.record import RankRecord, said

    try:
        record = _serve(job)
    except BaseException as error:  # noqa: BLE001 - whatever stops the rank is its record
        traceback.print_exc()  # whole, in the rank's log
        record = RankRecord(job.rank, {}, [], failure={
            "oracle": "world-rank", "diagnosis": said(error), "traceback": _ends(traceback.format_exc())})
    connection.send(record)
    connection.close()


def _ends(text: str, chars: int = 3000) -> str:
    """The first and the last `chars` characters of a long traceback: where it started, and where it broke."""
    return text if len(text) <= 2 * chars else f"{text[:chars]}\n[...]\n{text[-chars:]}"


def _serve(job: Job):
    import pytest

    from harness.compat import prepare_torchvision
    from harness.devices import collectives, get_device
    from harness.devices.gc_policy import freeze_heap
    from harness.sglang_coverage import measuring

    prepare_torchvision()
    freeze_heap("cpu")  # SGLang's collections around each capture then skip the imported heap (0.9 s a rank)
    with measuring(job.coverage), get_device("cpu").install("cuda"), pytest.MonkeyPatch.context() as patches:
        collectives.install(patches)
        from harness.targets.worlds.serving import RankServer

        server = RankServer(job.case, job.rank, job.checkpoint, job.dist_port)
        return server.play()
