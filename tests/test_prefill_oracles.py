"""The prefill suite's own oracles on hand-made evidence (no SGLang forward): each fires on what it must and
stays quiet otherwise."""
from __future__ import annotations

import logging
import warnings

import pytest

from harness.oracles import OracleFailure
from harness.oracles.capture_stream import CaptureStreamWatcher, classify
from harness.oracles.graph_replay import check_eager_forward, check_graph_forward
from harness.oracles.process_state import check_at_rest

OLD_ASSERT = "PCG capture stream is not set, please check if runtime recompilation happened"  # <= 0.5.15
NEW_WARNING = ("PCG capture stream is not set. This can be a Dynamo runtime recompilation or an optional VLM "
               "branch pre-warmed outside CUDA graph capture; falling back to eager execution for this subgraph.")


@pytest.mark.parametrize("text, signature", [
    (OLD_ASSERT, "pcg-capture-stream-not-set"),
    (NEW_WARNING, "pcg-capture-stream-not-set"),
    ("graph capture stream was not initialised", "stream-not-set"),
    ("tried to record a graph outside the capture session", "outside-capture"),
    ("CUDA error: operation not permitted when stream is capturing", "operation-not-permitted-capturing"),
    ("Capturing prefill shape (num_tokens=16)", None),
])
def test_classifier(text, signature):
    assert classify(text) == signature


def test_watcher_sees_the_once_only_warning_of_0_5_16_every_time():
    from sglang.srt.utils.common import print_warning_once

    for _ in range(2):  # the cache is cleared on entry, so a second watched example sees it again
        with CaptureStreamWatcher("test") as watcher:
            print_warning_once(NEW_WARNING)
        with pytest.raises(OracleFailure) as failure:
            watcher.check("replay")
        assert failure.value.oracle == "capture-stream" and "log" in failure.value.diagnosis


def test_watcher_sees_the_assertion_of_older_releases_and_python_warnings():
    with CaptureStreamWatcher("test") as watcher:
        with pytest.raises(AssertionError):
            with watcher.watching_warnings():
                raise AssertionError(OLD_ASSERT)
        with watcher.watching_warnings():
            warnings.warn("capture stream is not set")
    with pytest.raises(OracleFailure) as failure:
        watcher.check()
    assert failure.value.oracle == "capture-stream"
    assert {s.form for s in watcher.sightings} == {"exception", "warning"}


def test_watcher_quiet_on_unrelated_logs():
    with CaptureStreamWatcher("test") as watcher:
        logging.getLogger("sglang.test").warning("Capturing prefill shape (num_tokens=4)")
    watcher.check()


def test_graph_replay_oracle():
    check_graph_forward({"replays": 3, "new_graphs": 0, "new_captures": 0}, 3)
    check_eager_forward({"replays": 0, "new_graphs": 0, "new_captures": 0})
    for delta, text in [({"replays": 0, "new_graphs": 0, "new_captures": 0}, "ran eagerly"),
                        ({"replays": 3, "new_graphs": 2, "new_captures": 0}, "new graph"),
                        ({"replays": 1, "new_graphs": 0, "new_captures": 0}, "outside its captured graphs")]:
        with pytest.raises(OracleFailure, match=text):
            check_graph_forward(delta, 3)
    with pytest.raises(OracleFailure):
        check_eager_forward({"replays": 1, "new_graphs": 0, "new_captures": 0})


def test_process_state_oracle():
    check_at_rest({"flag": (lambda: False, False), "stream": (lambda: None, None)})
    with pytest.raises(OracleFailure, match="stream"):
        check_at_rest({"flag": (lambda: False, False), "stream": (lambda: object(), None)})


def test_admission_arithmetic():
    """What the graphs must not serve, from the case and the batch alone (no SGLang forward)."""
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    from harness.targets.prefill import Batch, PrefillCase, Request
    from harness.targets.prefill.admission import must_run_eager

    extend = ForwardMode.EXTEND
    text = Batch((Request(1, (3, 5)), Request(2, (4,), prefix=2, history=(1, 2))), extend, extend)
    tc, full = PrefillCase(capture_tokens=(4, 8, 16)), PrefillCase(backend="full", capture_tokens=(4, 8, 16))
    assert must_run_eager(tc, text) is None and must_run_eager(full, text) is None
    image = Batch((Request(1, (3, 5), embeds=((1, 2), (3, 4))),), extend, extend)
    cases = [(tc, Batch((Request(1, tuple(range(17))),), extend, extend), "exceed the largest capture (16)"),
             (tc, image, "input_embeds"),
             (tc, Batch(text.requests, extend, extend, capture_hidden_mode="FULL"), "capture_hidden_mode=FULL"),
             (tc, Batch(text.requests, extend, extend, return_logprob=True), "return_logprob"),
             (full, Batch(tuple(Request(row, (1,)) for row in range(1, 6)), extend, extend), "5 requests")]
    for case, batch, text_in_reason in cases:
        assert text_in_reason in (must_run_eager(case, batch) or ""), (case, batch)
    breakable = PrefillCase(backend="breakable", capture_tokens=(4, 8, 16))
    assert must_run_eager(breakable, Batch(text.requests, extend, extend, return_logprob=True)) is None
