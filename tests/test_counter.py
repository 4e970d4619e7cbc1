"""The harness's one counter: exact deltas, a failure that shows before, after and expected for each count, and
Dynamo compiles counted even across `torch._dynamo.reset()` (which drops compile callbacks)."""
from __future__ import annotations

import pytest
import torch

from harness.counter import Counter, counter


def test_since_gives_each_counts_growth():
    counts = Counter(num_graphs_created=2, num_graph_replays=5)
    mark = counts.mark()
    counts.num_graph_replays += 3
    counts.num_graphs_captured += 1
    assert counts.since(mark) == {"num_dynamo_frames_compiled": 0, "num_graphs_created": 0,
                                  "num_graphs_captured": 1, "num_graph_replays": 3,
                                  "num_platform_backend_compiles": 0}


def test_expect_passes_on_exact_deltas_and_ignores_unnamed_counts():
    counts = Counter()
    with counts.expect(num_graph_replays=2, num_graphs_created=0):
        counts.num_graph_replays += 2
        counts.num_graphs_captured += 7  # not named: not checked


def test_a_failing_expect_prints_before_after_and_expected_for_each_wrong_count():
    counts = Counter(num_graph_replays=4, num_graphs_captured=1)
    with pytest.raises(AssertionError) as failure:
        with counts.expect(num_graph_replays=2, num_graphs_captured=1, num_graphs_created=1):
            counts.num_graph_replays += 1  # one replay where two were expected
            counts.num_graphs_created += 1  # as expected: not reported
    message = str(failure.value)
    assert "2 count(s) not as expected" in message
    assert "num_graph_replays: before 4, after 5, expected +2 (got +1)" in message
    assert "num_graphs_captured: before 1, after 1, expected +1 (got +0)" in message
    assert "num_graphs_created" not in message


def test_expect_names_the_counts_when_given_an_unknown_one():
    with pytest.raises(TypeError, match="no count named num_graphs_seen; counts: num_dynamo"):
        with counter.expect(num_graphs_seen=1):
            pass


def test_dynamo_frames_are_counted_after_a_reset():
    torch._dynamo.reset()  # drops every compile callback, the counter's too: mark() registers it again
    compiled = torch.compile(lambda x, n: x * n, backend="eager")
    with counter.expect(num_dynamo_frames_compiled=2):  # the first call, then a recompile on n's guard
        compiled(torch.ones(1), 2)
        compiled(torch.ones(1), 2)
        compiled(torch.ones(1), 3)
