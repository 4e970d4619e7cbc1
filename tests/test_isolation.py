"""Nothing lost, nothing hung: under xdist a target that segfaults or hangs fails its test with the example it was
running (drawn values, stack of a hang), and the run goes on to the next test."""
from __future__ import annotations

import pytest

from harness.mutants import run_pytest
from harness.record import read_records
from reports.summary import load

pytestmark = pytest.mark.subprocess  # every test here runs a suite in another process


def test_a_segfault_and_a_hang_are_recorded_with_their_examples_and_the_run_goes_on(tmp_path):
    code, output = run_pytest(["tests/targets_that_crash.py", "-n", "1", "-p", "no:randomly", "--example-timeout",
                               "5", "--report-dir", str(tmp_path), "--max-worker-restart", "4",
                               "--hypothesis-seed", "3"], timeout=300)
    assert code == 1, output[-3000:]
    failures = {row["oracle"]: row for row in read_records(tmp_path / "failures.jsonl")}
    assert failures["crash"]["drawn"] == {"n": 3, "kind": "segfault"}, failures
    assert failures["hang"]["drawn"] == {"n": 4, "kind": "hang"}, failures
    assert "time.sleep" in failures["hang"]["details"]["stacks"] or "test_hangs_when_n_is_four" in \
        failures["hang"]["details"]["stacks"]
    after = load(tmp_path, "examples")
    assert any(row["drawn"].get("kind") == "after" and row["verdict"] == "pass" for row in after), output[-3000:]
    assert "1 passed" in output and "2 failed" in output, output[-2000:]
    # Recorded by the controller (pytest_handlecrashitem) and by the replacement workers: one run, one seed.
    assert {(row["run_id"], row["seed"]) for row in after} == {(failures["crash"]["run_id"], 3)}
    assert 'harness: the example in flight' in output and '{"n": 3, "kind": "segfault"}' in output
