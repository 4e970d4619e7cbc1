"""Mutants of SGLang's prefill runner as an EAGLE draft worker's (`harness/targets/prefill/draft.py`), in-process:
one line of an installed SGLang method recompiled by `edited` and set with pytest's MonkeyPatch (undone after).

- hidden_states_not_refreshed: `load_batch` no longer copies the batch's hidden states into the static buffer
  the graphs read, so every replay runs on the capture's (zero) hidden states.
- capture_reads_a_copy: `_build_capture_spec_info` hands the capture a copy of the static buffer, so the graphs read
  an address no replay refreshes (the static-address contract the buffer exists for).

Each must fail the draft prefill check naming the batch and its hidden-state seed; clean SGLang passes the same
batches.
"""
from __future__ import annotations

import pytest

from harness.devices import get_device
from harness.errors import PathMissing
from harness.oracles import OracleFailure
from harness.targets.prefill.base import PrefillCase
from tests.mutant_runs import edited

pytestmark = pytest.mark.slow  # builds the draft model and captures its prefill graphs in this process

BATCHES = [((5, 6, 7, 8), (9, 10, 11)), ((1, 2, 3, 4, 5, 6, 7, 8), (20, 21, 22, 23))]
SEEDS = [[1, 2], [3, 4]]


@pytest.fixture
def device():
    with get_device("cpu").install("cuda"):
        yield


def run() -> None:
    from harness.targets.prefill.draft import check_draft_prefill, draft_target

    try:
        target = draft_target(PrefillCase(backend="breakable", capture_tokens=(8, 16)))
    except PathMissing as missing:
        pytest.skip(str(missing))
    for index, (prompts, seeds) in enumerate(zip(BATCHES, SEEDS)):
        assert check_draft_prefill(target, prompts, seeds, index) == ["replayed", "replayed"]


def mutate(monkeypatch, name: str, old: str, new: str) -> None:
    from sglang.srt.model_executor.runner.prefill_cuda_graph_runner import PrefillCudaGraphRunner

    monkeypatch.setattr(PrefillCudaGraphRunner, name, edited(getattr(PrefillCudaGraphRunner, name), old, new))


def test_clean_sglang_passes_the_draft_prefill(device):
    run()


@pytest.mark.parametrize("name, old, new", [
    ("load_batch", "self.static_draft_hidden_states[:num_tokens].copy_(", "(lambda *_: None)("),
    ("_build_capture_spec_info", "hidden_states=self.static_draft_hidden_states[:num_tokens],",
     "hidden_states=self.static_draft_hidden_states[:num_tokens].clone(),"),
], ids=["hidden_states_not_refreshed", "capture_reads_a_copy"])
def test_stale_draft_hidden_states_fail_naming_the_batch(device, monkeypatch, name, old, new):
    mutate(monkeypatch, name, old, new)
    with pytest.raises(OracleFailure) as failure:
        run()
    assert failure.value.oracle == "eager-equality"
    assert "draft prefill 0.0 (2 request(s), [4, 3] tokens, hidden states of seed 1, captured token counts [8, 16]): " \
           "replay differs from eager" in failure.value.diagnosis, failure.value.diagnosis
