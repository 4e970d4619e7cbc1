"""The decode runner's switches a user sets beside the capture config, on the run's personality: capture
profiling (`--enable-profile-cuda-graph`, one trace per captured shape with `SGLANG_GRAPH_BATCH_CAPTURE`), the
metadata glue graph (`SGLANG_ENABLE_METADATA_GLUE_GRAPH`, with or without `SGLANG_OPT_SKIP_GLUED_REPLAY_VIEW`) and
the replay log (`SGLANG_LOG_DECODE_GRAPH_KEY`), a DSPARK target verify runner's own metadata glue
(`SGLANG_OPT_DSV41_TARGET_VERIFY_METADATA_GLUE`) and pre-planned input skip
(`SGLANG_OPT_DSV41_DSPARK_SKIP_PREFILLED_INPUTS`), a draft worker's metadata glue; every replay still equals
eager."""
from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, strategies as st

from harness.counter import counter
from harness.devices import cpu
from harness.oracles.capture_profile import check_capture_profile
from harness.oracles.graph_replay import check_dropped
from harness.oracles.metadata_glue import GlueGraphs, check_glue_declined, check_glue_served, \
    expected_candidate_variant, watch_early_verify
from harness.oracles.prefilled_inputs import check_prefilled_skips
from harness.oracles.process_state import check_at_rest
from harness.profiles import suite_settings
from harness.record import example
from harness.targets.decode.base import DecodeBatch, DecodeCase, SpecSettings
from harness.targets.decode.planned import KINDS
from harness.targets.decode.switches import RunnerSwitches, elastic_drop
from strategies.capture import decode_cases, replay_batches
from strategies.ragged import draft_batches, draft_cases
from strategies.switches import (
    dp_batches, dp_gather_cases, dspark_cases, glue_batches, glue_cases, pdmux_cases, prefilled_batches,
    profile_cases,
)
from suites.decode_common import capture_and_check, run_switched, skip_without_draft, skip_without_speculative


@suite_settings(gate_examples=3, shrink_in_gate=False)
@given(case=profile_cases(), data=st.data())
def test_profiled_capture_writes_one_trace_per_shape(case, data, device, personality, layout):
    with example("decode_switches", personality=personality, **case.drawn()) as ex:
        run_switched(case, lambda sizes: data.draw(replay_batches(case, sizes), label="replay batches"), device,
                     personality, layout, ex, lambda target, _, folder: check_capture_profile(target, folder))


@suite_settings(gate_examples=4, shrink_in_gate=False)
@given(case=glue_cases(), data=st.data())
def test_metadata_glue_replays_match_eager(case, data, device, personality, layout):
    """Replays of each captured size, past the glue graph's warm-ups into glued metadata prep, and a padded one
    the runner must prep eagerly (not routed to the glue)."""
    with example("decode_switches", personality=personality, **case.drawn()) as ex:
        graphs = GlueGraphs()
        run_switched(case, lambda sizes: data.draw(glue_batches(case, graphs.routing(sizes)), label="batches"), device,
                     personality, layout, ex, lambda target, batches, _: check_glue_served(target, batches),
                     serve_graphs=graphs)


@suite_settings(gate_examples=1, shrink_in_gate=False)
@given(case=draft_cases(), data=st.data())
def test_profiled_draft_worker_names_its_traces(case, data, device, personality, layout):
    """A DFLASH draft worker's capture profiled one trace per shape: its traces carry the draft prefix, so they
    never collide with the target runner's of the same shapes."""
    from harness.targets.decode.draft import draft_layout

    case = dataclasses.replace(case, switches=RunnerSwitches(profile="per_shape"))
    with example("decode_switches", personality=personality, **case.drawn()) as ex:
        skip_without_draft(layout, personality)
        run_switched(case, lambda sizes: data.draw(draft_batches(case, sizes), label="batches"), device,
                     personality, draft_layout(layout), ex, lambda target, _, folder: check_capture_profile(target,
                                                                                                        folder))


@suite_settings(gate_examples=3, shrink_in_gate=False)
@given(case=dp_gather_cases(), data=st.data())
def test_dp_gathered_buffers_replay_matches_eager(case, data, device, personality, layout):
    """`--moe-dense-tp-size 1`: the runner sizes the gathered DP buffers (global_num_tokens_gpu,
    global_dp_buffer_len) for each graph; the model reads them against its rows, so a wrong or stale length shows."""
    with example("decode_switches", personality=personality, **case.drawn()) as ex:
        run_switched(case, lambda sizes: data.draw(dp_batches(case, sizes), label="batches"), device,
                     personality, layout, ex, lambda *_: None)


@suite_settings(gate_examples=2, shrink_in_gate=False)
@given(case=pdmux_cases(), data=st.data())
def test_pdmux_stream_groups_replay_match_eager(case, data, device, personality, layout):
    """`--enable-pdmux`: SGLang's stream groups (`harness/targets/decode/pdmux.py`), every size captured once per
    group on the group's own decode backend (the graph count held to sizes x groups), and before each replay the
    scheduler's drawn choice of group (`set_current_stream_idx`): the runner must prepare that group's backend and
    replay that group's graph. A replay keyed to another group reads metadata it was not given: it fails to replay
    (`graph-replay`) or differs from eager; either diagnosis names the replays' groups."""
    from harness.oracles import OracleFailure
    from harness.targets.decode import pdmux

    if personality != "cuda":
        pytest.skip("PD-multiplexing is the CUDA decode runner's (green contexts): run with --personality cuda")
    groups, chosen = case.switches.pdmux_groups, []

    def on_drawn_group(target, replay):
        def replayed(batch, step):
            chosen.append(data.draw(st.integers(0, groups - 1), label=f"stream group of replay {step}"))
            pdmux.set_stream(chosen[-1])
            try:
                return replay(batch, step)
            except OracleFailure:
                raise
            except Exception as error:  # noqa: BLE001 - SGLang's error inside the group's replay, named
                raise OracleFailure("graph-replay", f"replay {step} ({batch.forward_mode} of {batch.batch_size}) on "
                                    f"stream group {chosen[-1]} of {groups} raised {type(error).__name__}: {error}; "
                                    "each group's graphs read the metadata its own decode backend was given",
                                    stream_groups=list(chosen)) from error
        return replayed

    with example("decode_switches", personality=personality, **case.drawn()) as ex:
        ex.note("stream_groups", chosen)  # filled replay by replay
        try:
            run_switched(case, lambda sizes: data.draw(replay_batches(case, sizes), label="replay batches"), device,
                         personality, layout, ex, lambda *_: None, checked=on_drawn_group)
        except OracleFailure as failure:
            if "stream group" in failure.diagnosis:
                raise
            raise OracleFailure(failure.oracle, f"{failure.diagnosis}; the replays' stream groups, in order: {chosen} "
                                f"(of {groups})", **failure.details) from failure


def skip_dspark_switches(layout, personality) -> None:
    skip_without_speculative(layout)
    if personality != "cuda":
        pytest.skip("the DSPARK target verify switches are the decode runner's: run with --personality cuda")


@suite_settings(gate_examples=1, shrink_in_gate=False)
@given(case=dspark_cases(dspark_verify_glue=True), data=st.data())
def test_dspark_verify_glue_replays_match_eager(case, data, device, personality, layout):
    """A DSPARK target verify runner's metadata prep through its own glue graph (the backend declares it host-free):
    uniform TARGET_VERIFY batches of captured sizes, past the warm-ups into glued prep, and a padded one prepped
    eagerly, each equal to eager."""
    with example("decode_switches", personality=personality, **case.drawn()) as ex:
        skip_dspark_switches(layout, personality)
        graphs = GlueGraphs()
        run_switched(case, lambda sizes: data.draw(glue_batches(case, graphs.routing(sizes)), label="batches"), device,
                     personality, layout, ex, lambda target, batches, _: check_glue_served(target, batches),
                     serve_graphs=graphs)


@suite_settings(gate_examples=1, shrink_in_gate=False)
@given(case=dspark_cases(dspark_verify_glue=True, glue_declined=True), data=st.data())
def test_dspark_verify_glue_declined_by_backend(case, data, device, personality, layout):
    """The switch on, but the backend's verify prep reads host values (the base double: the verify mask's counts):
    SGLang keeps the eager prep, builds no glue graph, and every replay equals eager."""
    with example("decode_switches", personality=personality, **case.drawn()) as ex:
        skip_dspark_switches(layout, personality)
        run_switched(case, lambda sizes: data.draw(glue_batches(case, sizes), label="batches"), device,
                     personality, layout, ex, lambda target, *_: check_glue_declined(target))


@suite_settings(gate_examples=1, shrink_in_gate=False)
@given(case=dspark_cases(dspark_verify_glue=True, early_verify=True), span_blocks=st.integers(2, 25), data=st.data())
def test_dsv41_variants_and_early_verify_metadata(case, span_blocks, data, device, personality, layout):
    """DeepSeek-V4.1's candidate graph variants on a DSPARK target verify runner, its verify metadata staged early
    (`harness/targets/decode/dsv41.py`): SGLang builds an unfiltered and a filtered graph per size from the drawn
    candidate span (`span_blocks` blocks of 4 tokens); each replay is reached plainly or, as the DSPARK worker
    does, after `stage_verify_metadata_early` with its tensors (drawn per replay). Every replay takes the variant
    its longest request implies, every stage is accepted and taken exactly where SGLang's contract says
    (`metadata_glue.watch_early_verify`), and every replay equals eager."""
    from harness.targets.decode.dsv41 import BLOCK_SIZE

    case = dataclasses.replace(case, switches=dataclasses.replace(case.switches, dsv41_span=span_blocks * BLOCK_SIZE))
    with example("decode_switches", personality=personality, span=case.switches.dsv41_span, **case.drawn()) as ex:
        skip_dspark_switches(layout, personality)
        run_early(case, lambda sizes: data.draw(glue_batches(case, sizes), label="batches"),
                  lambda count: data.draw(st.lists(st.sampled_from(["execute", "early", "early"]), min_size=count,
                                                   max_size=count), label="kinds"), device, personality, layout, ex)


def run_early(case, batches_for, kinds, device, personality, layout, ex) -> None:
    """`case` under DeepSeek-V4.1's variants and early metadata: its glue graphs keyed by size and variant, each
    replay watched (`watch_early_verify`), SGLang's counts in the record."""
    span, width = case.switches.dsv41_span, case.tokens_per_request
    graphs = GlueGraphs(key=lambda batch: expected_candidate_variant(batch, width, span))

    def checked(target, replay):
        return watch_early_verify(span, width, target.capture_bs, graphs)(target, replay)

    run_switched(case, lambda sizes: batches_for(graphs.routing(sizes)), device, personality, layout, ex,
                 lambda target, *_: note_early(ex, target), checked=checked, serve_graphs=graphs, kinds=kinds)


def dspark_verify(seq_lens: list[int], rows: list[int], first_slot: int, width: int = 3) -> DecodeBatch:
    """A DSPARK verify batch of `width` causal draft tokens a request, at pool `rows` and cache slots from
    `first_slot` on."""
    tokens = len(seq_lens) * width
    chain = [[k <= j for k in range(width)] for j in range(width)]
    return DecodeBatch(input_ids=[(7 * i) % 50 for i in range(tokens)],
                       positions=[s + i % width for s in seq_lens for i in range(width)], seq_lens=seq_lens,
                       forward_mode="TARGET_VERIFY", req_pool_indices=rows,
                       out_cache_loc=list(range(first_slot, first_slot + tokens)),
                       draft_visibility=[chain] * len(seq_lens))


# capture [2, 4], width 3, candidate span 16 (each batch replayed, then its shifted twin): a size-2 key's glue
# captures at its third prep, so the second batch's shifted replay is the first stage taken; then two batches of
# longest 14 and 15 (past 16 with the verify's 3: the filtered graph, never staged, its glue captured by the
# second), a padded 3 (never staged), and longest 13 (13 + 3 = 16: unfiltered, staged)
EARLY_CASE = DecodeCase(capture_bs=(2, 4), max_running_requests=8,
                        spec=SpecSettings(num_steps=3, topk=1, num_draft_tokens=3, algorithm="DSPARK"),
                        switches=RunnerSwitches(dspark_verify_glue=True, early_verify=True, dsv41_span=16))
EARLY_BATCHES = [dspark_verify([5, 9], [1, 2], 10), dspark_verify([7, 11], [3, 4], 20),
                 dspark_verify([14, 2], [5, 1], 30), dspark_verify([1, 15], [6, 8], 36),
                 dspark_verify([4, 6, 8], [2, 3, 6], 46),
                 dspark_verify([13, 6], [7, 2], 60)]


def test_dsv41_early_verify_metadata_at_its_bounds(device, personality, layout):
    """`EARLY_CASE`, every replay reached as the DSPARK worker does (staged early first): the stages refused
    before the glue is captured, the first taken, batches past the span on the filtered graph, a padded batch, and
    a batch exactly at the span on the unfiltered one, each checked as the drawn cases are."""
    with example("decode_switches", personality=personality, span=16, **EARLY_CASE.drawn()) as ex:
        skip_dspark_switches(layout, personality)
        run_early(EARLY_CASE, lambda sizes: EARLY_BATCHES, lambda count: ["early"] * count, device, personality,
                  layout, ex)


def note_early(ex, target) -> None:
    """The record's evidence of the early metadata: SGLang's own counts, and the variants replayed."""
    early = target.runner._early_verify_metadata
    ex.note("early_verify", {"staged": early.staged_ct, "taken": early.taken_ct, "rejected": early.rejected_ct,
                             "variants": {str(k): v for k, v in early.variant_cts.items()}})


# a load, its mark without a plan (fresh tensors: re-copied), a plan, a mark finding the record cleared; then drawn
PREFILLED_PREFIX = ["execute", "stale_mark", "planned", "stale_mark"]


@suite_settings(gate_examples=1, shrink_in_gate=False)
@given(case=dspark_cases(skip_prefilled=True), data=st.data())
def test_dspark_preplanned_verify_skips_prefilled_inputs(case, data, device, personality, layout):
    """Pre-planned DSPARK verify batches (load_batch + mark, then execute with the same tensors) skip the
    input_ids / positions re-copy; a marked batch whose tensors differ is still copied (eager equality)."""
    def kinds(count):
        rest = data.draw(st.lists(st.sampled_from(KINDS), min_size=count - len(PREFILLED_PREFIX),
                                  max_size=count - len(PREFILLED_PREFIX)), label="kinds")
        return PREFILLED_PREFIX + rest

    with example("decode_switches", personality=personality, **case.drawn()) as ex:
        skip_dspark_switches(layout, personality)
        run_switched(case, lambda sizes: data.draw(prefilled_batches(case, sizes), label="batches"), device,
                     personality, layout, ex, lambda target, *_: check_prefilled_skips(target), kinds=kinds)


@suite_settings(gate_examples=1, shrink_in_gate=False)
@given(case=draft_cases(), data=st.data())
def test_draft_glue_replays_match_eager(case, data, device, personality, layout):
    """A DFLASH draft worker's metadata prep through the glue graph (no switch: its backend declares the prep
    host-free), draft batches of captured sizes past the warm-ups and a padded one, each equal to eager."""
    from harness.targets.decode.draft import draft_layout

    case = dataclasses.replace(case, switches=RunnerSwitches(draft_glue=True))
    with example("decode_switches", personality=personality, **case.drawn()) as ex:
        skip_dspark_switches(layout, personality)
        graphs = GlueGraphs()
        run_switched(case, lambda sizes: data.draw(glue_batches(case, graphs.routing(sizes)), label="batches"), device,
                     personality, draft_layout(layout), ex,
                     lambda target, batches, _: check_glue_served(target, batches), serve_graphs=graphs)


@suite_settings(gate_examples=2, shrink_in_gate=False)
@given(case=decode_cases(), data=st.data())
def test_elastic_drop_then_recapture_replays_match_eager(case, data, device, personality, layout):
    """Elastic EP's graph reset: SGLang's `drop_elastic_cuda_graph_state` cleans the runner's backend and releases
    the shared graph pool, then a new capture (what `recapture_elastic_cuda_graph` builds). The drop releases
    every graph the capture made (reset or out of reach, while the runner is still referenced) and the pool; the
    recaptured runner replays the same batches equal to eager."""
    with example("decode_switches", personality=personality, elastic="drop, recapture", **case.drawn()) as ex:
        drop = elastic_drop()
        if isinstance(drop, str):
            pytest.skip(drop)
        from sglang.srt.model_executor.runner_utils.pool import get_global_graph_memory_pool
        drawn = []

        def batches_for(sizes):
            drawn[:] = drawn or data.draw(replay_batches(case, sizes), label="replay batches")
            return drawn

        first = capture_and_check(case, batches_for, device, personality, layout, ex)
        captured, pool = {c.graph_id for c in cpu.CAPTURES}, get_global_graph_memory_pool()
        mark = counter.mark()
        drop(first)
        check_dropped(captured, cpu.held_graphs(first.runner), counter.since(mark),
                      context="drop_elastic_cuda_graph_state")
        check_at_rest({"graph_memory_pool": (get_global_graph_memory_pool, None)},
                      context="drop_elastic_cuda_graph_state")
        capture_and_check(case, batches_for, device, personality, layout, ex)
        ex.note("pools", "fresh" if get_global_graph_memory_pool() is not pool else "reused")
