"""The overlap WAR barrier (`harness/targets/decode/overlap.py`): mutants of where the decode runner publishes its
read-done event must fail stream-order, naming both streams; clean SGLang passes (the suite's gate run)."""
from __future__ import annotations

import pytest

from tests.mutant_runs import Mutant, assert_caught

pytestmark = pytest.mark.subprocess  # every test here runs a suite in another process

RUNNER = "srt/model_executor/runner/decode_cuda_graph_runner.py"
TEST = "suites/test_decode_capture.py::test_overlap_war_barrier_orders_shared_writes"

MUTANTS = {
    # No in-graph marker, yet an in-replay declaration resolves to "reads done before the replay": the event is
    # recorded before the graph reads the shared table, so the next staging write races with those reads.
    "in_replay_resolves_to_pre_replay": Mutant(
        test=f"{TEST}[IN_REPLAY]",
        edits=[(RUNNER, "            # no in-graph marker (e.g. HIP): only a post-replay event covers its reads\n"
                        "            return SharedReadEnds.POST_REPLAY",
                "            return SharedReadEnds.PRE_REPLAY")],
        oracle="stream-order",
        texts=["unordered access across streams", "writing to"]),
    # The post-replay event recorded before the replay runs.
    "post_replay_event_before_replay": Mutant(
        test=f"{TEST}[POST_REPLAY]",
        edits=[(RUNNER, "            output = self.backend.replay(self._replay_graph_key, forward_batch)\n\n"
                        "            if shared_read_ends is SharedReadEnds.IN_REPLAY:\n"
                        "                self._publish_read_done(in_graph=True)\n\n"
                        "            if shared_read_ends is SharedReadEnds.POST_REPLAY:\n"
                        "                self._publish_read_done(in_graph=False)\n",
                "            if shared_read_ends is SharedReadEnds.POST_REPLAY:\n"
                "                self._publish_read_done(in_graph=False)\n\n"
                "            output = self.backend.replay(self._replay_graph_key, forward_batch)\n\n"
                "            if shared_read_ends is SharedReadEnds.IN_REPLAY:\n"
                "                self._publish_read_done(in_graph=True)\n")],
        oracle="stream-order",
        texts=["unordered access across streams", "writing to"]),
}


@pytest.mark.parametrize("name", sorted(MUTANTS))
def test_mutant_is_caught_by_stream_order(name, tmp_path):
    assert_caught(name, MUTANTS[name], tmp_path)
