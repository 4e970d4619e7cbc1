"""Shared by the mutant self-tests: run a suite on a mutated scratch copy of SGLang and read its verdict."""
from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from harness.errors import HarnessError
from harness.mutants import Edit, device_args, run_pytest, scratch_sglang
from harness.record import read_records


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
    return run_pytest([suite, "-x", "-q", "--report-dir", str(report_dir), *device_args(), *extra], sglang_root=root,
                      mutant=name, timeout=timeout, python=str(python) if python is not None else None)


def failure_records(report_dir: Path) -> list[dict]:
    """The run's failure records (`failures.jsonl`), first failure first."""
    return read_records(report_dir / "failures.jsonl")


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
