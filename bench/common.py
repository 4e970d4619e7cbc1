"""Shared by the benchmark scripts: run a suite (clean or on a mutant) in a fresh process and time it."""
from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from harness.mutants import Edit, device_args, run_pytest, scratch_sglang  # noqa: E402
from reports.summary import load  # noqa: E402


def run_suite(suite: str, edits: list[Edit] | None = None, name: str = "clean", extra: tuple = (),
              timeout: float = 900, env: dict | None = None) -> dict:
    """Run `suite` once; report wall time, examples/s and, for a failure, seconds until its first record."""
    root = scratch_sglang(edits) if edits else None
    report_dir = Path(tempfile.mkdtemp(prefix=f"bench-{name}-"))
    started = time.time()
    code, output = run_pytest([suite, "-x", "-q", "--report-dir", str(report_dir), *device_args(), *extra],
                              sglang_root=root,
                              mutant=name if edits else "", timeout=timeout, env=env)
    wall = time.time() - started
    rows = load(report_dir, "examples")
    rows.sort(key=lambda row: row["ts"])
    # Findings kept as strict expected failures are not detections.
    failing = [row for row in rows if row["verdict"] in ("fail", "error") and not row["suite"].endswith("_findings")]
    return {"name": name, "exit": code, "wall_s": round(wall, 1), "examples": len(rows),
            "examples_per_s": round(len(rows) / wall, 2) if wall else 0.0,
            "first_failure_s": round(failing[0]["ts"] - started, 1) if failing else None,
            "oracle": failing[0].get("oracle") if failing else None,
            "tail": output.strip().splitlines()[-1:] if output else []}


def print_table(rows: list[dict]) -> None:
    print(f"{'run':<36}{'exit':>5}{'wall s':>9}{'examples':>10}{'ex/s':>7}{'detect s':>10}  oracle")
    for row in rows:
        detect = "-" if row["first_failure_s"] is None else f"{row['first_failure_s']:.1f}"
        print(f"{row['name']:<36}{row['exit']:>5}{row['wall_s']:>9.1f}{row['examples']:>10}"
              f"{row['examples_per_s']:>7.2f}{detect:>10}  {row['oracle'] or ''}")
