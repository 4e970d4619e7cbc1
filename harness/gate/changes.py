"""What a pull request changed in SGLang's Python: the lines of each file of the `sglang` package that differ between
a base tree and the pull request's tree, numbered as in the base (the text a campaign's line map was measured on).

Read from the trees themselves, not from `git diff`: a base may be an exported tree, a release's site-packages or a
checkout at another commit, and the comparison is the same."""
from __future__ import annotations

import dataclasses
import difflib
import hashlib
from pathlib import Path


@dataclasses.dataclass(frozen=True)
class FileChange:
    """`file` (inside the sglang package) and the base's lines the change touches: replaced or deleted lines, and for
    an insertion the base lines either side of it (the code the new lines run between). Added or removed files have
    `lines` empty and say so in `status`."""
    file: str
    status: str  # "modified", "added", "removed"
    lines: tuple[int, ...] = ()


def _python_files(sglang_dir: Path) -> dict[str, Path]:
    return {p.relative_to(sglang_dir).as_posix(): p for p in sglang_dir.rglob("*.py") if "__pycache__" not in p.parts}


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def changed_lines(base: list[str], head: list[str]) -> tuple[int, ...]:
    """1-based lines of `base` that `head` replaced or deleted, and the neighbours of each insertion."""
    touched: set[int] = set()
    for tag, i1, i2, _, _ in difflib.SequenceMatcher(None, base, head, autojunk=False).get_opcodes():
        if tag in ("replace", "delete"):
            touched.update(range(i1 + 1, i2 + 1))
        elif tag == "insert":
            touched.update(line for line in (i1, i1 + 1) if 1 <= line <= len(base))
    return tuple(sorted(touched))


def tree_changes(base_sglang: Path, head_sglang: Path) -> list[FileChange]:
    """Every Python file of the package that differs between the two `sglang` folders, in path order."""
    base, head = _python_files(base_sglang), _python_files(head_sglang)
    changes = []
    for name in sorted(set(base) | set(head)):
        if name not in head:
            changes.append(FileChange(name, "removed"))
        elif name not in base:
            changes.append(FileChange(name, "added"))
        elif base[name].resolve() != head[name].resolve() and _digest(base[name]) != _digest(head[name]):
            old = base[name].read_text(encoding="utf-8", errors="replace").splitlines()
            new = head[name].read_text(encoding="utf-8", errors="replace").splitlines()
            changes.append(FileChange(name, "modified", changed_lines(old, new)))
    return changes
