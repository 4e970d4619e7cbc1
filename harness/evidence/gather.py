"""Evidence for a run's failing tests, gathered after the run (see `harness.evidence`): one row per failing test
in REPORT_DIR/evidence.jsonl, which the HTML report shows under the failure."""
from __future__ import annotations

import re
from pathlib import Path

from harness.evidence.ablate import ablate as run_ablation
from harness.evidence.trace import trace as run_trace
from harness.record import read_records, write_to


def _folder_name(test: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", test)[-120:]


def gather(report_dir: Path, run_id: str, trace_dir: Path | None, ablate: bool, limit: int) -> list[dict]:
    """Trace and/or ablate the first `limit` failing tests of run `run_id` (only those with a replay command)."""
    failures = [f for f in read_records(report_dir / "failures.jsonl") if f.get("run_id") == run_id and f.get("replay")]
    rows = []
    for failure in failures[:limit]:
        row, lines = {"test": failure["test"], "run_id": run_id, "oracle": failure.get("oracle")}, []
        if trace_dir is not None:
            row.update(run_trace(failure, trace_dir / _folder_name(failure["test"])))
            lines.append(f"trace: {row['trace_index'] or row['trace']}"
                         + (f" ({row['trace_note']})" if row.get("trace_note") else ""))
        if ablate:
            row.update(run_ablation(failure, report_dir / "ablation" / _folder_name(failure["test"])))
            lines += [f"{a['setting']:<28} {a['verdict']:<8} {a['oracle']}" for a in row["ablation"]]
            lines.append(f"ablation: {row['ablation_says']}")
        row["lines"] = lines
        write_to(report_dir / "evidence.jsonl", row)
        rows.append(row)
    if len(failures) > limit:
        rows.append({"test": f"{len(failures) - limit} more failing test(s)", "lines": [
            f"no evidence gathered (--evidence-limit {limit})"]})
    return rows
