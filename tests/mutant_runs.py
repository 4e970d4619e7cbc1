"""Shared by the mutant self-tests: run a suite on a mutated scratch copy of SGLang and read its verdict; `edited`
recompiles one line of an installed SGLang method for the in-process mutants.

Each run is forked from a warm parent (`harness.mutate.warm`, one per interpreter and test process) that has
imported torch, pytest, Hypothesis and SGLang's third-party imports, never SGLang: a run then costs its own SGLang
import (3 s) and its examples, not the 20 s of a cold interpreter. HARNESS_COLD_MUTANTS=1 starts each afresh.
"""
from __future__ import annotations

import atexit
import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from harness.errors import HarnessError
from harness.mutants import Edit, device_args, run_pytest, scratch_sglang
from harness.mutate.warm import WarmWorker
from harness.oracles.registry import require
from harness.record import read_records

_WARM: dict[str, WarmWorker] = {}


@dataclasses.dataclass(frozen=True)
class Mutant:
    """One row of a mutant table: `edits` applied to a scratch copy of SGLang, the suite `test` run on it (with
    `extra` options, or `-k select`), and what its first failure record must say: `oracle` (a registered one,
    checked when the table is built, or "crash": SGLang raised, no oracle judged) with every one of `texts` in its
    diagnosis and of `details` in its details."""
    edits: list[Edit]
    oracle: str
    texts: list[str]
    test: str = ""
    extra: tuple[str, ...] = ()
    select: str = ""
    details: list[str] = dataclasses.field(default_factory=list)

    def __post_init__(self):
        if self.oracle != "crash":
            require(self.oracle)


def tiered(table: dict[str, Mutant]) -> list:
    """The table's row names for `parametrize`, in name order: the first row of each (oracle, test, options) runs
    in every selftest; a further row firing the same oracle on the same path is `extended` (the nightly's and
    `selftest --extended`'s), so the default selftest still shows every oracle fire on every path a table drives."""
    seen, rows = set(), []
    for name in sorted(table):
        mutant = table[name]
        where = (mutant.select or mutant.test).split()
        key = (mutant.oracle, where[0] if where else "", mutant.extra)
        rows.append(pytest.param(name, marks=pytest.mark.extended) if key in seen else name)
        seen.add(key)
    return rows


def _warm_worker(python: Path | None) -> WarmWorker:
    key = str(python or sys.executable)
    if key not in _WARM:
        _WARM[key] = WarmWorker(python=key)
        atexit.register(_WARM[key].close)
    return _WARM[key]


def sglang_package(python: Path) -> str:
    """The directory of the `sglang` package that interpreter `python` imports."""
    done = subprocess.run([str(python), "-c", "import importlib.util; "
                           "print(list(importlib.util.find_spec('sglang').submodule_search_locations)[0])"],
                          capture_output=True, text=True, timeout=120, check=True)
    return done.stdout.strip()


def run_suite_on_mutant(suite: str, name: str, edits: list[Edit], report_dir: Path,
                        extra: tuple[str, ...] = (), timeout: float = 600,
                        python: Path | None = None) -> tuple[int, str]:
    """Run `suite` with `edits` applied to a scratch copy (of the SGLang that `python` imports, default this
    environment's), on HARNESS_SELFTEST_DEVICE (`extra` may override it); skips (with the reason) if the edit does
    not apply to that release, so a moved function is visible, never a silent pass."""
    try:
        base = sglang_package(python) if python is not None else None
        root = scratch_sglang(edits, base=base) if edits else None
    except HarnessError as error:
        pytest.skip(f"mutant {name} does not apply to the installed SGLang: {error}")
    args = [suite, "-x", "-q", "--report-dir", str(report_dir), *device_args(), *extra]
    if os.environ.get("HARNESS_COLD_MUTANTS") == "1":
        return run_pytest(args, sglang_root=root, mutant=name, timeout=timeout,
                          python=str(python) if python is not None else None)
    return _warm_worker(python).run(args, sglang_root=root, timeout=timeout, mutant=name,
                                    output=report_dir / "pytest-output.txt")


def failure_records(report_dir: Path) -> list[dict]:
    """The run's failure records (`failures.jsonl`), first failure first."""
    return read_records(report_dir / "failures.jsonl")


def assert_caught(name: str, mutant: Mutant, report_dir: Path, extra: tuple[str, ...] = (),
                  timeout: float = 600) -> dict:
    """`assert_mutant_fails` for a table row: its test, edits, options, oracle and texts; and each of its
    `details` in the failure record's details."""
    record = assert_mutant_fails(mutant.test, name, mutant.edits, report_dir, mutant.oracle, mutant.texts,
                                 extra=(*mutant.extra, *extra), timeout=timeout)
    for text in mutant.details:
        assert text in json.dumps(record["details"]), (text, record["details"])
    return record


def assert_mutant_fails(test: str, name: str, edits: list[Edit], report_dir: Path, oracle: str, texts: list[str],
                        extra: tuple[str, ...] = (), timeout: float = 600) -> dict:
    """Run `test` on the mutant: it must fail, its first failure record naming `oracle` with every one of `texts`
    in the diagnosis; returns that record."""
    code, output = run_suite_on_mutant(test, name, edits, report_dir, extra=extra, timeout=timeout)
    assert code == 1, f"mutant {name} was not detected (exit {code}):\n{output[-3000:]}"
    failures = failure_records(report_dir)
    assert failures, f"mutant {name}: the suite failed but wrote no failure record:\n{output[-3000:]}"
    assert failures[0]["oracle"] == oracle, failures[0]
    for text in texts:
        assert text in failures[0]["diagnosis"], (text, failures[0]["diagnosis"])
    return failures[0]


def edited(function, old: str, new: str):
    """`function` recompiled from its source with `old` replaced by `new` (exactly once), in its own module's
    globals: a mutant of one line of an installed SGLang method, set with MonkeyPatch and undone after."""
    import inspect
    import textwrap

    source = textwrap.dedent(inspect.getsource(function))
    assert source.count(old) == 1, f"{function.__qualname__}: the mutant's text is not in the installed source once"
    source = source.replace(old, new)
    namespace: dict = {}
    if "super()" not in source:
        exec(compile(source, inspect.getsourcefile(function), "exec"), function.__globals__, namespace)
        return namespace[function.__name__]
    # a method calling zero-argument super() needs the `__class__` cell its class body gave it: recompiled alone it
    # has none, so `super()` is spelled out against the method's class, which a factory's closure holds
    owner = function.__globals__[function.__qualname__.split(".")[0]]
    body = textwrap.indent(source.replace("super()", "super(__class__, self)"), "    ")
    factory = f"def _with_class(__class__):\n{body}\n    return {function.__name__}\n"
    exec(compile(factory, inspect.getsourcefile(function), "exec"), function.__globals__, namespace)
    return namespace["_with_class"](owner)
