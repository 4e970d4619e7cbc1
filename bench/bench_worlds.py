"""Seconds a world of ranks costs: the suite's explicit worlds (two ranks) and three four-rank worlds, each served
and judged as the suite does (`run_case`), with ranks forked from the fork server (the default) and spawned afresh
(`--spawn`); per rank, the seconds of its model build and capture and of its program.

    .venv/bin/python bench/bench_worlds.py [--spawn]
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--spawn", action="store_true", help="every rank a fresh interpreter (no fork server)")
    options = parser.parse_args()
    if options.spawn:
        os.environ["HARNESS_WORLD_START"] = "spawn"
    from harness.models.real import transformers_reference
    from harness.worlds.world import Admit, Decode, Idle, World, WorldCase
    from suites.test_parallel_worlds import DP_IDLE_RANK, EXPLICIT_WORLDS, run_case

    def reference(family):
        folder, _ = transformers_reference.checkpoint(family)
        return folder, lambda history: transformers_reference.logits(family, history)

    def four(world: World) -> WorldCase:
        first = tuple(Admit(((5, 6), (7,)) if i == 0 else ((8, 9),)) for i in range(world.dp_ranks))
        return WorldCase(world, "qwen3", (1, 2, 4), 8, (first, tuple(Decode() for _ in first),
                                                          tuple(Decode() if i == 0 else Idle() for i in range(
                                                              len(first)))))

    cases = [*EXPLICIT_WORLDS.items(), ("dp-idle-rank again (warm)", DP_IDLE_RANK),
             ("tp4 dp2 attention", four(World(tp=4, dp=2, dp_attention=True))),
             ("tp4 dp4 attention", four(World(tp=4, dp=4, dp_attention=True))), ("tp4", four(World(tp=4)))]
    print(f"ranks start by {'spawn' if options.spawn else 'fork server'}")
    print(f"{'world':<30}{'ranks':>6}{'wall s':>8}{'capture s':>11}{'program s':>11}")
    for name, case in cases:
        started = time.perf_counter()
        outcome = run_case(case, reference)
        wall = time.perf_counter() - started
        capture = max(r.seconds.get("build_and_capture", 0.0) for r in outcome.records.values())
        program = max(r.seconds.get("program", 0.0) for r in outcome.records.values())
        print(f"{name:<30}{case.world.ranks:>6}{wall:>8.1f}{capture:>11.1f}{program:>11.1f}")


if __name__ == "__main__":
    main()
