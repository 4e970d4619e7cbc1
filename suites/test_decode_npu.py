"""The decode suite under the NPU personality, whatever the run's `--personality`: a few examples of SGLang's own
`NPUGraphRunner` (capture through `NPUCudaGraphBackend`, `NPUGraphRunner.execute`, its graph updates, its capture
profiling through the `torch_npu.profiler` stand-in) on the virtual device, so one campaign measures both runners
(the `decode_capture_npu` coverage row). Replay commands name `--personality npu`."""
from __future__ import annotations

import pytest
from hypothesis import example as hypothesis_example, given, strategies as st

from harness.oracles.capture_profile import check_capture_profile
from harness.oracles.npu_graph_update import check_npu_graph_update, graph_updates
from harness.profiles import suite_settings
from harness.record import example
from harness.targets import decode
from harness.targets.decode.planned import KINDS
from harness.targets.decode.switches import RunnerSwitches
from strategies.capture import decode_cases
from strategies.switches import npu_batches, npu_cases
from suites.real_common import GATE_EXPLICIT_ONLY, PADDED_EAGLE3_DRAFT, draft_examples, draft_to_drawn, run_draft
from suites.decode_common import (
    PLANNED_AHEAD_THEN_STALE_MARK, capture_and_check, drawn_batches, drawn_kinds, mrope_case,
    npu_dflash_preplanned_verify, run_dllm, run_switched, skip_without_speculative,
)


@pytest.fixture(scope="module")
def personality(device_name):
    if device_name != "cpu":
        pytest.skip(f"SGLang's NPU runner runs here only on the cpu virtual device (this run: --device {device_name})")
    return "npu"


@pytest.fixture(scope="module")
def device(device):
    """The conftest's device under the npu personality, this thread on the second virtual NPU (a server's rank 1):
    a graph-update worker left on NPU 0 is then visible (`npu-graph-update`)."""
    import torch

    torch.npu.set_device(1)
    yield device
    torch.npu.set_device(0)


def update_checked(target, replay):
    """Each replay with the NPU graph update it must have made (`npu_graph_update`)."""
    def run(batch, step):
        before = graph_updates(target)
        output, expected = replay(batch, step)
        check_npu_graph_update(target, batch, before)
        return output, expected
    return run


@suite_settings(gate_examples=6, shrink_in_gate=False)
@given(case=npu_cases(), data=st.data())
def test_npu_replay_matches_eager_and_updates_graph(case, data, device, personality, layout):
    """DECODE, TARGET_VERIFY and IDLE batches through NPUGraphRunner.execute: outputs equal eager, each replay's
    graph update carries the batch's KV lengths under the architecture's name, the capture profile is written."""
    with example("decode_npu", personality=personality, **case.drawn()) as ex:
        if case.spec:
            skip_without_speculative(layout)
        run_switched(case, lambda sizes: data.draw(npu_batches(case, sizes), label="batches"), device, personality,
                     layout, ex, lambda target, _, folder: folder and check_capture_profile(target, folder),
                     checked=update_checked)


PADDED = {  # (forward mode, speculative algorithm or None, host mirror of seq_lens[, architecture]): each update
    # branch of the replay, and each architecture's (the v2 name; DeepSeek V4's none)
    "decode": ("DECODE", None, True), "decode-device-lens": ("DECODE", None, False),
    "eagle-verify": ("TARGET_VERIFY", "EAGLE", True), "eagle-verify-device-lens": ("TARGET_VERIFY", "EAGLE", False),
    "dflash-verify-device-lens": ("TARGET_VERIFY", "DFLASH", False),
    "decode-v2-name": ("DECODE", None, True, "MiMoV2ForCausalLM"),
    "decode-deepseek-v4": ("DECODE", None, True, "DeepseekV4ForCausalLM"),
}


@pytest.mark.parametrize("branch", sorted(PADDED))
def test_npu_padded_batch_updates_graph(branch, device, personality, layout):
    """A batch of one request padded to the captured 2, through each branch of NPUGraphRunner.execute's graph
    update: DECODE and TARGET_VERIFY, with the host mirror of seq_lens and without it (as some workers hand a batch
    over). DECODE's update carries the lengths, 0 for the padded request; EAGLE's verify adds the draft tokens;
    DFLASH's takes the attention backend's list, its padded request at the fill value plus the draft tokens; a v2
    architecture's goes under its own name, DeepSeek V4's graph is not updated; the output equals eager. Fixed
    examples, so the gate reaches every branch whatever the drawn test draws."""
    mode, algorithm, mirror, *architecture = PADDED[branch]
    spec = algorithm and decode.SpecSettings(num_steps=1, topk=1, num_draft_tokens=2, algorithm=algorithm)
    switches = RunnerSwitches(architecture=architecture[0]) if architecture else RunnerSwitches()
    case = decode.DecodeCase(capture_bs=(2,), max_running_requests=4, spec=spec, switches=switches)
    if mode == "DECODE":
        batch = decode.DecodeBatch(input_ids=[1], positions=[5], seq_lens=[9], host_seq_lens=mirror)
    else:
        batch = decode.DecodeBatch(input_ids=[1, 2], positions=[5, 6], seq_lens=[9], forward_mode=mode,
                                   draft_visibility=[[[True, False], [True, True]]], host_seq_lens=mirror)
    with example("decode_npu", personality=personality, **case.drawn()) as ex:
        if spec:
            skip_without_speculative(layout, personality)
        capture_and_check(case, lambda sizes: [batch], device, personality, layout, ex, checked=update_checked)


@suite_settings(gate_examples=3, shrink_in_gate=False)
@given(case=decode_cases(speculative=None), data=st.data())
def test_npu_planned_batches_replay_matches_eager(case, data, device, personality, layout):
    """Batches planned ahead through NPUGraphRunner.execute's pre-planned branch (as the decode suite's planned
    test drives them)."""
    def kinds(count):
        return data.draw(st.lists(st.sampled_from(KINDS), min_size=count, max_size=count), label="kinds")

    with example("decode_npu", personality=personality, **case.drawn()) as ex:
        skip_without_speculative(layout, personality)
        capture_and_check(case, drawn_batches(data, case), device, personality, layout, ex, kinds=kinds)


@suite_settings(gate_examples=1, shrink_in_gate=False)
@given(data=st.data())
def test_npu_dllm_replay_matches_eager(data, device, personality, layout):
    """SDAR's DLLM_EXTEND graphs through NPUGraphRunner (its dLLM KV-length names, full_logits of the raw tokens),
    fresh and pre-planned, as the decode suite's dLLM test drives them (Gemma4Renoise serves on CUDA only)."""
    run_dllm("tokens", data, device, personality, layout)


@suite_settings(gate_examples=2, shrink_in_gate=False)
@given(case=decode_cases().map(lambda case: mrope_case(case, overlap_plan_stream=True)),
       data=st.data())
def test_npu_mrope_planned_under_overlap_plan_stream(case, data, device, personality, layout):
    """An mRoPE model's batches planned ahead through NPUGraphRunner.execute with the overlap plan stream on: its
    pre-planned branch copies the batch's mRoPE positions again (the plan may have staged them early), so a stale
    mark, or a batch whose requests' next step was planned before it executed, replays its own mRoPE positions,
    not the plan's."""
    with example("decode_npu", personality=personality, **case.drawn()) as ex:
        skip_without_speculative(layout, personality)
        run_switched(case, drawn_batches(data, case), device, personality, layout, ex, lambda *_: None,
                     kinds=drawn_kinds(data, PLANNED_AHEAD_THEN_STALE_MARK))


def test_npu_standin_matches_the_real_torch_npu():
    """The stand-in this suite runs SGLang's NPU runner on, against the real torch_npu wheel's Python sources
    (`personalities/npu_contract.py`: signatures of the graph API, every torch.npu/torch_npu name SGLang's NPU
    capture path uses); no wheel to be had (no registry): a skip saying so."""
    from harness.personalities import npu_contract

    with example("decode_npu_contract") as ex:
        try:
            real = npu_contract.RealTorchNpu(npu_contract.fetch_wheel())
        except npu_contract.WheelUnavailable as error:
            pytest.skip(f"{error}; the npu-standin-contract check did not run")
        contract = npu_contract.check(real)
        ex.note("torch_npu", contract.version)
        ex.note("compared", {"signatures": len(contract.signatures), "sglang_uses": len(contract.uses),
                             "provided": len(contract.provided)})
        ex.note("unchecked", contract.unchecked[:20])


def test_findings_npu_dflash_preplanned_verify_crashes(device, personality, layout):
    """The decode suite's finding (`suites/test_decode_capture.py`), here under the npu personality."""
    npu_dflash_preplanned_verify(device, personality, layout)


@suite_settings(gate_examples=1, shrink_in_gate=False, **GATE_EXPLICIT_ONLY)
@hypothesis_example(drawn=PADDED_EAGLE3_DRAFT)
@given(drawn=draft_examples())
def test_npu_eagle_draft_replays_match_eager_and_update_graphs(drawn, device, personality):
    """The EAGLE draft worker's NPU graphs: SGLang's `EAGLEDraftNpuGraphRunner` and `EAGLEDraftExtendNpuGraphRunner`
    (what `EagleDraftWorker._capture_cuda_graphs` picks on an NPU) capture through the platform's
    `NPUCudaGraphBackend`; every replay against eager as on CUDA (`run_draft`), and the host-side KV lengths each
    replay rebinds its graph with (`npu-graph-update`): per draft step that attends, each request's prefix plus the
    draft tokens the step reads, each padded request 0; per draft extend, each request's length past its window.
    The gate's example is an EAGLE3 head's tree (its own vocabulary, three target layers read)."""
    from harness.models.real import draft_family
    from harness.targets.decode.eagle_draft import draft_missing

    case, groups, tile = drawn
    with example("decode_npu_draft", personality=personality, family=draft_family(case.spec.algorithm),
                 **draft_to_drawn(case, groups, tile)) as ex:
        reason = draft_missing(personality)
        if reason:
            pytest.skip(reason)
        run_draft(ex, case, groups, split_tile=tile, personality=personality)
