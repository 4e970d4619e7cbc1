"""Scheduler-built batches (`harness/targets/decode/scheduled.py`) on the real-model target: clean SGLang passes a
program of admissions, finishes and merges, and mutants of SGLang's own batch code, which no staged or tiny-model
suite runs, fail the batch-invariance check naming the request and the field its history contradicts.

- filter_keeps_the_first_input_ids: `ScheduleBatch.filter_batch` keeps the first `len(keep_indices)` input ids
  instead of the kept requests' (`input_ids[:n]` for `input_ids[keep_indices]`). After a request in the middle
  finishes, the next request decodes the token of the one that left. Replay and eager run the same wrong batch
  and agree; the request alone does not.
- merge_puts_the_new_lengths_first: `ScheduleBatch.merge_batch` concatenates `seq_lens` new batch first. The
  running requests then read the new requests' lengths (and the replay's attention metadata with them).

In-process (pytest's MonkeyPatch around SGLang's own methods, undone after), as `test_real_model_mutants.py`.
"""
from __future__ import annotations

import pytest

from harness.oracles import OracleFailure
from harness.targets.decode.base import DecodeCase
from harness.targets.decode.real_model import RealModelTarget
from harness.targets.decode.scheduled import Admit, Decode, Finish, run_program

pytestmark = pytest.mark.slow  # builds and captures a real model in this process: seconds a test

CASE = DecodeCase(capture_bs=(1, 3), max_running_requests=8)
# three requests decode on the graph of 3; the middle one leaves; the two left decode padded to 3; two join
PROGRAM = [Admit(((5, 17, 3, 99, 40), (7, 8, 9, 10, 11, 12, 13, 14, 15), (3, 4, 5))), Decode(), Finish((1,)),
           Decode(), Admit(((9, 90, 9, 9),)), Decode()]


def run(family: str) -> list:
    return run_program(RealModelTarget(CASE, family=family), PROGRAM)


def test_clean_sglang_passes_a_scheduled_program(family):
    assert run(family) == [("replayed", 3), ("replayed", 2), ("replayed", 3)]


def fails_batch_invariance(family: str, monkeypatch, method: str, mutant) -> str:
    """The program run with `ScheduleBatch.<method>` replaced by `mutant(real)`: a batch-invariance failure's
    diagnosis."""
    from sglang.srt.managers.schedule_batch import ScheduleBatch

    monkeypatch.setattr(ScheduleBatch, method, mutant(getattr(ScheduleBatch, method)))
    with pytest.raises(OracleFailure) as failure:
        run(family)
    assert failure.value.oracle == "batch-invariance"
    assert "gets logits that it does not get alone" in failure.value.diagnosis
    return failure.value.diagnosis


def test_filter_keeping_the_first_input_ids_fails_batch_invariance(family, monkeypatch):
    def keeps_the_first(real):
        def filter_batch(self, *args, **kwargs):
            ids = self.input_ids
            real(self, *args, **kwargs)
            if ids is not None and self.reqs:
                self.input_ids = ids[:len(self.reqs)]
        return filter_batch

    diagnosis = fails_batch_invariance(family, monkeypatch, "filter_batch", keeps_the_first)
    assert "scheduled decode step 3 (batch of 2" in diagnosis
    assert "request 1 (history of 5 tokens" in diagnosis
    assert "input id" in diagnosis and "where its history implies" in diagnosis


def test_merge_putting_the_new_lengths_first_fails_batch_invariance(family, monkeypatch):
    import torch

    def new_lengths_first(real):
        def merge_batch(self, other):
            mine, theirs = self.seq_lens, other.seq_lens
            real(self, other)
            self.seq_lens = torch.cat([theirs, mine])
        return merge_batch

    diagnosis = fails_batch_invariance(family, monkeypatch, "merge_batch", new_lengths_first)
    assert "scheduled decode step 5 (batch of 3" in diagnosis
    assert "seq_len" in diagnosis and "where its history implies" in diagnosis
