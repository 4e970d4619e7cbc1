"""One failure's replay command, run again in a fresh process with extra environment (a trace, an ablation
setting), its records into a folder of its own; what it concluded."""
from __future__ import annotations

import dataclasses
import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

from harness.mutants import REPO_ROOT


@dataclasses.dataclass(frozen=True)
class Outcome:
    verdict: str  # "pass", "fail" (an oracle fired), "error" (no record: a crash), "timeout"
    oracle: str = ""
    diagnosis: str = ""
    seconds: float = 0.0

    def same_failure(self, failure: dict) -> bool:
        return self.verdict != "pass" and self.oracle == failure.get("oracle")


def command(failure: dict, report_dir: Path) -> list[str]:
    """The failure's replay command with this interpreter and `report_dir` (the later option wins)."""
    words = shlex.split(failure["replay"])
    if words[:1] == ["python"]:
        words[0] = sys.executable
    return [*words, "--report-dir", str(report_dir), "-p", "no:cacheprovider", "-q"]


def rerun(failure: dict, report_dir: Path, env: dict[str, str], timeout: float) -> Outcome:
    """Run the replay with `env` added; its first failure record's oracle and diagnosis."""
    import time

    report_dir.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    try:
        done = subprocess.run(command(failure, report_dir), cwd=REPO_ROOT, env={**os.environ, **env},
                              capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        return Outcome("timeout", "", f"ran past {timeout:g} s", time.monotonic() - started)
    seconds = time.monotonic() - started
    (report_dir / "output.txt").write_text(done.stdout[-20000:] + done.stderr[-20000:])
    if done.returncode == 0:
        return Outcome("pass", seconds=seconds)
    records = report_dir / "failures.jsonl"
    first = json.loads(records.read_text().splitlines()[0]) if records.exists() and records.read_text() else {}
    if not first:
        text = (done.stdout + done.stderr).strip()
        return Outcome("error", "crash", text.splitlines()[-1][:300] if text else f"exit {done.returncode}", seconds)
    return Outcome("fail", first.get("oracle", ""), str(first.get("diagnosis", ""))[:500], seconds)
