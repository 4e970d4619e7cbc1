"""Worlds of ranks: the arithmetic the oracles hold SGLang to (fast, no SGLang), a layout SGLang refuses recorded in
SGLang's own words, and the finding the worlds found (strict xfail)."""
from __future__ import annotations

import dataclasses

import pytest

from harness.oracles import world_agreement
from harness.oracles.world_agreement import expected_iterations, refusal_rule
from harness.worlds.world import Admit, Decode, Finish, Idle, World, WorldCase
from suites.test_parallel_worlds import DP_IDLE_RANK, DP_PREFILL_GRAPHS, SCATTERED_ATTENTION


@pytest.mark.parametrize("world, requested, pool, expected", [
    (World(tp=2), (1, 2, 4), 8, [1, 2, 4]),
    (World(tp=2), (1, 2, 16), 8, [1, 2, 8]),  # 16 exceeds the pool of 8: the pool joins, 16 goes
    (World(tp=2, dp=2, dp_attention=True), (1, 2, 8), 8, [1, 2, 4]),  # 8 requests over 2 DP ranks: pools of 4
    (World(tp=2, moe_dense_tp=1), (1, 2, 6), 3, [2, 4]),  # aligned to 2: the pool of 3 aligned up to 4 joins
    (World(tp=4, dp=2, dp_attention=True), (1, 2, 3, 4), 8, [2, 4]),  # attention-TP width 2, pools of 4
    (World(tp=2, moe_dense_tp=1), (1,), 4, []),  # nothing survives the alignment: SGLang must refuse
])
def test_capture_list_arithmetic(world, requested, pool, expected):
    assert world.capture_list(requested, pool) == expected


def test_rank_layout_arithmetic():
    world = World(tp=4, dp=2, dp_attention=True)
    assert (world.dp_ranks, world.attn_tp, [world.dp_rank_of(r) for r in range(4)]) == (2, 2, [0, 0, 1, 1])
    assert World(tp=2).dp_ranks == 1 and World(tp=2).attn_tp == 2
    assert World(tp=2, dp=4, dp_attention=True).layout_error()
    assert World(tp=2, dp=2).layout_error()  # DP replicas without DP attention: several servers
    assert World(tp=4, dp=2, dp_attention=True).layout_error() is None
    pipeline = World(tp=2, pp=2)  # world rank = TP size x stage + TP rank (SGLang's spawn_world_rank)
    assert pipeline.ranks == 4 and [(pipeline.pp_rank_of(r), pipeline.tp_rank_of(r)) for r in range(4)] == [
        (0, 0), (0, 1), (1, 0), (1, 1)]
    assert pipeline.server_flags()["pp_size"] == 2 and pipeline.label() == "tp2 pp2"


def test_iteration_arithmetic_of_the_dp_world():
    """DP_IDLE_RANK: loads [5, 4] (prefill, vote off), [2, 1] (bucket 2), [2, 0] (the idle rank replays too), [1, 2]
    (rank 1 prefills: vote off), then [1, 2] decoding (bucket 2)."""
    got = [(e.counts, e.vote, e.graph, e.bucket) for e in expected_iterations(DP_IDLE_RANK, [1, 2, 4])]
    assert got == [([5, 4], False, False, None), ([2, 1], True, True, 2), ([2, 0], True, True, 2),
                   ([1, 2], False, False, None), ([1, 2], True, True, 2)]


def test_a_batch_past_the_largest_capture_runs_eager_on_every_dp_rank():
    case = WorldCase(World(tp=2, dp=2, dp_attention=True), "qwen3", (1, 2), 8,
                     ((Admit(((5,), (6,), (7,))), Idle()), (Decode(), Decode()), (Finish((0,)), Decode())))
    got = [(e.counts, e.graph, e.bucket) for e in expected_iterations(case, [1, 2])]
    assert got == [([3, 0], False, None), ([3, 0], False, None), ([2, 0], True, 2)]


def test_refusal_rules_name_the_layout_and_the_empty_capture_list():
    bad = dataclasses.replace(DP_IDLE_RANK, world=World(tp=2, dp=4, dp_attention=True))
    assert refusal_rule(bad)[0] == "parallel-layout"
    empty = dataclasses.replace(SCATTERED_ATTENTION, capture_bs=(1,), max_running_requests=4)
    assert refusal_rule(empty)[0] == "capture-list-empty"
    assert refusal_rule(DP_IDLE_RANK) is None


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


@pytest.mark.slow
@pytest.mark.subprocess
def test_a_layout_sglang_refuses_is_recorded_in_its_own_words(reference):
    """--dp 4 over --tp 2 with DP attention: SGLang's runtime context refuses the topology on every rank; the example
    is an expected error under the rule that predicted it, with SGLang's words, and no rank is left running."""
    from harness import record
    from suites.test_parallel_worlds import run_case

    case = WorldCase(World(tp=2, dp=4, dp_attention=True), "qwen3", (1, 2), 4, ((Admit(((5, 6),)),), (Decode(),)))
    written = []
    with pytest.MonkeyPatch.context() as patches:
        patches.setattr(record, "write", written.append)
        outcome = run_case(case, reference)
    assert outcome.leftover() == []
    assert written[-1]["verdict"] == "expected-error" and written[-1]["expected_rule"] == "parallel-layout"
    assert "parallel topology is inconsistent" in written[-1]["diagnosis"], written[-1]["diagnosis"]


@pytest.mark.slow
@pytest.mark.subprocess
@pytest.mark.xfail(strict=True, raises=AssertionError, reason="finding (SGLang 0.5.23): with attention's input "
                   "scattered over a TP group of 2, the decode runner appends the request pool aligned up (3 -> 4) "
                   "to its capture list, past the Triton backend's kv_indptr, sized by the pool: startup fails")
def test_findings_capture_past_the_request_pool(reference):
    from harness.oracles import OracleFailure
    from suites.test_parallel_worlds import run_case

    case = dataclasses.replace(SCATTERED_ATTENTION, max_running_requests=3)
    with pytest.MonkeyPatch.context() as patches:
        patches.setattr(world_agreement, "HOLD_CAPTURE_PAST_POOL", False)
        try:
            run_case(case, reference)
        except OracleFailure as failure:
            assert "Capture cuda graph failed" not in failure.diagnosis, failure.diagnosis


def test_prefill_graph_arithmetic_of_the_dp_world():
    """DP_PREFILL_GRAPHS, iteration by iteration: prefills of 5 and 4 tokens both fit [4, 8] (buckets 8 and 4, at
    most twice) and replay at the group's bucket 8; a 2-request decode beside a 3-token prefill converts and both
    replay at 4; no prefill: no prefill graph; a 9-token prompt past 8 votes everyone eager."""
    rows = expected_iterations(DP_PREFILL_GRAPHS, [1, 2, 4])
    assert [(w.prefill_vote, w.prefill_graph, w.converted, w.prefill_bucket) for w in rows] == [
        (True, [True, True], [False, False], [8, 8]),
        (True, [True, True], [True, False], [4, 4]),
        (True, [False, False], [False, False], [None, None]),
        (False, [False, False], [False, False], [None, None]),
    ]
    assert world_agreement.prefill_capture_list(dataclasses.replace(
        SCATTERED_ATTENTION, prefill_tokens=(3, 9, 10))) == [4, 10]  # aligned to the attention-TP width 2


def test_prefill_graph_arithmetic_with_an_idle_rank():
    """A prefill beside an idle DP rank: the idle rank votes yes, joins with a dummy extend at the group's bucket,
    and nothing converts."""
    case = dataclasses.replace(DP_PREFILL_GRAPHS, program=((Admit(((5, 6, 7, 8, 9),)), Idle()),))
    (row,) = expected_iterations(case, [1, 2, 4])
    assert (row.prefill_vote, row.prefill_graph, row.converted, row.prefill_bucket) == \
        (True, [True, True], [False, False], [8, 8])


@pytest.mark.slow
@pytest.mark.subprocess
@pytest.mark.xfail(strict=True, raises=AssertionError, reason="finding (SGLang 0.5.23): with attention scattered over "
                   "a TP group of 2 and prefill graph sizes off the alignment (--cuda-graph-bs-prefill 3 9), the "
                   "runner captures [4, 10] but the DP padding picks its bucket from the raw list (7 tokens, aligned "
                   "to 8 -> 9): the replay's reduce-scatter gets 9 rows for a graph of 10 and gloo aborts")
def test_findings_prefill_bucket_off_the_alignment(reference):
    from harness.oracles import OracleFailure
    from strategies.worlds import DENSE_TP_FAMILY
    from suites.test_parallel_worlds import run_case

    case = WorldCase(World(tp=2, moe_dense_tp=1), DENSE_TP_FAMILY, (2, 4), 4,
                     ((Admit(((5, 6, 7, 8, 9, 10, 11),)),), (Decode(),)), prefill_tokens=(3, 9))
    try:
        run_case(case, reference)
    except OracleFailure as failure:
        assert "(10 vs. 9)" not in failure.diagnosis, failure.diagnosis

