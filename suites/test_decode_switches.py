"""The decode runner's switches a user sets beside the capture config, on the run's personality: capture
profiling (`--enable-profile-cuda-graph`, one trace per captured shape with `SGLANG_GRAPH_BATCH_CAPTURE`), the
metadata glue graph (`SGLANG_ENABLE_METADATA_GLUE_GRAPH`, with or without `SGLANG_OPT_SKIP_GLUED_REPLAY_VIEW`) and
the replay log (`SGLANG_LOG_DECODE_GRAPH_KEY`); every replay still equals eager."""
from __future__ import annotations

import pytest
from hypothesis import given, strategies as st

from harness.oracles.capture_profile import check_capture_profile
from harness.oracles.metadata_glue import GlueGraphs, check_glue_served
from harness.profiles import suite_settings
from harness.record import example
from strategies.switches import glue_batches, glue_cases, profile_cases
from suites.test_decode_capture import capture_and_check, device, drawn_batches, layout  # noqa: F401 - fixtures


def skip_without(case, layout) -> None:
    missing = case.switches.missing(layout.runner_module)
    if missing:
        pytest.skip(missing)


@suite_settings(gate_examples=3, shrink_in_gate=False)
@given(case=profile_cases(), data=st.data())
def test_profiled_capture_writes_one_trace_per_shape(case, data, device, personality, layout):
    with example("decode_switches", personality=personality, **case.drawn()) as ex:
        skip_without(case, layout)
        with case.switches.environment() as profile_dir:
            target = capture_and_check(case, drawn_batches(data, case), device, personality, layout, ex)
            check_capture_profile(target, profile_dir)


@suite_settings(gate_examples=4, shrink_in_gate=False)
@given(case=glue_cases(), data=st.data())
def test_metadata_glue_replays_match_eager(case, data, device, personality, layout):
    """Unpadded replays of each captured size, past the glue graph's warm-ups into glued metadata prep."""
    with example("decode_switches", personality=personality, **case.drawn()) as ex:
        skip_without(case, layout)
        drawn = []

        def batches_for(sizes):
            drawn[:] = data.draw(glue_batches(case, sizes), label="batches")
            return drawn

        with case.switches.environment():
            target = capture_and_check(case, batches_for, device, personality, layout, ex,
                                       serve_graphs=GlueGraphs())
            check_glue_served(target, drawn)
