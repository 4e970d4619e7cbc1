"""A gate as fast as the change: the test items whose recorded coverage (the base campaign's line map, the one
`mutate` reads) executed a changed line of a targeted file, plus every suite of a targeted file the map holds no
record of; and the changed statements no test executed, said aloud (a gate cannot fail on a line it never runs).
"""
from __future__ import annotations

import dataclasses
from pathlib import Path

from harness.errors import HarnessError
from harness.gate.changes import FileChange
from harness.mutate.reach import LineMap
from harness.registry import coverage_rows


@dataclasses.dataclass
class Selection:
    """What the selected gate runs (`items`: pytest node ids, `suites`: suite files run whole) and why."""
    items: list[str] = dataclasses.field(default_factory=list)
    suites: list[str] = dataclasses.field(default_factory=list)
    why: dict[str, str] = dataclasses.field(default_factory=dict)  # item or suite -> the file:lines that chose it
    unexecuted: dict[str, list[int]] = dataclasses.field(default_factory=dict)  # changed statements no test ran
    untargeted: list[str] = dataclasses.field(default_factory=list)  # changed files no suite targets

    @property
    def args(self) -> list[str]:
        """The pytest arguments: whole suites first, then the items not inside one of them."""
        return self.suites + [i for i in self.items if i.split("::")[0] not in self.suites]


def targeted_files() -> dict[str, list[str]]:
    """Each targeted file (inside the sglang package) -> the suite files whose coverage rows list it."""
    files: dict[str, list[str]] = {}
    for suite, _, targets in coverage_rows().values():
        for target in targets:
            paths = files.setdefault(target.split("::")[0], [])
            paths.extend(p for p in suite.paths if p not in paths)
    return files


def statements(path: Path) -> set[int]:
    """The executable statements of a Python file, as coverage.py counts them (a comment or a docstring is not one)."""
    from coverage.python import PythonParser

    parser = PythonParser(text=path.read_text(encoding="utf-8", errors="replace"))
    parser.parse_source()
    return set(parser.statements)


def select(changes: list[FileChange], line_map: LineMap | None, base_sglang: Path) -> Selection:
    """The selection for `changes` (lines numbered as in `base_sglang`); `line_map` None: every targeted file is
    treated as unrecorded (its suites run whole). A recorded file whose changed lines no test executed adds nothing
    to run (the map was measured on these very tests) and is listed in `unexecuted`. Raises when no change touches
    a targeted file."""
    targeted, chosen = targeted_files(), Selection()
    for change in changes:
        if change.file not in targeted:
            chosen.untargeted.append(change.file)
            continue
        recorded = line_map is not None and change.file in line_map.files and change.status == "modified"
        if not recorded:  # no record of this file: its suites run whole
            for suite in targeted[change.file]:
                chosen.why.setdefault(suite, f"{change.file} ({change.status}, no record in the line map)")
                if suite not in chosen.suites:
                    chosen.suites.append(suite)
            continue
        items = line_map.tests(change.file, change.lines)
        for item in (items or line_map.fastest_of(change.file)) if items is not None else ():
            chosen.why.setdefault(item, f"{change.file}:{_span(change.lines)}")  # [] only import-time lines ran
            if item not in chosen.items:
                chosen.items.append(item)
        ran = {int(line) for line in line_map.files[change.file]}
        missed = sorted((set(change.lines) & statements(base_sglang / change.file)) - ran)
        if missed:
            chosen.unexecuted[change.file] = missed
    if len(chosen.untargeted) == len(changes):
        example = f", e.g. {', '.join(c.file for c in changes[:3])}" if changes else ""
        raise HarnessError(f"the change touches no file the harness targets ({len(changes)} file(s) changed"
                           f"{example}): nothing to gate")
    return chosen


def _span(lines: tuple[int, ...]) -> str:
    return f"{lines[0]}-{lines[-1]}" if len(lines) > 1 else str(lines[0]) if lines else "?"
