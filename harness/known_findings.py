"""What the harness already knows fails on the installed SGLang: a suite's strict expected failures (its
`test_findings_*` tests marked `xfail(strict=True)`, kept so they show when SGLang changes) and its pinned
regressions (`suites/regressions/`). `python -m harness repro` runs these first, in seconds, so that a log whose
failure is one of them is named as that known finding instead of being searched for again.

Each finding declares what it is about: the guard, frame or op (regular expressions) its failure shows, in its
suite's `FINDINGS_ABOUT = {test name: {"guard": ..., "frame": ..., "op": ...}}` or a pinned regression's module-level
`ABOUT = {...}` (`{}`: no particular guard, frame or op). A log that names a guard, frame or op is answered only by
a finding that declares the same: an oracle of the right family failing under the log's conditions is not enough
(a recompile on grad_mode is not a finding about another guard of another function).
"""
from __future__ import annotations

import ast
import dataclasses
import re
import tempfile
from pathlib import Path

from harness import registry
from harness.mutants import REPO_ROOT, run_pytest
from harness.record import read_records


ABOUT_KEYS = ("guard", "frame", "op")  # what a log names that a finding must share to answer it


@dataclasses.dataclass
class Known:
    test: str  # the node id (a parametrised test: all its parameters)
    reason: str  # the xfail reason, or the regression module's docstring's first line
    about: dict | None = None  # {"guard"/"frame"/"op": regular expression}; None: undeclared


def _declared(tree: ast.Module, name: str) -> dict | None:
    """The literal dict a module assigns to `name` at its top level, or None."""
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == name for t in node.targets):
            return ast.literal_eval(node.value)
    return None


def _reason(decorator: ast.expr) -> str | None:
    """The reason of an `@pytest.mark.xfail(strict=True, reason=...)` decorator, or None for any other."""
    if not (isinstance(decorator, ast.Call) and getattr(decorator.func, "attr", "") == "xfail"):
        return None
    keywords = {k.arg: k.value for k in decorator.keywords}
    strict = keywords.get("strict")
    if not (isinstance(strict, ast.Constant) and strict.value is True):
        return None
    reason = keywords.get("reason")
    try:
        return str(ast.literal_eval(reason)) if reason is not None else ""
    except ValueError:
        return ""


def known_tests(suite: str) -> list[Known]:
    """The suite's strict expected failures and pinned regressions, in file order."""
    paths = registry.get(suite).paths
    found = []
    tree = ast.parse((REPO_ROOT / paths[0]).read_text())
    about = _declared(tree, "FINDINGS_ABOUT") or {}
    for node in tree.body:
        if isinstance(node, ast.FunctionDef):
            for decorator in node.decorator_list:
                reason = _reason(decorator)
                if reason is not None:
                    found.append(Known(f"{paths[0]}::{node.name}", reason, about.get(node.name)))
    for path in paths[1:]:
        if "regressions" in Path(path).parts and (REPO_ROOT / path).exists():  # the suite's other files are not pins
            module = ast.parse((REPO_ROOT / path).read_text())
            doc = ast.get_docstring(module) or path
            found.append(Known(path, doc.splitlines()[0], _declared(module, "ABOUT")))
    return found


def mismatch(known: Known, named: dict) -> str | None:
    """Why `known` cannot answer a log naming `named` ({"guard"/"frame"/"op": text}), or None when it can: every
    key the log names and the finding declares must match, and the log must share at least one of them."""
    named = {key: named[key] for key in ABOUT_KEYS if named.get(key)}
    if not named:
        return None  # the log names none: its oracle and conditions decide, as they always did
    about = known.about or {}
    shared = [key for key in named if key in about]
    if not shared:
        if not about:
            return f"it declares no guard, frame or op (the log names its {' and '.join(named)})"
        return ", ".join(f"its {k} is /{v}/" for k, v in about.items()) + f", and the log names no {' or '.join(about)}"
    for key in shared:
        if not re.search(about[key], named[key]):
            return f"its {key} is /{about[key]}/"  # the log's own is printed with its evidence
    return None


def answering(known: list[Known], named: dict) -> tuple[list[Known], list[str]]:
    """The findings that may answer a log naming `named`, and a note on each one that cannot and why."""
    eligible, notes = [], []
    for finding in known:
        why = mismatch(finding, named)
        if why is None:
            eligible.append(finding)
        else:
            notes.append(f"not the known finding {finding.test.split('::')[-1]}: {why}")
    return eligible, notes


def run_known(suite: str, timeout: float = 300, known: list[Known] | None = None) -> tuple[list[Known], list[dict]]:
    """Run the suite's known findings (or those of them given) as ordinary tests (`--runxfail`); their failure
    records, first first."""
    known = known_tests(suite) if known is None else known
    if not known:
        return known, []
    work = Path(tempfile.mkdtemp(prefix="harness-known-"))
    run_pytest([*(k.test for k in known), "-q", "--runxfail", "--profile", "gate", "--report-dir", str(work)],
               timeout=timeout)
    return known, read_records(work / "failures.jsonl")


def reason_of(known: list[Known], test: str) -> str:
    return next((k.reason for k in known if test.startswith(k.test)), "")
