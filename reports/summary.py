"""Summarise one run from its JSONL records: per suite the examples, verdicts and time; then each failure
with its oracle, diagnosis and replay command. Written to the terminal and to REPORT_DIR/summary.md."""
from __future__ import annotations

import collections
import json
from pathlib import Path

from harness.registry import coverage_rows

VERDICTS = ("pass", "fail", "error", "expected-error", "skip")


def load(report_dir: Path, name: str, run_id: str | None = None) -> list[dict]:
    """Records from REPORT_DIR/NAME*.jsonl (all xdist workers); a torn last line of a killed run is skipped."""
    rows = []
    for path in sorted(Path(report_dir).glob(f"{name}*.jsonl")):
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                continue
            if run_id is None or row.get("run_id") == run_id:
                rows.append(row)
    return rows


def ran_suites_coverage(coverage: list[dict], examples: list[dict]) -> list[dict]:
    """Coverage rows of the suites that ran examples (importing SGLang alone marks module-level lines run);
    a personality's row (the NPU runner's) only when that personality ran."""
    ran = {(row["suite"], row.get("personality")) for row in examples}
    rows = coverage_rows()

    def shown(row):
        if row["suite"] not in rows:
            return False
        suite, needs, _ = rows[row["suite"]]
        return any(name in suite.records and needs in (None, personality) for name, personality in ran)
    return [row for row in coverage if shown(row)]


def expected_by_rule(examples: list[dict]) -> dict[str, collections.Counter]:
    """Per suite, its expected errors counted by the rule that predicted each (`expected_rule`; a record written
    before rules were required counts under "(no rule)")."""
    counts: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for row in examples:
        if row.get("verdict") == "expected-error":
            counts[row["suite"]][row.get("expected_rule") or "(no rule)"] += 1
    return counts


def expected_lines(examples: list[dict]) -> list[str]:
    """One line per suite with expected errors: how many, their share of the suite's examples, and per rule."""
    totals = collections.Counter(row["suite"] for row in examples)
    lines = []
    for suite, rules in sorted(expected_by_rule(examples).items()):
        count = sum(rules.values())
        lines.append(f"expected errors of {suite}: {count} of {totals[suite]} examples "
                     f"({100 * count / totals[suite]:.1f}%): "
                     + ", ".join(f"{rule} {n}" for rule, n in sorted(rules.items(), key=lambda kv: (-kv[1], kv[0]))))
    return lines


def summarise(report_dir: Path, run_id: str) -> str:
    examples = load(report_dir, "examples", run_id)
    failures = load(report_dir, "failures", run_id)
    coverage = ran_suites_coverage(load(report_dir, "coverage", run_id), examples)
    if not examples and not failures:
        return ""
    by_suite: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    seconds: dict[str, float] = collections.defaultdict(float)
    for row in examples:
        by_suite[row["suite"]][row.get("verdict", "error")] += 1
        seconds[row["suite"]] += row.get("seconds", 0.0)
    lines = []
    header = f"{'suite':<22}{'examples':>9}" + "".join(f"{v:>16}" for v in VERDICTS) + f"{'seconds':>10}"
    if examples:
        lines.append(header)
    for suite in sorted(by_suite):
        counts = by_suite[suite]
        lines.append(f"{suite:<22}{sum(counts.values()):>9}" + "".join(f"{counts[v]:>16}" for v in VERDICTS)
                     + f"{seconds[suite]:>10.1f}")
    lines += expected_lines(examples)
    for row in coverage:
        lines.append(f"coverage of SGLang's {row['suite']} code: {row['percent']:.1f}% "
                     f"({row['covered']}/{row['statements']} statements) "
                     + ", ".join(f"{f}: {p:.0f}%" for f, p in row["files"].items()))
        if "branch_percent" in row:  # coverage.py's branch mode: the ways out of each line with several
            lines.append(f"branches of SGLang's {row['suite']} code: {row['branch_percent']:.1f}% "
                         f"({row['branches_taken']}/{row['branches']} branches) "
                         + ", ".join(f"{f}: {p:.0f}%" for f, p in row["branch_files"].items()))
    if failures:
        lines.append("")
        lines.append(f"{len(failures)} failing test(s):")
        for row in failures:
            lines.append(f"- {row['test']}  [{row['oracle']}] {row['diagnosis']}")
            lines.append(f"    drawn: {json.dumps(row.get('drawn'))}")
            lines.append(f"    replay: {row['replay']}")
    context = (examples or failures)[0]
    if context.get("stream_order", "on") != "on":
        lines.append(f"stream-order check: {context['stream_order']}")
    text = "\n".join(lines)
    (Path(report_dir) / "summary.md").write_text(
        f"# Harness run {run_id}\n\nSGLang {context.get('sglang')}, torch {context.get('torch')}, "
        f"device {context.get('device')}, profile {context.get('profile')}, seed {context.get('seed')}\n\n"
        f"```\n{text}\n```\n", encoding="utf-8")
    return text
