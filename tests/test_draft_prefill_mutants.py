"""Mutants of SGLang's prefill runner as an EAGLE / EAGLE3 draft worker's (`harness/targets/prefill/draft.py`),
in-process: one line of an installed SGLang method recompiled by `edited` and set with pytest's MonkeyPatch
(undone after).

- hidden_states_not_refreshed: `load_batch` no longer copies the batch's hidden states into the static buffer
  the graphs read, so every replay runs on the capture's (zero) hidden states.
- capture_reads_a_copy: `_build_capture_spec_info` hands the capture a copy of the static buffer, so the graphs read
  an address no replay refreshes (the static-address contract the buffer exists for).
- draft_embeds_not_refreshed (EAGLE3): `load_batch` no longer copies the draft's input embeddings into the static
  `input_embeds` slot the EAGLE3 graphs read, so a replay embeds the capture's dummy tokens.
- tail_row_not_replaced / head_row_replaced (EAGLE3, a multimodal target's composed embeddings): the sampled
  token's embedding lands nowhere, or on each request's first row instead of its last.

Each must fail the draft prefill check naming the family, the batch and its seed; clean SGLang passes the same
batches, text and multimodal.
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


def run(family: str = "eagle", multimodal: bool = False) -> None:
    from harness.targets.prefill.draft import check_draft_prefill, draft_target

    try:
        target = draft_target(PrefillCase(backend="breakable", capture_tokens=(8, 16)), family)
    except PathMissing as missing:
        pytest.skip(str(missing))
    for index, (prompts, seeds) in enumerate(zip(BATCHES, SEEDS)):
        assert check_draft_prefill(target, prompts, seeds, index, multimodal) == ["replayed", "replayed"]


def mutate(monkeypatch, name: str, old: str, new: str) -> None:
    from sglang.srt.model_executor.runner.prefill_cuda_graph_runner import PrefillCudaGraphRunner

    monkeypatch.setattr(PrefillCudaGraphRunner, name, edited(getattr(PrefillCudaGraphRunner, name), old, new))


@pytest.mark.parametrize("family, multimodal", [("eagle", False), ("eagle3", False), ("eagle3", True)],
                         ids=["eagle", "eagle3", "eagle3-multimodal"])
def test_clean_sglang_passes_the_draft_prefill(device, family, multimodal):
    run(family, multimodal)


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


@pytest.mark.parametrize("old, new, multimodal", [
    ('self.buffer_registry.get_slot("input_embeds").buffer[:num_tokens].copy_(', "(lambda *_: None)(", False),
    ("draft_input_embeds[last_indices] = self.layer_model.embed_tokens(", "(lambda *_: None)(", True),
    ("forward_batch.extend_start_loc + forward_batch.extend_seq_lens - 1", "forward_batch.extend_start_loc", True),
], ids=["draft_embeds_not_refreshed", "tail_row_not_replaced", "head_row_replaced"])
def test_stale_draft_embeddings_fail_naming_the_batch(device, monkeypatch, old, new, multimodal):
    mutate(monkeypatch, "load_batch", old, new)
    with pytest.raises(OracleFailure) as failure:
        run("eagle3", multimodal)
    assert failure.value.oracle == "eager-equality"
    composed = " and composed embeddings" if multimodal else ""
    assert f"eagle3 draft prefill 0.0 (2 request(s), [4, 3] tokens, hidden states{composed} of seed 1, captured " \
           "token counts [8, 16]): replay differs from eager" in failure.value.diagnosis, failure.value.diagnosis
