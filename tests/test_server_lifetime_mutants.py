"""Mutants of SGLang that only a served lifetime shows (`suites/test_server_lifetime.py`), in-process: one line of an
installed SGLang function recompiled by `edited` and set with pytest's MonkeyPatch (undone after).

- padding_reset_skips_a_row: the decode registry's `GraphSlot.reset_padding` resets the padded tail from the second
  padded row on. On a fresh server the tail holds the zeros it was allocated with, so the first padded replay is
  right (the real-model suite's pinned padded example passes on this mutant); after a wider batch the first padded
  row keeps a live request's pool row and KV slot, and its padded replay writes into that slot. The served program
  (three requests, one leaves, two padded to three) fails naming the row and what it holds.
- prefill_on_the_last_forward_metadata: SGLang's eager runner plans no attention metadata for an extend batch, so a
  prefill runs on whatever the backend's last forward left (after capture, the last captured graph's decode
  metadata: the first prefill crashes in the eager runner). Only the served stack prefills through the eager
  runner on the backend the graphs use; the scheduled suite prefills on a backend of its own and passes it.

Each mutant fails the served program, and the state machine itself finds it within its gate budget; clean SGLang
passes the same program.
"""
from __future__ import annotations

import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis.stateful import run_state_machine_as_test

from harness.devices import get_device
from harness.oracles import OracleFailure
from harness.record import Example
from harness.targets.decode import served
from harness.targets.decode.base import DecodeCase
from harness.targets.decode.scheduled import Admit, Decode, Finish
from tests.mutant_runs import edited

pytestmark = pytest.mark.slow  # builds a real model and captures its graphs in this process

# capture 1 and 3, four request rows: three requests decode on the graph of 3, the middle one leaves, the other two
# decode padded to 3 (the padded row the one the leaver held), then a new prompt is prefilled after those replays
# and everyone decodes again
GROW_THEN_SHRINK = (DecodeCase(capture_bs=(1, 3), max_running_requests=4), [
    Admit(((5, 17, 3, 99, 40), (7, 8, 9, 10, 11, 12), (3, 4, 5))), Decode(), Finish((1,)), Decode(),
    Admit(((9, 90, 9, 9),)), Decode()])


@pytest.fixture
def device():
    reason = served.missing()
    if reason:
        pytest.skip(reason)
    with get_device("cpu").install("cuda"):
        yield


def serve(program=GROW_THEN_SHRINK) -> None:
    from suites.real_common import run_served_program

    case, steps = program
    run_served_program(Example("real_models_served", {}), case, "dense", steps)


def skip_first_padded_row(monkeypatch) -> None:
    from sglang.srt.model_executor.cuda_graph_buffer_registry import GraphSlot

    monkeypatch.setattr(GraphSlot, "reset_padding", edited(
        GraphSlot.reset_padding, "tail = self.buffer[raw_n:padded_n]", "tail = self.buffer[raw_n + 1:padded_n]"))


def plan_no_extend_metadata(monkeypatch) -> None:
    from sglang.srt.model_executor.runner.eager_runner import EagerRunner

    monkeypatch.setattr(EagerRunner, "_execute_extend", edited(
        EagerRunner._execute_extend, "forward_batch.needs_forward_metadata_init()", "False"))


def test_clean_sglang_serves_the_lifetime(device):
    serve()


def test_padding_reset_skipping_a_row_fails_after_a_wider_batch(device, monkeypatch):
    skip_first_padded_row(monkeypatch)
    serve((GROW_THEN_SHRINK[0], GROW_THEN_SHRINK[1][:2]))  # a fresh server's padded tail is still zero: no failure
    with pytest.raises(OracleFailure) as failure:
        serve()
    # step 3 (after the leaver's finish): the seq_len the leaver's row held, where the fill value belongs
    assert "replay 3: padded rows 2..2 of `seq_lens` hold [4], SGLang's padding policy promises 1 (batch of 2 " \
        "request(s) padded to 3)" in failure.value.diagnosis, failure.value.diagnosis


def test_prefill_on_stale_metadata_fails(device, monkeypatch):
    plan_no_extend_metadata(monkeypatch)
    with pytest.raises(AttributeError) as failure:  # the backend's last metadata is a decode graph's: no extend fields
        serve()
    assert any(entry.path.name == "eager_runner.py" for entry in failure.traceback), failure.value


@pytest.mark.parametrize("mutant", [skip_first_padded_row, plan_no_extend_metadata])
def test_the_state_machine_finds_each_mutant(device, monkeypatch, mutant):
    """Generation, not the pinned program: the gate's machine (dense family, drawn capacity and steps) fails."""
    from suites.test_server_lifetime import ServerLifetime

    mutant(monkeypatch)
    with pytest.raises(Exception) as failure:
        run_state_machine_as_test(ServerLifetime, settings=settings(
            max_examples=12, stateful_step_count=12, deadline=None, database=None, derandomize=True,
            phases=[Phase.generate], suppress_health_check=list(HealthCheck)))  # the verdict only: no shrinking
    assert failure.value is not None
