"""The project's imports point one way: no cycle, and no arrow up a layer (devices and oracles never import
targets, a version layout never imports a sibling layout, tests never import bench). The checker reads the AST
(imports inside functions included), so a cycle hidden in a lazy import counts too."""
from __future__ import annotations

import ast
import re
import shutil
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PACKAGES = ("harness", "strategies", "suites", "reports", "tests", "bench")
# (importer prefix, imported prefix): an arrow that must not exist
FORBIDDEN = (("harness.devices", "harness.targets"), ("harness.devices", "harness.oracles"),
             ("harness.oracles", "harness.targets"), ("harness.models", "harness.targets"), ("tests", "bench"))
LAYOUT = re.compile(r"^harness\.targets\.(\w+)\.(v\d\w*|main_\w+)$")  # one module per SGLang layout


def _module(root: Path, path: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph(root: Path) -> dict[str, set[str]]:
    """module -> the project's modules it imports (the deepest existing module of each imported name)."""
    files = {_module(root, p): p for package in PACKAGES for p in (root / package).rglob("*.py")
             if "__pycache__" not in p.parts}
    graph = {}
    for name, path in files.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        found = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                    base = ".".join(anchor + ([base] if base else []))
                targets = [base] + [f"{base}.{alias.name}" for alias in node.names]
            else:
                continue
            for target in targets:
                while target and target not in files:
                    target = target.rpartition(".")[0]
                if target and target != name:
                    found.add(target)
        graph[name] = found
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected groups of more than one module (Tarjan), each sorted."""
    index, low, stack, on_stack, groups = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while not group or group[-1] != v:
                group.append(stack.pop())
                on_stack.discard(group[-1])
            if len(group) > 1:
                groups.append(sorted(group))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return groups


def _under(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def upward_arrows(graph: dict[str, set[str]]) -> list[str]:
    bad = [f"{a} -> {b}" for a, deps in graph.items() for b in deps
           for src, dst in FORBIDDEN if _under(a, src) and _under(b, dst)]
    for a, deps in graph.items():
        mine = LAYOUT.match(a)
        for b in deps:
            theirs = LAYOUT.match(b)
            if mine and theirs and mine.group(1) == theirs.group(1):
                bad.append(f"{a} -> {b} (a layout imports a sibling layout)")
    return sorted(bad)


def test_the_project_has_no_cycle_and_no_upward_arrow():
    graph = import_graph(REPO)
    assert len(graph) > 50, f"the checker found only {len(graph)} modules: it is not reading the project"
    assert not cycles(graph), cycles(graph)
    assert not upward_arrows(graph), upward_arrows(graph)


def _copy(tmp_path: Path) -> Path:
    for package in PACKAGES:
        shutil.copytree(REPO / package, tmp_path / package, ignore=shutil.ignore_patterns("__pycache__"))
    return tmp_path


def test_the_checker_fires_on_an_added_cycle_and_upward_arrows(tmp_path):
    root = _copy(tmp_path)
    # a cycle through a lazy import: harness.record imports harness.oracles; the reverse closes it
    (root / "harness/oracles/__init__.py").write_text((root / "harness/oracles/__init__.py").read_text()
                                                      + "\n\ndef _late():\n    from harness import record  # noqa\n")
    (root / "harness/oracles/eager.py").write_text((root / "harness/oracles/eager.py").read_text()
                                                   + "\nfrom harness.targets import decode  # noqa\n")
    (root / "harness/targets/decode/v0_5_9.py").write_text((root / "harness/targets/decode/v0_5_9.py").read_text()
                                                           + "\nfrom harness.targets.decode import v0_5_14  # noqa\n")
    graph = import_graph(root)
    assert any({"harness.record", "harness.oracles"} <= set(group) for group in cycles(graph)), cycles(graph)
    arrows = upward_arrows(graph)
    assert "harness.oracles.eager -> harness.targets.decode" in arrows, arrows
    assert ("harness.targets.decode.v0_5_9 -> harness.targets.decode.v0_5_14 (a layout imports a sibling layout)"
            in arrows), arrows


def test_oracles_do_not_probe_which_target_they_hold():
    """An oracle reads a target through `harness.oracles.replay_target.ReplayTarget` (and the attributes every
    target has): `getattr(target, ...)` / `hasattr(target, ...)` would be the oracles -> targets import this file
    forbids, gone underground. Probing SGLang's own objects (`target.runner`) for a release's names stays allowed."""
    probes = []
    for path in sorted((REPO / "harness" / "oracles").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) \
                    and node.func.id in ("getattr", "hasattr") and node.args \
                    and isinstance(node.args[0], ast.Name) and node.args[0].id == "target":
                probes.append(f"{path.name}:{node.lineno}")
    assert not probes, f"oracles asking which target they hold: {probes}"
