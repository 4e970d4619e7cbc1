"""The functions `mutate` changes: the registry's coverage targets (`path/in/sglang[::name]`; a whole file means
every function in it), each with the suites that drive its file; and a seeded sample of their mutants."""
from __future__ import annotations

import ast
import dataclasses
import random
from pathlib import Path
from collections.abc import Sequence

from harness.errors import HarnessError
from harness.mutate.operators import Mutant, function_mutants, functions, valid
from harness.registry import SUITES, Suite


@dataclasses.dataclass(frozen=True)
class Target:
    file: str  # path inside the sglang package
    function: str  # qualified name: `function` or `Class.method`
    suites: tuple[Suite, ...]  # the suites whose coverage lists the file
    node: ast.AST
    text: str  # the file's text


def targeted_functions(sglang_dir: Path) -> list[Target]:
    """Every targeted function this SGLang has, in file and line order (files it lacks are left out)."""
    wanted: dict[str, list[str | None]] = {}
    owners: dict[str, list[Suite]] = {}
    for suite in SUITES:
        for entry in suite.coverage:
            relative, _, name = entry.partition("::")
            wanted.setdefault(relative, []).append(name or None)
            if suite not in owners.setdefault(relative, []):
                owners[relative].append(suite)
    found = []
    for relative, names in wanted.items():
        path = Path(sglang_dir) / relative
        if not path.exists():
            continue
        text = path.read_text()
        for qualified, node in functions(ast.parse(text)):
            if None in names or any(qualified == n or qualified.startswith(f"{n}.") for n in names):
                found.append(Target(relative, qualified, tuple(owners[relative]), node, text))
    return found


def narrow(found: list[Target], names: Sequence[str]) -> list[Target]:
    """The targets named (`function`, `Class.method` or `Class`); an unknown name is a usage error."""
    if not names:
        return found
    chosen = [t for t in found if any(n in (t.function, t.function.split(".")[0], t.function.split(".")[-1])
                                      for n in names)]
    known = {n for t in found for n in (t.function, t.function.split(".")[0], t.function.split(".")[-1])}
    unknown = [n for n in names if n not in known]
    if unknown:
        raise HarnessError(f"no targeted function named {', '.join(unknown)}; the registry targets "
                           f"{len(found)} functions, e.g. {', '.join(t.function for t in found[:6])} "
                           "(see `python -m harness mutate --list`)")
    return chosen


def mutants(chosen: list[Target]) -> list[Mutant]:
    """Every candidate mutant of the chosen functions, in file, line and operator order (not yet parsed)."""
    every = [m for t in chosen for m in function_mutants(t.file, t.text, t.function, t.node)]
    every.sort(key=lambda m: (m.file, m.line, m.operator, m.id))
    return list(dict((m.id, m) for m in every).values())


def sample(every: list[Mutant], texts: dict[str, str], count: int | None, seed: int) -> list[Mutant]:
    """`count` valid mutants (all when None) drawn with `seed`, in file and line order; `texts`: file -> text.
    Only drawn ones are parsed (a file takes milliseconds; thousands of candidates would take minutes)."""
    order = list(range(len(every)))
    random.Random(seed).shuffle(order)
    dumps = {file: ast.dump(ast.parse(text)) for file, text in texts.items()}
    picked = []
    for i in order:
        if count is not None and len(picked) == count:
            break
        if valid(every[i], texts[every[i].file], dumps[every[i].file]):
            picked.append(i)
    return [every[i] for i in sorted(picked)]
