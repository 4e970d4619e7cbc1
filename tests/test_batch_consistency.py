"""Oracle `batch-consistency`: each relation between a batch's fields, judged in process on hand-made batches, and
four mutants of SGLang shown to fire on the real-model suite, where the Triton backend ignores the fields they
break (the replay still equals eager): the replay view's `seq_lens_sum` without its padded rows, its host mirror
of seq_lens handed over unpadded, `extend_start_loc` shifted by one request, and the EAGLE draft runner's padded
replay handing its multi-step backend (no AttentionBackend subclass) the unpadded mirror (seed 8117's survivor),
and the decode runner leaving the caller's batch on its padded `positions` buffer after a replay (the raw batch
must come back: `check_restored`). Clean runs are the suites'."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from harness.oracles.batch_consistency import relations
from tests.mutant_runs import Mutant, assert_caught

RUNNER = "srt/model_executor/runner/decode_cuda_graph_runner.py"
BATCH = "srt/model_executor/forward_batch_info.py"
REAL = "suites/test_real_models.py"
DRAFT_RUNNER = "srt/speculative/eagle_draft_cuda_graph_runner.py"


class Mode:
    def __init__(self, name):
        self.name = name

    def is_decode(self):
        return self.name == "DECODE"

    def is_extend(self):
        return self.name in ("EXTEND", "MIXED")


def decode(**changes):
    fields = dict(batch_size=3, forward_mode=Mode("DECODE"), seq_lens=torch.tensor([5, 7, 1]), seq_lens_sum=13,
                  seq_lens_cpu=torch.tensor([5, 7, 1]), req_pool_indices=torch.tensor([2, 0, 0]),
                  input_ids=torch.tensor([1, 2, 3]), positions=torch.tensor([4, 6, 0]))
    return SimpleNamespace(**{**fields, **changes})


def extend(**changes):
    fields = dict(batch_size=2, forward_mode=Mode("EXTEND"), seq_lens=torch.tensor([5, 3]), seq_lens_sum=8,
                  input_ids=torch.arange(6), positions=torch.arange(6), extend_seq_lens=torch.tensor([4, 2]),
                  extend_prefix_lens=torch.tensor([1, 1]), extend_start_loc=torch.tensor([0, 4]),
                  extend_num_tokens=6, extend_seq_lens_cpu=[4, 2], extend_prefix_lens_cpu=[1, 1])
    return SimpleNamespace(**{**fields, **changes})


def test_a_consistent_batch_breaks_nothing():
    assert relations(decode()) == [] and relations(extend()) == []


@pytest.mark.parametrize("changes, said", [
    ({"seq_lens_sum": 12}, "`seq_lens_sum` is 12, the sum of `seq_lens` [5, 7, 1] is 13"),
    ({"seq_lens_cpu": torch.tensor([5, 7, 0])}, "`seq_lens_cpu` row 2 is 0, `seq_lens` row 2 is 1"),
    ({"seq_lens_cpu": torch.tensor([5, 7])}, "`seq_lens_cpu` has 2 rows, the batch 3 requests"),
    ({"req_pool_indices": torch.tensor([2, 0])}, "`req_pool_indices` has 2 rows"),
    ({"positions": torch.tensor([4, 6])}, "`positions` has 2 rows, `input_ids` 3"),
    ({"input_ids": torch.tensor([1, 2, 3, 4]), "positions": torch.arange(4)}, "a DECODE batch of 3 requests has 4"),
])
def test_each_decode_relation_is_named(changes, said):
    (broken,) = relations(decode(**changes))
    assert said in broken


@pytest.mark.parametrize("changes, said", [
    ({"extend_start_loc": torch.tensor([0, 2])}, "the exclusive prefix sum of `extend_seq_lens` is [0, 4]"),
    ({"extend_num_tokens": 5}, "`extend_num_tokens` is 5"),
    ({"extend_prefix_lens": torch.tensor([1, 0]), "extend_prefix_lens_cpu": [1, 0]},
     "`extend_prefix_lens` [1, 0] + `extend_seq_lens` [4, 2] != `seq_lens` [5, 3]"),
    ({"extend_seq_lens_cpu": [4, 3]}, "`extend_seq_lens_cpu` [4, 3] != its tensor [4, 2]"),
])
def test_each_extend_relation_is_named(changes, said):
    assert any(said in broken for broken in relations(extend(**changes))), relations(extend(**changes))


MUTANTS = {
    "replay_sum_without_padding": Mutant(
        test=f"{REAL}::test_real_model_replay_matches_eager",
        edits=[(RUNNER, "            else forward_batch.seq_lens_sum + (bs - raw_bs) * seq_len_fill_value\n",
                "            else forward_batch.seq_lens_sum\n")],
        oracle="batch-consistency", texts=["TritonAttnBackend.init_forward_metadata_out_graph", "`seq_lens_sum` is"]),
    "replay_mirror_unpadded": Mutant(
        test=f"{REAL}::test_real_model_replay_matches_eager",
        edits=[(RUNNER, "None if forward_batch.seq_lens_cpu is None else buffers.seq_lens_cpu[:bs]",
                "None if forward_batch.seq_lens_cpu is None else buffers.seq_lens_cpu[:raw_bs]")],
        oracle="batch-consistency", texts=["`seq_lens_cpu` has", "rows, the batch"]),
    "extend_start_shifted": Mutant(
        test=f"{REAL}::test_real_model_prefill_breakable_matches_eager",
        edits=[(BATCH, "    extend_start_loc[1:] = torch.cumsum(extend_seq_lens[:-1], dim=0)\n",
                "    extend_start_loc[1:] = torch.cumsum(extend_seq_lens[1:], dim=0)\n")],
        oracle="batch-consistency", texts=["`extend_start_loc` is", "exclusive prefix sum"]),
    # the decode runner keeping the caller's batch on its padded buffer (the bug class the draft runners' restore
    # guards: a padded view handed back to the scheduler)
    "decode_batch_left_padded": Mutant(
        test=f"{REAL}::test_real_model_replay_matches_eager",
        edits=[(RUNNER, "        if self._skips_prefilled_inputs:\n            self._prefilled_inputs = (",
                "        forward_batch.positions = buffers.positions[:padded_num_tokens]\n"
                "        if self._skips_prefilled_inputs:\n            self._prefilled_inputs = (")],
        oracle="batch-consistency",
        texts=["the decode runner's replay of a batch of", "the batch's `positions` is", "the padded view was not "
               "handed back"]),
    "draft_mirror_left_unpadded": Mutant(
        test=f"{REAL}::test_eagle_draft_replays_match_eager",
        edits=[(DRAFT_RUNNER, "        if forward_batch.seq_lens_cpu is not None:\n            if bs != raw_bs:\n"
                "                buffers.seq_lens_cpu.fill_(self.seq_len_fill_value)\n"
                "            buffers.seq_lens_cpu[:raw_bs].copy_(forward_batch.seq_lens_cpu)\n"
                "            forward_batch.seq_lens_cpu = buffers.seq_lens_cpu[:bs]\n", "")],
        oracle="batch-consistency",
        texts=["TritonMultiStepDraftBackend.init_forward_metadata_out_graph",
               "`seq_lens_cpu` has 2 rows, the batch 3"]),
}


@pytest.mark.slow
@pytest.mark.subprocess
@pytest.mark.parametrize("name", sorted(MUTANTS))
def test_mutant_fails_with_its_diagnosis(name, tmp_path):
    mutant = MUTANTS[name]
    assert_caught(name, mutant, tmp_path, extra=() if "eagle" in mutant.test else ("-k", "dense"))
