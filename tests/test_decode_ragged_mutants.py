"""Mutants of the decode runner's compact ragged verify (SGLANG_RAGGED_VERIFY_MODE=compact), each in a scratch copy
of the installed SGLang: the ragged tests of the decode suite must fail with the oracle and a diagnosis naming the
input or contract; clean SGLang passes them (tests/test_decode_mutants.py runs the whole suite clean).

- Staging (`_stage_ragged_verify_layout`): the copy of the batch's padded qo_indptr, or of its verify_lens, into the
  layout the tier's graph was captured with is lost, so replays read the capture-time (or last) layout.
- Admission (`_can_run_ragged_verify_graph`, `_ragged_capture_slots`): slots compared with `<` (a batch filling its
  tier's slots runs eagerly); slots counted as tier / draft tokens (the uniform layout's), so a tier captures fewer
  request slots than min(tier, max_bs) and batches with more requests are refused.
- Configuration: the ValueError for LoRA, or for --disable-cuda-graph-padding, dropped: SGLang builds a compact
  runner whose graphs cannot pad the batch the way the case asks.
- Padding (`RaggedVerifyLayout.padded_to_bucket`): rows not capped at the draft width, so the last row of a full
  tier carries its leftover tokens; the outputs of the real rows are unchanged, and the per-replay layout check
  (`check_padding_promises`: the tier's layout against `padded_verify_lens`) names it.
- Layouts (`harness/oracles/ragged_layout.py`): a zero-length row accepted, the tier rounded past an exact fit,
  a capture's longer placeholder rows put last, the attention geometry's KV prefix sums not shifted by one.
- A draft worker's verify graphs (DFLASH): the replay no longer copies the batch's `input_embeds` into the static
  buffer, or the capture no longer hands the static embeddings to the forward. (Dropping the constructor's guard
  against an EAGLE draft runner is no regression: `get_spec_info` refuses it again at capture, same text.)
"""
from __future__ import annotations

import pytest

from tests.mutant_runs import Mutant, assert_caught

pytestmark = pytest.mark.subprocess  # every test here runs a suite in another process

SUITE = "suites/test_decode_capture.py"
RUNNER = "srt/model_executor/runner/decode_cuda_graph_runner.py"
REPLAY = f"{SUITE}::test_ragged_verify_replay_matches_eager"
REFUSAL = f"{SUITE}::test_ragged_verify_refuses_what_it_cannot_pad"
DRAFT = f"{SUITE}::test_draft_worker_verify_replay_matches_eager"
FILLS_SLOTS = f"{SUITE}::test_ragged_verify_fills_a_tiers_slots[True]"

STAGE_SKIPS_QO_INDPTR = [(RUNNER, "        cap_layout.qo_indptr_device.copy_(live.qo_indptr_device)\n", "")]
STAGE_SKIPS_VERIFY_LENS = [(RUNNER, "        cap_layout.verify_lens.copy_(live.verify_lens)\n", "")]
SLOTS_OFF_BY_ONE = [(RUNNER, "and forward_batch.batch_size <= self._ragged_capture_slots(admission_tokens)",
                     "and forward_batch.batch_size < self._ragged_capture_slots(admission_tokens)")]
SLOTS_UNIFORM = [(RUNNER, "        return min(num_tokens, self.max_bs)\n",
                  "        return num_tokens // self.captured_req_width\n")]
LORA_ACCEPTED = [(RUNNER, "            or model_runner.lora_manager is not None\n", "")]
NO_PADDING_ACCEPTED = [(RUNNER, "            or model_runner.lora_manager is not None\n"
                                "            or self.disable_padding\n",
                        "            or model_runner.lora_manager is not None\n")]
DRAFT_EMBEDS_NOT_COPIED = [(RUNNER, "            buffers.input_embeds[:raw_num_token]"
                                    ".copy_(forward_batch.input_embeds)\n",
                            "            pass\n")]
DRAFT_EMBEDS_NOT_PASSED = [(RUNNER, '                            kwargs["input_embeds"] = self.buffers.input_embeds[\n'
                                    "                                :num_tokens\n                            ]\n",
                            "                            pass\n")]

LAYOUTS = f"{SUITE}::test_ragged_layouts_are_the_requests_arithmetic"
RAGGED = "srt/speculative/ragged_verify.py"

MUTANTS = {
    "ragged_zero_row_accepted": Mutant(
        test=LAYOUTS,
        edits=[(RAGGED, "        if min(self.verify_lens_cpu) < 1:\n", "        if min(self.verify_lens_cpu) < 0:\n")],
        oracle="ragged-layout",
        texts=["a request verifying nothing", "must refuse it"]),
    "ragged_tier_rounds_past_an_exact_fit": Mutant(
        test=LAYOUTS,
        edits=[(RAGGED, "    index = bisect.bisect_left(grid, total)\n",
                "    index = min(bisect.bisect_right(grid, total), len(grid) - 1)\n")],
        oracle="ragged-layout",
        texts=["graph_num_tokens", "expected"]),
    "ragged_capture_rows_longer_last": Mutant(
        test=LAYOUTS,
        edits=[(RAGGED, "    return [base + 1] * rem + [base] * (num_slots - rem)\n",
                "    return [base] * (num_slots - rem) + [base + 1] * rem\n")],
        oracle="ragged-layout",
        texts=["capture verify lens", "expected"]),
    "ragged_geometry_kv_prefix_unshifted": Mutant(
        test=LAYOUTS,
        edits=[(RAGGED, "        torch.cumsum(cache_seqlens_int32, dim=0, dtype=torch.int32), (1, 0)\n",
                "        torch.cumsum(cache_seqlens_int32, dim=0, dtype=torch.int32), (0, 1)\n")],
        oracle="ragged-layout",
        texts=["attention geometry", "cu_seqlens_k"]),
    "ragged_padding_rows_not_capped": Mutant(  # outputs unchanged: only the tier's layout shows it
        test=FILLS_SLOTS,
        edits=[(RAGGED, "        if cap is not None:\n            padded = torch.clamp(padded, max=cap)\n",
                "        if cap is None:\n            padded = torch.clamp(padded, max=cap)\n")],
        oracle="ragged-layout",
        texts=["`verify_lens` holds [2, 1, 2, 3]", "padded to tier 8 has [2, 1, 2, 2]"]),
    "ragged_stage_skips_qo_indptr": Mutant(
        test=REPLAY,
        edits=STAGE_SKIPS_QO_INDPTR,
        oracle="eager-equality",
        texts=["TARGET_VERIFY", "the tier's ragged layout", "`qo_indptr` holds"]),
    "ragged_stage_skips_verify_lens": Mutant(
        test=REPLAY,
        edits=STAGE_SKIPS_VERIFY_LENS,
        oracle="eager-equality",
        texts=["TARGET_VERIFY", "`verify_lens` holds"]),
    "ragged_admission_slots_off_by_one": Mutant(
        test=REPLAY,
        edits=SLOTS_OFF_BY_ONE,
        oracle="eager-equality",
        texts=["refused to replay", "ragged verify_lens", "tier"]),
    "ragged_capture_slots_uniform": Mutant(
        test=FILLS_SLOTS,
        edits=SLOTS_UNIFORM,
        oracle="eager-equality",
        texts=["refused to replay", "ragged verify_lens [1, 1, 1]"]),
    "ragged_lora_accepted": Mutant(
        test=f"{REFUSAL}[lora]",
        edits=LORA_ACCEPTED,
        oracle="admission",
        texts=["with lora on", "must refuse"]),
    "ragged_padding_disabled_accepted": Mutant(
        test=f"{REFUSAL}[disable_padding]",
        edits=NO_PADDING_ACCEPTED,
        oracle="admission",
        texts=["with disable_padding on"]),
    "draft_embeds_not_copied": Mutant(
        test=DRAFT,
        edits=DRAFT_EMBEDS_NOT_COPIED,
        oracle="eager-equality",
        texts=["TARGET_VERIFY", "not bit-equal"]),
    "draft_embeds_not_passed": Mutant(
        test=DRAFT,
        edits=DRAFT_EMBEDS_NOT_PASSED,
        oracle="eager-equality",
        texts=["TARGET_VERIFY", "not bit-equal"]),
}


@pytest.mark.parametrize("name", sorted(MUTANTS))
def test_ragged_mutant_fails_the_suite_with_its_diagnosis(name, tmp_path):
    assert_caught(name, MUTANTS[name], tmp_path)
