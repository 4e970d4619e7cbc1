"""What `mutate` tells its user: the kill ratio per targeted function and per file (killed or timed out, of the
mutants a suite reached), each survivor as `file:line` with the original and the mutated code side by side; the
mode used (fast: the items reaching each line; thorough: every suite of the file) and, in fast mode, per mutant
the items it was given, how many ran and the one that killed it."""
from __future__ import annotations

import collections
from collections.abc import Iterable

from harness.mutate.judge import KILLED, SURVIVED, TIMED_OUT, UNREACHED

VERDICTS = (KILLED, SURVIVED, TIMED_OUT, UNREACHED)
SIDE = 72  # characters of each side of a survivor's line


def ratio(counts: collections.Counter) -> str:
    """`killed+timed out / reached` as a percentage and a fraction ('-' when nothing was reached)."""
    caught, reached = counts[KILLED] + counts[TIMED_OUT], counts[KILLED] + counts[TIMED_OUT] + counts[SURVIVED]
    return f"{100.0 * caught / reached:5.1f}% ({caught}/{reached})" if reached else "    - (0/0)"


def _table(title: str, rows: list[dict], key) -> list[str]:
    groups: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for row in rows:
        groups[key(row)][row["verdict"]] += 1
    width = max([len(title)] + [len(name) for name in groups])
    lines = [f"{title:<{width}}  {'kill ratio':>16}" + "".join(f"{v:>11}" for v in VERDICTS)]
    for name in sorted(groups):
        counts = groups[name]
        lines.append(f"{name:<{width}}  {ratio(counts):>16}" + "".join(f"{counts[v]:>11}" for v in VERDICTS))
    return lines


def _mode_line(mode: str, why: str) -> str:
    if mode == "fast":
        return "mode: fast (only the test items that executed each mutated line, fastest first, -x)"
    return f"mode: thorough (every suite that drives the file{f'; {why}' if why else ''})"


def _tests_line(row: dict) -> str:
    """Fast mode: which items a mutant was given, how many ran, which killed it."""
    given = row.get("tests") or []
    killer = f"; killed by {row['test']}" if row.get("test") else (f"; {row['oracle']}" if row.get("oracle") else "")
    reach = f"; {row['reach']}" if row.get("reach") else ""
    return (f"- {row['file']}:{row['line']} [{row['operator']}] {row['verdict']}: {row.get('ran', 0)} of "
            f"{len(given)} item(s) ran{killer}{reach} ({row.get('seconds', 0)} s)")


def summary(rows: Iterable[dict], mode: str = "thorough", why: str = "") -> str:
    rows = list(rows)
    total = collections.Counter(row["verdict"] for row in rows)
    lines = [_mode_line(mode, why), f"{len(rows)} mutants: kill ratio {ratio(total).strip()} of those reached; "
             + ", ".join(f"{total[v]} {v}" for v in VERDICTS), ""]
    lines += _table("file", rows, lambda r: r["file"]) + [""]
    lines += _table("function", rows, lambda r: f"{r['file'].rsplit('/', 1)[-1]}::{r['function']}")
    survivors = [r for r in rows if r["verdict"] == SURVIVED]
    if survivors:
        lines += ["", f"{len(survivors)} survivor(s):", f"  {'original':<{SIDE}} | mutated"]
        for row in sorted(survivors, key=lambda r: (r["file"], r["line"])):
            lines.append(f"- {row['file']}:{row['line']} [{row['operator']}] {row['function']}")
            lines.append(f"  {row['original'][:SIDE]:<{SIDE}} | {row['mutated'][:SIDE]}")
    judged = [r for r in rows if r.get("mode") == "fast" and r["verdict"] != UNREACHED]
    if judged:
        lines += ["", "test items per mutant (fastest first):"]
        for row in sorted(judged, key=lambda r: (r["file"], r["line"])):
            lines.append(_tests_line(row))
            if row.get("tests"):
                lines.append(f"    given: {', '.join(row['tests'][:8])}{' ...' if len(row['tests']) > 8 else ''}")
    return "\n".join(lines)
