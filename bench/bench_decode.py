"""Benchmark of the decode suite's machinery on the cpu virtual device.

Prints:
- replays per second through SGLang's real `DecodeCudaGraphRunner.execute` (load_batch + graph replay + slicing),
  in record mode (eager model) and rerun mode (torch.compile, eager backend), and with the NPU personality;
- the capture (constructor) time of each;
- for each mutant of tests/test_decode_mutants.py: seconds from the start of the suite's pytest process until the
  first failing example was recorded (the JSONL record's timestamp), and the process's wall time.

Usage: python bench/bench_decode.py [--replays N] [--skip-mutants] [--only-mutants]
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


def bench_replays(replays: int) -> None:
    from harness.devices import cpu
    from harness.targets import decode_runner as dr

    for personality, compile_, mode in (("cuda", False, "record"), ("cuda", True, "rerun"), ("npu", False, "record")):
        with cpu.install(personality=personality), cpu.capture_mode(mode):
            case = dr.DecodeCase(capture_bs=(1, 2, 4, 8), max_running_requests=8, enable_torch_compile=compile_,
                                 torch_compile_max_bs=8)
            target = dr.make_target(case, personality=personality)
            batch = dr.DecodeBatch(input_ids=[1, 2, 3], positions=[4, 5, 6], seq_lens=[7, 8, 9])
            for _ in range(5):
                target.replay(batch)
            started = time.perf_counter()
            for _ in range(replays):
                target.replay(batch)
            elapsed = time.perf_counter() - started
            print(f"personality={personality:4s} compile={str(compile_):5s} mode={mode:6s} "
                  f"capture of 4 sizes: {target.capture_seconds:6.2f} s   replays/s: {replays / elapsed:8.0f} "
                  f"(batch of 3 padded to 4)", flush=True)


def bench_mutants() -> None:
    from bench.common import print_table, run_suite
    from tests.test_decode_mutants import MUTANTS

    print_table([run_suite(test, edits, name, extra=tuple(extra))
                 for name, (edits, test, extra, _, _) in sorted(MUTANTS.items())])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--replays", type=int, default=2000)
    parser.add_argument("--skip-mutants", action="store_true")
    parser.add_argument("--only-mutants", action="store_true")
    args = parser.parse_args()
    os.chdir(REPO)
    if not args.only_mutants:
        bench_replays(args.replays)
    if not args.skip_mutants:
        bench_mutants()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
