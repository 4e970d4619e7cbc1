"""Decode graph capture and replay: draw a capture configuration, let SGLang's real decode runner (or, with
`--personality npu`, SGLang's NPU runner) capture it on the device, replay drawn batches through the runner's real
`execute`, and check replay against eager, the `patch_model` contract, recompilation and staleness
(known bug class 1: a platform monkey-patch silently ignored, SGLang PR #27774)."""
from __future__ import annotations

import dataclasses

import pytest
from hypothesis import example as hypothesis_example, given, strategies as st

from harness.oracles import OracleFailure
from harness.oracles.rebinding import assert_no_by_value_imports_of_rebound_names
from harness.profiles import suite_settings
from harness.record import example
from harness.targets import decode
from harness.versions import sglang_version
from harness.targets.decode import overlap
from harness.oracles.ragged_layout import LayoutRequest
from strategies.capture import decode_cases
from harness.targets.decode.dllm import ALGORITHMS as DLLM_ALGORITHMS
from strategies.dllm import INPUTS as DLLM_INPUTS
from strategies.ragged import (
    capture_verify_shapes, draft_batches, draft_cases, ragged_batches, ragged_cases, ragged_layout_fields,
    ragged_layout_requests,
)
from suites.decode_common import (
    PLANNED_AHEAD_THEN_STALE_MARK, capture_and_check, drawn_batches, drawn_kinds, mrope_case,
    npu_dflash_preplanned_verify, run_dllm, run_switched, skip_without_dllm, skip_without_draft,
    skip_without_speculative, unplanned_or_planned,
)


def test_no_module_imports_a_rebound_name_by_value():
    with example("rebinding_static") as ex:
        findings = assert_no_by_value_imports_of_rebound_names()
        ex.note("rebinding_sites", findings.rebinding_count)
        ex.note("benign", [b.key for b in findings.benign])
        ex.note("advisories", [a.describe() for a in findings.advisories])


@suite_settings(gate_examples=30, shrink_in_gate=False)
@given(case=decode_cases(), data=st.data())
def test_replay_matches_eager_and_patch_model_contract(case, data, device, personality, layout):
    with example("decode_capture", personality=personality, **case.drawn()) as ex:
        capture_and_check(case, drawn_batches(data, case), device, personality, layout, ex)


@suite_settings(gate_examples=8, shrink_in_gate=False)
@given(case=decode_cases(speculative=True), data=st.data())
def test_target_verify_replay_matches_eager(case, data, device, personality, layout):
    """EAGLE speculative decoding: TARGET_VERIFY graphs of several tokens per request, replayed with SGLang's own
    EagleVerifyInput (drawn verify mask, idle inputs for IDLE batches)."""
    with example("decode_target_verify", personality=personality, **case.drawn()) as ex:
        skip_without_speculative(layout)
        capture_and_check(case, drawn_batches(data, case), device, personality, layout, ex)


@suite_settings(gate_examples=4, shrink_in_gate=False)
@given(case=decode_cases(speculative=True), data=st.data())
def test_verify_batch_of_another_width_is_refused(case, data, device, personality, layout):
    """A speculative worker may verify another number of tokens per request than the runner captured (SGLang's
    adaptive speculative decoding grows and shrinks it at run time); the graphs' static buffers and attention
    metadata hold the captured width, so such a TARGET_VERIFY batch must be refused, whatever the algorithm (the
    runner's uniform-width rule, NGRAM's token count), and eager serves it: its logits, one row a token."""
    width = case.tokens_per_request
    other = data.draw(st.sampled_from([w for w in (width - 1, width + 1) if w >= 1]), label="verify width")
    with example("decode_verify_width", personality=personality, verify_width=other, **case.drawn()) as ex:
        skip_without_speculative(layout)
        from sglang.srt.speculative import spec_info

        if not hasattr(spec_info.SpecInput, "num_tokens_per_req"):  # widths fixed at startup before 0.5.2x
            pytest.skip(f"SGLang {sglang_version()}: a speculative input carries no per-request width "
                        "(SpecInput.num_tokens_per_req): every verify batch has the configured width")
        device.reset()
        target = layout.make_target(case, personality=personality, device=device.torch_device)
        size = data.draw(st.integers(1, max(target.capture_bs)), label="requests")
        tokens = size * other
        batch = decode.DecodeBatch(
            input_ids=data.draw(st.lists(st.integers(0, 49), min_size=tokens, max_size=tokens), label="ids"),
            positions=[10 + i for i in range(tokens)], seq_lens=[10 + 3 * r for r in range(size)],
            req_pool_indices=list(range(1, size + 1)), out_cache_loc=list(range(5, 5 + tokens)),
            forward_mode="TARGET_VERIFY",
            draft_visibility=[[[k <= j for k in range(other)] for j in range(other)] for _ in range(size)])
        ex.note("replayed", [])
        if target.can_replay(batch):
            raise OracleFailure("admission", f"the runner admits a TARGET_VERIFY batch of {size} request(s) x "
                                f"{other} tokens having captured {width} tokens a request ({case.spec.algorithm}, "
                                f"sizes {target.capture_bs}): its graphs' buffers and metadata hold {width}",
                                batch=batch)
        rows = target.eager(batch).next_token_logits.shape[0]
        if rows != tokens:
            raise OracleFailure("eager-equality", f"eager served the refused verify batch of {size} x {other} "
                                f"tokens with {rows} logits rows, not one a token ({tokens})")


@suite_settings(gate_examples=6, shrink_in_gate=False)
@given(case=decode_cases(disable_padding=True), data=st.data())
def test_padding_disabled_replays_only_captured_sizes(case, data, device, personality, layout):
    """--disable-cuda-graph-padding: captured sizes replay their graph, every other size is refused (runs eagerly).
    A release whose runner refuses a captured size is a finding, kept visible as an expected failure: SGLang
    0.5.14 and main trees of June 2026 look the size up as an int among graphs keyed by ShapeKey, so no batch
    ever replays a graph with padding disabled."""
    with example("decode_padding_disabled", personality=personality, **case.drawn()) as ex:
        try:
            capture_and_check(case, drawn_batches(data, case), device, personality, layout, ex)
        except OracleFailure as failure:
            if failure.details.get("refused_captured"):
                pytest.xfail(f"finding on SGLang {sglang_version()}: {failure.diagnosis}")
            raise


@suite_settings(gate_examples=12, shrink_in_gate=False)
@given(case=decode_cases(speculative=None), data=st.data())
def test_planned_batches_replay_matches_eager(case, data, device, personality, layout):
    """Batches planned ahead (load_batch + mark_forward_metadata_ready before execute), re-planned after a
    resize, marked without a plan, interleaved with unplanned ones, as `planned.PlannedReplays` drives them."""
    with example("decode_planned", personality=personality, **case.drawn()) as ex:
        skip_without_speculative(layout, personality)
        capture_and_check(case, drawn_batches(data, case), device, personality, layout, ex, kinds=drawn_kinds(data))


@suite_settings(gate_examples=3, shrink_in_gate=False)
@given(case=decode_cases(speculative=None).map(mrope_case), data=st.data())
def test_mrope_replay_matches_eager(case, data, device, personality, layout):
    """An mRoPE model (a VLM's decode) reads `mrope_positions`, which the runner stages through its buffer registry
    (the [3, tokens] slot, its padded columns zeroed); planned ahead as in the planned test, a stale mark replays
    the plan's mRoPE positions with the batch's own positions (the decode runner re-copies only those), and so
    does a batch whose requests' next step was planned before it executed."""
    with example("decode_mrope", personality=personality, **case.drawn()) as ex:
        skip_without_speculative(layout, personality)
        run_switched(case, drawn_batches(data, case), device, personality, layout, ex, lambda *_: None,
                     kinds=drawn_kinds(data, PLANNED_AHEAD_THEN_STALE_MARK))


@pytest.mark.parametrize("reads", overlap.READ_ENDS)
@suite_settings(gate_examples=1, shrink_in_gate=False)
@given(case=decode_cases(speculative=None), data=st.data())
def test_overlap_war_barrier_orders_shared_writes(reads, case, data, device, personality, layout):
    """The overlap scheduler's order (`targets/decode/overlap.py`): each batch staged into a scheduler-shared table
    on the schedule stream, replayed on the forward stream, then SGLang's `_apply_war_barrier` before the next
    staging write; the attention double declares where its reads of the table end (each SharedReadEnds).
    stream-order judges the read-done events; the publication is derived from the declaration: an event per replay
    for PRE/IN/POST (IN resolves to POST off CUDA: no in-graph marker event), none for UNKNOWN (wait_stream)."""
    case = dataclasses.replace(case, shared_reads=reads)
    loops = []

    def in_overlap_order(target, replay):
        loops.append(overlap.OverlapLoop(target))
        return loops[-1].wrap(replay)

    with example("decode_overlap", personality=personality, **case.drawn()) as ex:
        missing = overlap.missing()
        if missing:
            pytest.skip(missing)
        if personality != "cuda" or not device.counts_graphs:
            pytest.skip("the overlap WAR barrier is driven on the virtual device's streams, CUDA personality")
        capture_and_check(case, drawn_batches(data, case), device, personality, layout, ex, checked=in_overlap_order)
        published = loops[0].published
        expected = ["none" if reads == "UNKNOWN" else "event"] * len(published)
        ex.note("read_done", published)
        if published != expected:
            raise OracleFailure("stream-order", f"the runner published read-done events {published} over "
                                f"{len(published)} replays; a backend declaring {reads} implies {expected}",
                                shared_reads=reads)


# -- findings on clean SGLang, kept visible -------------------------------------------------------------------
def test_findings_npu_dflash_preplanned_verify_crashes(device, personality, layout):
    """A pre-planned DFLASH verify batch through the NPU runner replays as eager computes it. Finding on 0.5.23,
    kept visible as an expected failure: NPUGraphRunner.execute's pre-planned DFLASH branch calls
    build_replay_fb_view without its global_num_tokens_cpu argument (TypeError)."""
    npu_dflash_preplanned_verify(device, personality, layout)


@suite_settings(gate_examples=1, shrink_in_gate=False)
@given(case=decode_cases(compile=True, many_compiled_sizes=True), data=st.data())
def test_more_compiled_sizes_than_dynamos_default_limit(case, data, device, personality, layout):
    """9 to 12 compiled sizes, past Dynamo's default per-frame recompile_limit (8): SGLang's
    set_torch_compile_config must raise the limit, so every size compiles and replays its own specialisation
    (dynamo-contract: the limit in force, no limit hit), eager compile backend."""
    with example("decode_capture", personality=personality, **case.drawn()) as ex:
        capture_and_check(case, drawn_batches(data, case), device, personality, layout, ex)


@suite_settings(gate_examples=1, shrink_in_gate=False)
@given(case=decode_cases(compile=True, compile_backend="inductor", compile_every_size=True), data=st.data())
def test_inductor_compiled_replay_matches_eager(case, data, device, personality, layout):
    with example("decode_capture_inductor", personality=personality, **case.drawn()) as ex:
        capture_and_check(case, drawn_batches(data, case), device, personality, layout, ex)


# -- the compact ragged verify layout (SGLANG_RAGGED_VERIFY_MODE=compact) -------------------------------------


def skip_without_ragged(layout, personality) -> None:
    """The release's reason (`ragged.ragged_missing`); under the NPU personality: SGLang's NPUGraphRunner has no
    ragged verify (its execute keys graphs by batch size, never by the token tiers the base runner captured)."""
    from harness.targets.decode.ragged import ragged_missing

    if personality == "npu":
        pytest.skip(f"SGLang {sglang_version()}: {layout.npu_runner_class} has no compact ragged verify "
                    "(graphs keyed by batch size, not token tier): a CUDA runner path")
    missing = layout.speculative_missing() or ragged_missing(layout)
    if missing:
        pytest.skip(missing)


@suite_settings(gate_examples=6, shrink_in_gate=False)
@given(case=ragged_cases(), data=st.data())
def test_ragged_verify_replay_matches_eager(case, data, device, personality, layout):
    """DSPARK verify batches of per-request verify lengths (SGLang's RaggedVerifyLayout): graphs per token tier,
    admission by tier and slots, the layout staged into the tier's graph (fresh and pre-planned load_batch), each
    replay against eager on the real rows."""
    from harness.targets.decode.ragged import ragged_layout

    def batches(capture_bs):
        grid = tuple(sorted({bs * case.tokens_per_request for bs in capture_bs}))
        return data.draw(ragged_batches(case, grid, max(capture_bs)), label="ragged batches")

    with example("decode_ragged_verify", personality=personality, backend_graphs=True, **case.drawn()) as ex:
        skip_without_ragged(layout, personality)
        capture_and_check(case, batches, device, personality, ragged_layout(layout), ex,
                          kinds=lambda count: data.draw(unplanned_or_planned(count), label="kinds"))


@pytest.mark.parametrize("backend_graphs", [True, False])
def test_ragged_verify_fills_a_tiers_slots(backend_graphs, device, personality, layout):
    """Capture sizes 2 and 4, two draft tokens: tiers 4 and 8 tokens, min(tier, 4) = 4 request slots each. Three
    anchor-only requests (verify_lens [1, 1, 1], tier 4) fill three of tier 4's slots, more than the 2 requests a
    uniform layout of that tier holds; [2, 1, 2, 2] (tier 8) fills all four. Both replay and equal eager; with an
    attention backend declaring no ragged verify graphs (SGLang's default) the runner refuses both (eager)."""
    from harness.targets.decode.ragged import RaggedBatch, ragged_layout

    case = decode.DecodeCase(capture_bs=(2, 4), max_running_requests=8,
                             spec=decode.SpecSettings(num_steps=1, topk=1, num_draft_tokens=2, algorithm="DSPARK"))
    batches = [RaggedBatch(input_ids=[3, 4, 5, 0], positions=[7, 8, 9, 0], seq_lens=[6, 9, 4],
                           forward_mode="TARGET_VERIFY", req_pool_indices=[1, 0, 5], out_cache_loc=[2, 3, 4, 0],
                           verify_lens=[1, 1, 1], grid=(4, 8)),
               RaggedBatch(input_ids=[1, 2, 3, 4, 5, 6, 7, 0], positions=[10, 11, 12, 13, 14, 15, 16, 0],
                           seq_lens=[3, 5, 7, 2], forward_mode="TARGET_VERIFY", req_pool_indices=[4, 2, 0, 6],
                           out_cache_loc=[9, 8, 7, 6, 5, 4, 3, 0], verify_lens=[2, 1, 2, 2], grid=(4, 8))]
    with example("decode_ragged_verify", personality=personality, backend_graphs=backend_graphs,
                 **case.drawn()) as ex:
        skip_without_ragged(layout, personality)
        capture_and_check(case, lambda capture_bs: batches, device, personality,
                          ragged_layout(layout, backend_graphs=backend_graphs), ex)


@suite_settings(gate_examples=30)  # no capture: milliseconds an example
@hypothesis_example(  # a capture whose tokens do not divide evenly over its slots: which rows are the longer
    request=LayoutRequest(verify_lens=[1, 3, 2], grid=[4, 8]), capture=(7, 3, 3), seq_lens=[0, 4, 9, 2],
    mode="compacted", struct=dict(verify_lens_cpu=[1, 2], total_verify_tokens=3, graph_num_tokens=4, cap=None))
@hypothesis_example(  # past the last tier, a layout past its graph's tokens, a capture past what its slots hold
    request=LayoutRequest(verify_lens=[3, 2], grid=[2, 4]), capture=(9, 2, 4), seq_lens=[5, 0, 7, 1], mode="eager",
    struct=dict(verify_lens_cpu=[2, 2], total_verify_tokens=4, graph_num_tokens=3, cap=None))
@given(request=ragged_layout_requests(), struct=ragged_layout_fields(), capture=capture_verify_shapes(),
       seq_lens=st.lists(st.integers(0, 40), min_size=4, max_size=4),
       mode=st.sampled_from(["compacted", "Compact", "dynamic", "static "]))
def test_ragged_layouts_are_the_requests_arithmetic(request, struct, capture, seq_lens, mode, layout):
    """SGLang's ragged verify layout builders on drawn requests, malformed ones among them: the tier and prefix
    sums of `from_verify_lens`, the layout's own validation, a capture's placeholder rows, the attention geometry a
    ragged backend reads, an unknown mode refused (`harness/oracles/ragged_layout.py`)."""
    from harness.oracles import ragged_layout as check
    from harness.targets.decode.ragged import ragged_missing

    with example("decode_ragged_layout", request=dataclasses.asdict(request), struct=struct, capture=capture,
                 seq_lens=seq_lens, mode=mode) as ex:
        missing = ragged_missing(layout)
        if missing:
            pytest.skip(missing)
        ex.note("from_verify_lens", check.check_from_verify_lens(request))
        ex.note("struct", check.check_struct_validation(struct))
        ex.note("capture_lens", check.check_capture_lens(*capture))
        if request.refusal() is None:
            lens = request.verify_lens[:4]
            ex.note("geometry", check.check_geometry(lens, seq_lens[:len(lens)], request.grid))
        ex.note("mode", check.check_unknown_mode(mode))


@pytest.mark.parametrize("conflict", ["lora", "disable_padding"])
def test_ragged_verify_refuses_what_it_cannot_pad(conflict, device, personality, layout):
    """Compact ragged verify pads every batch to its tier's slots, which LoRA's per-request scales and
    --disable-cuda-graph-padding cannot follow: SGLang must refuse to build the runner (ValueError), not capture."""
    from harness.targets.decode.ragged import REFUSAL, ragged_layout

    case = decode.DecodeCase(capture_bs=(1, 2), max_running_requests=4, **{conflict: True},
                             spec=decode.SpecSettings(num_steps=1, topk=1, num_draft_tokens=2, algorithm="DSPARK"))
    with example("decode_ragged_refusal", personality=personality, conflict=conflict, **case.drawn()):
        skip_without_ragged(layout, personality)
        check_construction_refused(ragged_layout(layout), case, device, personality, ValueError, REFUSAL,
                                   f"SGLang built a compact ragged verify runner with {conflict} on; the runner "
                                   f"must refuse it ({REFUSAL!r} ...): its graphs pad every batch to the tier")


def check_construction_refused(target_layout, case, device, personality, error: type, text: str, failure: str):
    """SGLang's runner constructor must raise `error` with `text` for `case`; building it is the `failure`."""
    device.reset()
    try:
        target_layout.make_target(case, personality=personality, device=device.torch_device)
    except error as refused:
        assert text in str(refused), f"SGLang refused the case for another reason: {refused}"
        return
    raise OracleFailure("admission", failure)


# -- a draft worker's verify graphs (model_runner.is_draft_worker) ----------------------------------------------


@suite_settings(gate_examples=3, shrink_in_gate=False)
@given(case=draft_cases(), compact=st.booleans(), data=st.data())
def test_draft_worker_verify_replay_matches_eager(case, compact, data, device, personality, layout):
    """A DFLASH draft worker's TARGET_VERIFY graphs (no verify mask, no hidden states), reading the drawn
    embeddings the worker hands over; built under SGLANG_RAGGED_VERIFY_MODE=compact too, which a draft runner
    ignores."""
    from harness.targets.decode.draft import draft_layout

    with example("decode_draft_verify", personality=personality, compact=compact, **case.drawn()) as ex:
        skip_without_draft(layout, personality)
        capture_and_check(case, lambda capture_bs: data.draw(draft_batches(case, capture_bs), label="draft batches"),
                          device, personality, draft_layout(layout, compact=compact), ex,
                          kinds=lambda count: data.draw(unplanned_or_planned(count), label="kinds"))


def test_draft_worker_of_an_algorithm_without_draft_verify_is_refused(device, personality, layout):
    """EAGLE drafts do not verify like a target (`supports_target_verify_for_draft` false): SGLang must refuse to
    build a draft worker's decode runner for it, not capture TARGET_VERIFY graphs."""
    from harness.targets.decode.draft import REFUSAL, draft_layout

    case = decode.DecodeCase(capture_bs=(1, 2), max_running_requests=4,
                             spec=decode.SpecSettings(num_steps=1, topk=1, num_draft_tokens=2, algorithm="EAGLE"))
    with example("decode_draft_refusal", personality=personality, **case.drawn()):
        skip_without_draft(layout, personality)
        check_construction_refused(draft_layout(layout), case, device, personality, RuntimeError, REFUSAL,
                                   "SGLang built an EAGLE draft worker's decode runner; EAGLE drafts do not verify "
                                   f"like a target, so it must refuse ({REFUSAL!r})")


# -- a diffusion LLM's DLLM_EXTEND graphs (--dllm-algorithm) ----------------------------------------------------


@pytest.mark.parametrize("inputs", sorted(DLLM_INPUTS))
@suite_settings(gate_examples=1, shrink_in_gate=False)
@given(data=st.data())
def test_dllm_replay_matches_eager(inputs, data, device, personality, layout):
    """DLLM_EXTEND graphs of a block per request (SGLang's DllmConfig from a checkpoint and algorithm config),
    reading the embeddings or in-graph preparation state the algorithm hands over, fresh and pre-planned; each
    replay returns full_logits of the raw tokens, equal to eager, with seq_lens padded by the block size."""
    run_dllm(inputs, data, device, personality, layout)


def test_dllm_batch_without_embeddings_is_refused(device, personality, layout):
    """Gemma4Renoise without in-graph preparation reads the batch's input_embeds: a DLLM_EXTEND batch handed over
    without them must be refused (ValueError) before anything is staged, not replayed on stale embeddings."""
    from harness.targets.decode.dllm import REFUSAL, DllmBatch, dllm_layout

    case = decode.DecodeCase(capture_bs=(1, 2), max_running_requests=4, dllm=decode.DllmSettings(
        algorithm="Gemma4Renoise", architecture="DiffusionGemmaForBlockDiffusion", block_size=2))
    batch = DllmBatch(input_ids=[1, 2], positions=[3, 4], seq_lens=[5], forward_mode="DLLM_EXTEND")
    with example("decode_dllm_refusal", personality=personality, **case.drawn()):
        skip_without_dllm(layout, personality, case.dllm)
        device.reset()
        target = dllm_layout(layout).make_target(case, personality=personality, device=device.torch_device)
        try:
            target.replay(batch)
        except ValueError as refused:
            assert REFUSAL in str(refused), f"SGLang refused the batch for another reason: {refused}"
            return
        raise OracleFailure("admission", "SGLang replayed a Gemma4Renoise DLLM_EXTEND batch without input_embeds; "
                            f"it must refuse it ({REFUSAL!r}): the graph would read the last batch's embeddings")


@pytest.mark.parametrize("inputs", ["input_embeds", "prepared"])  # the paths with a per-step input to restage
def test_dllm_preplanned_batch_stages_its_inputs(inputs, device, personality, layout):
    """Capture size 2, block size 2. One request (padded to 2: seq_lens' padded row must hold the block size, the
    full_logits returned only its 2 raw tokens), then two, each loaded and marked ahead (load_batch + mark, the
    dLLM worker's way); then the next denoising step of those two requests (new tokens, new embeddings or
    preparation state) marked on the standing plan: the pre-planned branch must copy its embeddings or state too,
    not replay the step before's."""
    from harness.targets.decode.dllm import DllmBatch, dllm_layout

    architecture, prepared = DLLM_INPUTS[inputs]
    settings = decode.DllmSettings(algorithm=DLLM_ALGORITHMS[architecture], architecture=architecture,
                                   block_size=2, capture_input_preparation=prepared)
    case = decode.DecodeCase(capture_bs=(2,), max_running_requests=4, dllm=settings)
    values = [[[0.5, -1.0, 0.25, 2.0], [1.0, 1.0, -0.5, 0.125]],
              [[0.25, 0.5, 0.75, 1.0], [-2.0, 0.0, 1.5, 0.5], [1.25, -0.25, 0.0, 0.5], [0.5, 0.5, 0.5, -1.0]]]
    extra = [{"preparation_state" if prepared else "input_embeds": v} for v in values]
    batches = [DllmBatch(input_ids=[4, 7], positions=[10, 11], seq_lens=[12], forward_mode="DLLM_EXTEND",
                         req_pool_indices=[3], out_cache_loc=[5, 6], **extra[0]),
               DllmBatch(input_ids=[1, 2, 3, 4], positions=[5, 6, 7, 8], seq_lens=[9, 6], forward_mode="DLLM_EXTEND",
                         req_pool_indices=[0, 2], out_cache_loc=[1, 2, 3, 4], **extra[1])]
    step = {name: [[-v for v in row] for row in values] for name, values in extra[1].items()}
    batches.append(dataclasses.replace(batches[1], input_ids=[6, 0, 5, 2], **step))
    with example("decode_dllm", inputs=inputs, personality=personality, **case.drawn()) as ex:
        skip_without_dllm(layout, personality, settings)
        capture_and_check(case, lambda capture_bs: batches, device, personality, dllm_layout(layout), ex,
                          kinds=lambda count: ["planned"] * 4 + ["stale_mark"] * 2)
