"""The oracle registry is the one list: every name the code raises is registered (and every registered name is
raised), each registered self-test exists and names its oracle, `OracleFailure` refuses an unknown name, and
docs/oracles.md's table is the registry's."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

from harness.oracles import OracleFailure
from harness.oracles.registry import DOCS, ORACLES, docs_table, markdown_table

ROOT = Path(__file__).resolve().parent.parent


def _module_name(path: Path) -> str:
    return ".".join(path.relative_to(ROOT).with_suffix("").parts)


def _string_constants(tree: ast.Module) -> dict[str, str]:
    return {target.id: node.value.value for node in tree.body if isinstance(node, ast.Assign)
            and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)
            for target in node.targets if isinstance(target, ast.Name)}


def _forwarders(tree: ast.Module) -> set[str]:
    """Functions of the module that pass their first parameter on as `OracleFailure`'s name (`_fail(oracle, ...)`)."""
    found = {"OracleFailure"}
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef) and node.args.args:
            first = node.args.args[0].arg
            if any(isinstance(call, ast.Call) and getattr(call.func, "id", None) == "OracleFailure" and call.args
                   and getattr(call.args[0], "id", None) == first for call in ast.walk(node)):
                found.add(node.name)
    return found


def raised_names() -> dict[str, set[str]]:
    """Oracle name -> the files that raise it: `OracleFailure("x", ...)` (or through a local helper that passes its
    first argument on), with a literal or a constant the file defines or imports from another harness module."""
    files = [*sorted((ROOT / "harness").rglob("*.py")), *sorted((ROOT / "suites").rglob("*.py"))]
    trees = {_module_name(path): (path, ast.parse(path.read_text())) for path in files}
    constants = {name: _string_constants(tree) for name, (_, tree) in trees.items()}
    raised: dict[str, set[str]] = {}
    for module, (path, tree) in trees.items():
        names = dict(constants[module])
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module in constants:
                names.update({alias.asname or alias.name: constants[node.module][alias.name]
                              for alias in node.names if alias.name in constants[node.module]})
        raisers = _forwarders(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) in raisers and node.args:
                first = node.args[0]
                value = first.value if isinstance(first, ast.Constant) else names.get(getattr(first, "id", None))
                if isinstance(value, str):
                    raised.setdefault(value, set()).add(str(path.relative_to(ROOT)))
    return raised


def test_every_raised_oracle_is_registered_and_every_registered_one_is_raised():
    raised = raised_names()
    assert set(raised) - set(ORACLES) == set(), f"raised but not registered: {sorted(set(raised) - set(ORACLES))}"
    assert set(ORACLES) - set(raised) == set(), f"registered, raised nowhere: {sorted(set(ORACLES) - set(raised))}"
    for name, oracle in ORACLES.items():
        assert oracle.module in raised[name], f"{name}: registered in {oracle.module}, raised in {raised[name]}"


@pytest.mark.parametrize("name", sorted(ORACLES))
def test_each_oracle_names_self_tests_that_exist_and_name_it(name):
    oracle = ORACLES[name]
    assert oracle.self_tests, f"{name} has no self-test"
    module_constant = Path(oracle.module).stem
    for test in oracle.self_tests:
        path = ROOT / "tests" / test
        assert path.exists(), f"{name}: self-test {test} does not exist"
        text = path.read_text()
        assert name in text or module_constant in text, f"{name}: {test} names neither it nor {oracle.module}"


def test_an_unknown_oracle_name_is_refused_saying_where_to_register_it():
    with pytest.raises(ValueError, match="unknown oracle 'eager-equalty'.*harness/oracles/registry.py"):
        OracleFailure("eager-equalty", "a typo")
    assert OracleFailure("eager-equality", "fine").oracle == "eager-equality"


def test_the_docs_table_is_the_registry():
    assert docs_table(DOCS.read_text()) == markdown_table(), (
        "docs/oracles.md is out of date: run `python -m harness oracles --write-docs`")


def test_each_oracle_has_its_section_in_the_docs():
    sections = {line[3:].strip() for line in DOCS.read_text().splitlines() if line.startswith("## ")}
    assert set(ORACLES) - sections == set(), f"docs/oracles.md lacks `## name` sections for {set(ORACLES) - sections}"
