"""Mutants of SGLang's multi-rank decode path, each run as a world of two ranks on a scratch copy of SGLang (the
ranks import it first: `run_world(sglang_root=...)`). Each must fail naming the rank, the iteration and the relation
broken; clean SGLang passes the same worlds.

- dp_bucket_per_rank: `DecodeCudaGraphRunner._max_dp_batch_size` answers the rank's own batch size instead of the
  DP group's largest request count: DP ranks of loads 2 and 1 pad to buckets 2 and 1, whose gathers differ
  (`world-agreement`, before the forward: rank 0 graph bucket 2, rank 1 graph bucket 1).
- extending_rank_votes_for_the_graph: `_local_decode_cuda_graph_vote` lets a rank that prefills vote for the decode
  graph: the group's vote holds while one rank extends, so its peer replays while it runs eager (`world-agreement`).
- idle_rank_votes_against_the_graph: an idle rank (no batch) votes against it, so a group with one idle rank never
  replays (`world-agreement`: the vote, against the arithmetic "every rank decodes or idles").
- gather_keeps_local_counts: `_update_gather_batch` keeps each rank's own count where the MLP gathers every DP
  rank's: the ranks disagree on their bucket (`world-agreement`).
- scatter_from_rank_zero: `get_dp_local_info` takes every DP rank's rows from the start of the gathered buffer: rank
  1 gets rank 0's hidden states, in eager and graph alike (`transformers-reference`, naming rank 1's request).
- capture_sizes_not_aligned: `get_batch_sizes_to_capture` keeps sizes off the attention-TP alignment: a scattered
  attention world captures a size its ranks cannot split (`world-agreement` on the capture list).
- pad_mask_by_real_count: the buffer registry splits the real token count over the attention-TP ranks by the real
  count instead of the padded bucket (`num_tokens_per_dp`): one request padded to 2 gives rank 0 a chunk of
  1 // 2 = 0, so its replay publishes 0 real tokens where it holds 1 (`world-agreement`, naming rank 0 and the
  chunk arithmetic); replay and eager share the registry's count, so only the pad-mask oracle sees it.
- embedding_mask_compiled_static: the vocabulary-parallel embedding's compiled helper `get_masked_input_and_mask`
  (`torch.compile(dynamic=True)`, inside SGLang's layer at TP > 1) loses `dynamic=True`: the second prefill, of
  another length than the first, recompiles it at serve time (`no-recompile`, naming the rank, the iteration and
  Dynamo's failing guard).
- prefill_vote_kept_local: `MLPSyncBatchInfo.all_gather` no longer min-reduces the ranks' prefill-graph votes
  (`can_run_prefill_cuda_graph` stays each rank's own): with rank 0's 9-token prompt past the largest captured 8,
  rank 1 still converts its decode and replays the prefill graph while rank 0 runs eager (`world-agreement`,
  iteration 3, before the forward).
- decode_not_converted: `maybe_convert_decode_to_extend` no longer converts: rank 0's decode stays a decode the
  group voted off the decode graph (a peer prefills) while rank 1 replays the prefill graph (`world-agreement`,
  iteration 1).
- pipeline_proxy_not_copied: the buffer registry's pipeline slots no longer take the previous stage's hidden
  states into the graph's inputs (`_pp_source` answers None): stage 1 replays the capture's stale rows, so its
  replay differs from the same batch eager (`world-agreement`, naming rank 1 and pipeline stage 1).
- eager_drops_the_pipeline_input: `ModelRunner._pp_kwargs` hands no hidden states to an eager forward: stage 1's
  first eager forward (the replayed prefill's eager twin) has nothing to start from and the rank stops with
  SGLang's own error (`world-rank`, rank 1, iteration 0).
- prefill_graph_drops_the_pipeline_input: the prefill runner's layer-model kwargs leave out the previous stage's
  hidden states: stage 1 cannot capture its prefill graphs (`world-rank`, rank 1, before any iteration).
- rank_one_fails_its_capture: rank 1 raises in its capture; rank 0 waits in a collective it never joins. The world
  is recorded with rank 1's error first and rank 0 killed as hung: nothing is left running (`world-rank`).
- rank_one_skips_the_dp_sync: rank 1 skips the DP group's gather; rank 0 waits for it forever. Both are killed at
  the world's time limit, with their stacks (`world-rank`).
"""
from __future__ import annotations

import dataclasses

import pytest

from harness.mutants import scratch_sglang
from harness.oracles import OracleFailure
from harness.worlds.world import Admit, Decode, World, WorldCase
from strategies.worlds import PIPELINE_FAMILY, WORLD_FAMILY
from suites.test_parallel_worlds import DP_IDLE_RANK, DP_PREFILL_GRAPHS, PIPELINE, SCATTERED_ATTENTION, run_case

pytestmark = [pytest.mark.slow, pytest.mark.subprocess]  # each world: two rank processes

RUNNER = "srt/model_executor/runner/decode_cuda_graph_runner.py"
DP_ATTN = "srt/managers/scheduler_components/dp_attn.py"
DP_ATTENTION = "srt/layers/dp_attention.py"
BASE_RUNNER = "srt/model_executor/runner/base_cuda_graph_runner.py"
REGISTRY = "srt/model_executor/cuda_graph_buffer_registry.py"
EMBEDDING = "srt/layers/vocab_parallel_embedding.py"
MODEL_RUNNER = "srt/model_executor/model_runner.py"
PREFILL_RUNNER = "srt/model_executor/runner/prefill_cuda_graph_runner.py"
# the DP world up to its idle iteration (iteration 3, a prefill beside a decode, stays in for the vote mutant)
DP_SHORT = dataclasses.replace(DP_IDLE_RANK, program=DP_IDLE_RANK.program[:4])
# two eager prefills of lengths no capture compiled (3 tokens, then 4) in a TP-2 world: the vocabulary-parallel
# embedding's compiled helper runs on each
TP_TWO_PREFILLS = WorldCase(World(tp=2), WORLD_FAMILY, (1, 2), 4, (
    (Admit(((5, 6), (7,))),), (Decode(),), (Admit(((8, 9, 10, 11),)),), (Decode(),)))


@pytest.fixture(scope="module")
def reference():
    from harness.models.real import transformers_reference
    from harness.targets import worlds

    try:
        worlds.load()
    except Exception as missing:  # noqa: BLE001 - PathMissing, or an SGLang that cannot import here
        pytest.skip(str(missing))
    return lambda family: (transformers_reference.checkpoint(family)[0],
                           lambda history: transformers_reference.logits(family, history))


def judged(case, reference, edits=(), timeout: float = 240):
    """Serve and judge `case` as the suite does (on a scratch SGLang with `edits`): (the OracleFailure or None, the
    outcome). Every rank process has been reaped when it returns."""
    from harness.targets.worlds import launcher

    root = str(scratch_sglang(list(edits))) if edits else None
    run, outcomes = launcher.run_world, []

    def run_world(*args, **kwargs):
        outcomes.append(run(*args, **{**kwargs, "sglang_root": root, "timeout": timeout, "grace": 5}))
        return outcomes[-1]

    with pytest.MonkeyPatch.context() as patches:
        patches.setattr(launcher, "run_world", run_world)
        try:
            run_case(case, reference)
        except OracleFailure as failure:
            return failure, outcomes[-1]
    return None, outcomes[-1]


def test_clean_sglang_passes_the_dp_world(reference):
    failure, outcome = judged(DP_SHORT, reference)
    assert failure is None, failure
    assert outcome.complete


def test_dp_bucket_per_rank_fails_naming_each_ranks_bucket(reference):
    failure, _ = judged(DP_SHORT, reference, [(RUNNER, "        return max(request_counts)",
                                               "        return forward_batch.batch_size")])
    assert failure is not None and failure.oracle == "world-agreement", failure
    assert "iteration 1" in failure.diagnosis and "rank 0: decode graph, bucket 2" in failure.diagnosis \
        and "rank 1: decode graph, bucket 1" in failure.diagnosis, failure.diagnosis


@pytest.mark.extended  # world-agreement on this world's vote: the idle rank's mutant, in every selftest
def test_extending_rank_voting_for_the_graph_fails_naming_graph_and_eager(reference):
    failure, _ = judged(DP_SHORT, reference, [(DP_ATTN, "        or local_batch.forward_mode.is_decode_or_idle()\n",
                                               "        or local_batch.forward_mode.is_decode_or_idle()\n"
                                               "        or local_batch.forward_mode.is_extend()\n")])
    assert failure is not None and failure.oracle == "world-agreement", failure
    assert "iteration 3" in failure.diagnosis and "eager" in failure.diagnosis, failure.diagnosis


def test_idle_rank_voting_against_the_graph_fails_naming_the_vote(reference):
    failure, _ = judged(DP_SHORT, reference, [(DP_ATTN, "        local_batch is None\n"
                                               "        or local_batch.forward_mode.is_decode_or_idle()\n"
                                               "        or local_batch.forward_mode.is_prebuilt()\n",
                                               "        local_batch is not None\n"
                                               "        and (local_batch.forward_mode.is_decode_or_idle()\n"
                                               "        or local_batch.forward_mode.is_prebuilt())\n")])
    assert failure is not None and failure.oracle == "world-agreement", failure
    assert "iteration 2" in failure.diagnosis and "voted False" in failure.diagnosis, failure.diagnosis


def test_gather_keeping_local_counts_fails_naming_the_rank(reference):
    failure, _ = judged(DP_SHORT, reference, [(DP_ATTN, "    if not require_mlp_tp_gather:", "    if True:")])
    assert failure is not None and failure.oracle in ("world-agreement", "world-rank"), failure
    assert "in iteration 0" in failure.diagnosis and "collective mismatch" in failure.diagnosis, failure.diagnosis


def test_scatter_from_rank_zero_fails_against_transformers(reference):
    failure, _ = judged(DP_SHORT, reference, [(DP_ATTENTION, "            local_start_pos = cumtokens[dp_rank - 1]",
                                               "            local_start_pos = torch.zeros_like(cumtokens[0])")])
    assert failure is not None and failure.oracle == "transformers-reference", failure
    assert "of world tp2 dp2-attention, iteration" in failure.diagnosis, failure.diagnosis


def test_capture_sizes_not_aligned_fail_at_capture(reference):
    failure, _ = judged(SCATTERED_ATTENTION, reference, [(
        BASE_RUNNER, "    capture_bs = [bs for bs in capture_bs if bs * alignment_width % mul_base == 0]",
        "    capture_bs = list(capture_bs)")])
    assert failure is not None and failure.oracle in ("world-agreement", "world-rank"), failure
    assert "captured [1, 2, 4]" in failure.diagnosis or "SGLang refused a case the rules call valid" in \
        failure.diagnosis, failure.diagnosis


def test_clean_sglang_passes_the_scattered_expert_parallel_world(reference):
    failure, outcome = judged(SCATTERED_ATTENTION, reference)
    assert failure is None, failure
    assert [row.non_padded for row in outcome.records[1].iterations if row.graph] == [0, 1]


def test_pad_mask_split_by_the_real_count_fails_naming_rank_and_chunk(reference):
    failure, _ = judged(SCATTERED_ATTENTION, reference, [(
        REGISTRY, "=fb.global_num_token_non_padded,\n                    num_tokens_per_dp=ctx.padded_num_tokens,",
        "=fb.global_num_token_non_padded,\n"
        "                    num_tokens_per_dp=int(fb.global_num_token_non_padded),")])
    assert failure is not None and failure.oracle == "world-agreement", failure
    assert "iteration 1 on rank 0" in failure.diagnosis and "num_token_non_padded 0 for 1 real token(s) padded " \
        "to 2, where the rank holds 1" in failure.diagnosis and "chunk 2 // 2 = 1" in failure.diagnosis, \
        failure.diagnosis


def test_clean_sglang_compiles_nothing_after_the_first_prefill_of_a_tp_world(reference):
    failure, outcome = judged(TP_TWO_PREFILLS, reference)
    assert failure is None, failure
    assert [row.graph for row in outcome.records[0].iterations] == [False, True, False, False]  # 3 past capture


def test_embedding_mask_compiled_static_recompiles_at_serve_time(reference):
    failure, _ = judged(TP_TWO_PREFILLS, reference, [(
        EMBEDDING, "@torch.compile(dynamic=True, backend=get_compiler_backend()",
        "@torch.compile(dynamic=False, backend=get_compiler_backend()")])
    assert failure is not None and failure.oracle == "no-recompile", failure
    assert "rank 0's model" in failure.diagnosis and "iteration 2" in failure.diagnosis \
        and "size mismatch" in str(failure.details.get("failing_guard")), (failure.diagnosis, failure.details)


def test_clean_sglang_passes_the_dp_world_with_prefill_graphs(reference):
    failure, outcome = judged(DP_PREFILL_GRAPHS, reference)
    assert failure is None, failure
    rank0 = outcome.records[0].iterations
    assert [(row.prefill_graph, row.converted) for row in rank0] == [(True, False), (True, True), (False, False),
                                                                    (False, False)]


def test_prefill_vote_kept_local_fails_naming_graph_and_eager(reference):
    failure, _ = judged(DP_PREFILL_GRAPHS, reference, [(
        DP_ATTN, "        self.can_run_prefill_cuda_graph = bool(tp0_info_cpu[:, 6].min())\n", "")])
    assert failure is not None and failure.oracle == "world-agreement", failure
    assert "iteration 3" in failure.diagnosis and "rank 0: prefill eager, rank 1: prefill graph" in \
        failure.diagnosis, failure.diagnosis


@pytest.mark.extended  # world-agreement on this world's graph-or-eager split: the prefill vote's mutant
def test_decode_not_converted_fails_naming_the_ranks(reference):
    failure, _ = judged(DP_PREFILL_GRAPHS, reference, [(
        DP_ATTN, "        batch.convert_decode_to_extend()\n", "")])
    assert failure is not None and failure.oracle == "world-agreement", failure
    assert "iteration 1" in failure.diagnosis and "rank 0: decode eager" in failure.diagnosis \
        and "rank 1: prefill graph" in failure.diagnosis, failure.diagnosis


def test_rank_failing_its_capture_is_named_first_and_its_peer_reaped(reference):
    failure, outcome = judged(DP_SHORT, reference, [(
        RUNNER, "    def capture(self) -> None:\n        with self.model_context():",
        "    def capture(self) -> None:\n        if get_parallel().tp_rank == 1:\n"
        "            raise RuntimeError('rank 1 fails its capture')\n        with self.model_context():")])
    assert failure is not None and failure.oracle == "world-rank", failure
    text = failure.diagnosis
    # the cause first: rank 1's own error, whether rank 0 then failed on the dead connection ("rank 1: ...;
    # rank 0: ...") or, on a loaded machine, was still in the capture's collective, hung and was killed ("rank 1 of
    # world ...: ... (rank 0 hung and was killed)")
    assert "rank 1 fails its capture" in text and text.index("rank 1") < text.index("rank 0"), text
    assert outcome.leftover() == [], outcome


def test_rank_stuck_before_the_dp_sync_hangs_and_both_are_killed_with_their_stacks(reference):
    failure, outcome = judged(DP_SHORT, reference, [(
        DP_ATTN, "        mlp_sync_info.all_gather(",
        "        __import__('time').sleep(3600) if get_parallel().attn_dp_rank == 1 else None\n"
        "        mlp_sync_info.all_gather(")], timeout=45)
    assert failure is not None and failure.oracle == "world-rank", failure
    assert outcome is not None and sorted(outcome.hung) == [0, 1], outcome
    assert "hung" in failure.diagnosis and "time.sleep" not in failure.diagnosis
    assert "dp_attn.py" in outcome.hung[1], outcome.hung[1][-2000:]
    assert outcome.leftover() == [], outcome


def test_clean_sglang_passes_the_pipeline_world(reference):
    failure, outcome = judged(PIPELINE, reference)
    assert failure is None, failure
    for stage in (0, 1):  # both stages replay the same iterations: prefill, decode, -, -, decode after a finish
        assert [row.graph for row in outcome.records[stage].iterations] == [True, True, False, False, True]
    assert outcome.records[1].iterations[1].requests and not outcome.records[0].iterations[1].requests


# the nightly's first pipeline example (seed 3727820271): one request decoded on the only captured size, 2, so
# stage 0 replays and hands on its bucket's two rows (the decode runner slices `PPProxyTensors` to the padded size)
PADDED_PIPELINE = WorldCase(World(tp=1, pp=2), PIPELINE_FAMILY, (2,), 2, (
    (Admit(((3,),)),), (Decode(),), (Decode(),)))


def test_clean_sglang_passes_a_padded_pipeline_decode(reference):
    """Stage 1 replays on the padded rows stage 0 hands on; its eager twin takes the batch's own row only. Before
    `Stages.real_rows` the twin ran on both rows and SGLang's KV write refused it: a false alarm of the harness."""
    failure, outcome = judged(PADDED_PIPELINE, reference)
    assert failure is None, failure
    for stage in (0, 1):  # the prefill eager (no prefill graphs), both decodes replay bucket 2 with one request
        assert [(row.graph, row.bucket) for row in outcome.records[stage].iterations][1:] == [(True, 2)] * 2


def test_pipeline_proxy_not_copied_fails_naming_the_stage(reference):
    failure, _ = judged(PIPELINE, reference, [(REGISTRY, "return None if ppx is None else ppx.tensors.get(key)",
                                               "return None")])
    assert failure is not None and failure.oracle == "eager-equality", failure
    assert "iteration 0 on rank 1" in failure.diagnosis and "pipeline stage 1: output['next_token_logits']" in \
        failure.diagnosis, failure.diagnosis


def test_eager_dropping_the_pipeline_input_fails_naming_the_rank(reference):
    failure, _ = judged(PIPELINE, reference, [(
        MODEL_RUNNER, 'return {"pp_proxy_tensors": pp_proxy_tensors} if self.support_pp else {}', "return {}")])
    assert failure is not None and failure.oracle == "world-rank", failure
    assert "rank 1 of world tp1 pp2" in failure.diagnosis and "iteration 0" in failure.diagnosis, failure.diagnosis


@pytest.mark.extended  # world-rank naming stage 1 of this world: the eager pipeline input's mutant
def test_prefill_graph_dropping_the_pipeline_input_fails_at_capture(reference):
    failure, _ = judged(PIPELINE, reference, [(
        PREFILL_RUNNER, '        kwargs["pp_proxy_tensors"] = pp_proxy_tensors\n', "        pass\n")])
    assert failure is not None and failure.oracle == "world-rank", failure
    assert "rank 1 of world tp1 pp2" in failure.diagnosis, failure.diagnosis
