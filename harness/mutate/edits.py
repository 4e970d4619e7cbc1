"""`mutate --edits FILE`: given text edits (`[{"file", "old", "new"}]`, `file` inside the sglang package, e.g. the
reverse of a fix about to be merged) judged as mutants, with the same report: would the gate catch this regression?
Each edit is one mutant; its `old` text must occur exactly once in its file, so it can never apply to nothing or to
the wrong place."""
from __future__ import annotations

import ast
import dataclasses
import hashlib
import json
import os
from pathlib import Path

from harness.errors import HarnessError
from harness.mutate.operators import functions


@dataclasses.dataclass(frozen=True)
class TextEdit:
    """One given edit, with what a generated Mutant carries for the judge and the report; `lines`: the lines it
    replaces and the first line of the statement it starts in (what coverage records)."""
    file: str
    function: str
    line: int
    lines: tuple[int, ...]
    old: str
    new: str
    base: str  # digest of the file's text
    operator: str = "edit"

    @property
    def id(self) -> str:
        return hashlib.sha256(repr((self.file, self.old, self.new, self.base)).encode()).hexdigest()[:12]

    @property
    def original(self) -> str:
        return " ".join(self.old.split())

    @property
    def mutated(self) -> str:
        return " ".join(self.new.split())

    def apply(self, text: str) -> str:
        return text.replace(self.old, self.new, 1)


def _where(text: str, start: int, end: int) -> tuple[str, tuple[int, ...]]:
    """The innermost function holding line `start` and the lines an edit of `start`..`end` touches (with the first
    line of the innermost simple statement it starts in)."""
    tree = ast.parse(text)
    inside = [(node.lineno, name) for name, node in functions(tree) if node.lineno <= start <= node.end_lineno]
    statements = [node.lineno for node in ast.walk(tree) if isinstance(node, ast.stmt)
                  and not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.If, ast.For,
                                            ast.While, ast.With, ast.Try))
                  and node.lineno <= start <= node.end_lineno]
    lines = set(range(start, end + 1)) | set(statements[-1:] if statements else [])
    return (max(inside)[1] if inside else "(module)"), tuple(sorted(lines))


def load(path: Path, sglang_dir: Path) -> list[TextEdit]:
    """The edits in `path`, each checked against the package at `sglang_dir`; bad input is a HarnessError."""
    where = f"--edits {path}"
    try:
        raw = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise HarnessError(f"{where}: cannot read it ({error})") from None
    try:
        given = json.loads(raw)
    except json.JSONDecodeError as error:
        raise HarnessError(f"{where}: not valid JSON ({error.msg} at line {error.lineno} column {error.colno}); "
                           'expected a list of {"file", "old", "new"} objects') from None
    if not isinstance(given, list) or not given:
        raise HarnessError(f'{where}: expected a non-empty JSON list of {{"file", "old", "new"}} objects, got '
                           f"{type(given).__name__}")
    root = Path(os.path.abspath(sglang_dir))
    found = []
    for index, item in enumerate(given):
        at = f"{where}: edit {index}"
        if not isinstance(item, dict) or not all(isinstance(item.get(k), str) for k in ("file", "old", "new")):
            raise HarnessError(f'{at}: needs the string fields "file", "old" and "new", got {json.dumps(item)[:200]}')
        relative, old, new = item["file"], item["old"], item["new"]
        if not old or old == new:
            raise HarnessError(f"{at}: its old text is empty or the same as its new text: it changes nothing")
        target = Path(os.path.normpath(root / relative))  # not resolved: a scratch copy's files are links
        if Path(relative).is_absolute() or root not in target.parents:
            raise HarnessError(f"{at}: {relative} is outside the SGLang package at {root} (give a path inside it, "
                               "e.g. srt/model_executor/runner/prefill_cuda_graph_runner.py)")
        if not target.is_file():
            raise HarnessError(f"{at}: {relative} does not exist in the SGLang package at {root}")
        text = target.read_text(encoding="utf-8")
        count = text.count(old)
        if count != 1:
            raise HarnessError(f"{at}: its old text occurs {count} times in {relative}; it must occur exactly once "
                               "(give more surrounding text)")
        offset = text.index(old)
        start = text.count("\n", 0, offset) + 1
        end = start + old.rstrip("\n").count("\n")
        function, lines = _where(text, start, end)
        found.append(TextEdit(target.relative_to(root).as_posix(), function, start, lines, old, new,
                              hashlib.sha256(text.encode()).hexdigest()[:12]))
    return found
