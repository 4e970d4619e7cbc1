"""Prefill suite benchmark: gate wall time and examples per second on clean SGLang, and for each mutant of
`tests/test_prefill_mutants.py` the seconds from suite start (pytest launched) until its first failing example.

    python bench/bench_prefill.py [--out reports/out/bench_prefill.json] [--skip-clean]

Each run is a fresh pytest process (SGLang keeps process-wide state), as the mutant self-tests run it.
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from harness.mutants import run_pytest, scratch_sglang  # noqa: E402
from tests.test_prefill_mutants import MUTANTS, SUITE  # noqa: E402


def _records(report_dir: Path) -> list[dict]:
    path = report_dir / "examples.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def run(name: str, edits, extra=()) -> dict:
    report_dir = Path(tempfile.mkdtemp(prefix=f"bench-prefill-{name}-"))
    root = scratch_sglang(edits) if edits else None
    started = time.time()
    code, output = run_pytest([SUITE, "-q", "--report-dir", str(report_dir), *extra], sglang_root=root,
                              mutant=name, timeout=900)
    wall = time.time() - started
    rows = _records(report_dir)
    failing = [r for r in rows if r["verdict"] in ("fail", "error") and not r["drawn"].get("finding")]
    result = {"name": name, "exit": code, "wall_s": round(wall, 1), "examples": len(rows),
              "example_seconds": round(sum(r["seconds"] for r in rows), 1)}
    if rows:
        result["examples_per_s_wall"] = round(len(rows) / wall, 2)
        result["examples_per_s_in_examples"] = round(len(rows) / max(1e-9, result["example_seconds"]), 1)
    if failing:
        first = min(failing, key=lambda r: r["ts"])
        result.update(first_detection_s=round(first["ts"] - started, 1), oracle=first.get("oracle"),
                      diagnosis=first.get("diagnosis", "")[:200], test=first["test"])
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(REPO / "reports" / "out" / "bench_prefill.json"))
    parser.add_argument("--skip-clean", action="store_true")
    args = parser.parse_args()
    results = []
    if not args.skip_clean:
        results.append(run("clean", []))
        print(json.dumps(results[-1]), flush=True)
    for name, (edits, *_rest) in sorted(MUTANTS.items()):
        results.append(run(name, edits, extra=("-x",)))
        print(json.dumps(results[-1]), flush=True)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
