"""The gate end to end, as a pull request's CI runs it (`python -m harness gate`), on scratch copies of the installed
SGLang: `--base` on two identical trees reports nothing; on trees differing by one edit that no oracle names (SGLang's
accumulated recompile limit halved) it reports that setting alone, and `--no-behaviour-change` fails on it; `--select`
on a one-line change runs only the test items the line map says execute that line, and still fails on a mutant of
it."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from harness.mutants import REPO_ROOT, scratch_sglang

pytestmark = pytest.mark.subprocess

ONE_TEST = "suites/test_decode_capture.py::test_replay_matches_eager_and_patch_model_contract"
HALVED_LIMIT = [("srt/compilation/torch_compile_decoration.py",
                 "torch._dynamo.config.accumulated_cache_size_limit = 1024",
                 "torch._dynamo.config.accumulated_cache_size_limit = 512")]
PADDED_ROWS = [("srt/model_executor/runner/decode_cuda_graph_runner.py",
                "output.next_token_logits[: self.raw_num_token]",
                "output.next_token_logits[: self.bs * self.captured_req_width]")]


def _gate(*args: str, timeout: float = 900) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "harness", "gate", *args], cwd=REPO_ROOT, capture_output=True,
                          text=True, timeout=timeout)


@pytest.mark.extended  # the run below compares two trees too, and finds the one setting only
def test_base_on_identical_trees_reports_nothing(tmp_path):
    clean = str(scratch_sglang([]))
    done = _gate(clean, "--base", clean, "--suites", ONE_TEST, "--no-behaviour-change", "--report-dir",
                 str(tmp_path))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-2000:]
    assert "behaviour: 0 difference(s) in" in done.stdout


def test_base_reports_a_setting_no_oracle_names(tmp_path):
    clean, halved = str(scratch_sglang([])), str(scratch_sglang(HALVED_LIMIT))
    refactor = _gate(halved, "--base", clean, "--suites", ONE_TEST, "--no-behaviour-change", "--report-dir",
                     str(tmp_path / "refactor"))
    assert refactor.returncode == 1, refactor.stdout[-3000:]
    assert "note dynamo_budget.accumulated_recompile_limit | 1024 | 512" in refactor.stdout
    # every oracle passed on both trees (no failure record): the exit is the comparison's, under the flag alone
    assert not (tmp_path / "refactor" / "failures.jsonl").exists() and "1 passed" in refactor.stdout
    # and the setting is all it found: every example drew the same values and gave the same verdict and outputs
    rows = [json.loads(line) for line in (tmp_path / "refactor" / "behaviour.jsonl").read_text().splitlines()]
    assert rows and {row["what"] for row in rows} == {"note dynamo_budget.accumulated_recompile_limit"}, rows[:3]
    junit = (tmp_path / "refactor" / "junit.xml").read_text()
    assert 'name="behaviour"' in junit and "--no-behaviour-change" in junit
    assert "accumulated_recompile_limit" in (tmp_path / "refactor" / "report.html").read_text()


def test_select_runs_the_items_that_reach_the_changed_line_and_catches_its_mutant(tmp_path):
    line_map = tmp_path / "map"
    # the map of three of the suite's tests: two replay the padded rows the mutant returns, one never runs a runner
    built = subprocess.run([sys.executable, "-m", "pytest", "suites/test_decode_capture.py", "--profile=gate", "-k",
                            "replay_matches_eager_and_patch_model_contract or padding_disabled or ragged_layouts",
                            "--sglang-coverage", f"--report-dir={line_map}", "-q", "-p", "no:cacheprovider"],
                           cwd=REPO_ROOT, capture_output=True, text=True, timeout=900)
    assert built.returncode == 0, built.stdout[-3000:]
    recorded = json.loads((line_map / "line_tests.json").read_text())
    all_items = {i for lines in recorded["files"].values() for items in lines.values() for i in items}
    done = _gate(str(scratch_sglang(PADDED_ROWS)), "--select", str(line_map), "--report-dir", str(tmp_path / "r"))
    assert done.returncode == 1, done.stdout[-3000:]  # the mutant is caught
    chosen = [line.split()[0] for line in done.stdout.splitlines() if "<- srt/model_executor/runner/decode" in line]
    assert chosen and set(chosen) < all_items, done.stdout[-3000:]  # some items, not every one the map knows
    failures = [json.loads(line) for line in (tmp_path / "r" / "failures.jsonl").read_text().splitlines()]
    assert failures[0]["oracle"] == "eager-equality" and failures[0]["test"] in chosen
