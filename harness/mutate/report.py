"""What `mutate` tells its user: the kill ratio per targeted function and per file (killed or timed out, of the
mutants a suite reached), each survivor as `file:line` with the original and the mutated code side by side."""
from __future__ import annotations

import collections
from typing import Iterable

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


def summary(rows: Iterable[dict]) -> str:
    rows = list(rows)
    total = collections.Counter(row["verdict"] for row in rows)
    lines = [f"{len(rows)} mutants: kill ratio {ratio(total).strip()} of those reached; "
             + ", ".join(f"{total[v]} {v}" for v in VERDICTS), ""]
    lines += _table("file", rows, lambda r: r["file"]) + [""]
    lines += _table("function", rows, lambda r: f"{r['file'].rsplit('/', 1)[-1]}::{r['function']}")
    survivors = [r for r in rows if r["verdict"] == SURVIVED]
    if survivors:
        lines += ["", f"{len(survivors)} survivor(s):", f"  {'original':<{SIDE}} | mutated"]
        for row in sorted(survivors, key=lambda r: (r["file"], r["line"])):
            lines.append(f"- {row['file']}:{row['line']} [{row['operator']}] {row['function']}")
            lines.append(f"  {row['original'][:SIDE]:<{SIDE}} | {row['mutated'][:SIDE]}")
    return "\n".join(lines)
