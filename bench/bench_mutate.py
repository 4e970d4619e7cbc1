"""Mutants a minute of `python -m harness mutate -n 2` on a seeded draw, fast (only the test items the campaign's
line map says reach each line, fastest first) beside --thorough (every suite of the file), the verdicts that differ
and whether every fast kill is a thorough kill; and seconds per bisect step and in total for the bug-1 proof on a
clone of Oasis-Git/sglang.

Usage:
  python bench/bench_mutate.py [--count 30] [--seed 0] [--campaign DIR | --suites PATH ...] [--functions NAME ...]
      (DIR: a gate campaign's report with its line map, reused; else the gate campaign of --suites runs at -n 2)
  python bench/bench_mutate.py --bisect-tree /work/oasis-sglang            (runs the bug-1 bisect in the 0.5.14 env)
"""
from __future__ import annotations

import argparse
import json
import os
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
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def _load() -> str:
    """How contended the machine is (other processes share its cores)."""
    one, five, _ = os.getloadavg()
    return f"load average {one:.1f} (1 min), {five:.1f} (5 min) on {os.cpu_count()} cores"


def _campaign(work: Path, campaign: str | None, suites: list[str]) -> Path:
    target = work / "campaign"
    if campaign:
        shutil.copytree(campaign, target, ignore=shutil.ignore_patterns("mutants*", "mutate.md"))
        return target
    started = time.time()
    subprocess.run([sys.executable, "-m", "harness", "campaign", "--report-dir", str(target), "-n", "2",
                    *(["--suites", *suites] if suites else [])], cwd=REPO)
    print(f"gate campaign with coverage (-n 2{', ' + ' '.join(suites) if suites else ''}): "
          f"{time.time() - started:.0f} s; {_load()}")
    return target


def _mutate(campaign: Path, work: Path, mode: str, args: list[str]) -> tuple[list[dict], float]:
    report = work / mode
    shutil.copytree(campaign, report, ignore=shutil.ignore_patterns("mutants*", "mutate.md"))
    started = time.time()
    subprocess.run([sys.executable, "-m", "harness", "mutate", *args, "-n", "2", "--report-dir", str(report),
                    *(["--thorough"] if mode == "thorough" else [])], cwd=REPO, check=True)
    wall = time.time() - started
    rows = _rows(report / "mutants.jsonl")
    ran = [r for r in rows if r["verdict"] != "unreached"]
    seconds = [r["seconds"] for r in ran]
    print(f"mutate -n 2 {mode}: {len(rows)} mutants ({len(ran)} run, {len(rows) - len(ran)} unreached) in "
          f"{wall:.0f} s: {len(rows) / (wall / 60):.2f} mutants a minute ({len(ran) / (wall / 60):.2f} run ones); "
          f"median {statistics.median(seconds) if seconds else 0:.1f} s a run mutant; {_load()}")
    return rows, wall


def bench_mutate(count: int, seed: int, campaign: str | None, suites: list[str], functions: list[str]) -> None:
    work = Path(tempfile.mkdtemp(prefix="bench-mutate-"))
    print(f"[bench] {_load()}; work in {work}")
    source = _campaign(work, campaign, suites)
    args = ["--count", str(count), "--seed", str(seed), *(["--functions", *functions] if functions else [])]
    fast, fast_wall = _mutate(source, work, "fast", args)
    thorough, thorough_wall = _mutate(source, work, "thorough", args)
    if any(r.get("mode") != "fast" for r in fast):
        print("note: the fast run fell back to --thorough (no fresh line map): see its first lines")
    by_id = {r["id"]: r for r in thorough}
    differing = [(r, by_id[r["id"]]) for r in fast if r["id"] in by_id and r["verdict"] != by_id[r["id"]]["verdict"]]
    fast_kills = [r for r in fast if r["verdict"] == "killed"]
    agree = sum(by_id.get(r["id"], {}).get("verdict") == "killed" for r in fast_kills)
    print(f"fast {fast_wall:.0f} s vs thorough {thorough_wall:.0f} s ({thorough_wall / max(fast_wall, 1e-9):.1f}x); "
          f"{len(differing)} of {len(fast)} verdicts differ; {agree} of {len(fast_kills)} fast kills are thorough "
          "kills")
    for mine, theirs in differing:
        print(f"  differs: {mine['file']}:{mine['line']} [{mine['operator']}] fast {mine['verdict']} "
              f"({mine.get('test') or ''}) vs thorough {theirs['verdict']} ({theirs.get('test') or ''})")


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
    parser.add_argument("--count", type=int, default=30)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--campaign", default=None, help="a gate campaign's report directory to reuse")
    parser.add_argument("--suites", nargs="+", default=[], metavar="PATH", help="the campaign's suites (default all)")
    parser.add_argument("--functions", nargs="+", default=[], metavar="NAME", help="only these targeted functions")
    parser.add_argument("--bisect-tree", default=None, help="a clone of Oasis-Git/sglang: time the bug-1 bisect")
    options = parser.parse_args()
    if options.bisect_tree:
        bench_bisect(options.bisect_tree)
    else:
        bench_mutate(options.count, options.seed, options.campaign, options.suites, options.functions)


if __name__ == "__main__":
    main()
