"""What the harness already knows fails on the installed SGLang: a suite's strict expected failures (its
`test_findings_*` tests marked `xfail(strict=True)`, kept so they show when SGLang changes) and its pinned
regressions (`suites/regressions/`). `python -m harness repro` runs these first, in seconds, so that a log whose
failure is one of them is named as that known finding instead of being searched for again.
"""
from __future__ import annotations

import ast
import dataclasses
import tempfile
from pathlib import Path

from harness import registry
from harness.mutants import REPO_ROOT, run_pytest
from harness.record import read_records


@dataclasses.dataclass
class Known:
    test: str  # the node id (a parametrised test: all its parameters)
    reason: str  # the xfail reason, or the regression module's docstring's first line


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
    for node in tree.body:
        if isinstance(node, ast.FunctionDef):
            for decorator in node.decorator_list:
                reason = _reason(decorator)
                if reason is not None:
                    found.append(Known(f"{paths[0]}::{node.name}", reason))
    for path in paths[1:]:
        if "regressions" in Path(path).parts and (REPO_ROOT / path).exists():  # the suite's other files are not pins
            doc = ast.get_docstring(ast.parse((REPO_ROOT / path).read_text())) or path
            found.append(Known(path, doc.splitlines()[0]))
    return found


def run_known(suite: str, timeout: float = 300) -> tuple[list[Known], list[dict]]:
    """Run the suite's known findings as ordinary tests (`--runxfail`); their failure records, first first."""
    known = known_tests(suite)
    if not known:
        return known, []
    work = Path(tempfile.mkdtemp(prefix="harness-known-"))
    run_pytest([*(k.test for k in known), "-q", "--runxfail", "--profile", "gate", "--report-dir", str(work)],
               timeout=timeout)
    return known, read_records(work / "failures.jsonl")


def reason_of(known: list[Known], test: str) -> str:
    return next((k.reason for k in known if test.startswith(k.test)), "")
