"""Each mutant re-introduces known bug 2 (or its cause) into a scratch copy of the installed SGLang; the prefill
suite must fail with a diagnosis naming the mode and the guard (or the missing capture stream). Clean SGLang
must pass."""
from __future__ import annotations

import json

import pytest

from harness.record import read_records
from tests.mutant_runs import failure_records, run_suite_on_mutant

SUITE = "suites/test_prefill_pcg.py"
RUNNER = "srt/model_executor/runner/prefill_cuda_graph_runner.py"
TC_BACKEND = "srt/model_executor/runner_backend/tc_piecewise_cuda_graph_backend.py"

LOCAL_NORMALISED = """        pcg_forward_mode = (
            ForwardMode.EXTEND
            if forward_batch.forward_mode == ForwardMode.MIXED
            else forward_batch.forward_mode
        )
"""
GLOBAL_NORMALISED = """        pcg_global_forward_mode = (
            ForwardMode.EXTEND
            if forward_batch.global_forward_mode == ForwardMode.MIXED
            else forward_batch.global_forward_mode
        )
"""

# name -> (edits, oracle of the first failure, texts its diagnosis must hold, texts its details must hold)
MUTANTS = {
    # (a) Known bug 2 as released up to 0.5.9: load_batch passes MIXED through in both fields.
    "mixed_not_normalised": (
        [(RUNNER, LOCAL_NORMALISED + GLOBAL_NORMALISED,
          "        pcg_forward_mode = forward_batch.forward_mode\n"
          "        pcg_global_forward_mode = forward_batch.global_forward_mode\n")],
        "no-recompile", ["after capture", "forward_mode=MIXED"], ["forward_mode"]),
    # (b) Half a fix: forward_mode normalised, global_forward_mode not.
    "global_mode_not_normalised": (
        [(RUNNER, GLOBAL_NORMALISED, "        pcg_global_forward_mode = forward_batch.global_forward_mode\n")],
        "no-recompile", ["after capture", "global_forward_mode=MIXED"], ["global_forward_mode"]),
    # (c) The capture session never publishes the capture stream (compile_phase.set_pcg_capture_stream).
    "capture_stream_not_set": (
        [(TC_BACKEND, "                with set_pcg_capture_stream(stream):",
          "                with set_pcg_capture_stream(None):")],
        "capture-stream", ["pcg-capture-stream-not-set", "capture"], ["capture stream is not set"]),
    # (d) The capture loop skips the smallest token count: its batches still run (padded to the next size), so
    # only the capture counted against the case's arithmetic (sizes x pieces) can fail.
    "smallest_shape_not_captured": (
        [(RUNNER, "        capture_shapes = list(reversed(self.capture_num_tokens))\n",
          "        capture_shapes = list(reversed(self.capture_num_tokens))[:-1]\n")],
        "graph-replay", ["the capture recorded 6 graph(s), expected 9", "3 token counts x 3 graph(s)"], []),
}


COMPILE_PHASE = "srt/compilation/compile_phase.py"
PIECEWISE_CONTEXT = "srt/model_executor/runner_backend_utils/tc_piecewise_cuda_graph/context_manager.py"

# State carried across steps, for the stateful machine alone (`-k PrefillMachine`): name -> as MUTANTS.
STATEFUL_MUTANTS = {
    # The capture stream outlives the capture session: a later serve-time recompile would capture silently.
    "capture_stream_left_set": (
        [(COMPILE_PHASE, "    finally:\n        _pcg_capture_stream = None", "    finally:\n        pass")],
        "process-state", ["compile_phase.pcg_capture_stream"], []),
    # The piecewise "inside a graph" flag outlives a replay: later eager forwards take the compiled trampoline.
    "piecewise_flag_left_set": (
        [(PIECEWISE_CONTEXT, "    finally:\n        _in_tc_piecewise_cuda_graph = False",
          "    finally:\n        pass")],
        "process-state", ["tc_piecewise.in_cuda_graph"], []),
    # Known bug 2 reached by a sequence of steps: the machine's MIXED step recompiles.
    "mixed_not_normalised": MUTANTS["mixed_not_normalised"],
}


def _first_failure(report_dir) -> dict:
    failures = failure_records(report_dir)
    assert failures, "the suite failed without writing a failure record"
    return failures[0]


@pytest.mark.parametrize("name", sorted(MUTANTS))
def test_mutant_fails_the_suite_with_its_diagnosis(name, tmp_path):
    edits, oracle, in_diagnosis, in_details = MUTANTS[name]
    code, output = run_suite_on_mutant(SUITE, name, edits, tmp_path, timeout=900)
    assert code == 1, f"mutant {name} was not detected (exit {code}):\n{output[-3000:]}"
    failure = _first_failure(tmp_path)
    assert failure["oracle"] == oracle, failure
    for text in in_diagnosis:
        assert text in failure["diagnosis"], (text, failure)
    details = json.dumps(failure["details"])
    for text in in_details:
        assert text in details, (text, failure)
    assert failure["sglang_mutant"] == name and failure["test"] in failure["replay"]


@pytest.mark.parametrize("name", sorted(STATEFUL_MUTANTS))
def test_stateful_machine_finds_carried_state(name, tmp_path):
    edits, oracle, in_diagnosis, in_details = STATEFUL_MUTANTS[name]
    code, output = run_suite_on_mutant(SUITE, name, edits, tmp_path, extra=("-k", "PrefillMachine"), timeout=900)
    assert code == 1, f"stateful machine missed mutant {name} (exit {code}):\n{output[-3000:]}"
    failure = _first_failure(tmp_path)
    assert failure["oracle"] == oracle and "PrefillMachine" in failure["test"], failure
    for text in in_diagnosis:
        assert text in failure["diagnosis"], (text, failure)


def test_clean_sglang_passes(tmp_path):
    code, output = run_suite_on_mutant(SUITE, "clean", [], tmp_path, timeout=900)
    assert code == 0, output[-3000:]
    rows = read_records(tmp_path / "examples.jsonl")
    strict = [r for r in rows if r["suite"] != "prefill_pcg_findings"]  # strict xfails: known findings
    assert len(strict) >= 100 and not [r for r in strict if r["verdict"] in ("fail", "error")]
    assert {r["notes"].get("path") for r in strict} >= {"graph", "eager"}
