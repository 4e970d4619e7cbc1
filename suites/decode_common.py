"""What the decode suites share (capture, checks, skips, drawn kinds): a module, never a test module imported
by another, so each test is collected once, where it is written."""
from __future__ import annotations

import contextlib
import dataclasses

import pytest
from hypothesis import strategies as st

from harness.counter import counter
from harness.models import capture_queries
from harness.oracles import capture_context
from harness.oracles import dp_gather, dynamo_evidence
from harness.oracles.eager import assert_matches_eager
from harness.oracles.hooks import HookRecorder
from harness.oracles.recompile import RecompileWatcher
from harness.oracles.replay_log import check_replay_log, replay_log
from harness.record import example
from harness.oracles.decode_replay import check_compiled_forwards_match_eager, check_replays_match_eager
from harness.oracles.patch_contract import check_patch_model_contract, expected_sizes
from harness.targets import decode
from harness.targets.sglang_plumbing import load
from harness.versions import sglang_version
from harness.targets.decode.planned import KINDS, PlannedReplays
from harness.targets.decode.switches import RunnerSwitches
from strategies.capture import compile_probe_batch, replay_batches
from strategies.dllm import dllm_batches, dllm_cases


def drawn_batches(data, case):
    return lambda capture_bs: data.draw(replay_batches(case, capture_bs), label="replay batches")


def capture_mode_for(case) -> str:
    """Record (the faithful CUDA-graph semantics: no Python at replay) unless torch.compile is on; compiled forwards
    are re-run so compiled code and its guards run at every replay -- except with LoRA variants, whose forward
    depends on the capture-time variant flag SGLang sets only while capturing (a re-run would see it unset)."""
    return "rerun" if case.enable_torch_compile and not case.record_nolora_graph else "record"


def capture_and_check(case, batches_for, device, personality, layout, ex, kinds=None, checked=None,
                      serve_graphs=None):
    """Capture `case` through the real runner, replay `batches_for(captured sizes)`, and run every oracle;
    `kinds(count)`: how each replay reaches the runner (`planned.KINDS`), default unplanned; `checked(target,
    replay)`: the replay with a further check around it; `serve_graphs`: as `check_replays_match_eager`.
    Returns the target."""
    hooks = HookRecorder()
    mode = capture_mode_for(case)
    device.reset()
    decode.fresh_dynamo_when_compiler_changes(case, personality)
    with device.capture_mode(mode), RecompileWatcher("decode forward") as watcher, \
            capture_queries.recording() as answers:
        budget = dynamo_evidence.BudgetWatcher()  # Dynamo's recompile limits vs the sizes compiled
        mark = counter.mark()
        with dynamo_evidence.TraceRecorder() as compiles:  # the fused ops' compile mode at each trace
            target = layout.make_target(case, personality=personality, device=device.torch_device, hooks=hooks)
        ex.note("fused_ops", capture_context.check_fused_ops_traced(
            compiles.fused_modes, promised=capture_context.fused_compile_promised(personality),
            what=f"decode patch_model compile ({personality})"))
        budget.note_limits()
        capture_queries.serving()
        captured = counter.since(mark)["num_graphs_captured"] if device.counts_graphs else None
        if layout.note:
            ex.note("layout", layout.note)
        if target.dropped_options:
            ex.note("dropped_options", f"{target.dropped_options}: SGLang {layout.name} has no such option; "
                                       "the case ran without it")
        check_compiled_forwards_match_eager(target, compile_probe_batch, exact=case.compile_backend == "eager")
        ex.note("dynamo_budget", budget.check(expected_sizes(target.case)[1]))
        watcher.arm()
        ex.note("capture_bs", target.capture_bs)
        ex.note("compile_bs", target.compile_bs)
        ex.note("capture_modes", sorted(set(device.capture_modes_used())))
        ex.note("capture_seconds", round(target.capture_seconds, 3))
        check_patch_model_contract(target, hooks, layout, graphs_captured=captured)
        batches = batches_for(target.capture_bs)
        ex.note("replayed", [(b.forward_mode, b.batch_size) for b in batches])
        replay = None
        if kinds is not None:
            drawn_kinds, replays = kinds(2 * len(batches)), PlannedReplays(target)
            ex.note("kinds", drawn_kinds)
            replay = lambda batch, step: replays.replay(batch, drawn_kinds[step])  # noqa: E731
        if checked is not None:
            replay = checked(target, replay or (lambda batch, step: (target.replay(batch), batch)))
        check_replays_match_eager(target, batches, exact=case.compile_backend == "eager",
                                  count_replays=device.counts_graphs, replay=replay, serve_graphs=serve_graphs)
        if kinds is not None:
            ex.note("kinds_taken", replays.taken)  # also target.kinds_taken (`PlannedReplays`)
        watcher.check("a replay compiled a frame")
    ex.note("capture_context", capture_context.check(answers, capture_mode_promised=True,
                                                     what=f"decode runner ({personality})"))
    capture_context.check_fused_ops_at_rest(compiles.fused_ops(), what=f"decode runner ({personality})")
    return target


def run_switched(case, draw_batches, device, personality, layout, ex, check, **kwargs) -> None:
    """Capture and replay `case` under its switches, then `check(target, the batches replayed, the profiler
    folder)` while they hold; the replay log checked where the switch is on (the decode runner's execute; the NPU
    runner logs none)."""
    missing = case.switches.missing(layout.runner_module)
    if missing:
        pytest.skip(missing)
    drawn = []

    def batches_for(sizes):
        drawn[:] = draw_batches(sizes)
        return drawn

    runner = load(layout.runner_module)
    gathers = case.switches.dp_gather and hasattr(runner, "set_dp_buffer_len")
    with case.switches.environment() as profile_dir, replay_log() as lines, \
            (dp_gather.observing(runner) if gathers else contextlib.nullcontext()) as published:
        target = capture_and_check(case, batches_for, device, personality, layout, ex, **kwargs)
        if gathers:
            width = target.case.tokens_per_request
            dp_gather.check_published(published, [bs * width for bs in target.capture_bs])
        if case.switches.log_graph_key and personality == "cuda":
            check_replay_log(lines, target.case, drawn)
        check(target, drawn, profile_dir)


def skip_without_speculative(layout, personality=None) -> None:
    """Inside the example, so the skip and its reason (release, missing name) are recorded; with `personality`,
    the pre-planned batches' needs too (`Layout.planning_missing`)."""
    missing = layout.planning_missing(personality) if personality else layout.speculative_missing()
    if missing:
        pytest.skip(missing)


def drawn_kinds(data, first: tuple[str, ...] = ()):
    """How each replay reaches the runner, drawn per replay from `planned.KINDS` after the kinds `first`."""
    def kinds(count):
        rest = max(0, count - len(first))
        drawn = data.draw(st.lists(st.sampled_from(KINDS), min_size=rest, max_size=rest), label="kinds")
        return [*first, *drawn][:count]
    return kinds


# the first batch planned, then the next step of its requests planned before it executes (k + 1 planned before k
# runs), then its shifted twin marked without a plan (same shapes): the staged plan's inputs replayed both times
PLANNED_AHEAD_THEN_STALE_MARK = ("planned_ahead", "stale_mark")


def mrope_case(case, **switches):
    return dataclasses.replace(case, switches=RunnerSwitches(mrope=True, **switches))


def npu_dflash_preplanned_verify(device, personality, layout) -> None:
    """The finding's check (`test_findings_npu_dflash_preplanned_verify_crashes`, here and under the npu suite)."""
    case = decode.DecodeCase(capture_bs=(2,), max_running_requests=4,
                             spec=decode.SpecSettings(num_steps=1, topk=1, num_draft_tokens=2, algorithm="DFLASH"))
    with example("decode_findings", personality=personality, **case.drawn()):
        if personality != "npu":
            pytest.skip("the NPU runner's branch: run with --personality npu")
        skip_without_speculative(layout, personality)
        batch = decode.DecodeBatch(input_ids=[1, 2, 3, 4], positions=[5, 6, 7, 8], seq_lens=[9, 10],
                                   forward_mode="TARGET_VERIFY", draft_visibility=[[[True, False], [True, True]]] * 2)
        device.reset()
        target = layout.make_target(case, personality=personality, device=device.torch_device)
        replays = PlannedReplays(target)
        try:
            output = replays.execute(replays.plan(batch))
        except TypeError as error:
            if "global_num_tokens_cpu" not in str(error):
                raise
            pytest.xfail(f"finding on SGLang {sglang_version()}: NPUGraphRunner.execute's pre-planned DFLASH "
                         f"branch: {error}")
        assert_matches_eager(output.next_token_logits, target.eager(batch).next_token_logits, exact=True)


def unplanned_or_planned(count):
    """How each replay reaches the runner: execute plans it, or load_batch + mark first (`planned.KINDS`' first
    two; a resize or a stale mark assumes one width per request)."""
    return st.lists(st.sampled_from(KINDS[:2]), min_size=count, max_size=count)


def skip_without_draft(layout, personality) -> None:
    from harness.targets.decode.draft import draft_missing

    missing = layout.speculative_missing() or draft_missing(layout)
    if missing:
        pytest.skip(missing)


def skip_without_dllm(layout, personality, settings) -> None:
    """The release's reason (`dllm.dllm_missing`); under the NPU personality, Gemma4Renoise (SGLang serves it on
    CUDA/ROCm only: its configure_server_args refuses other devices), so only SDAR's graphs run on the NPU runner."""
    from harness.targets.decode.dllm import dllm_missing

    missing = layout.planning_missing(personality) or dllm_missing(layout, settings)
    if missing:
        pytest.skip(missing)
    if personality == "npu" and settings.algorithm == "Gemma4Renoise":
        pytest.skip(f"SGLang {sglang_version()}: Gemma4Renoise serves on CUDA/ROCm only, not under "
                    f"{layout.npu_runner_class}")


def run_dllm(inputs, data, device, personality, layout) -> None:
    """One drawn dLLM case of `inputs` (`strategies.dllm.INPUTS`), captured and replayed under `personality`."""
    from harness.targets.decode.dllm import dllm_layout

    case = data.draw(dllm_cases(inputs), label="case")
    with example("decode_dllm", inputs=inputs, personality=personality, **case.drawn()) as ex:
        skip_without_dllm(layout, personality, case.dllm)
        capture_and_check(case, lambda capture_bs: data.draw(dllm_batches(case, capture_bs), label="dllm batches"),
                          device, personality, dllm_layout(layout), ex,
                          kinds=lambda count: data.draw(unplanned_or_planned(count), label="kinds"))
