"""Mutants of the decode runner's dLLM path (DLLM_EXTEND graphs), each in a scratch copy of the installed SGLang: the
dLLM tests of the decode suite must fail with the oracle and a diagnosis naming the input or contract; clean SGLang
passes them (tests/test_decode_mutants.py runs the whole suite clean).

- Output: `full_logits` returned unsliced (the padded rows of the graph's block reach the sampler).
- Padding: seq_lens padded with the attention backend's fill value instead of the block size SGLang promises.
- Pre-planned branch (load_batch + mark): the batch's `dllm_input_preparation_state`, or its `input_embeds`, not
  copied into the static buffers, so the replay reads the capture-time or previous batch's.
- Admission: the ValueError for a batch without the embeddings its algorithm reads dropped.
"""
from __future__ import annotations

import pytest

from tests.mutant_runs import Mutant, assert_caught

pytestmark = pytest.mark.subprocess  # every test here runs a suite in another process

SUITE = "suites/test_decode_capture.py"
RUNNER = "srt/model_executor/runner/decode_cuda_graph_runner.py"
STAGED = f"{SUITE}::test_dllm_preplanned_batch_stages_its_inputs"
REFUSAL = f"{SUITE}::test_dllm_batch_without_embeddings_is_refused"

FULL_LOGITS_UNSLICED = [(RUNNER, "                    output.full_logits[: self.raw_num_token]\n",
                         "                    output.full_logits\n")]
FILL_NOT_BLOCK_SIZE = [(RUNNER, "            else self.dllm_config.block_size\n",
                        "            else self.attn_backend.get_cuda_graph_seq_len_fill_value()\n")]
STATE_NOT_COPIED = [(RUNNER, "                slot.buffer[: self.raw_num_token].copy_(source)\n", "")]
EMBEDS_NOT_COPIED = [(RUNNER, "                self.buffers.input_embeds[: self.raw_num_token].copy_(\n"
                              "                    forward_batch.input_embeds\n                )\n",
                      "                pass\n")]
EMBEDS_NOT_REQUIRED = [(RUNNER, "            and forward_batch.input_embeds is None\n        ):\n",
                        "            and False\n        ):\n")]

MUTANTS = {
    "dllm_full_logits_unsliced": Mutant(
        test=f"{STAGED}[prepared]",
        edits=FULL_LOGITS_UNSLICED,
        oracle="eager-equality",
        texts=["full_logits of 4 rows", "2 raw tokens"]),
    "dllm_fill_not_block_size": Mutant(
        test=f"{STAGED}[prepared]",
        edits=FILL_NOT_BLOCK_SIZE,
        oracle="eager-equality",
        texts=["`seq_lens`", "promises 2"]),
    "dllm_preplanned_state_not_copied": Mutant(
        test=f"{STAGED}[prepared]",
        edits=STATE_NOT_COPIED,
        oracle="eager-equality",
        texts=["DLLM_EXTEND", "static `dllm_input_preparation_state`"]),
    "dllm_preplanned_embeds_not_copied": Mutant(
        test=f"{STAGED}[input_embeds]",
        edits=EMBEDS_NOT_COPIED,
        oracle="eager-equality",
        texts=["DLLM_EXTEND", "static `input_embeds` holds"]),
    "dllm_embeds_not_required": Mutant(
        test=REFUSAL,
        edits=EMBEDS_NOT_REQUIRED,
        oracle="admission",
        texts=["without input_embeds", "must refuse"]),
}


@pytest.mark.parametrize("name", sorted(MUTANTS))
def test_dllm_mutant_fails_the_suite_with_its_diagnosis(name, tmp_path):
    assert_caught(name, MUTANTS[name], tmp_path)
