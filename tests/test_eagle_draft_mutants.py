"""Mutants of SGLang's EAGLE draft decode graphs (`harness/targets/decode/eagle_draft.py`), in-process: one line of
an installed SGLang method recompiled by `edited` and set with pytest's MonkeyPatch (undone after). Each must fail
the draft check naming what went wrong, and clean SGLang must pass the same case. No tiny model runs the draft
worker, its multi-step backend or its runner: only this target can see them.

- padded_draft_positions_left_stale: `EAGLEDraftCudaGraphRunner.execute` no longer zeroes the static positions
  before a padded replay, so the padded rows keep the last batch's. The real rows' draft tree is unchanged; the
  per-step rails of the padded branches (whose length the kernel takes from the positions) then reach past the
  padding slot into stale indices: `draft-rails` names the padded branch and the slots it reads.
- padded_draft_writes_left_stale: the same method no longer zeroes the static `out_cache_loc` before a padded
  replay, so each draft step of a padded row writes its K/V into the slots the last batch's request held:
  `eager-equality` names the KV slots the replay wrote and eager did not.
- padded_extend_writes_left_stale: `EAGLEDraftExtendCudaGraphRunner.execute` no longer zeroes the static
  `out_cache_loc` before a padded replay: the padded rows of the draft extend write their window's K/V into the
  slots the last batch held, where eager writes nothing: `eager-equality` names the slots.
  The same on a STANDALONE draft, whose extend carries no hidden state (the graph captures the draft's own, eager
  none: nothing reads either, so only the logits and the KV are compared).
- extend_rail_counts_the_window: `TritonAttnBackend._update_draft_extend_buffers` takes the whole post-window
  length as each request's KV rail (the window's own slots read again as prefix), in the graph only:
  `draft-rails` names the graph's kv_indptr against the prefixes, before the graph replays.
- draft_splits_by_request_not_branch: under `--enable-deterministic-inference`, `TritonAttnBackend.get_num_kv_splits`
  spreads the requests' split counts over their branches with `repeat` instead of `repeat_interleave` (branch k of
  request r gets another request's count). Graph and eager run the same counts, so the trees agree; the split check
  (`batch-invariance`) names the counts against ceil(seq_len / tile) per branch.
- npu_draft_step_lengths_one_short (NPU personality): `EAGLEDraftNpuGraphRunner._replay_graph` rebinds step i's
  host-side KV lengths as seq_len + i instead of seq_len + i + 1: the virtual device's graph, whose static buffers
  carry the lengths, replays equal to eager; `npu-graph-update` names the step and the request whose length is off.
- npu_draft_padding_lengths_from_the_mirror (NPU personality): the same method takes the padded host mirror
  (`seq_lens_cpu[:bs]`, its padded rows at the fill value) instead of the real requests before padding with 0s:
  the update lists more lengths than the graph has requests; `npu-graph-update` names the step counts.
- npu_extend_padding_dropped (NPU personality): `EAGLEDraftExtendNpuGraphRunner._replay_graph` no longer pads its
  update with a 0 per padded request: the padded rows keep the last batch's lengths on an NPU;
  `npu-graph-update` names the replay padded to 3.
- npu_update_worker_on_device_0 (NPU personality, the runner on NPU 1): `NPUCudaGraphBackend.__init__` no longer
  binds its graph-update worker thread to the runner's device (`initializer=None`): each update is made from NPU 0;
  `npu-graph-update` names the graph's NPU and the worker's.
- greedy_variant_never_picked (rejection sampling): `EAGLEDraftCudaGraphRunner._sampling_variant` never names the
  greedy variant, so an all-greedy batch replays the sampling graph: `graph-key` names the variant it must replay.
- greedy_variant_captured_sampling (rejection sampling): `capture_one_shape` captures the greedy variant with the
  batch's sampling on, so the greedy graph draws a proposal distribution eager never builds: `eager-equality` names
  `draft_probs`.
- padded_field_not_handed_back: `EAGLEDraftCudaGraphRunner.execute`, after a padded replay, no longer points the
  batch's `positions` (or `seq_lens`) back at the raw rows: the caller gets the padded view; `batch-consistency`
  names the field and both shapes (the draft tree itself is right, so nothing else sees it).
- eagle3_tree_tokens_unmapped (EAGLE3): `EagleDraftWorker.draft_forward` no longer maps each step's top-k through
  the head's `hot_token_id`, so draft-vocabulary ids reach the tree. Graph and eager run the same code and agree;
  `draft-token-map` names the request and the ids no target token has.
- eagle3_extend_hidden_width_of_the_head (EAGLE3): the draft extend runner sizes its hidden-state buffer by the
  head's width (64) instead of the three target layers it reads (`get_draft_input_from_target_hidden_dim`, 192):
  the captured extend reads a truncated buffer; `eager-equality` names `hidden_states` and the KV slots.
- draft_sink_dropped (`--speculative-draft-window-size 6 --speculative-draft-sink-size 2`, the rejection-sampling
  case): `resolve_draft_decode_window` drops the sink, so EAGLE's rails keep only the recent window: `draft-rails`
  names the branch that reads 7 slots where sink and window give 9.
- window_rail_one_short (EAGLE3, window 6): `TritonMultiStepDraftBackend._fill_window_rail` plans its window layers'
  rails one slot narrower than their window: `draft-rails` names the window rail's kv_indptr.
- eager_draft_rails_one_step_short: `TritonMultiStepDraftBackend.common_template` slices each step's
  `kv_indices` for one step fewer (`draft_kv_indices_used_len(..., i)`), which only the eager path reads (the graph
  reads its static buffer whole): `draft-rails` names the eager backend's indices of the branch cut short.
"""
from __future__ import annotations

import dataclasses

import pytest

from harness.devices import get_device
from harness.oracles import OracleFailure
from harness.targets.decode.base import DecodeCase, SpecSettings
from harness.targets.decode.eagle_draft import DraftBatch, DraftExtendBatch, EagleDraftTarget, check_draft_replay, \
    check_extend_replay, draft_missing
from tests.mutant_runs import edited

pytestmark = pytest.mark.slow  # builds two models and captures the draft graphs in this process

# capture 1 and 3, a tree of 2 branches over 3 steps: three requests, then two padded to 3
CASE = DecodeCase(capture_bs=(1, 3), max_running_requests=8,
                  spec=SpecSettings(num_steps=3, topk=2, num_draft_tokens=5, algorithm="EAGLE"))
BATCHES = [DraftBatch([5, 14, 2], [3, 1, 7], [[4, 7], [1, 2], [5, 6]], [[0.6, 0.3], [0.5, 0.4], [0.9, 0.05]], 3),
           DraftBatch([9, 6], [7, 2], [[8, 9], [10, 11]], [[0.7, 0.2], [0.4, 0.35]], 4),
           # the draft extends of a 5-token verify window: three requests, then two padded to 3
           DraftExtendBatch([5, 14, 2], [3, 1, 7], [[1, 2, 3, 4, 5], [6, 7, 8, 9, 10], [11, 12, 13, 14, 15]],
                            [2, 4, 1], 5),
           DraftExtendBatch([9, 6], [7, 2], [[21, 22, 23, 24, 25], [26, 27, 28, 29, 30]], [3, 1], 6)]


def _installed(personality: str):
    from harness.targets.decode.real_model import load

    load()
    reason = draft_missing(personality)
    if reason:
        pytest.skip(reason)
    return get_device("cpu").install(personality)


@pytest.fixture
def device():
    with _installed("cuda"):
        yield


@pytest.fixture
def npu_device():
    """Under the npu personality, on the second virtual NPU (where a worker left on NPU 0 is visible)."""
    import torch

    with _installed("npu"):
        torch.npu.set_device(1)
        try:
            yield
        finally:
            torch.npu.set_device(0)


def run_case(split_tile: int | None = None, personality: str = "cuda", case: DecodeCase = CASE,
             batches: list = BATCHES) -> None:
    target = EagleDraftTarget(case, split_tile=split_tile, personality=personality)
    for index, batch in enumerate(batches):
        check = check_extend_replay if isinstance(batch, DraftExtendBatch) else check_draft_replay
        check(target, batch, f"draft replay {index}")


def mutate(monkeypatch, owner, name: str, old: str, new: str) -> None:
    monkeypatch.setattr(owner, name, edited(getattr(owner, name), old, new))


def test_clean_sglang_passes_the_draft_check(device):
    run_case()


EAGLE3_CASE = dataclasses.replace(CASE, spec=dataclasses.replace(CASE.spec, algorithm="EAGLE3"))


def test_clean_sglang_passes_the_eagle3_draft_check(device):
    run_case(case=EAGLE3_CASE)


# a STANDALONE draft (a vanilla Llama of its own weights): no hidden state in its batches, none captured
STANDALONE_CASE = dataclasses.replace(CASE, spec=dataclasses.replace(CASE.spec, algorithm="STANDALONE"))


def test_clean_sglang_passes_the_standalone_draft_check(device):
    run_case(case=STANDALONE_CASE)


def test_eagle3_tree_tokens_unmapped_fail_naming_the_request(device, monkeypatch):
    from sglang.srt.speculative.eagle_worker_v2 import EagleDraftWorker

    mutate(monkeypatch, EagleDraftWorker, "draft_forward",
           "            if self.hot_token_id is not None:\n                topk_index = self.hot_token_id[topk_index]\n"
           "            hidden_states", "            hidden_states")
    with pytest.raises(OracleFailure) as failure:
        run_case(case=EAGLE3_CASE)
    assert failure.value.oracle == "draft-token-map"
    assert "draft replay 0: the replayed draft tree of request 0 holds token(s)" in failure.value.diagnosis
    assert "no target id of the EAGLE3 head's map" in failure.value.diagnosis


def test_eagle3_extend_hidden_width_of_the_head_fails_naming_hidden_states(device, monkeypatch):
    import sglang.srt.speculative.eagle_draft_extend_cuda_graph_runner as extend_runner

    monkeypatch.setattr(extend_runner, "get_draft_input_from_target_hidden_dim",
                        lambda model_runner: model_runner.model_config.hidden_size)
    with pytest.raises(OracleFailure) as failure:
        run_case(case=EAGLE3_CASE)
    assert failure.value.oracle == "eager-equality"
    assert "draft replay 2: the replayed draft extend differs from eager's: output['hidden_states']" \
        in failure.value.diagnosis
    assert "differs at KV slot(s)" in failure.value.diagnosis


def test_padded_draft_positions_left_stale_fail_naming_the_padded_branch(device, monkeypatch):
    from sglang.srt.speculative.eagle_draft_cuda_graph_runner import EAGLEDraftCudaGraphRunner

    mutate(monkeypatch, EAGLEDraftCudaGraphRunner, "execute", "buffers.positions.zero_()\n", "pass\n")
    with pytest.raises(OracleFailure) as failure:
        run_case()
    assert failure.value.oracle == "draft-rails"
    assert "draft replay 1" in failure.value.diagnosis
    assert "padded branch 5 reads KV slots [0, 23, 24] from the draft step 0's graph's rails" in failure.value.diagnosis
    assert "a padded row may read only SGLang's padding slot 0" in failure.value.diagnosis


def test_padded_draft_writes_left_stale_fail_naming_the_slots(device, monkeypatch):
    from sglang.srt.speculative.eagle_draft_cuda_graph_runner import EAGLEDraftCudaGraphRunner

    mutate(monkeypatch, EAGLEDraftCudaGraphRunner, "execute", "buffers.out_cache_loc.zero_()\n", "pass\n")
    with pytest.raises(OracleFailure) as failure:
        run_case()
    assert failure.value.oracle == "eager-equality"
    assert "draft replay 1" in failure.value.diagnosis
    assert "differs at KV slot(s)" in failure.value.diagnosis


@pytest.mark.parametrize("field, restore, padded, raw", [
    ("positions", "forward_batch.positions = buffers.positions[:raw_num_token]\n", "(6,)", "(4,)"),
    ("seq_lens", "forward_batch.seq_lens = buffers.seq_lens[:raw_bs]\n", "(3,)", "(2,)")])
def test_padded_field_not_handed_back_fails_naming_it(device, monkeypatch, field, restore, padded, raw):
    """Both survivors of `mutate --seed 4409` (lines 756 and 757 of 0.5.23's runner): the draft tree is right."""
    from sglang.srt.speculative.eagle_draft_cuda_graph_runner import EAGLEDraftCudaGraphRunner

    mutate(monkeypatch, EAGLEDraftCudaGraphRunner, "execute", restore, "pass\n")
    with pytest.raises(OracleFailure) as failure:
        run_case()
    assert failure.value.oracle == "batch-consistency"
    assert f"draft replay 1: after the runner's execute the batch's `{field}` is {padded} rows" in \
        failure.value.diagnosis
    assert f"where the raw batch handed in was {raw} rows" in failure.value.diagnosis


def test_eager_draft_rails_one_step_short_fail_naming_the_branch(device, monkeypatch):
    from sglang.srt.layers.attention.triton_backend import TritonMultiStepDraftBackend

    mutate(monkeypatch, TritonMultiStepDraftBackend, "common_template",
           "draft_kv_indices_used_len(seq_lens_sum, self.topk, bs, i + 1)",
           "draft_kv_indices_used_len(seq_lens_sum, self.topk, bs, i)")
    with pytest.raises(OracleFailure) as failure:
        run_case()
    assert failure.value.oracle == "draft-rails"
    assert "eager backend's kv_indices of branch" in failure.value.diagnosis


@pytest.mark.parametrize("case", [CASE, STANDALONE_CASE], ids=["eagle", "standalone"])
def test_padded_extend_writes_left_stale_fail_naming_the_slots(device, monkeypatch, case):
    from sglang.srt.speculative.eagle_draft_extend_cuda_graph_runner import EAGLEDraftExtendCudaGraphRunner

    mutate(monkeypatch, EAGLEDraftExtendCudaGraphRunner, "execute", "buffers.out_cache_loc.zero_()\n", "pass\n")
    with pytest.raises(OracleFailure) as failure:
        run_case(case=case)
    assert failure.value.oracle == "eager-equality"
    assert "draft replay 3" in failure.value.diagnosis
    assert "differs at KV slot(s)" in failure.value.diagnosis


def test_extend_rail_counting_the_window_fails_naming_kv_indptr(device, monkeypatch):
    from sglang.srt.layers.attention.triton_backend import TritonAttnBackend

    mutate(monkeypatch, TritonAttnBackend, "_update_draft_extend_buffers",
           "kv_lens = torch.clamp(seq_lens - extend_seq_lens, min=0)", "kv_lens = torch.clamp(seq_lens, min=0)")
    with pytest.raises(OracleFailure) as failure:
        run_case()
    assert failure.value.oracle == "draft-rails"
    assert "draft replay 2, padded to 3: draft extend's graph's kv_indptr is" in failure.value.diagnosis


def test_draft_splits_by_request_not_branch_fail_naming_the_counts(device, monkeypatch):
    from sglang.srt.layers.attention.triton_backend import TritonAttnBackend

    # tile 8: requests of 5, 14 and 2 tokens split 1, 2 and 1 times; clean SGLang passes the same draft batch
    run_case(split_tile=8, batches=BATCHES[:1])
    mutate(monkeypatch, TritonAttnBackend, "get_num_kv_splits", "seq_lens.repeat_interleave(num_group)",
           "seq_lens.repeat(num_group)")
    with pytest.raises(OracleFailure) as failure:
        run_case(split_tile=8, batches=BATCHES[:1])
    assert failure.value.oracle == "batch-invariance"
    assert "draft replay 0" in failure.value.diagnosis
    assert "[1, 2, 1, 1, 2, 1] KV splits per request where tiles of 8" in failure.value.diagnosis


# -- the NPU draft runners (under the virtual device's npu personality) --------------------------------------------
NPU_RUNNERS = "sglang.srt.hardware_backend.npu.graph_runner"


def test_clean_sglang_passes_the_npu_draft_check(npu_device):
    run_case(personality="npu")


def test_npu_draft_step_lengths_one_short_fail_naming_the_step(npu_device, monkeypatch):
    from sglang.srt.hardware_backend.npu.graph_runner.eagle_draft_npu_graph_runner import EAGLEDraftNpuGraphRunner

    mutate(monkeypatch, EAGLEDraftNpuGraphRunner, "_replay_graph", "[: self.raw_bs] + speculative_step_id + 1",
           "[: self.raw_bs] + speculative_step_id")
    with pytest.raises(OracleFailure) as failure:
        run_case(personality="npu")
    assert failure.value.oracle == "npu-graph-update"
    assert "draft replay 0, draft decode replay of 3 request(s) padded to 3" in failure.value.diagnosis
    assert "step 0 request 0: 5 where 6" in failure.value.diagnosis


def test_npu_draft_padding_lengths_from_the_mirror_fail_naming_the_counts(npu_device, monkeypatch):
    from sglang.srt.hardware_backend.npu.graph_runner.eagle_draft_npu_graph_runner import EAGLEDraftNpuGraphRunner

    mutate(monkeypatch, EAGLEDraftNpuGraphRunner, "_replay_graph", "forward_batch.seq_lens_cpu[: self.raw_bs]",
           "forward_batch.seq_lens_cpu[: self.bs]")
    with pytest.raises(OracleFailure) as failure:
        run_case(personality="npu")
    assert failure.value.oracle == "npu-graph-update"
    assert "draft replay 1, draft decode replay of 2 request(s) padded to 3" in failure.value.diagnosis


def test_npu_extend_padding_dropped_fails_naming_the_replay(npu_device, monkeypatch):
    from sglang.srt.hardware_backend.npu.graph_runner.eagle_draft_extend_npu_graph_runner import \
        EAGLEDraftExtendNpuGraphRunner

    mutate(monkeypatch, EAGLEDraftExtendNpuGraphRunner, "_replay_graph",
           "self.bs - self.raw_bs", "0")
    with pytest.raises(OracleFailure) as failure:
        run_case(personality="npu")
    assert failure.value.oracle == "npu-graph-update"
    assert "draft replay 3, draft extend replay of 2 request(s) padded to 3" in failure.value.diagnosis


def test_npu_update_worker_on_device_0_fails_naming_both_devices(npu_device, monkeypatch):
    from sglang.srt.hardware_backend.npu.graph_runner.npu_cudagraph_backend import NPUCudaGraphBackend

    mutate(monkeypatch, NPUCudaGraphBackend, "__init__", "initializer=self._device_module.set_device,",
           "initializer=None,")
    with pytest.raises(OracleFailure) as failure:
        run_case(personality="npu")
    assert failure.value.oracle == "npu-graph-update"
    assert "draft replay 0, draft decode replay of 3 request(s): the graph of size 3 was captured on NPU 1 and " \
           "updated from a thread on NPU 0" in failure.value.diagnosis


# -- rejection sampling (top-k 1): a greedy and a sampling draft graph a size ---------------------------------------
def run_rejection_sampling_case() -> None:
    from suites.real_common import REJECTION_SAMPLING_DRAFT

    case, groups, _ = REJECTION_SAMPLING_DRAFT
    run_case(case=case, batches=groups[0])


def test_clean_sglang_passes_the_rejection_sampling_draft_check(device):
    run_rejection_sampling_case()


def test_greedy_variant_never_picked_fails_naming_the_graph(device, monkeypatch):
    from sglang.srt.speculative.eagle_draft_cuda_graph_runner import EAGLEDraftCudaGraphRunner

    mutate(monkeypatch, EAGLEDraftCudaGraphRunner, "_sampling_variant", "return _GREEDY_VARIANT\n",
           "return None\n")
    with pytest.raises(OracleFailure) as failure:
        run_rejection_sampling_case()
    assert failure.value.oracle == "graph-key"
    assert "draft replay 0" in failure.value.diagnosis
    assert "must replay the graph of size 3 variant 'greedy'" in failure.value.diagnosis


def test_greedy_variant_captured_sampling_fails_naming_the_output(device, monkeypatch):
    from sglang.srt.speculative.eagle_draft_cuda_graph_runner import EAGLEDraftCudaGraphRunner

    mutate(monkeypatch, EAGLEDraftCudaGraphRunner, "capture_one_shape",
           "sampling_info.is_all_greedy = variant == _GREEDY_VARIANT", "sampling_info.is_all_greedy = False")
    with pytest.raises(OracleFailure) as failure:
        run_rejection_sampling_case()
    assert failure.value.oracle == "eager-equality"
    assert "draft replay 0" in failure.value.diagnosis
    assert "draft_probs" in failure.value.diagnosis


def test_draft_machine_finds_stale_padded_extend_writes_by_itself(device, monkeypatch):
    """The draft worker's lifetime machine (`suites/test_server_lifetime.py`), given no hand-written history: under
    padded_extend_writes_left_stale it must reach a padded draft extend after a wider one on its own (drawn sizes,
    a fixed seed) and fail `eager-equality` naming the KV slots; the same machine passes on clean SGLang (the
    nightly's run of it)."""
    from hypothesis import HealthCheck, Phase, settings
    from hypothesis.stateful import run_state_machine_as_test
    from sglang.srt.speculative.eagle_draft_extend_cuda_graph_runner import EAGLEDraftExtendCudaGraphRunner

    from suites.test_server_lifetime import DraftWorkerLifetime

    mutate(monkeypatch, EAGLEDraftExtendCudaGraphRunner, "execute", "buffers.out_cache_loc.zero_()\n", "pass\n")
    searched = settings(max_examples=6, stateful_step_count=10, derandomize=True, database=None, deadline=None,
                        phases=[Phase.generate], suppress_health_check=list(HealthCheck))
    with pytest.raises(OracleFailure) as failure:
        run_state_machine_as_test(DraftWorkerLifetime, settings=searched)
    assert failure.value.oracle == "eager-equality"
    assert "draft extend replay step" in failure.value.diagnosis
    assert "differs at KV slot(s)" in failure.value.diagnosis


def test_draft_sink_dropped_fails_naming_the_branch(device, monkeypatch):
    import sglang.srt.layers.attention.triton_backend as triton_backend

    monkeypatch.setattr(triton_backend, "resolve_draft_decode_window", edited(
        triton_backend.resolve_draft_decode_window,
        "return window_size, int(cfg.speculative_draft_sink_size or 0)", "return window_size, 0"))
    with pytest.raises(OracleFailure) as failure:
        run_rejection_sampling_case()
    assert failure.value.oracle == "draft-rails"
    assert "draft replay 0" in failure.value.diagnosis
    assert "branch 1 (request 1) reads 7 slots, not 9" in failure.value.diagnosis, failure.value.diagnosis


EAGLE3_WINDOW_CASE = dataclasses.replace(CASE, spec=dataclasses.replace(CASE.spec, algorithm="EAGLE3", draft_window=6))


def test_clean_sglang_passes_the_eagle3_window_draft_check(device):
    run_case(case=EAGLE3_WINDOW_CASE)


def test_window_rail_one_short_fails_naming_the_window_rail(device, monkeypatch):
    from sglang.srt.layers.attention.triton_backend import TritonMultiStepDraftBackend

    mutate(monkeypatch, TritonMultiStepDraftBackend, "_fill_window_rail",
           "self.sliding_window_size,\n        ENTRY_PAGE_SIZE",
           "self.sliding_window_size - 1,\n        ENTRY_PAGE_SIZE")
    with pytest.raises(OracleFailure) as failure:
        run_case(case=EAGLE3_WINDOW_CASE)
    assert failure.value.oracle == "draft-rails"
    assert "draft replay 0" in failure.value.diagnosis
    assert "window kv_indptr" in failure.value.diagnosis, failure.value.diagnosis
