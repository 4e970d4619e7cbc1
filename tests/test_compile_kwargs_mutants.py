"""Each mutant re-introduces a break of the build_torch_compile_kwargs contract into a scratch copy of the
installed SGLang; the suite must fail naming the broken contract (`kwargs-validity` or `hook-contract`). Clean
SGLang must pass. The table is in tests/mutant_tables.py, which other self-tests read too."""
from __future__ import annotations

import pytest

from harness.record import read_records
from tests.mutant_runs import assert_caught, run_suite_on_mutant
from tests.mutant_tables import KWARGS_MUTANTS as MUTANTS, KWARGS_SUITE as SUITE

pytestmark = pytest.mark.subprocess  # every test here runs a suite in another process

@pytest.mark.parametrize("name", sorted(MUTANTS))
def test_mutant_fails_the_suite_with_its_diagnosis(name, tmp_path):
    failure = assert_caught(name, MUTANTS[name], tmp_path)
    assert failure["sglang_mutant"] == name and failure["test"] in failure["replay"]


def test_clean_sglang_passes(tmp_path):
    code, output = run_suite_on_mutant(SUITE, "clean", [], tmp_path)
    assert code == 0, output[-3000:]
    rows = read_records(tmp_path / "examples.jsonl")
    assert len(rows) >= 40 and not [r for r in rows if r["verdict"] in ("fail", "error")]
