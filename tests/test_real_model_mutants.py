"""Mutants of SGLang that only a real model on the real attention backend can see, in-process (the real module
monkeypatched with pytest's MonkeyPatch, undone after): the real-model suite's check must fire naming the input,
and clean SGLang must pass the same case.

- triton_replay_skips_metadata_refresh: `TritonAttnBackend._init_forward_metadata_out_graph` does its work only in
  capture, so at replay the captured decode kernels read the KV index pointer and indices planned for the capture's
  dummy batch (stale graph metadata; the kind of bug a metadata-glue or planning change re-introduces). The tiny
  decode model never runs this backend (its attention double plans its own metadata), so no tiny-model suite can
  fail on it; here replay differs from eager and the diagnosis names `kv_indptr`, for each captured family.

- allocator_hands_out_the_padding_slot: `TokenToKVPoolAllocator.clear` leaves slot 0 (the slot SGLang reserves
  for the K/V that padded rows of a graph replay write) among the free slots, so a real request's token lands
  there; a padded replay's dummy row then overwrites it before attention reads it, eager (unpadded) does not. The
  tiny models use no KV pool; here the replay of 2 requests padded to 3 differs from eager and the diagnosis names
  the request holding slot 0.

- verify_mask_copied_by_an_even_split: `TritonAttnBackend._update_target_verify_buffers` copies `len // bs` of the
  EAGLE verify mask at replay (one line recompiled from the installed source by `edited`): the drafts are masked
  as an earlier replay left them. Here a TARGET_VERIFY replay differs from eager and the diagnosis names the
  backend's `_verify_mask` and the requests whose part is stale.

- deterministic split mutants: `TritonAttnBackend.get_num_kv_splits` under `--enable-deterministic-inference`
  keeping the plain backend's fixed split count, or rounding the tile count down. The first changes no output
  (eager runs the same splits); the split check (`batch-invariance`) names the counts and the arithmetic.

- graph_window_one_key_wider: the decode graph's window rail (`_update_decode_kv_buffers`) filled with W + 1 keys
  while eager's keeps W (an off-by-one mended in one place only); only the swa family (Gemma2) has window layers.
  The replay differs from eager and the diagnosis names `window_kv_indptr` against the window's arithmetic.

- breakable_attention_drops_save_kv_cache: the prefill runner's breakable graphs with a real model run SGLang's
  `RadixAttention._eager_attention` between captured segments; with `save_kv_cache` passed as False the replay's
  logits are right and its K/V are never written. The diagnosis names the KV buffer and the slots.

- extend_reading_no_cached_prefix: the Triton backend's extend metadata built from zero prefix lengths; only a
  chunked-prefill batch (a request extending its cached first chunk) shows it, and there eager (like the replay)
  differs from SGLang's torch-native attention over the same cache.

- prefill_padding_limit_raised: the prefill runner's limit on graph padding (a bucket at most twice the batch's
  tokens) raised to 4: a batch the harness's rule (`admission.padding_refusal`) says must run eager is offered a
  graph (`admission`).

- graph_offered_to_input_embeds: `PrefillCudaGraphRunner.can_replay_locally` without its `input_embeds` rule: a
  batch sent as embeddings is offered a graph (`admission`).

- hybrid replay keeping the capture's state slots: `HybridLinearAttnBackend._replay_metadata` (its Mamba base)
  no longer copies the batch's state slots into the captured `state_indices_list`: the linear-attention layer of
  every replay reads and writes the capture's dummy slots. The diagnosis names the recurrent state's slots and the
  buffer against the batch's slots.

- hybrid replay keeping the capture's track slots: under the Mamba extra buffer the same method no longer copies
  the batch's track destinations: a request that checkpoints writes its state into slot 0, its own track slot
  keeps the old one. The diagnosis names the track slot and `mamba_track_indices_buf` against the batch's.

In-process rather than a subprocess mutant run: the edit is a wrapper around SGLang's own method, and the model
build and a one-size capture cost a few seconds, where a fresh interpreter importing SGLang costs tens.
"""
from __future__ import annotations

import pytest

from harness.devices import get_device
from harness.oracles import OracleFailure
from harness.targets.decode.base import DecodeBatch, DecodeCase, SpecSettings
from harness.targets.decode.real_model import RealModelTarget, StagedBatch, check_replays, family_missing, load
from tests.mutant_runs import edited

pytestmark = pytest.mark.slow  # drives SGLang's compile or capture in this process: seconds a test

# one captured size, one replay with prefixes longer than the capture's dummy batch reads
CASE = DecodeCase(capture_bs=(2,), max_running_requests=8)
REPLAYS = [[StagedBatch(DecodeBatch(input_ids=[5, 90], positions=[8, 3], seq_lens=[9, 4], req_pool_indices=[4, 2]),
                        seed=7)]]


def run_case(family: str) -> None:
    target = RealModelTarget(CASE, family=family)
    check_replays(target, REPLAYS)


def test_clean_sglang_passes_the_real_model_check(family):
    run_case(family)


def test_triton_replay_skips_metadata_refresh_fails_naming_kv_indptr(family, monkeypatch):
    from sglang.srt.layers.attention.triton_backend import TritonAttnBackend

    real = TritonAttnBackend._init_forward_metadata_out_graph

    def capture_only(self, forward_batch, in_capture):
        if in_capture:
            real(self, forward_batch, in_capture)

    monkeypatch.setattr(TritonAttnBackend, "_init_forward_metadata_out_graph", capture_only)
    with pytest.raises(OracleFailure) as failure:
        run_case(family)
    assert failure.value.oracle == "eager-equality"
    diagnosis = failure.value.diagnosis
    assert "replay differs from eager" in diagnosis
    assert "the Triton backend's `kv_indptr`[:3] holds [0, 1, 2] where the batch implies [0, 9, 13]" in diagnosis


# two requests padded to the captured 3: the padded row writes slot 0
PADDED_CASE = DecodeCase(capture_bs=(3,), max_running_requests=8)
PADDED_REPLAYS = [[StagedBatch(DecodeBatch(input_ids=[5, 90], positions=[8, 3], seq_lens=[9, 4],
                                           req_pool_indices=[4, 2]), seed=7)]]


def test_clean_sglang_passes_a_padded_replay(family):
    check_replays(RealModelTarget(PADDED_CASE, family=family), PADDED_REPLAYS)


def test_allocator_handing_out_the_padding_slot_fails_naming_the_request(family, monkeypatch):
    import torch
    from sglang.srt.mem_cache.allocator.token import TokenToKVPoolAllocator

    real = TokenToKVPoolAllocator.clear

    def padding_slot_free(self):
        real(self)
        self.free_pages = torch.cat([torch.zeros(1, dtype=self.free_pages.dtype), self.free_pages])

    monkeypatch.setattr(TokenToKVPoolAllocator, "clear", padding_slot_free)
    with pytest.raises(OracleFailure) as failure:
        check_replays(RealModelTarget(PADDED_CASE, family=family), PADDED_REPLAYS)
    assert failure.value.oracle == "eager-equality"
    diagnosis = failure.value.diagnosis
    assert "replay differs from eager" in diagnosis
    assert "request(s) [0] of the batch hold KV slot 0, SGLang's padding slot, which the 1 padded row(s)" in diagnosis


# two requests verify 3 drafts each on the captured 2: the first a chain, the second a tree
VERIFY_CASE = DecodeCase(capture_bs=(2,), max_running_requests=8,
                         spec=SpecSettings(num_steps=2, topk=1, num_draft_tokens=3, algorithm="EAGLE"))
TREE = [[True, False, False], [True, True, False], [True, False, True]]
CHAIN = [[True, False, False], [True, True, False], [True, True, True]]
VERIFY_REPLAYS = [[StagedBatch(DecodeBatch(input_ids=[5, 6, 7, 90, 91, 92], positions=[], seq_lens=[9, 4],
                                           req_pool_indices=[4, 2], forward_mode="TARGET_VERIFY",
                                           draft_visibility=[CHAIN, TREE]), seed=7)]]


def test_clean_sglang_passes_a_target_verify_replay(family):
    check_replays(RealModelTarget(VERIFY_CASE, family=family), VERIFY_REPLAYS)


def test_verify_mask_copied_by_an_even_split_fails_naming_the_mask(family, monkeypatch):
    """`TritonAttnBackend._update_target_verify_buffers` copies `len(mask) // bs` entries of the verify mask at
    replay, as if every request's part were as long (they are not: each spans its prefix plus its drafts), so the
    tail of the mask stays as the last replay or the capture left it. No tiny model runs this backend."""
    from sglang.srt.layers.attention.triton_backend import TritonAttnBackend

    mutant = edited(TritonAttnBackend._update_target_verify_buffers,
                    "custom_mask[: spec_info.custom_mask.shape[0]] = spec_info.custom_mask",
                    "custom_mask[: spec_info.custom_mask.shape[0] // bs] = "
                    "spec_info.custom_mask[: spec_info.custom_mask.shape[0] // bs]")
    monkeypatch.setattr(TritonAttnBackend, "_update_target_verify_buffers", mutant)
    with pytest.raises(OracleFailure) as failure:
        check_replays(RealModelTarget(VERIFY_CASE, family=family), VERIFY_REPLAYS)
    assert failure.value.oracle == "eager-equality", failure.value
    diagnosis = failure.value.diagnosis
    assert "replay differs from eager" in diagnosis, diagnosis
    assert ("its verify mask buffer (`_verify_mask`) differs from the batch's custom mask for request(s) [0, 1]"
            in diagnosis)


# -- a sliding-window model (the swa family: Gemma2, window 6 on layer 0) -------------------------------------------
# two requests on the captured 2, both past the window: 9 and 8 keys, the window rail keeps 6 of each
WINDOW_REPLAYS = [[StagedBatch(DecodeBatch(input_ids=[5, 90], positions=[8, 7], seq_lens=[9, 8],
                                           req_pool_indices=[4, 2]), seed=7)]]
# for a mutant that widens the graph's window to W + 1 = 7: one request past it (7 keys), one short of it (4), so
# the rail's 11 entries fit its static buffer of 2 x 6 (two requests past it would write 14, past the buffer's end:
# heap corruption that once crashed a CI worker, not an oracle's verdict)
WIDER_WINDOW_REPLAYS = [[StagedBatch(DecodeBatch(input_ids=[5, 90], positions=[8, 3], seq_lens=[9, 4],
                                                 req_pool_indices=[4, 2]), seed=7)]]


def run_window(replays=WINDOW_REPLAYS) -> None:
    from harness.targets.decode.real_model import family_missing

    if family_missing("swa"):
        pytest.skip(family_missing("swa"))
    check_replays(RealModelTarget(CASE, family="swa"), replays)


def test_clean_sglang_passes_sliding_window_replays():
    load()
    with get_device("cpu").install("cuda"):
        run_window()


def test_graph_window_one_key_wider_fails_naming_the_window_rail(monkeypatch):
    """`TritonAttnBackend._update_decode_kv_buffers` (the decode graph's metadata, capture and replay) fills the
    window rail with W + 1 keys, eager's `init_forward_metadata` still with W: the off-by-one of
    `test_findings_triton_decode_window_one_key_short` mended in one of its two places. The tiny models have no
    window layers; the replay of the real one differs from eager, the diagnosis names `window_kv_indptr`."""
    from sglang.srt.layers.attention.triton_backend import TritonAttnBackend

    mutant = edited(TritonAttnBackend._update_decode_kv_buffers, "self.sliding_window_size,\n            seq_lens,",
                    "self.sliding_window_size + 1,\n            seq_lens,")
    monkeypatch.setattr(TritonAttnBackend, "_update_decode_kv_buffers", mutant)
    load()
    with get_device("cpu").install("cuda"), pytest.raises(OracleFailure) as failure:
        run_window(WIDER_WINDOW_REPLAYS)
    assert failure.value.oracle == "eager-equality", failure.value
    diagnosis = failure.value.diagnosis
    assert "replay differs from eager" in diagnosis, diagnosis
    assert "its `window_kv_indptr`[:3] holds [0, 7, 11] where a window of 6 over the batch implies [0, 6, 10]" \
        in diagnosis, diagnosis


# -- --enable-deterministic-inference: KV splits by a fixed tile ---------------------------------------------------
# two requests on the captured 2, tiles of 16: 17 tokens -> 2 splits, 5 -> 1
DETERMINISTIC_REPLAYS = [[StagedBatch(DecodeBatch(input_ids=[5, 90], positions=[16, 4], seq_lens=[17, 5],
                                                  req_pool_indices=[4, 2]), seed=7)]]


def run_deterministic() -> None:
    check_replays(RealModelTarget(CASE, family="dense", split_tile=16), DETERMINISTIC_REPLAYS)


def test_clean_sglang_passes_deterministic_decode_replays():
    load()
    with get_device("cpu").install("cuda"):
        run_deterministic()


@pytest.mark.parametrize("old, new, splits", [
    # the fixed count of the plain backend kept under deterministic inference (outputs unchanged: eager agrees)
    (") and not self.enable_deterministic:", "):", "[16, 16]"),  # max_kv_splits: context 256 / 16
    # the tile count rounded down
    ("expanded_seq_lens + self.split_tile_size - 1", "expanded_seq_lens", "[1, 0]"),
], ids=["fixed_count_kept", "tiles_rounded_down"])
def test_deterministic_split_mutants_fail_batch_invariance(monkeypatch, old, new, splits):
    """`TritonAttnBackend.get_num_kv_splits` edited (one line, `edited`): the decode graph's kernels then read
    split counts that do not follow each request's own length; the split check names them and the arithmetic."""
    from sglang.srt.layers.attention.triton_backend import TritonAttnBackend

    monkeypatch.setattr(TritonAttnBackend, "get_num_kv_splits", edited(TritonAttnBackend.get_num_kv_splits, old, new))
    load()
    with get_device("cpu").install("cuda"), pytest.raises(OracleFailure) as failure:
        run_deterministic()
    assert failure.value.oracle == "batch-invariance", failure.value
    assert (f"runs {splits} KV splits per request where tiles of 16 over seq_lens [17, 5] give [2, 1] "
            "(ceil(seq_len / 16))") in failure.value.diagnosis, failure.value.diagnosis


# -- the prefill runner's breakable graphs (harness/targets/prefill/real_model.py) --------------------------------
PREFILL_BATCHES = [((1, 2, 3, 4, 5), (9, 8, 7)), ((5,) * 9, (3, 4), (7, 7, 7, 7))]  # 8 tokens, then 15 padded to 16


def _prefill_target(family: str):
    from harness.targets.prefill.base import PrefillCase
    from harness.targets.prefill.real_model import RealModelPrefillTarget

    return RealModelPrefillTarget(PrefillCase(backend="breakable", capture_tokens=(8, 16)), family)


@pytest.mark.parametrize("prefill_family", ["dense", pytest.param("vlm", marks=pytest.mark.slow)])
def test_clean_sglang_passes_breakable_prefill_replays(prefill_family):
    from harness.targets.prefill.real_model import check_prefill

    load()
    with get_device("cpu").install("cuda"):
        target = _prefill_target(prefill_family)
        assert [check_prefill(target, p, i) for i, p in enumerate(PREFILL_BATCHES)] == ["replayed", "replayed"]


# a logprob batch: 5 tokens from position 1 (4 logits rows), 3 asking none (1 row)
LOGPROB_BATCH = (((1, 2, 3, 4, 5), (9, 8, 7)), [1, None])


def test_clean_sglang_passes_a_logprob_prefill_replay():
    from harness.targets.prefill.real_model import check_prefill

    load()
    with get_device("cpu").install("cuda"):
        assert check_prefill(_prefill_target("dense"), LOGPROB_BATCH[0], 0, logprob_starts=LOGPROB_BATCH[1]) \
            == "replayed"


def test_logits_buffer_rows_swapped_fails_logits_buffer(monkeypatch):
    """`_prefill_logits_buffer_rows` with its `zip` pair swapped (a seed-13 survivor of the last stop): a logprob
    batch gets a shared logits buffer of max(start - seq, 1) rows a request; the logits processor drops a buffer
    of the wrong length and allocates, so the outputs agree and only the buffer's length shows it."""
    from sglang.srt.model_executor.runner.prefill_cuda_graph_runner import PrefillCudaGraphRunner

    from harness.targets.prefill.real_model import check_prefill

    load()
    mutant = edited(PrefillCudaGraphRunner._prefill_logits_buffer_rows, "for start_len, seq_len in zip(",
                    "for seq_len, start_len in zip(")
    monkeypatch.setattr(PrefillCudaGraphRunner, "_prefill_logits_buffer_rows", mutant)
    with get_device("cpu").install("cuda"), pytest.raises(OracleFailure) as failure:
        check_prefill(_prefill_target("dense"), LOGPROB_BATCH[0], 0, logprob_starts=LOGPROB_BATCH[1])
    assert failure.value.oracle == "logits-buffer", failure.value
    assert "asked for shared logits buffers of [2] row(s) where its logits are 5 row(s) (4 + 1" \
        in failure.value.diagnosis, failure.value.diagnosis


def test_breakable_attention_dropping_save_kv_cache_fails_naming_the_cache(monkeypatch):
    """`RadixAttention._eager_attention` (the attention a breakable prefill graph runs eagerly between its captured
    segments) passes `False` for `save_kv_cache`: a replayed prefill computes the right logits and writes no K/V,
    so the next decode step of those requests reads an empty prefix. The tiny prefill model has its own attention
    and never runs this method; here the KV cache the replay leaves differs from eager's, named by buffer and
    slot."""
    from sglang.srt.layers import radix_attention
    from sglang.srt.model_executor.runner_backend_utils.breakable_cuda_graph.breakable_cuda_graph import (
        eager_on_graph,
    )

    from harness.targets.prefill.real_model import check_prefill

    load()
    inner = radix_attention.RadixAttention._eager_attention.__wrapped__  # the body under SGLang's eager_on_graph
    mutant = edited(inner, "save_kv_cache,\n                **kwargs,", "False,\n                **kwargs,")
    monkeypatch.setattr(radix_attention.RadixAttention, "_eager_attention", eager_on_graph(mutant))
    with get_device("cpu").install("cuda"), pytest.raises(OracleFailure) as failure:
        check_prefill(_prefill_target("dense"), PREFILL_BATCHES[0], 0)
    assert failure.value.oracle == "eager-equality"
    diagnosis = failure.value.diagnosis
    assert "the replay's logits equal eager's but the KV cache it leaves does not" in diagnosis
    assert "`k_buffer[layer 0]` differs at KV slot(s)" in diagnosis


def test_prefill_padding_limit_raised_fails_admission(monkeypatch):
    """SGLang's prefill runner serving a batch padded more than twice (its `_MAX_PREFILL_CUDA_GRAPH_PADDING_FACTOR`
    raised to 4): 3 tokens padded to the captured 8 are offered a graph the harness's rule says they must not get;
    on clean SGLang they are refused."""
    from sglang.srt.model_executor.runner import prefill_cuda_graph_runner

    from harness.targets.prefill.real_model import check_prefill

    load()
    with get_device("cpu").install("cuda"):
        target = _prefill_target("dense")
        assert check_prefill(target, ((1, 2, 3),), 0) == "refused"
        monkeypatch.setattr(prefill_cuda_graph_runner, "_MAX_PREFILL_CUDA_GRAPH_PADDING_FACTOR", 4)
        with pytest.raises(OracleFailure) as failure:
            check_prefill(target, ((1, 2, 3),), 1)
    assert failure.value.oracle == "admission"
    assert ("the runner offers a graph though its 3 tokens would be padded to 8, more than 2x"
            in failure.value.diagnosis)


def test_graph_offered_to_input_embeds_fails_admission(monkeypatch):
    """SGLang's prefill runner with its `input_embeds` rule dropped from `can_replay_locally`: a batch of prompts
    sent as embeddings is offered a graph whose static inputs are token ids (the replay would run the fake ids).
    Clean SGLang refuses it (and then meets a finding in its eager runner: the suite's strict xfails)."""
    from sglang.srt.model_executor.runner.prefill_cuda_graph_runner import PrefillCudaGraphRunner

    from harness.targets.prefill.real_model import check_input_embeds

    load()
    monkeypatch.setattr(PrefillCudaGraphRunner, "can_replay_locally", edited(
        PrefillCudaGraphRunner.can_replay_locally, "if input_embeds is not None:", "if False:"))
    with get_device("cpu").install("cuda"):
        target = _prefill_target("dense")
        with pytest.raises(OracleFailure) as failure:
            check_input_embeds(target, [(1, 2, 3, 4, 5), (9, 8, 7)], 0)
    assert failure.value.oracle == "admission"
    assert "the runner offers a graph to a batch carrying input_embeds" in failure.value.diagnosis


# chunked prefill: the 9-token prompt's first 4 tokens prefilled by an earlier chunk, its 5 extend with 2 new tokens
CHUNKED = ((tuple(range(21, 30)), (3, 4)), [4, 0])  # distinct tokens: a prompt of one token repeated has one V


def test_clean_sglang_passes_a_chunked_prefix_prefill():
    from harness.targets.prefill.real_model import check_prefill

    load()
    with get_device("cpu").install("cuda"):
        assert check_prefill(_prefill_target("dense"), *CHUNKED[:1], 0, CHUNKED[1]) == "replayed"


def test_extend_reading_no_cached_prefix_fails_against_the_torch_reference(monkeypatch):
    """`TritonAttnBackend.init_forward_metadata` builds an extend batch's prefix KV indices from zero prefix
    lengths: a request that extends a cached prefix (chunked prefill) attends to its new tokens only, in the graph's
    replay and eager alike, so replay equals eager; SGLang's torch-native attention over the same cache does not,
    and the check of eager against it fails. Only a batch with a cached prefix shows it: the tiny prefill model
    runs no Triton backend, and a batch of new requests has no prefix to lose."""
    from sglang.srt.layers.attention.triton_backend import TritonAttnBackend

    from harness.targets.prefill.real_model import check_prefill

    mutant = edited(TritonAttnBackend.init_forward_metadata,
                    "                forward_batch.extend_prefix_lens,\n"
                    "                forward_batch.req_pool_indices,\n                kv_indices,\n",
                    "                torch.zeros_like(forward_batch.extend_prefix_lens),\n"
                    "                forward_batch.req_pool_indices,\n                kv_indices,\n")
    load()
    with get_device("cpu").install("cuda"):
        target = _prefill_target("dense")
        assert check_prefill(target, CHUNKED[0], 0) == "replayed"  # new requests: nothing to lose
        monkeypatch.setattr(TritonAttnBackend, "init_forward_metadata", mutant)
        with pytest.raises(OracleFailure) as failure:
            check_prefill(target, *CHUNKED[:1], 1, CHUNKED[1])
    assert failure.value.oracle == "eager-equality", failure.value
    diagnosis = failure.value.diagnosis
    assert "cached prefixes [4, 0]" in diagnosis, diagnosis
    assert "eager on the Triton backend differs from SGLang's torch-native attention" in diagnosis, diagnosis


# a mixed chunked prefill: two prompts (8 tokens) arriving while two requests decode (10 tokens, padded to 16)
MIXED = (((1, 2, 3), (4, 4, 4, 4, 4)), ((5, 6, 7, 8), (9, 10)))


def test_clean_sglang_passes_a_mixed_prefill_replay():
    from harness.targets.prefill.real_model import check_prefill

    load()
    with get_device("cpu").install("cuda"):
        assert check_prefill(_prefill_target("dense"), MIXED[0], 0, running=MIXED[1]) == "replayed"


def test_mixed_write_slots_out_of_order_fail_batch_invariance(monkeypatch):
    """`ScheduleBatch.mix_with_running` putting the running requests' write slots before the prompts' (the batch's
    tokens are the prompts' first): every token writes its K/V where another token's belongs, so a decode token's
    lands in another's slot. The extend kernels take the new tokens' own K/V, so this step's logits are right: on
    an MHA family the torch-native reference (reading them from the cache) already differs from eager
    (`eager-equality`); on MLA, which has no torch-native prefill reference here, replay and eager run the same
    wrong batch and agree, and so do the caches they leave; only the K/V the running request's token leaves in its
    slot, against decoding alone, shows what its next step would read."""
    from sglang.srt.managers.schedule_batch import ScheduleBatch

    from harness.targets.prefill.real_model import check_prefill

    mutant = edited(ScheduleBatch.mix_with_running,
                    "torch.cat([self.out_cache_loc, running_out_cache_loc])",
                    "torch.cat([running_out_cache_loc, self.out_cache_loc])")
    monkeypatch.setattr(ScheduleBatch, "mix_with_running", mutant)
    load()
    with get_device("cpu").install("cuda"), pytest.raises(OracleFailure) as failure:
        check_prefill(_prefill_target("mla"), MIXED[0], 0, running=MIXED[1])
    assert failure.value.oracle == "batch-invariance"
    assert "running request 0 (rid 0, history [5, 6, 7, 8," in failure.value.diagnosis
    assert "the K/V its decode token leaves in its slot" in failure.value.diagnosis


# two prompts, the first with 3 of its 8 tokens prefilled by an earlier chunk, then two decode steps
REFERENCE = ([(5, 17, 3, 99, 40, 7, 8, 9), (7, 8, 9)], [3, 0], 2)


def _reference_check(family: str, tied: bool | None = None) -> int:
    from harness.targets.prefill.base import PrefillCase
    from harness.targets.prefill.real_model import RealModelPrefillTarget, check_against_transformers

    load()
    with get_device("cpu").install("cuda"):
        target = RealModelPrefillTarget(PrefillCase(backend="breakable", capture_tokens=(16,)), family,
                                        weights="transformers", tied=tied, capture=False)
        return check_against_transformers(target, *REFERENCE)


@pytest.mark.parametrize("reference_family", ["dense", "mla", "moe", "swa", "vlm"])
def test_clean_sglang_matches_transformers(reference_family):
    assert _reference_check(reference_family) == 3 * 2  # the prefill and two decode steps, two requests each


def test_gate_and_up_shards_swapped_at_load_fail_the_transformers_reference(monkeypatch):
    """`LlamaForCausalLM`'s weight loader mapping the checkpoint's `gate_proj` into the second half of the fused
    `gate_up_proj` and `up_proj` into the first (two shard ids swapped): the MLP applies SiLU to the wrong half.
    Replay, eager, the torch-native backend and a request alone all run the same swapped weights and agree; only
    another implementation of the architecture over the same checkpoint shows it."""
    from sglang.srt.models.llama import LlamaForCausalLM

    mutant = edited(LlamaForCausalLM._legacy_load_weights,
                    '(".gate_up_proj", ".gate_proj", 0),\n        (".gate_up_proj", ".up_proj", 1),',
                    '(".gate_up_proj", ".gate_proj", 1),\n        (".gate_up_proj", ".up_proj", 0),')
    monkeypatch.setattr(LlamaForCausalLM, "_legacy_load_weights", mutant)
    with pytest.raises(OracleFailure) as failure:
        _reference_check("dense")
    assert failure.value.oracle == "transformers-reference"
    assert "the prefill, request 0 (cached prefix 3): SGLang's next-token logits after 8 tokens" in \
        failure.value.diagnosis


def test_mla_untying_a_tied_head_fails_the_transformers_reference(monkeypatch):
    """`DeepseekV2ForCausalLM.__init__` tying its LM head only on a pipeline of 0 ranks (a constant off by one):
    a tied checkpoint then gets a head of its own that nothing loads. Every SGLang-against-SGLang check runs the
    same untied model; transformers ties."""
    from sglang.srt.models.deepseek_v2 import DeepseekV2ForCausalLM

    assert _reference_check("mla", tied=True) == 6  # clean SGLang ties as transformers does
    monkeypatch.setattr(DeepseekV2ForCausalLM, "__init__", edited(
        DeepseekV2ForCausalLM.__init__, "self.pp_group.world_size == 1 and config.tie_word_embeddings",
        "self.pp_group.world_size == 0 and config.tie_word_embeddings"))
    with pytest.raises(OracleFailure) as failure:
        _reference_check("mla", tied=True)
    assert failure.value.oracle == "transformers-reference"


# -- the hybrid family: SGLang's HybridLinearAttnBackend and its per-request state slots -------------------------
# capture 1 and 3; three requests (a captured size), then two padded to 3 on other rows
HYBRID_CASE = DecodeCase(capture_bs=(1, 3), max_running_requests=8)
HYBRID_REPLAYS = [[StagedBatch(DecodeBatch(input_ids=[5, 90, 17], positions=[8, 3, 12], seq_lens=[9, 4, 13],
                                           req_pool_indices=[4, 2, 7]), seed=7),
                   StagedBatch(DecodeBatch(input_ids=[33, 61], positions=[5, 10], seq_lens=[6, 11],
                                           req_pool_indices=[1, 5]), seed=8)]]


def run_hybrid(replays=HYBRID_REPLAYS, mamba_track: int | None = None) -> None:
    load()
    if family_missing("hybrid"):
        pytest.skip(family_missing("hybrid"))
    with get_device("cpu").install("cuda"):
        check_replays(RealModelTarget(HYBRID_CASE, family="hybrid", mamba_track=mamba_track), replays)


def test_clean_sglang_passes_hybrid_replays():
    run_hybrid()


def test_hybrid_replay_keeping_capture_state_slots_fails_naming_the_state(monkeypatch):
    """`HybridLinearAttnBackend._replay_metadata` no longer copies the batch's state slots into the captured
    buffer: every replay's linear-attention layer reads and writes the slots of the capture's dummy batch."""
    from sglang.srt.layers.attention.hybrid_linear_attn_backend import MambaAttnBackendBase

    monkeypatch.setattr(MambaAttnBackendBase, "_replay_metadata", edited(
        MambaAttnBackendBase._replay_metadata,
        "        self.state_indices_list[bs - 1][: len(mamba_indices)].copy_(mamba_indices)", "        pass"))
    with pytest.raises(OracleFailure) as failure:
        run_hybrid()
    assert failure.value.oracle == "eager-equality"
    diagnosis = failure.value.diagnosis
    assert "replay differs from eager" in diagnosis, diagnosis
    assert "`mamba recurrent_state[layer 0]` differs at state slot(s)" in diagnosis, diagnosis
    assert "the linear-attention backend's `state_indices_list[2]` holds [-1, -1, -1] where the batch's rows map " \
        "state slots [1, 2, 3]" in diagnosis, diagnosis


# the Mamba extra buffer, a checkpoint every 8 tokens: the third request (16 tokens) checkpoints on the captured 3,
# then two requests padded to 3 (the padded row must checkpoint nothing)
TRACK_REPLAYS = [[StagedBatch(DecodeBatch(input_ids=[5, 90, 17], positions=[8, 3, 15], seq_lens=[9, 4, 16],
                                          req_pool_indices=[4, 2, 7]), seed=7),
                  StagedBatch(DecodeBatch(input_ids=[33, 61], positions=[5, 10], seq_lens=[6, 11],
                                          req_pool_indices=[1, 5]), seed=8)]]


def test_clean_sglang_passes_hybrid_replays_that_checkpoint_state():
    run_hybrid(TRACK_REPLAYS, mamba_track=8)


def test_hybrid_replay_keeping_capture_track_slots_fails_naming_the_checkpoint(monkeypatch):
    """`_replay_metadata` no longer copies the batch's track destinations into the captured buffer: a request
    that checkpoints writes its state into the capture's slot 0, not its own track slot."""
    from sglang.srt.layers.attention.hybrid_linear_attn_backend import MambaAttnBackendBase

    monkeypatch.setattr(MambaAttnBackendBase, "_replay_metadata", edited(
        MambaAttnBackendBase._replay_metadata,
        "        track_buf.copy_(self._translate_mamba_indices(mamba_track_indices[:bs]))", "        pass"))
    with pytest.raises(OracleFailure) as failure:
        run_hybrid(TRACK_REPLAYS, mamba_track=8)
    assert failure.value.oracle == "eager-equality"
    diagnosis = failure.value.diagnosis
    assert "`mamba recurrent_state[layer 0]` differs at state slot(s) [8]" in diagnosis, diagnosis
    assert "its `mamba_track_indices_buf`[:3] holds [0, 0, 0] where the batch's requests track into slots " \
        "[5, 6, 8] (checkpointing [False, False, True])" in diagnosis, diagnosis
