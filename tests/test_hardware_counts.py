"""On a real GPU the graph counts come from wrapping `torch.cuda.CUDAGraph` (`devices.counting_cuda_graphs`), not
from the virtual device. Without a GPU: the wrapping counts whatever graph class torch has (here a stand-in with
CUDAGraph's methods), the graph-replay oracle fires on those counts when a graph forward falls back to eager, the
wrapping is undone, and the suites select the hardware branch and skip with the reason."""
from __future__ import annotations

import pytest
import torch

from harness.counter import counter
from harness.devices import counting_cuda_graphs, get_device
from harness.mutants import run_pytest
from harness.oracles import OracleFailure
from harness.oracles.graph_replay import check_eager_forward, check_graph_forward, replay_delta


class FakeCUDAGraph:
    """CUDAGraph's methods, doing nothing: what SGLang's backends call on the class."""

    def capture_begin(self, *args, **kwargs):
        pass

    def capture_end(self):
        pass

    def replay(self):
        pass


@pytest.fixture
def graph_class(monkeypatch):
    monkeypatch.setattr(torch.cuda, "CUDAGraph", FakeCUDAGraph)
    return FakeCUDAGraph


def test_cuda_graph_methods_bump_the_counter_and_are_restored(graph_class):
    originals = {name: getattr(graph_class, name) for name in ("capture_begin", "capture_end", "replay")}
    with counting_cuda_graphs():
        graph = torch.cuda.CUDAGraph()
        with counter.expect(num_graphs_created=1, num_graphs_captured=1, num_graph_replays=2):
            graph.capture_begin(None, capture_error_mode="global")
            graph.capture_end()
            graph.replay()
            graph.replay()
    assert {name: getattr(graph_class, name) for name in originals} == originals
    with counter.expect(num_graph_replays=0):
        graph.replay()  # unwrapped again: not counted


def test_graph_replay_oracle_fires_on_an_eager_fallback_from_hardware_counts(graph_class):
    with counting_cuda_graphs():
        graph = torch.cuda.CUDAGraph()
        graph.capture_begin()
        graph.capture_end()
        mark = counter.mark()
        graph.replay()  # a forward that replayed its graph
        check_graph_forward(replay_delta(counter.since(mark)), 1, context="replayed")
        mark = counter.mark()  # a forward that took the graph path but ran eagerly: no replay
        with pytest.raises(OracleFailure, match="replayed no captured graph: it ran eagerly"):
            check_graph_forward(replay_delta(counter.since(mark)), 1, context="fell back")
        mark = counter.mark()  # SGLang's eager path that captured at serve time
        graph.capture_begin()
        graph.capture_end()
        with pytest.raises(OracleFailure, match="created 1"):
            check_eager_forward(replay_delta(counter.since(mark)))


def test_the_gpu_device_counts_graphs():
    assert get_device("cuda").counts_graphs and get_device("cpu").counts_graphs
    assert not get_device("npu").counts_graphs


@pytest.mark.subprocess
@pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is here: the suites run on it instead")
def test_capture_suites_on_cuda_skip_with_the_reason_without_a_gpu(tmp_path):
    code, output = run_pytest(["suites/test_prefill_pcg.py", "suites/test_decode_capture.py", "--device", "cuda",
                               "-q", "-rs", "--report-dir", str(tmp_path)], timeout=300)
    assert code == 0, output[-3000:]
    assert "no CUDA GPU visible (torch.cuda.is_available() is False)" in output, output[-3000:]
    # only the device-independent tests run (the static scan, the ragged layouts' arithmetic); every capture skips
    assert "2 passed" in output and "skipped" in output and "failed" not in output, output[-500:]
