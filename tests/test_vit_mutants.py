"""Mutants of SGLang's ViT CUDA-graph runner (`harness/targets/encoder/vit.py`), in-process: one line of an installed
SGLang method recompiled by `edited` and set with pytest's MonkeyPatch (undone after). Each must fail the encoder
check naming what went wrong, and clean SGLang must pass the same batches, on both towers.

- key_ignores_the_layout: `ViTCudaGraphRunner._get_graph_key` keys by patch count alone, so two images of 16
  patches replay the graph captured for one image of 32 (its attention boundaries baked in): `graph-replay` names
  the batch that captured nothing for a new layout.
- replay_keeps_the_captured_pixels: `replay` no longer copies the batch's patches into the graph's input, so a
  known layout replays the pixels of the batch that captured it: `eager-equality` names the batch.
- workspace_rebound_after_growth: `_get_sin_cos_ws` forgets the rotary rows each graph captured: after a larger
  batch grows the workspace, an earlier layout's replay writes its rotary embedding into the new workspace while
  its graph reads the old one (which the other layouts of its size overwrote): `eager-equality`.
- window_order_not_restored (qwen2_5_vl): `replay` drops the inverse window permutation of the output.
"""
from __future__ import annotations

import pytest

from harness.devices import get_device
from harness.oracles import OracleFailure
from harness.targets.encoder.vit import VitTarget, check_images, encoder_missing
from tests.mutant_runs import edited

pytestmark = pytest.mark.slow  # builds vision towers and captures their graphs in this process

# three layouts of 32 patches (one transposed: the same windows), 72 patches (the rotary workspace grows), the first
# layout again with other pixels
BATCHES = [([(1, 4, 8)], 1), ([(1, 8, 4)], 2), ([(1, 4, 4), (1, 4, 4)], 3), ([(2, 6, 6)], 4), ([(1, 4, 8)], 5)]


@pytest.fixture
def device(monkeypatch):
    reason = encoder_missing("qwen2_5_vl")
    if reason:
        pytest.skip(reason)
    monkeypatch.setenv("SGLANG_VIT_ENABLE_CUDA_GRAPH", "1")
    with get_device("cpu").install("cuda"):
        yield


def run(name: str = "qwen2_5_vl") -> None:
    check_images(VitTarget(name, max_context_len=8 if name == "qwen2_5_vl" else None), BATCHES, name)


def runner_class():
    from sglang.srt.multimodal.vit_cuda_graph_runner import ViTCudaGraphRunner

    return ViTCudaGraphRunner


def mutate(monkeypatch, name: str, old: str, new: str) -> None:
    owner = runner_class()
    monkeypatch.setattr(owner, name, edited(getattr(owner, name), old, new))


@pytest.mark.parametrize("tower", ["qwen2_5_vl", "qwen3_vl"])
def test_clean_sglang_passes_the_encoder_check(device, tower):
    run(tower)


@pytest.mark.parametrize("tower", ["qwen2_5_vl", "qwen3_vl"])
def test_key_ignoring_the_layout_fails_naming_the_batch(device, monkeypatch, tower):
    mutate(monkeypatch, "_get_graph_key", "return (x_3d.shape[0], attention_layout_key)",
           "return (x_3d.shape[0], None)")
    with pytest.raises(OracleFailure) as failure:
        run(tower)
    assert failure.value.oracle == "graph-replay"
    assert "image batch 2 (grids [(1, 4, 4), (1, 4, 4)]): captured 0 graph(s) and replayed 1; a new attention " \
           "layout captures 1" in failure.value.diagnosis


def test_replay_keeping_the_captured_pixels_fails_naming_the_batch(device, monkeypatch):
    mutate(monkeypatch, "replay", "self.block_input[graph_key].copy_(x_3d)", "pass")
    with pytest.raises(OracleFailure) as failure:
        run()
    assert failure.value.oracle == "eager-equality"
    assert "image batch 1 (grids [(1, 8, 4)]): the graph's output differs from eager" in failure.value.diagnosis


def test_workspace_rebound_after_growth_fails(device, monkeypatch):
    mutate(monkeypatch, "_get_sin_cos_ws", "graph_ws = self._sin_cos_ws_by_graph.get(graph_key)\n",
           "graph_ws = None\n")
    with pytest.raises(OracleFailure) as failure:
        run()
    assert failure.value.oracle == "eager-equality"
    assert "image batch 4 (grids [(1, 4, 8)]): the graph's output differs from eager" in failure.value.diagnosis


def test_window_order_not_restored_fails(device, monkeypatch):
    mutate(monkeypatch, "replay", "out = out.index_select(0, output_indices)", "out = out")
    with pytest.raises(OracleFailure) as failure:
        run()
    assert failure.value.oracle == "eager-equality"
    assert "image batch 0 (grids [(1, 4, 8)])" in failure.value.diagnosis
