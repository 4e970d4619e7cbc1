"""Shared by the mutant self-tests: run a suite on a mutated scratch copy of SGLang and read its verdict."""
from __future__ import annotations

from pathlib import Path

import pytest

from harness.errors import HarnessError
from harness.mutants import Edit, run_pytest, scratch_sglang


def run_suite_on_mutant(suite: str, name: str, edits: list[Edit], report_dir: Path,
                        extra: tuple[str, ...] = (), timeout: float = 600) -> tuple[int, str]:
    """Run `suite` with `edits` applied to a scratch copy; skips (with the reason) if the edit does not apply
    to the installed release, so a moved function is visible, never a silent pass."""
    try:
        root = scratch_sglang(edits) if edits else None
    except HarnessError as error:
        pytest.skip(f"mutant {name} does not apply to the installed SGLang: {error}")
    return run_pytest([suite, "-x", "-q", "--report-dir", str(report_dir), *extra], sglang_root=root,
                      mutant=name, timeout=timeout)
