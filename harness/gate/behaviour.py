"""`gate --base`: one drawn example on two SGLang trees, what it did on each, side by side. Most regressions in the
targeted files arrive as refactors meant to change nothing; a difference no oracle names (other graphs captured,
other capture sizes, a compile more, an eager fallback, an output that moved, other padded contents) is still a
change of behaviour, and a refactor must show none (`--no-behaviour-change`).

Examples are matched by test and drawn values (the gate's seed is fixed, so both trees draw the same examples unless
a draw depends on SGLang: such an example is listed as drawn on one tree only). Compared per example: the verdict,
every note but timings, and what the oracles observed (`harness.oracles.observed`): outputs within `rtol`, padded
rows exactly."""
from __future__ import annotations

import collections
import dataclasses
import json
import math
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

TIMINGS = ("seconds", "gc")  # notes whose value is a measurement of time or of the collector, not of behaviour


@dataclasses.dataclass(frozen=True)
class Difference:
    test: str
    drawn: str  # the drawn values, as JSON
    what: str  # "verdict", "note capture_bs", "outputs[3]", "drawn on one tree only", ...
    base: Any
    head: Any

    def row(self) -> dict:
        return {"test": self.test, "drawn": self.drawn, "what": self.what, "base": self.base, "head": self.head}


def _key(record: dict) -> tuple[str, str]:
    return record.get("test", ""), json.dumps(record.get("drawn"), sort_keys=True, default=str)


def _by_example(records: list[dict]) -> dict[tuple[str, str], list[dict]]:
    grouped = collections.defaultdict(list)
    for record in records:
        if record.get("verdict") is not None:
            grouped[_key(record)].append(record)
    return grouped


def close(a: Any, b: Any, rtol: float) -> bool:
    """Equal, leaf by leaf, numbers within `rtol` of the larger magnitude (and 1e-9 absolute)."""
    if isinstance(a, bool) or isinstance(b, bool):
        return a == b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return math.isclose(a, b, rel_tol=rtol, abs_tol=1e-9) or (math.isnan(a) and math.isnan(b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(close(a[k], b[k], rtol) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(close(x, y, rtol) for x, y in zip(a, b))
    return a == b


def leaves(path: str, a: Any, b: Any, rtol: float) -> list[tuple[str, Any, Any]]:
    """Where `a` and `b` differ, narrowed to the differing keys of dicts and items of equal-length lists (so a
    table row names `dynamo_budget.accumulated_recompile_limit`, not the whole note)."""
    if close(a, b, rtol):
        return []
    if isinstance(a, dict) and isinstance(b, dict):
        return [leaf for k in sorted(set(a) | set(b), key=str)
                for leaf in leaves(f"{path}.{k}", a.get(k), b.get(k), rtol)]
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b) and len(a) <= 16:
        return [leaf for i, (x, y) in enumerate(zip(a, b)) for leaf in leaves(f"{path}[{i}]", x, y, rtol)]
    return [(path, a, b)]


def _compare(base: dict, head: dict, rtol: float) -> list[tuple[str, Any, Any]]:
    found = []
    if base.get("verdict") != head.get("verdict"):
        found.append(("verdict", base.get("verdict"), head.get("verdict")))
    notes_a, notes_b = base.get("notes") or {}, head.get("notes") or {}
    for name in sorted(set(notes_a) | set(notes_b)):
        if not any(t in name for t in TIMINGS):
            found.extend(leaves(f"note {name}", notes_a.get(name), notes_b.get(name), 0.0))
    seen_a, seen_b = base.get("behaviour") or {}, head.get("behaviour") or {}
    for kind in sorted(set(seen_a) | set(seen_b)):
        a, b = seen_a.get(kind, []), seen_b.get(kind, [])
        if len(a) != len(b):
            found.append((f"{kind}: count", len(a), len(b)))
        tolerance = rtol if kind == "outputs" else 0.0
        found.extend((f"{kind}[{i}]", x, y) for i, (x, y) in enumerate(zip(a, b)) if not close(x, y, tolerance))
    return found


def compare(base_records: list[dict], head_records: list[dict], rtol: float = 1e-4) -> tuple[list[Difference], int]:
    """The differences between the two runs' examples, and how many examples were compared."""
    base, head = _by_example(base_records), _by_example(head_records)
    differences, compared = [], 0
    for key in sorted(set(base) | set(head)):
        a, b = base.get(key, []), head.get(key, [])
        for record_a, record_b in zip(a, b):
            compared += 1
            differences.extend(Difference(*key, what, x, y) for what, x, y in _compare(record_a, record_b, rtol))
        if len(a) != len(b):
            differences.append(Difference(*key, "drawn on one tree only", len(a), len(b)))
    return differences, compared


def table(differences: list[Difference], compared: int, rtol: float, limit: int = 40) -> str:
    """The differences as a Markdown table (the first `limit`), with the count and the tolerance above it."""
    lines = [f"behaviour: {len(differences)} difference(s) in {compared} example(s) compared on both trees "
             f"(outputs within rtol {rtol:g}, everything else exactly)"]
    if differences:
        lines += ["", "| test | drawn | what | base | head |", "|---|---|---|---|---|"]
        lines += [f"| {d.test} | {_short(d.drawn)} | {d.what} | {_short(d.base)} | {_short(d.head)} |"
                  for d in differences[:limit]]
        if len(differences) > limit:
            lines.append(f"... and {len(differences) - limit} more (behaviour.jsonl)")
    return "\n".join(lines)


def _short(value: Any, width: int = 80) -> str:
    text = value if isinstance(value, str) else json.dumps(value, default=str)
    return (text if len(text) <= width else text[:width - 3] + "...").replace("|", "\\|")


def write(report_dir: Path, differences: list[Difference], compared: int, rtol: float, fail: bool) -> None:
    """behaviour.jsonl (one row per difference, read by the HTML report) and a `behaviour` test suite appended to
    the JUnit XML: one test case per example that changed, its differences as properties, failed under `fail`."""
    with open(report_dir / "behaviour.jsonl", "w", encoding="utf-8") as stream:
        for difference in differences:
            stream.write(json.dumps(difference.row(), default=str) + "\n")
    junit = report_dir / "junit.xml"
    tree = ET.parse(junit) if junit.exists() else ET.ElementTree(ET.Element("testsuites"))
    root = tree.getroot()
    if root.tag != "testsuites":
        wrapper = ET.Element("testsuites")
        wrapper.append(root)
        tree, root = ET.ElementTree(wrapper), wrapper
    by_example = collections.defaultdict(list)
    for difference in differences:
        by_example[(difference.test, difference.drawn)].append(difference)
    suite = ET.SubElement(root, "testsuite", name="behaviour", tests=str(max(1, len(by_example))),
                          failures=str(len(by_example) if fail else 0), errors="0", skipped="0")
    ET.SubElement(ET.SubElement(suite, "properties"), "property", name="compared", value=str(compared))
    if not by_example:
        ET.SubElement(suite, "testcase", classname="behaviour", name="no behaviour change")
    for (test, drawn), rows in by_example.items():
        case = ET.SubElement(suite, "testcase", classname="behaviour", name=f"{test} {drawn}")
        properties = ET.SubElement(case, "properties")
        for row in rows:
            ET.SubElement(properties, "property", name=row.what, value=f"base {_short(row.base, 400)} -> head "
                          f"{_short(row.head, 400)}")
        if fail:
            ET.SubElement(case, "failure", message=f"{len(rows)} behaviour change(s) (--no-behaviour-change)").text = \
                "\n".join(f"{r.what}: base {_short(r.base, 400)} -> head {_short(r.head, 400)}" for r in rows)
    tree.write(junit, encoding="unicode")
