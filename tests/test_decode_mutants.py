"""Mutants of SGLang's decode graph runner, each re-introduced into a scratch copy of the installed SGLang: the decode
suite must fail with the right oracle and diagnosis; clean SGLang must pass.

- bug1_by_value_patch_model: known bug 1 (SGLang PR #23906, fixed by #27774): the runner imports `patch_model` by
  value from torch_compile_decoration and calls it directly, so the NPU runner's override never runs. Both the
  dynamic check (NPU personality: the override must be what ran during capture) and the static check (no by-value
  import of a rebound name) must fail.
- replay_returns_padded_rows: the replay slices the graph output to the padded batch instead of the real rows;
  the eager oracle must fail on a batch size between captured sizes.
- replay_skips_graph: the full-graph backend returns the captured output without replaying the graph, so every
  replay returns stale values; the device's replay count fails at the first replay (eager equality later).
- pool_size_not_captured / compile_sizes_off_by_one: `get_batch_sizes_to_capture` adds the request-pool size less
  one, or compiles sizes below `torch_compile_max_bs` only; replays still match eager, so only the contract's
  sizes derived from the case (not read back from the runner) can fail.
- replay_launches_graph_twice: every replay launches its graph twice (same numbers); the device's replay count fails.
- is_decode_answers_for_another_mode: `ForwardMode.is_decode` is wrong for every caller, so replay and eager agree;
  eager held to the model's closed form fails.
- The inputs the model reads: seq_lens_sum_not_padded, seq_lens_padded_with_zero, zero_padding_skipped (the
  backend's plan, the padding promise). TARGET_VERIFY: verify_output_sliced_by_requests, verify_view_drops_spec_info.
  Batches planned ahead: planned_replay_skips_positions / _input_ids (the pre-planned branch's re-copy).
  An mRoPE model: mrope_positions_not_copied (the registry slot never filled from the batch),
  mrope_padding_not_zeroed (its padded columns left stale, SGLang's own set edited to agree).
  Configuration: default_capture_list_drops_max_bs, padding_switch_ignored. Admission: verify_width_rule_dropped
  (a verify batch of another width than the capture's admitted).
"""
from __future__ import annotations

import pytest

from tests.mutant_tables import BUG1, STATIC
from tests.mutant_runs import Mutant, assert_caught, run_suite_on_mutant, tiered

pytestmark = pytest.mark.subprocess  # every test here runs a suite in another process

SUITE = "suites/test_decode_capture.py"
RUNNER = "srt/model_executor/runner/decode_cuda_graph_runner.py"

PADDED_ROWS = [
    (RUNNER, "output.next_token_logits[: self.raw_num_token]",
     "output.next_token_logits[: self.bs * self.captured_req_width]"),
]

SKIP_REPLAY = [
    ("srt/model_executor/runner_backend/full_cuda_graph_backend.py",
     "        with graph_pool_replay_scope():\n            self._graphs[shape_key].replay()\n",
     "        with graph_pool_replay_scope():\n            pass\n"),
]

BASE = "srt/model_executor/runner/base_cuda_graph_runner.py"
POOL_NOT_CAPTURED = [(BASE, "        capture_bs += [num_max_requests]\n",
                      "        capture_bs += [num_max_requests - 1]\n")]
COMPILE_OFF_BY_ONE = [(BASE, "if bs <= get_exec().graph.torch_compile_max_bs]",
                       "if bs < get_exec().graph.torch_compile_max_bs]")]

# The runner's uniform-width rule dropped: a verify batch of another width than the capture's (an adaptive
# speculative worker's) is admitted to graphs whose buffers and metadata hold the captured width (NGRAM's own token
# count check still refuses it; the suite's other drawn algorithms are admitted)
WIDTH_RULE_DROPPED = [(RUNNER, "and spec_info.num_tokens_per_req != self.captured_req_width",
                       "and spec_info.num_tokens_per_req != spec_info.num_tokens_per_req")]

# The mode predicate every model and the runner branch on answers for another mode: graph and eager agree, so only
# eager held to the model's closed form fails.
IS_DECODE_WRONG = [("srt/model_executor/forward_batch_info.py",
                    "    def is_decode(self):\n        return self == ForwardMode.DECODE\n",
                    "    def is_decode(self):\n        return self == ForwardMode.TARGET_VERIFY\n")]
# Each replay launches the graph twice: the output is the same, only the device's replay count shows it.
REPLAYS_TWICE = [
    ("srt/model_executor/runner_backend/full_cuda_graph_backend.py",
     "        with graph_pool_replay_scope():\n            self._graphs[shape_key].replay()\n",
     "        with graph_pool_replay_scope():\n            self._graphs[shape_key].replay()\n"
     "            self._graphs[shape_key].replay()\n"),
]

# -- the inputs the model reads --------------------------------------------------------------------------------
# The replay view hands the backend the real rows' seq_lens_sum, not the padded batch's.
SUM_NOT_PADDED = [(RUNNER, "else forward_batch.seq_lens_sum + (bs - raw_bs) * seq_len_fill_value",
                   "else forward_batch.seq_lens_sum")]
# Padded seq_lens filled with 0 instead of the backend's fill value (SGLang's own check covers only the ZERO
# policy's slots): the padding promise fails, or the backend's plan (the view adds the fill value to seq_lens_sum).
SEQ_LENS_PADDED_ZERO = [("srt/model_executor/cuda_graph_buffer_registry.py",
                         '            "seq_lens",\n            _bs,\n            torch.int64,\n            axis="bs",\n'
                         "            padding_policy=PaddingPolicy.FILL_SENTINEL,\n"
                         "            pad_value=seq_len_fill_value,",
                         '            "seq_lens",\n            _bs,\n            torch.int64,\n            axis="bs",\n'
                         "            padding_policy=PaddingPolicy.FILL_SENTINEL,\n            pad_value=0,")]
# The ZERO padding policy leaves the padded tail as the previous replay left it (pool rows, cache slots, positions
# of other requests: the stale out-of-range values of SGLang issue #24361); real rows are unaffected, so only the
# padding promise fails.
ZERO_PADDING_SKIPPED = [("srt/model_executor/cuda_graph_buffer_registry.py",
                         "        elif self.padding_policy == PaddingPolicy.ZERO:\n            tail.zero_()\n",
                         "        elif self.padding_policy == PaddingPolicy.ZERO:\n            pass\n")]
# -- TARGET_VERIFY -----------------------------------------------------------------------------------------------
# The replay slices request rows, not token rows (bs instead of bs x draft tokens).
VERIFY_SLICES_REQUESTS = [(RUNNER, "output.next_token_logits[: self.raw_num_token]",
                           "output.next_token_logits[: self.raw_bs]")]
# The replay view drops the batch's spec info: the backend never plans this batch's verify mask.
VIEW_DROPS_SPEC_INFO = [(RUNNER, "        spec_info=forward_batch.spec_info,\n        lora_ids=(",
                         "        spec_info=None,\n        lora_ids=(")]
# -- batches planned ahead: the pre-planned branch's re-copy (`_copy_replay_inputs`) loses one input -------------
PLANNED_SKIPS_POSITIONS = [
    (RUNNER, "            self.buffers.positions[: self.raw_num_token].copy_(forward_batch.positions)\n",
     "            pass\n")]
PLANNED_SKIPS_INPUT_IDS = [
    (RUNNER, "            self.buffers.input_ids[: self.raw_num_token].copy_(forward_batch.input_ids)\n",
     "            pass\n")]
# -- an mRoPE model's positions ([3, tokens]) through the buffer registry ---------------------------------------
REGISTRY = "srt/model_executor/cuda_graph_buffer_registry.py"
_MROPE_SLOT = ('            "mrope_positions",\n            lambda _bs2, mt: (3, mt),\n            torch.int64,\n'
               '            axis="tokens",\n            slice_fn=lambda buf, n: buf[:, :n],\n')
# The slot registered as one the runner computes itself: the batch's mRoPE positions never copied in.
MROPE_NOT_COPIED = [(REGISTRY, _MROPE_SLOT, _MROPE_SLOT + "            copy_from_fb=False,\n")]
# The slot's padded columns left as the last replay wrote them: its ZERO policy dropped, and mrope_positions taken
# off the index-semantic set, so SGLang's own consistency assertion agrees.
MROPE_PADDING_KEPT = [(REGISTRY, _MROPE_SLOT + "            padding_policy=PaddingPolicy.ZERO,\n", _MROPE_SLOT),
                      ("srt/model_executor/input_buffers.py", '        "mrope_positions",\n        "out_cache_loc",',
                       '        "out_cache_loc",')]
# -- configuration -----------------------------------------------------------------------------------------------
DEFAULT_LIST_DROPS_MAX = [("srt/arg_groups/cuda_graph_hook.py",
                           "    if max_bs not in capture_bs:\n        capture_bs.append(max_bs)\n", "")]
PADDING_SWITCH_IGNORED = [(RUNNER, "            if self.disable_padding\n            else cuda_graph_bs <= self.max_bs",
                           "            if False\n            else cuda_graph_bs <= self.max_bs")]

DYNAMIC = f"{SUITE}::test_replay_matches_eager_and_patch_model_contract"
VERIFY = f"{SUITE}::test_target_verify_replay_matches_eager"
PLANNED = f"{SUITE}::test_planned_batches_replay_matches_eager"
PADDING = f"{SUITE}::test_padding_disabled_replays_only_captured_sizes"
MROPE = f"{SUITE}::test_mrope_replay_matches_eager"

MUTANTS = {
    # The NPU runner runs on the virtual device only, also in a GPU run of the self-tests.
    "bug1_by_value_patch_model_dynamic": Mutant(
        test=DYNAMIC,
        extra=("--personality", "npu", "--device", "cpu"),
        edits=BUG1,
        oracle="hook-contract",
        texts=["`patch_model_npu` ran 0 time(s)", "other patch_model variants ran: {'patch_model'"]),
    "bug1_by_value_patch_model_static": Mutant(
        test=STATIC,
        edits=BUG1,
        oracle="rebinding-by-value-import",
        texts=["sglang.srt.compilation.torch_compile_decoration.patch_model is rebound at",
               "npu_graph_runner.py:",
               "sglang.srt.model_executor.runner.decode_cuda_graph_runner imports it by value at",
               "decode_cuda_graph_runner.py:40"]),
    "replay_returns_padded_rows": Mutant(
        test=DYNAMIC,
        edits=PADDED_ROWS,
        oracle="eager-equality",
        texts=["shape or dtype differs from eager"]),
    # Caught at the first replay by the device's replay count (the stale output may still equal eager there).
    "replay_skips_graph": Mutant(
        test=DYNAMIC,
        edits=SKIP_REPLAY,
        oracle="graph-replay",
        texts=["replayed no captured graph", "replay 0"]),
    "replay_launches_graph_twice": Mutant(
        test=DYNAMIC,
        edits=REPLAYS_TWICE,
        oracle="graph-replay",
        texts=["replayed 2 graph(s)", "replay 0"]),
    "pool_size_not_captured": Mutant(
        test=DYNAMIC,
        edits=POOL_NOT_CAPTURED,
        oracle="hook-contract",
        texts=["but the case asks for capture"]),
    "is_decode_answers_for_another_mode": Mutant(
        test=DYNAMIC,
        edits=IS_DECODE_WRONG,
        oracle="eager-equality",
        texts=["eager itself differs from the model's closed form"]),
    "compile_sizes_off_by_one": Mutant(
        test=DYNAMIC,
        edits=COMPILE_OFF_BY_ONE,
        oracle="hook-contract",
        texts=["but the case asks for capture", "and compile"]),
    "seq_lens_sum_not_padded": Mutant(
        test=DYNAMIC,
        edits=SUM_NOT_PADDED,
        oracle="eager-equality",
        texts=["seq_lens_sum", "away from the sum"]),
    "seq_lens_padded_with_zero": Mutant(
        test=DYNAMIC,
        edits=SEQ_LENS_PADDED_ZERO,
        oracle="eager-equality",
        texts=["padded rows", "`seq_lens`", "promises 1"]),
    "zero_padding_skipped": Mutant(
        test=DYNAMIC,
        edits=ZERO_PADDING_SKIPPED,
        oracle="eager-equality",
        texts=["padded rows", "promises 0"]),
    "verify_output_sliced_by_requests": Mutant(
        test=VERIFY,
        edits=VERIFY_SLICES_REQUESTS,
        oracle="eager-equality",
        texts=["TARGET_VERIFY", "shape or dtype differs"]),
    "verify_view_drops_spec_info": Mutant(
        test=VERIFY,
        edits=VIEW_DROPS_SPEC_INFO,
        oracle="eager-equality",
        texts=["TARGET_VERIFY", "attention metadata visible_drafts"]),
    "planned_replay_skips_positions": Mutant(
        test=PLANNED,
        edits=PLANNED_SKIPS_POSITIONS,
        oracle="eager-equality",
        texts=["`positions` holds"]),
    "planned_replay_skips_input_ids": Mutant(
        test=PLANNED,
        edits=PLANNED_SKIPS_INPUT_IDS,
        oracle="eager-equality",
        texts=["`input_ids` holds"]),
    "mrope_positions_not_copied": Mutant(
        test=MROPE,
        edits=MROPE_NOT_COPIED,
        oracle="eager-equality",
        texts=["not bit-equal to eager", "`mrope_positions[0]` holds"]),
    "mrope_padding_not_zeroed": Mutant(
        test=MROPE,
        edits=MROPE_PADDING_KEPT,
        oracle="eager-equality",
        texts=["padded token columns", "`mrope_positions`", "promises 0"]),
    "default_capture_list_drops_max_bs": Mutant(
        test=DYNAMIC,
        edits=DEFAULT_LIST_DROPS_MAX,
        oracle="hook-contract",
        texts=["default decode capture list", "ending at"]),
    "verify_width_rule_dropped": Mutant(
        test=f"{SUITE}::test_verify_batch_of_another_width_is_refused",
        edits=WIDTH_RULE_DROPPED,
        oracle="admission",
        texts=["the runner admits a TARGET_VERIFY batch", "tokens having captured"]),
    "padding_switch_ignored": Mutant(
        test=PADDING,
        edits=PADDING_SWITCH_IGNORED,
        oracle="eager-equality",
        texts=["accepted", "with padding disabled"]),
}


@pytest.mark.parametrize("name", tiered(MUTANTS))
def test_decode_mutant_fails_the_suite_with_its_diagnosis(name, tmp_path):
    assert_caught(name, MUTANTS[name], tmp_path)


@pytest.mark.parametrize("personality", ["cuda", "npu"])
def test_clean_sglang_passes_the_decode_suite(personality, tmp_path):
    virtual = ("--device", "cpu") if personality == "npu" else ()  # the NPU runner: virtual device only
    code, output = run_suite_on_mutant(SUITE, "clean", [], tmp_path, extra=("--personality", personality, *virtual),
                                       timeout=600)
    assert code == 0, f"clean SGLang failed the decode suite ({personality}):\n{output[-3000:]}"
