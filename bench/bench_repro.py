"""Seconds `python -m harness repro` takes to reproduce known bug 2 from a traceback pasted from SGLang 0.5.9.

The log is what a user of 0.5.9 with mixed chunked prefill sees (the scheduler's traceback ending in the stream
assertion, with the batch's forward mode in the log line above it). It runs in the 0.5.9 environment
(`.venvs/sglang-0.5.9`, built by hand from requirements/sglang-0.5.9.txt) and prints the wall time, the signature
found, and whether the standalone script failed as reported. The regression it would pin is removed again (a pin
of 0.5.9's failure does not belong in the repository).

Usage: python bench/bench_repro.py [--python .venvs/sglang-0.5.9/bin/python] [--budget 300]
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PASTED_0_5_9 = """\
[2026-03-02 10:11:12 TP0] Prefill batch. #new-seq: 2, #new-token: 6, #cached-token: 0, forward_mode=ForwardMode.MIXED
[2026-03-02 10:11:12 TP0] Scheduler hit an exception: Traceback (most recent call last):
  File "/usr/local/lib/python3.11/site-packages/sglang/srt/managers/scheduler.py", line 2713, in run_scheduler_process
    scheduler.event_loop_overlap()
  File "/usr/local/lib/python3.11/site-packages/sglang/srt/model_executor/model_runner.py", line 2143, in forward
    output = self._forward_raw(
  File "/usr/local/lib/python3.11/site-packages/sglang/srt/model_executor/piecewise_cuda_graph_runner.py", \
line 563, in replay
    output = self.model_runner.model.forward(
  File "/usr/local/lib/python3.11/site-packages/sglang/srt/compilation/cuda_piecewise_backend.py", line 111, in __call__
    assert get_pcg_capture_stream() is not None, \
"PCG capture stream is not set, please check if runtime recompilation happened"
AssertionError: PCG capture stream is not set, please check if runtime recompilation happened
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--python", default=str(REPO / ".venvs" / "sglang-0.5.9" / "bin" / "python"))
    parser.add_argument("--budget", type=float, default=300.0)
    args = parser.parse_args()
    if not Path(args.python).exists():
        print(f"no SGLang 0.5.9 environment at {args.python}: build it from requirements/sglang-0.5.9.txt")
        return 2
    with tempfile.TemporaryDirectory() as scratch:
        log = Path(scratch) / "user.log"
        log.write_text(PASTED_0_5_9)
        started = time.perf_counter()
        done = subprocess.run([args.python, "-m", "harness", "repro", str(log), "--budget", str(args.budget),
                               "--out", str(Path(scratch) / "out")], cwd=REPO, capture_output=True, text=True)
        wall = time.perf_counter() - started
    for line in done.stdout.splitlines():
        if "regression to pin" in line:
            os.remove(line.split(": ", 1)[1].strip())
    interesting = [line for line in done.stdout.splitlines()
                   if any(k in line for k in ("signature", "reproduced", "fails as reported", "gave up"))]
    print("\n".join(interesting) or done.stdout[-2000:] + done.stderr[-2000:])
    print(f"repro of known bug 2 from a pasted 0.5.9 traceback: exit {done.returncode}, {wall:.1f} s wall")
    return done.returncode


if __name__ == "__main__":
    sys.exit(main())
