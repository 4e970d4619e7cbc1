"""SGLang's decode path served by a world of ranks: one process per rank, SGLang's own parallel state on gloo,
a model loaded shard by shard from a transformers checkpoint, the decode runner's graphs captured on every rank,
and a drawn program of scheduler iterations, each attention-DP rank with its own load (`harness/targets/worlds`).

Worlds: tensor parallel, attention DP, scattered attention with expert parallelism, and a two-stage pipeline whose
stages hand hidden states over SGLang's PP group (`Stages` in `harness/targets/worlds/serving.py`).

Checked (`harness/oracles/world_agreement.py`): each rank's placement, capture list, DP gather, vote, graph-or-eager
decision and bucket against the world's arithmetic, the same on every rank; each replay against the same batch
run eager (in the rank); every request's next-token logits against transformers' for its tokens. A rank that
crashes or hangs fails the example with its rank and the world; a configuration SGLang refuses is held to the rule
that predicts it. Two-rank worlds in the gate; four-rank worlds (attention-TP width 2 under DP attention) in the
nightly."""
from __future__ import annotations

import pytest
from hypothesis import given

from harness.errors import PathMissing
from harness.oracles.world_agreement import check_world, construction_refusal, refusal_rule
from harness.profiles import suite_settings
from harness.record import example
from harness.worlds.world import Admit, Decode, Finish, Idle, World, WorldCase
from strategies.worlds import DENSE_TP_FAMILY, PIPELINE_FAMILY, WORLD_FAMILY, world_cases

# rank 0 admits two prompts, rank 1 one; then both decode (DP loads 2 and 1: bucket 2 on both), rank 1 idles while
# rank 0 decodes (the idle rank replays with the group), rank 0 finishes a request and rank 1 admits (a prefill:
# the vote keeps everyone eager), then both decode; 8 running requests over 2 DP ranks: pools of 4
DP_IDLE_RANK = WorldCase(World(tp=2, dp=2, dp_attention=True), WORLD_FAMILY, (1, 2, 4), 8, (
    (Admit(((5, 6, 7), (8, 9))), Admit(((10, 11, 12, 13),))),
    (Decode(), Decode()),
    (Decode(), Idle()),
    (Finish((0,)), Admit(((20, 21),))),
    (Decode(), Decode()),
))
# plain tensor parallel: both ranks serve one batch, which outgrows the largest captured size (3 > 2: eager)
TP_PAST_CAPTURE = WorldCase(World(tp=2), WORLD_FAMILY, (1, 2), 4, (
    (Admit(((5, 6), (7,), (8, 9, 10))),),
    (Decode(),),
    (Finish((1,)),),
))
# attention's input scattered over the TP group (--moe-dense-tp-size 1): captured sizes aligned to 2, the pool of 4
# appended (6 exceeds it), 1 and 6 dropped; with experts over both ranks (--ep-size 2) the replay publishes its pad
# mask: one request padded to 2 leaves rank 0 one real token of its chunk of 1, rank 1 none
SCATTERED_ATTENTION = WorldCase(World(tp=2, moe_dense_tp=1, ep=2), DENSE_TP_FAMILY, (1, 2, 6), 4, (
    (Admit(((5, 6, 7),)),),
    (Decode(),),
    (Admit(((8, 9),)),),
    (Decode(),),
))

# prefill graphs (breakable, 4 and 8 tokens) in the DP world: both ranks prefill (5 and 4 tokens: buckets 8 and 4,
# each at most twice its tokens) and replay together; rank 0's two-request decode joins rank 1's 3-token prefill as
# one-token extends (SGLang's decode-to-extend conversion: 2 tokens, bucket 4) and both replay the prefill graph;
# both decode (decode graphs); rank 0's 9-token prompt exceeds 8, so the group votes no and every rank runs eager
DP_PREFILL_GRAPHS = WorldCase(World(tp=2, dp=2, dp_attention=True), WORLD_FAMILY, (1, 2, 4), 8, (
    (Admit(((5, 6, 7), (8, 9))), Admit(((10, 11, 12, 13),))),
    (Decode(), Admit(((14, 15, 16),))),
    (Decode(), Decode()),
    (Admit(((20,) * 9,)), Decode()),
), prefill_tokens=(4, 8))

# a two-stage pipeline (--pp-size 2, a layer per stage): each stage captures decode sizes 1 and 2 and prefill
# graphs of 4 and 8 tokens; stage 0 hands its hidden states and residual to stage 1 at every forward. Both stages
# replay the 5-token prefill (bucket 8) and the two-request decode (bucket 2); the 1-token prompt would pad past
# twice its tokens (eager); three requests exceed the decode capture (eager); after a finish two replay again
PIPELINE = WorldCase(World(tp=1, pp=2), PIPELINE_FAMILY, (1, 2), 4, (
    (Admit(((5, 6, 7), (9, 10))),),
    (Decode(),),
    (Admit(((11,),)),),
    (Decode(),),
    (Finish((1,)),),
), prefill_tokens=(4, 8))


@pytest.fixture(scope="module")
def layout(device_name, personality):
    if device_name != "cpu" or personality != "cuda":
        pytest.skip(f"worlds run on the cpu virtual device under the cuda personality, not {device_name}/"
                    f"{personality}: each rank is a process of its own with gloo collectives")
    from harness.targets import worlds

    try:
        return worlds.load()
    except PathMissing as missing:
        pytest.skip(str(missing))


@pytest.fixture(scope="module")
def reference():
    """For a family: the checkpoint the ranks load, and transformers' next-token logits for a token history (one
    checkpoint per family and process)."""
    from harness.models.real import transformers_reference

    def of(family: str):
        folder, _ = transformers_reference.checkpoint(family)
        return folder, lambda history: transformers_reference.logits(family, history)

    return of


@pytest.fixture(scope="module")
def coverage(pytestconfig):
    """The run's coverage measurement, which each rank joins (None without --sglang-coverage)."""
    from harness.pytest_plugin import RUN

    run = pytestconfig.stash.get(RUN, None)
    return None if run is None else run.coverage


def run_case(case: WorldCase, reference, coverage=None, **launch):
    """Serve `case` and judge it; `launch`: `run_world`'s options (a mutant's `sglang_root`, a timeout). Returns the
    outcome."""
    import os

    from harness.targets.worlds.launcher import run_world

    folder, logits = reference(case.family)
    item = os.environ.get("PYTEST_CURRENT_TEST", "").rsplit(" ", 1)[0]
    with example("parallel_worlds", **case.drawn()) as ex:
        outcome = run_world(case, folder, coverage=coverage and coverage.child(item), **launch)
        ex.note("seconds", round(outcome.seconds, 1))
        ex.note("decisions", {rank: [(row.forward_mode, row.graph, row.bucket) for row in record.iterations]
                              for rank, record in outcome.records.items()})
        refused = construction_refusal(outcome)
        ex.audit_refusal(refusal_rule(case), refused=refused, oracle="world-rank",
                         what=f"world {case.world.label()} with --cuda-graph-bs {list(case.capture_bs)} and "
                              f"--max-running-requests {case.max_running_requests}")
        if refused is None:
            check_world(case, outcome, logits)
    return outcome


# the hand-written worlds, a test item each: xdist spreads them over the workers (one item of six worlds, ~50 s,
# was the gate's longest tail)
EXPLICIT_WORLDS = {"dp-idle-rank": DP_IDLE_RANK, "tp-past-capture": TP_PAST_CAPTURE,
                   "scattered-attention": SCATTERED_ATTENTION, "dp-prefill-graphs": DP_PREFILL_GRAPHS,
                   "pipeline": PIPELINE}


@pytest.mark.parametrize("case", EXPLICIT_WORLDS.values(), ids=EXPLICIT_WORLDS.keys())
def test_explicit_two_rank_world_matches_its_arithmetic_and_transformers(case, layout, reference, coverage):
    run_case(case, reference, coverage)


@given(case=world_cases(2))
@suite_settings(1, shrink_in_gate=False)
def test_two_rank_world_matches_its_arithmetic_and_transformers(case, layout, reference, coverage):
    run_case(case, reference, coverage)


def replay_case(drawn: dict) -> None:
    """One recorded example without Hypothesis or pytest (repro scripts, pinned regressions)."""
    from harness.models.real import transformers_reference

    def reference(family: str):
        folder, _ = transformers_reference.checkpoint(family)
        return folder, lambda history: transformers_reference.logits(family, history)

    run_case(WorldCase.from_drawn(drawn), reference)


@pytest.fixture(scope="module")
def beyond_the_gate():
    """Four-rank worlds run in the nightly and repro profiles: four processes on the gate's two cores cost more than
    the gate's budget."""
    from hypothesis import settings

    if settings.get_current_profile_name() == "gate":
        pytest.skip("four-rank worlds run in the nightly profile (--profile nightly)")


@given(case=world_cases(4))
@suite_settings(1, shrink_in_gate=False)
def test_four_rank_world_matches_its_arithmetic_and_transformers(case, beyond_the_gate, layout, reference, coverage):
    run_case(case, reference, coverage)
