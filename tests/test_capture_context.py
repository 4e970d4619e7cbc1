"""The capture-context oracle: the rules on logged answers (fast), and mutants of SGLang's capture-mode plumbing
that make the decode runner or the breakable prefill backend tell layers the wrong thing (a suite run each)."""
from __future__ import annotations

import pytest

from harness.models.capture_queries import Answer
from harness.oracles import OracleFailure, capture_context
from tests.mutant_runs import Mutant, assert_caught, run_suite_on_mutant

CAPTURE_MODE = "srt/model_executor/runner_utils/capture_mode.py"
DECODE_RUNNER = "srt/model_executor/runner/decode_cuda_graph_runner.py"
TC_PIECEWISE = "srt/model_executor/runner_backend/tc_piecewise_cuda_graph_backend.py"
DECORATION = "srt/compilation/torch_compile_decoration.py"
DECODE_INDUCTOR = "suites/test_decode_capture.py::test_inductor_compiled_replay_matches_eager"
INDUCTOR_PIECES = "suites/test_prefill_pcg.py::test_piecewise_inductor_pieces"


def test_answers_that_fit_their_phase_pass():
    log = [Answer("forward", "capturing", True, False), Answer("forward", "capturing", True, True),
           Answer("forward", "serving", False, False)]
    assert capture_context.check(log, capture_mode_promised=True, what="decode") == {
        "asked": 3, "during_device_capture": 1, "query": "get_is_capture_mode", "capture_mode_promised": True}


def test_not_capturing_inside_a_device_capture_fails_where_promised():
    log = [Answer("PrefillLayer[0].forward", "capturing", False, True)]
    capture_context.check(log, capture_mode_promised=False, what="tc_piecewise")  # nothing promised there
    with pytest.raises(OracleFailure, match=r"answered False at PrefillLayer\[0\].forward while the device"):
        capture_context.check(log, capture_mode_promised=True, what="breakable")


def test_capturing_while_serving_fails():
    with pytest.raises(OracleFailure, match="answered True at forward while the harness ran an eager"):
        capture_context.check([Answer("forward", "serving", True, False)], capture_mode_promised=False, what="x")


def test_a_release_without_the_query_is_not_judged():
    log = [Answer("forward", "capturing", None, True), Answer("forward", "serving", None, False)]
    assert capture_context.check(log, capture_mode_promised=True, what="decode")["query"] == "absent"


def test_promises_follow_the_path():
    assert capture_context.promised("decode")
    assert capture_context.promised("prefill", "breakable")
    assert capture_context.promised("prefill", "full", lora=True)
    assert not capture_context.promised("prefill", "full")
    assert not capture_context.promised("prefill", "tc_piecewise", lora=True)


MUTANTS = {
    # The decode runner captures outside model_capture_mode(): LoRA kernel recording, dispose_tensor and
    # compile_in_capture_mode all see "not capturing" inside the graph.
    "decode_capture_outside_capture_mode": Mutant(
        test="suites/test_decode_capture.py::test_replay_matches_eager_and_patch_model_contract",
        edits=[(DECODE_RUNNER, "            with model_capture_mode():\n                self.capture()",
                "            if True:\n                self.capture()")],
        oracle="capture-context",
        texts=["get_is_capture_mode() answered False", "DecodeModel.forward", "decode runner"]),
    # The capture-mode query forgets breakable captures (which do not enter model_capture_mode).
    "query_forgets_breakable_capture": Mutant(
        test="suites/test_prefill_pcg.py::test_live_backends[breakable]",
        edits=[(CAPTURE_MODE, "return is_capture_mode or is_in_breakable_cuda_graph()", "return is_capture_mode")],
        oracle="capture-context",
        texts=["get_is_capture_mode() answered False", "PrefillLayer[", "breakable backend"]),
    # model_capture_mode() never turns the flag off: the eager forwards after capture take capture-only branches.
    "capture_mode_left_on": Mutant(
        test="suites/test_decode_capture.py::test_replay_matches_eager_and_patch_model_contract",
        edits=[(CAPTURE_MODE, "        is_capture_mode = False\n"
                              "        get_flags().capture.disable_dispose_tensor = False",
                "        get_flags().capture.disable_dispose_tensor = False")],
        oracle="capture-context",
        texts=["get_is_capture_mode() answered True", "while the harness ran an eager"]),
    # The compile pass no longer switches the fused ops to their compile-safe forward: Dynamo traces the eager
    # dispatch (the fused CUDA kernel on a GPU). On the CPU both forwards compute the same, so outputs agree.
    "fused_ops_not_switched_for_compile": Mutant(
        test=INDUCTOR_PIECES,
        edits=[(TC_PIECEWISE, "                if compiler != \"eager\":\n"
                              "                    _toggle_fused_ops(inner_model, reverse=False, num_tokens=16)\n",
                "")],
        oracle="capture-context",
        texts=["out of torch.compile mode", "layers.0.act", "prefill tc_piecewise compile pass"]),
    # ... or never switches them back: every eager forward after it runs the compile-safe forward. The
    # `state-at-rest` oracle sees it first, when the runner's construction returns (capture-context would at the
    # first served forward).
    "fused_ops_left_in_compile_mode": Mutant(
        test=INDUCTOR_PIECES,
        edits=[(TC_PIECEWISE, "                _toggle_fused_ops(inner_model, reverse=True, num_tokens=16)",
                "                pass")],
        oracle="state-at-rest",
        texts=["prefill runner's tc_piecewise capture", "model.model.layers.0.act.is_torch_compile: False before"]),
    # The same two on decode's patch_model (`_to_torch` around its torch.compile).
    "patch_model_compiles_fused_ops_uncompiled": Mutant(
        test=DECODE_INDUCTOR,
        edits=[(DECORATION, "            _to_torch(model, reverse=False, num_tokens=num_tokens)\n", "")],
        oracle="capture-context",
        texts=["out of torch.compile mode", "['act']", "decode patch_model compile"]),
    "patch_model_leaves_fused_ops_in_compile_mode": Mutant(
        test=DECODE_INDUCTOR,
        edits=[(DECORATION, "            _to_torch(model, reverse=True, num_tokens=num_tokens)\n", "")],
        oracle="state-at-rest",
        texts=["decode runner's capture of [1] with torch.compile",
               "model.act.is_torch_compile: False before, True after"]),
}


@pytest.mark.subprocess
@pytest.mark.parametrize("name", sorted(MUTANTS))
def test_mutant_is_caught_by_capture_context(name, tmp_path):
    assert_caught(name, MUTANTS[name], tmp_path)


@pytest.mark.subprocess
def test_clean_sglang_passes_breakable_capture_context(tmp_path):
    code, output = run_suite_on_mutant("suites/test_prefill_pcg.py::test_live_backends[breakable]", "", [], tmp_path)
    assert code == 0, output[-3000:]
