"""SGLang's `ViTCudaGraphRunner` on a real vision tower: SGLang's own tower class for a VLM family (tiny config,
random weights), under `SGLANG_VIT_ENABLE_CUDA_GRAPH=1` and `--mm-attention-backend triton_attn` (the backend the
runner captures on CUDA below Hopper; its `context_attention_fwd` run by Triton's CPU interpreter).

Towers (`ENCODERS`):
- qwen2_5_vl: `Qwen2_5_VisionTransformer`, windowed blocks beside full-attention ones (two cu_seqlens layouts in one
  graph, the output permuted back by the window index). Its constructor builds the runner only on CUDA; the
  target builds it as that constructor does there (`ViTCudaGraphRunner(self)`, `enable_cg`).
- qwen3_vl: `Qwen3VLMoeVisionModel`, deepstack mergers captured beside the main merger; its constructor builds the
  runner on every device (`graph_runners`).

A forward of an image batch (`grids`: per image (t, h, w) in patches, h and w multiples of the merge size) goes
through the tower's own `forward_with_cuda_graph` (the runner captures a graph per attention layout, then replays)
and its eager `forward`; `check_images` holds the first to the second.
"""
from __future__ import annotations

import dataclasses
import importlib
from typing import Any

import torch

from harness.errors import HarnessError, PathMissing
from harness.oracles import state_at_rest
from harness.targets.sglang_plumbing import tp_group

RUNNER_MODULE = "sglang.srt.multimodal.vit_cuda_graph_runner"
KERNEL_MODULES = ("sglang.kernels.ops.attention.prefill_attention",)  # the vision Triton attention's kernel
PATCH = 2  # patch size, in pixels: an input row holds 3 channels x PATCH x PATCH
# Weights drawn in +-WEIGHT_RANGE: wide enough that attention is sharp (scores of order 10), so which keys and which
# rotary phases a graph reads shows in its output; at +-0.1 the softmax is nearly uniform and a stale rotary
# workspace moves the output by 1e-7 only
WEIGHT_RANGE = 0.5


@dataclasses.dataclass(frozen=True)
class Encoder:
    name: str
    module: str  # SGLang's model module
    tower: str  # its vision tower class
    config: tuple[str, str]  # transformers' vision config (module, class)
    fields: dict
    runner_attribute: str  # where the tower keeps its runner
    builds_runner: bool  # whether its constructor builds the runner off CUDA


_COMMON = dict(hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=48, patch_size=PATCH,
               spatial_merge_size=2, temporal_patch_size=1, in_channels=3)
ENCODERS = {
    "qwen2_5_vl": Encoder("qwen2_5_vl", "sglang.srt.models.qwen2_5_vl", "Qwen2_5_VisionTransformer",
                          ("transformers.models.qwen2_5_vl.configuration_qwen2_5_vl", "Qwen2_5_VLVisionConfig"),
                          dict(_COMMON, depth=2, window_size=8, fullatt_block_indexes=[1]),
                          "cuda_graph_runner", builds_runner=False),
    "qwen3_vl": Encoder("qwen3_vl", "sglang.srt.models.qwen3_vl", "Qwen3VLMoeVisionModel",
                        ("transformers.models.qwen3_vl.configuration_qwen3_vl", "Qwen3VLVisionConfig"),
                        dict(_COMMON, depth=3, num_position_embeddings=16, deepstack_visual_indexes=[0, 1]),
                        "graph_runners", builds_runner=True),
}


def encoder_missing(name: str) -> str | None:
    """Why the installed SGLang (or transformers) cannot build encoder `name` with its runner, or None."""
    from harness.versions import module_exists, sglang_version

    encoder = ENCODERS[name]
    for module, owner in ((RUNNER_MODULE, "ViTCudaGraphRunner"), (encoder.module, encoder.tower),
                          encoder.config):
        if not module_exists(module) or not hasattr(importlib.import_module(module), owner):
            return f"SGLang {sglang_version()} (or its transformers) has no {module}.{owner}: no ViT graphs of " \
                   f"the {name} tower to drive"
    return None


def kernels():
    from harness.devices.triton_interpreter import interpret_kernels

    return interpret_kernels(tuple(importlib.import_module(m) for m in KERNEL_MODULES))


class VitTarget:
    """One vision tower of `ENCODERS[name]` with SGLang's runner; `max_context_len`: the runner's initial rotary
    workspace (qwen2_5_vl's constructor argument; None: sized by the first image batch); `precise_interpolation`:
    `--enable-precise-embedding-interpolation` (qwen3_vl's graph path interpolates its position embeddings at
    half-pixel centres without it, where its eager path always takes linspace coordinates, as transformers does:
    the suite's strict finding `test_findings_qwen3_vl_graph_interpolates_position_embeddings_otherwise`)."""

    def __init__(self, name: str, *, max_context_len: int | None = None, seed: int = 0,
                 precise_interpolation: bool = True) -> None:
        if name not in ENCODERS:
            raise HarnessError(f"no encoder {name!r}: one of {sorted(ENCODERS)}")
        reason = encoder_missing(name)
        if reason:
            raise PathMissing(reason)
        from sglang.srt.server_args import ServerArgs

        from harness.models.real import cpu_construction
        from harness.targets.sglang_plumbing import ensure_tp_group, publish_server_args

        self.encoder = encoder = ENCODERS[name]
        publish_server_args(ServerArgs(model_path="dummy", mm_attention_backend="triton_attn", device="cpu",
                                       enable_precise_embedding_interpolation=precise_interpolation))
        ensure_tp_group()
        config = getattr(importlib.import_module(encoder.config[0]), encoder.config[1])(**encoder.fields)
        tower_class = getattr(importlib.import_module(encoder.module), encoder.tower)
        extra = {"max_context_len": max_context_len} if not encoder.builds_runner else {}
        with cpu_construction():
            tower = tower_class(config, **extra)
        generator = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for parameter in tower.parameters():
                parameter.copy_((torch.rand(parameter.shape, generator=generator) * 2 - 1) * WEIGHT_RANGE)
        tower.requires_grad_(False)
        if not encoder.builds_runner:  # as its constructor does on CUDA under SGLANG_VIT_ENABLE_CUDA_GRAPH
            from sglang.srt.multimodal.vit_cuda_graph_runner import ViTCudaGraphRunner

            tower.cuda_graph_runner, tower.enable_cg = ViTCudaGraphRunner(tower), True
        self.tower = tower

    @property
    def runner(self) -> Any:
        return getattr(self.tower, self.encoder.runner_attribute)

    def pixels(self, grids: list[tuple[int, int, int]], seed: int) -> tuple[torch.Tensor, torch.Tensor]:
        """An image batch's patch rows and its `grid_thw`."""
        rows = sum(t * h * w for t, h, w in grids)
        generator = torch.Generator().manual_seed(seed)
        return torch.randn(rows, 3 * PATCH * PATCH, generator=generator), torch.tensor(grids, dtype=torch.int64)

    def graph_forward(self, x, grid_thw) -> torch.Tensor:
        """The tower's graph path, with `SGLANG_VIT_ENABLE_CUDA_GRAPH=1` (its vision attention reads the captured
        cu_seqlens workspace only then); a capture it makes for a new layout is held to `state-at-rest`."""
        import pytest

        with pytest.MonkeyPatch.context() as patches, kernels(), torch.no_grad(), state_at_rest.watching(
                self.tower, f"the ViT runner's graph forward of grids {grid_thw.tolist()}", tp_group=tp_group()):
            patches.setenv("SGLANG_VIT_ENABLE_CUDA_GRAPH", "1")
            return self.tower.forward_with_cuda_graph(x, grid_thw).clone()

    def eager_forward(self, x, grid_thw) -> torch.Tensor:
        """The tower's forward with the graph switch off: its `forward` dispatches to the graph path while
        `SGLANG_VIT_ENABLE_CUDA_GRAPH` (qwen3_vl) or `enable_cg` (qwen2_5_vl) is on."""
        import pytest

        with pytest.MonkeyPatch.context() as patches, kernels(), torch.no_grad():
            patches.setenv("SGLANG_VIT_ENABLE_CUDA_GRAPH", "0")
            if hasattr(self.tower, "enable_cg"):
                patches.setattr(self.tower, "enable_cg", False)
            return self.tower.forward(x, grid_thw)


# -- what each image batch must replay -----------------------------------------------------------------------------
def attention_layout(encoder: Encoder, grids) -> tuple:
    """The key the runner must file an image batch's graph under, from the grids alone: its patch rows, the
    full-attention boundaries and, for a windowed tower, the window boundaries (cumulative patch counts).

    Full attention: qwen2_5_vl attends within each image (t * h * w patches), qwen3_vl within each frame (h * w).
    Windows (qwen2_5_vl): each frame's merged grid (h / m x w / m units of m * m patches, m the merge size) is cut
    row-major into windows of W x W units, W = window_size / m / patch; edge windows hold what is left. E.g. one
    image (1, 4, 8), m 2, W 2: a 2 x 4 merged grid, two 2 x 2 windows of 16 patches: (32, (32,), (0, 16, 32)).
    Equal layouts share a graph (an image (1, 8, 4) files under the same key as (1, 4, 8)); any other pair must not.
    """
    fields, merge = encoder.fields, encoder.fields["spatial_merge_size"]
    full, total = [0], 0
    for t, h, w in grids:
        frames = [h * w] * t if encoder.name == "qwen3_vl" else [t * h * w]
        for size in frames:
            total += size
            full.append(total)
    if "window_size" not in fields:
        return total, tuple(full), None
    window = fields["window_size"] // merge // fields["patch_size"]
    windows = [0]
    for t, h, w in grids:
        rows, cols = h // merge, w // merge
        for _ in range(t):
            for r in range(0, rows, window):
                for c in range(0, cols, window):
                    windows.append(windows[-1] + (min(r + window, rows) - r) * (min(c + window, cols) - c) * merge ** 2)
    return total, tuple(full), tuple(windows)


def check_images(target: VitTarget, batches: list[tuple[list[tuple[int, int, int]], int]], where: str) -> list:
    """Each image batch (grids, pixel seed) through the tower's graph path, then eagerly: the graph forward
    captures one graph exactly when its attention layout is new (`attention_layout`) and replays exactly one
    (`graph-replay`), and its output equals eager's (`eager-equality`, within `same`'s tolerance: the kernels read
    the capture's metadata, eager its own). Returns the layouts, in order."""
    from harness.counter import counter
    from harness.oracles import OracleFailure
    from harness.oracles.eager import assert_matches_eager
    from harness.oracles.graph_replay import check_eager_forward, replay_delta

    seen: dict = {}
    layouts = []
    for step, (grids, seed) in enumerate(batches):
        here = f"{where}, image batch {step} (grids {grids})"
        layout = attention_layout(target.encoder, grids)
        layouts.append(layout)
        new = layout not in seen
        seen.setdefault(layout, step)
        x, grid_thw = target.pixels(grids, seed)
        mark = counter.mark()
        got = target.graph_forward(x, grid_thw)
        since = counter.since(mark)
        captured, replayed = since["num_graphs_captured"], since["num_graph_replays"]
        if captured != int(new) or replayed != 1:
            shares = "" if new else f" (batch {seen[layout]} has its attention layout)"
            raise OracleFailure("graph-replay", f"{here}: captured {captured} graph(s) and replayed {replayed}; a "
                                f"{'new' if new else 'known'} attention layout{shares} captures {int(new)} and "
                                f"replays 1 (layout {layout}; the runner holds {len(target.runner.block_graphs)} "
                                f"graph(s) for {len(seen)} layout(s))", layout=str(layout), captured=captured,
                                replayed=replayed)
        mark = counter.mark()
        eager = target.eager_forward(x, grid_thw)
        check_eager_forward(replay_delta(counter.since(mark)), context=here)
        try:
            assert_matches_eager(got, eager, exact=False)
        except OracleFailure as failure:
            earlier = [s for s, g in enumerate(batches[:step]) if attention_layout(target.encoder, g[0])[0] ==
                       layout[0] and attention_layout(target.encoder, g[0]) != layout]
            also = f"; earlier batches {earlier} have as many patches in another layout" if earlier else ""
            raise OracleFailure(failure.oracle, f"{here}: the graph's output differs from eager: "
                                f"{failure.diagnosis}{also}", **failure.details) from None
    return layouts
