"""Benchmark of the decode suite's machinery on the cpu virtual device (or a real GPU with `--device cuda`).

Prints:
- replays per second through SGLang's real `DecodeCudaGraphRunner.execute` (load_batch + graph replay + slicing),
  in record mode (eager model) and rerun mode (torch.compile, eager backend), and with the NPU personality; on
  `--device cuda`, real CUDA graphs, without and with torch.compile (inductor);
- the capture (constructor) time of each;
- for each mutant of tests/test_decode_mutants.py: seconds from the start of the suite's pytest process until the
  first failing example was recorded (the JSONL record's timestamp), and the process's wall time.

Usage: python bench/bench_decode.py [--replays N] [--skip-mutants] [--only-mutants] [--device cpu|cuda]
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))


CONFIGS = {"cpu": (("cuda", False, "record", "eager"), ("cuda", True, "rerun", "eager"),
                   ("npu", False, "record", "eager")),
           "cuda": (("cuda", False, "cuda-graph", "eager"), ("cuda", True, "cuda-graph", "inductor"))}


def bench_replays(replays: int, device_name: str = "cpu") -> None:
    import dataclasses

    from harness.devices import get_device, prepare
    from harness.targets import decode as dr

    prepare(device_name)
    device = get_device(device_name)
    if not device.available:
        raise SystemExit(device.skip_reason)
    for personality, compile_, mode, backend in CONFIGS[device_name]:
        with device.install(personality), device.capture_mode(mode):
            case = dr.DecodeCase(capture_bs=(1, 2, 4, 8), max_running_requests=8, enable_torch_compile=compile_,
                                 torch_compile_max_bs=8)
            if compile_ and "compile_backend" in {f.name for f in dataclasses.fields(case)}:
                case = dataclasses.replace(case, compile_backend=backend)
            target = dr.load().make_target(case, personality=personality, device=device.torch_device)
            batch = dr.DecodeBatch(input_ids=[1, 2, 3], positions=[4, 5, 6], seq_lens=[7, 8, 9])
            for _ in range(5):
                target.replay(batch)
            sync = getattr(getattr(__import__("torch"), device_name, None), "synchronize", lambda: None)
            sync()
            started = time.perf_counter()
            for _ in range(replays):
                target.replay(batch)
            sync()
            elapsed = time.perf_counter() - started
            print(f"device={device_name} personality={personality:4s} compile={str(compile_):5s} "
                  f"({backend if compile_ else 'off'}) mode={mode:10s} "
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
    parser.add_argument("--device", default="cpu", choices=sorted(CONFIGS))
    args = parser.parse_args()
    os.chdir(REPO)
    if not args.only_mutants:
        bench_replays(args.replays, args.device)
    if not args.skip_mutants:
        bench_mutants()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
