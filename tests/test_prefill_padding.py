"""The prefill padded-rows check (`oracles/prefill_padding.py`, part of eager-equality): clean SGLang passes with
every token slot and request slot checked; a registry whose padded tail is left stale (its real `reset_padding`
monkeypatched away, in-process) and a runner that pads unused chunked-prefix request slots with the wrong value
(a scratch-copy edit of the runner, one narrow suite node in a fresh process) fire, naming the static input and
the first row that differs."""
from __future__ import annotations

import pytest

from tests.prefill_sessions import cpu_prefill_layout

from harness.oracles import OracleFailure
from harness.record import Example
from harness.targets.prefill import Batch, PrefillCase, Request

CASE = PrefillCase(backend="full", capture_tokens=(4, 8))


@pytest.fixture(scope="module")
def full_session():
    """A full-backend session over (4, 8) on the virtual device (4 request slots), shared by this module's tests
    (a failing step closes it; the next `get` captures again) and closed after them."""
    from harness.targets.prefill.session import PrefillSession

    cpu_prefill_layout("full")
    yield lambda: PrefillSession.get(CASE)
    PrefillSession.close_current()


@pytest.fixture
def session(full_session):
    return full_session()


def _extend(*requests):
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    return Batch(tuple(requests), ForwardMode.EXTEND, ForwardMode.EXTEND)


def test_clean_padded_rows_hold_the_promise(session):
    """8 tokens over 2 requests, then 3 tokens of 1 request (padded to 4 tokens, 3 unused request slots)."""
    ex = Example("prefill_pcg", {})
    session.step(_extend(Request(1, (3, 5, 7, 9)), Request(2, (4, 6, 8, 2))), ex)
    session.step(_extend(Request(3, (11, 12, 13))), ex)
    note = ex.notes["padded_rows"]
    assert note.startswith("padded rows checked (batch of 3 token(s) padded to the captured 4)"), note
    for name in ("input_ids", "positions", "out_cache_loc", "extend_start_loc", "req_pool_indices", "seq_lens_cpu"):
        assert name in note, note


def test_stale_padded_tail_fires(session, monkeypatch):
    """SGLang's registry stops resetting padded tails: the 3-token batch's row 3 keeps the 8-token batch's."""
    from sglang.srt.model_executor.cuda_graph_buffer_registry import GraphSlot

    monkeypatch.setattr(GraphSlot, "reset_padding", lambda self, raw_n, padded_n: None)
    session.step(_extend(Request(1, (3, 5, 7, 9)), Request(2, (4, 6, 8, 2))), Example("prefill_pcg", {}))
    with pytest.raises(OracleFailure) as raised:
        session.step(_extend(Request(3, (11, 12, 13))), Example("prefill_pcg", {}))
    failure = raised.value
    assert failure.oracle == "eager-equality"
    assert "padded row 3 of the prefill static input `input_ids` holds 9, SGLang promises 0" in failure.diagnosis
    assert "batch of 3 token(s) padded to the captured 4" in failure.diagnosis
    assert failure.details["static_input"] == "input_ids" and failure.details["row"] == 3


RUNNER = "srt/model_executor/runner/prefill_cuda_graph_runner.py"
SLOT_PADDING = "        ] + [0] * (self._capture_req_slots - raw_bs)\n"


@pytest.mark.subprocess  # a fresh process capturing the chunked-prefix variants (Triton's CPU interpreter): ~60 s
def test_chunked_prefix_slots_padded_wrong_fire(tmp_path):
    """The runner pads the unused request slots of a chunked-prefix replay with 1-token prefixes instead of
    zero-length ones: the first batch with a cached prefix and fewer requests than slots fails, naming the chunk
    seq_lens input and the first unused slot."""
    from tests.mutant_runs import assert_mutant_fails

    record = assert_mutant_fails(
        "suites/test_prefill_pcg.py::test_full_chunked_prefix", "prefix_slots_padded_with_one",
        [(RUNNER, SLOT_PADDING, SLOT_PADDING.replace("[0]", "[1]"))], tmp_path, "eager-equality",
        ["of the prefill static input `prefix chunk seq_lens", "SGLang promises 0", "zero-length prefix"])
    assert record["details"]["static_input"].startswith("prefix chunk seq_lens")
