"""Mutants of SGLang's multi-LoRA serving (`harness/targets/decode/real_lora.py`), in-process: one line of an
installed SGLang method recompiled by `edited` (or the method wrapped) and set with pytest's MonkeyPatch, undone
after. Each must fail the LoRA check naming what went wrong, and clean SGLang must pass the same case. The tiny
decode model serves LoRA through a double of the manager, so none of these can show there.

- scaling_left_at_one: `LoRAManager.prepare_lora_batch` hands each adapter a scaling of 1 instead of its
  lora_alpha / r. Replay and eager run the same wrong delta, so they agree; `lora-reference` fails against the
  merged model, and its diagnosis names the adapter.
- graph_batch_info_not_updated_in_place: `LoRAManager._use_cuda_graph_batch` answers False, so a decode batch's
  adapters go into a fresh batch info while the graph keeps reading the one it captured (every row on no adapter).
  Replay differs from eager (`eager-equality`), and the diagnosis shows the graph's batch info: the request on
  adapter "a" reads a slot of rank 0.
- evicted_slot_keeps_missing_modules: `LoRAMemoryPool.load_lora_weight_to_buffer` no longer zeroes the buffers of
  modules the incoming adapter lacks, so an adapter loaded into an evicted slot keeps the evicted adapter's weights
  there ("b" has no k_proj, o_proj, gate_proj, up_proj; it evicts "a" in a pool of two slots). Replay and eager
  agree; `lora-reference` fails for "b"'s requests.
- base_batch_replays_the_lora_graph: `DecodeCudaGraphRunner._resolve_lora_variant` answers "lora" for a batch on
  no adapter, under `record_nolora_graph`: the LoRA graph serves it at rank 0, equal to eager and to the base
  model; `graph-key` names the graph replayed against the "nolora" one the batch implies.
- embedding_lora_b_never_loaded: `LoRAMemoryPool.load_lora_weight_to_buffer` no longer recognises PEFT's
  `lora_embedding_B` key, so the embedding adapter's B stays zero in its slot; replay and eager agree,
  `lora-reference` fails for "e"'s requests.
- lm_head_lora_skipped: `ParallelLMHeadWithLoRA.forward` always takes the base path: `lora-reference` fails for "e".
- untied_lm_head_off_the_shared_weight: on a tied checkpoint SGLang unties the LM head (a `ParallelLMHead` on the
  embedding's base weight) so it gets LoRA layers of its own; built without that weight, every request's logits are
  wrong (`lora-reference`). Leaving the head tied instead trips SGLang's own assertion as the pool loads "e"'s
  lm_head weights ("Failed to load lm_head LoRA weight"), a crash the record keeps.
- prefill_chunks_routed_to_the_first_adapter: the Triton LoRA backend's prefill-graph path fills its static sgemm
  routing (`prefill_cuda_graph_sgemm_batch_info.weight_indices`) with the first chunk's adapter for every chunk.
  Eager of an eligible batch reads the same static routing, so replay and eager agree; `lora-reference` fails for
  the request on no adapter behind one on "a".
"""
from __future__ import annotations

import pytest

from harness.devices import get_device
from harness.oracles import OracleFailure
from harness.targets.decode.base import DecodeBatch, DecodeCase
from harness.targets.decode.real_model import StagedBatch
from tests.mutant_runs import edited

pytestmark = pytest.mark.slow  # builds the LoRA server's model and captures it in this process

CASE = DecodeCase(capture_bs=(1, 3), max_running_requests=8)


def batch(ids, seq_lens, rows, tokens, seed) -> StagedBatch:
    return StagedBatch(DecodeBatch(input_ids=tokens, positions=[n - 1 for n in seq_lens], seq_lens=seq_lens,
                                   req_pool_indices=rows, lora_ids=ids), seed)


# an adapter beside the base model, padded to 3; then both adapters in one full graph
MIXED = [[batch(["a", None], [9, 4], [4, 2], [5, 90], 7), batch(["b", "a", "b"], [3, 12, 6], [1, 5, 3],
                                                                 [7, 9, 11], 8)]]
# a pool of two slots: the base model and "a", then "b" evicts "a"
EVICTING = [[batch(["a", None], [9, 4], [4, 2], [5, 90], 7), batch(["b", "b"], [3, 12], [1, 5], [7, 9], 8)]]


@pytest.fixture
def device(monkeypatch):
    from harness.targets.decode import real_lora
    from harness.targets.decode.real_model import load

    load()
    reason = real_lora.lora_missing("triton")
    if reason:
        pytest.skip(reason)
    monkeypatch.setattr(real_lora, "_SERVED", {})  # a fresh server: the pool starts empty, each mutant applies
    with get_device("cpu").install("cuda"):
        yield


# a server started with "e" (LoRA on the token embedding and the LM head): "e" beside "a" and the base model
EMBEDDING = [[batch(["e", "a", None], [9, 4, 6], [4, 2, 6], [5, 90, 17], 7)], [batch(["e"], [3], [1], [7], 8)]]

# under record_nolora_graph: an adapter beside the base model, then a batch on no adapter (the "nolora" graph)
BASE_ONLY = [[batch(["a", None], [9, 4], [4, 2], [5, 90], 7), batch([None, None], [3, 12], [1, 5], [7, 9], 8)]]


def run_case(groups, backend: str = "triton", max_loras: int = 3, record_nolora_graph: bool = False,
             embeddings: bool = False, tied: bool = False) -> int:
    import dataclasses

    from harness.targets.decode.real_lora import RealLoRATarget, Serving, check_lora_replays

    case = dataclasses.replace(CASE, record_nolora_graph=record_nolora_graph)
    target = RealLoRATarget(case, serving=Serving(backend, max_loras, embeddings=embeddings, tied=tied))
    return check_lora_replays(target, groups)


def mutate(monkeypatch, owner, name: str, old: str, new: str) -> None:
    monkeypatch.setattr(owner, name, edited(getattr(owner, name), old, new))


@pytest.mark.parametrize("backend", ["triton", "csgmv"])
def test_clean_sglang_passes_the_lora_check(device, backend):
    assert run_case(MIXED, backend) == 5
    assert run_case(EVICTING, backend, max_loras=2) == 4


def test_clean_sglang_passes_the_embedding_lora_check(device):
    assert run_case(EMBEDDING, embeddings=True) == 4


def test_clean_sglang_passes_the_tied_lm_head_lora_check(device):
    assert run_case(EMBEDDING, embeddings=True, tied=True) == 4


def test_untied_lm_head_off_the_shared_weight_fails_for_every_request(device, monkeypatch):
    """The untied LM head must share the embedding's base weight: left at its construction values (uninitialised
    memory), every request's logits are wrong, the base model's included; garbage that holds NaN makes the logits
    NaN, which fails first, as replay against eager or as eager against SGLang's torch-native attention (whichever
    comparison meets it first: the memory differs from run to run)."""
    from sglang.srt.lora.lora_manager import LoRAManager

    mutate(monkeypatch, LoRAManager, "init_lora_modules", "untied_lm_head.weight = embed_tokens.weight",
           "pass")
    with pytest.raises(OracleFailure) as failure:
        run_case(EMBEDDING, embeddings=True, tied=True)
    if failure.value.oracle == "eager-equality":
        assert "replay differs from eager" in failure.value.diagnosis or \
            "eager on the Triton backend differs from SGLang's torch-native attention" in failure.value.diagnosis, \
            failure.value.diagnosis
    else:
        assert failure.value.oracle == "lora-reference"
        assert "served with no adapter (the base model), its logits differ" in failure.value.diagnosis


def test_embedding_lora_b_never_loaded_fails_for_the_embedding_adapter(device, monkeypatch):
    from sglang.srt.lora.mem_pool import LoRAMemoryPool

    # PEFT names an Embedding's B `lora_embedding_B`: the pool no longer recognises it, so the slot's B stays zero
    mutate(monkeypatch, LoRAMemoryPool, "load_lora_weight_to_buffer",
           '"embed_tokens" in name\n                and ("lora_embedding_B" in name',
           '"embed_tokens" in name\n                and ("lora_embedding_b" in name')
    with pytest.raises(OracleFailure) as failure:
        run_case(EMBEDDING, embeddings=True)
    assert failure.value.oracle == "lora-reference"
    assert "served with adapter 'e'" in failure.value.diagnosis


def test_lm_head_lora_skipped_fails_for_the_embedding_adapter(device, monkeypatch):
    from sglang.srt.lora.layers import ParallelLMHeadWithLoRA

    mutate(monkeypatch, ParallelLMHeadWithLoRA, "forward", "    if self.lora_active:", "    if False:")
    with pytest.raises(OracleFailure) as failure:
        run_case(EMBEDDING, embeddings=True)
    assert failure.value.oracle == "lora-reference"
    assert "served with adapter 'e'" in failure.value.diagnosis


def test_clean_sglang_passes_the_nolora_variant_check(device):
    assert run_case(BASE_ONLY, record_nolora_graph=True) == 4


def test_base_batch_replaying_the_lora_graph_fails_naming_the_key(device, monkeypatch):
    from sglang.srt.model_executor.runner.decode_cuda_graph_runner import DecodeCudaGraphRunner

    mutate(monkeypatch, DecodeCudaGraphRunner, "_resolve_lora_variant", 'return "nolora"', 'return "lora"')
    with pytest.raises(OracleFailure) as failure:
        run_case(BASE_ONLY, record_nolora_graph=True)
    assert failure.value.oracle == "graph-key"
    assert "a batch of 2 request(s) must replay the graph of size 3 variant 'nolora' (captured sizes [1, 3]); it " \
           "replayed: size 3 variant 'lora'" in failure.value.diagnosis


def test_scaling_left_at_one_fails_against_the_merged_model(device, monkeypatch):
    from sglang.srt.lora.lora_manager import LoRAManager

    mutate(monkeypatch, LoRAManager, "prepare_lora_batch", "scalings[weight_index] = lora.scaling",
           "scalings[weight_index] = 1.0")
    with pytest.raises(OracleFailure) as failure:
        run_case(MIXED)
    assert failure.value.oracle == "lora-reference"
    assert "served with adapter 'a', its logits differ from those of the model with that adapter merged" in \
        failure.value.diagnosis


def test_graph_batch_info_not_updated_in_place_fails_naming_the_slot(device, monkeypatch):
    from sglang.srt.lora.lora_manager import LoRAManager

    monkeypatch.setattr(LoRAManager, "_use_cuda_graph_batch", lambda self, forward_batch: False)
    with pytest.raises(OracleFailure) as failure:
        run_case(MIXED)
    assert failure.value.oracle == "eager-equality"
    diagnosis = failure.value.diagnosis
    assert "replay differs from eager" in diagnosis
    assert "request 0 (a): slot 0, rank 0, scaling 0.0 where its adapter has rank 4, scaling 2.0" in diagnosis


@pytest.mark.parametrize("backend", ["triton", "csgmv"])
def test_evicted_slot_keeping_missing_modules_fails_for_the_incoming_adapter(device, monkeypatch, backend):
    from sglang.srt.lora.mem_pool import LoRAMemoryPool

    mutate(monkeypatch, LoRAMemoryPool, "load_lora_weight_to_buffer", "            buffer_view.zero_()",
           "            pass")
    with pytest.raises(OracleFailure) as failure:
        run_case(EVICTING, backend, max_loras=2)
    assert failure.value.oracle == "lora-reference"
    assert "served with adapter 'b'" in failure.value.diagnosis


# prefill: a batch on "a" and no adapter, then a chunked batch on "b", "a", "b" (its first prompt's cached chunk
# prefilled with "b"), both within the captured 16 tokens
PREFILLS = [([(1, 2, 3, 4, 5), (9, 8, 7)], [0, 0], ["a", None]),
            ([tuple(range(21, 30)), (3, 4), (7, 7, 7, 7)], [4, 0, 0], ["b", "a", "b"])]


def run_prefills(backend: str = "triton") -> None:
    from harness.targets.decode.real_lora import Serving
    from harness.targets.prefill.base import PrefillCase
    from harness.targets.prefill.real_model import RealModelPrefillTarget, check_prefill

    target = RealModelPrefillTarget(PrefillCase(backend="breakable", capture_tokens=(8, 16)), "dense",
                                    lora=Serving(backend))
    for index, (prompts, chunks, adapters) in enumerate(PREFILLS):
        assert check_prefill(target, prompts, index, chunks, adapters=adapters) == "replayed"


@pytest.mark.parametrize("backend", ["triton", "csgmv"])
def test_clean_sglang_passes_the_prefill_lora_check(device, backend):
    run_prefills(backend)


def test_prefill_chunks_routed_to_the_first_adapter_fail_against_the_merged_model(device, monkeypatch):
    from sglang.srt.lora.backend.triton_backend import TritonLoRABackend

    mutate(monkeypatch, TritonLoRABackend, "prepare_lora_batch",
           '                        indices, dtype=torch.int32, pin_memory=True, device="cpu"',
           '                        [indices[0]] * len(indices), dtype=torch.int32, pin_memory=True, device="cpu"')
    with pytest.raises(OracleFailure) as failure:
        run_prefills()
    assert failure.value.oracle == "lora-reference"
    diagnosis = failure.value.diagnosis
    assert "adapters ['a', None] on LoRA backend triton" in diagnosis  # the request on no adapter routed to "a"
    assert "request 1: served with no adapter (the base model)" in diagnosis
