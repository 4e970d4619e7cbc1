"""Seconds per mutant (median) and mutants per minute of `python -m harness mutate -n 2`, and seconds per bisect
step and in total for the bug-1 proof on a clone of Oasis-Git/sglang.

Usage:
  python bench/bench_mutate.py [--count 20] [--seed 0] [--campaign DIR]   (DIR: a gate campaign's report, reused)
  python bench/bench_mutate.py --bisect-tree /work/oasis-sglang            (runs the bug-1 bisect in the 0.5.14 env)
"""
from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
BUG1 = ("--good", "2495c02c~8", "--bad", "70c71ba1~1", "--test",
        "suites/regressions/test_decode_patch_model_override.py", "--python", "0.5.14")


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def bench_mutate(count: int, seed: int, campaign: str | None) -> None:
    work = Path(tempfile.mkdtemp(prefix="bench-mutate-"))
    if campaign:  # the campaign's coverage (what makes a mutant unreached) is reused, not measured here
        shutil.copytree(campaign, work, dirs_exist_ok=True, ignore=shutil.ignore_patterns("mutants*", "mutate.md"))
    started = time.time()
    subprocess.run([sys.executable, "-m", "harness", "mutate", "--count", str(count), "--seed", str(seed), "-n", "2",
                    "--report-dir", str(work)], cwd=REPO, check=True)
    wall = time.time() - started
    rows = _rows(work / "mutants.jsonl")
    ran = [r for r in rows if r["verdict"] != "unreached"]
    seconds = [r["seconds"] for r in ran]
    print(f"mutate -n 2: {len(rows)} mutants ({len(ran)} run, {len(rows) - len(ran)} unreached) in {wall:.0f} s; "
          f"median {statistics.median(seconds) if seconds else 0:.1f} s a run mutant; "
          f"{len(ran) / (wall / 60):.2f} run mutants a minute")


def bench_bisect(tree: str) -> None:
    work = Path(tempfile.mkdtemp(prefix="bench-bisect-"))
    started = time.time()
    subprocess.run([sys.executable, "-m", "harness", "bisect", "--tree", tree, *BUG1, "--report-dir", str(work)],
                   cwd=REPO, check=True)
    steps = _rows(work / "bisect.jsonl")
    print(f"bisect bug 1: {len(steps)} steps, {time.time() - started:.0f} s in all, "
          f"median {statistics.median(s['seconds'] for s in steps):.1f} s a step")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--count", type=int, default=20)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--campaign", default=None, help="a gate campaign's report directory to reuse")
    parser.add_argument("--bisect-tree", default=None, help="a clone of Oasis-Git/sglang: time the bug-1 bisect")
    options = parser.parse_args()
    if options.bisect_tree:
        bench_bisect(options.bisect_tree)
    else:
        bench_mutate(options.count, options.seed, options.campaign)


if __name__ == "__main__":
    main()
