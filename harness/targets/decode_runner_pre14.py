"""Adapter for SGLang's decode graph runner as released in 0.5.9 to 0.5.13 (`CudaGraphRunner` in
`srt/model_executor/cuda_graph_runner.py`; with `--personality npu` its subclass `NPUGraphRunner` in
`srt/hardware_backend/npu/graph_runner/npu_graph_runner.py`): the layout before the 0.5.14 runner refactor.

Selected by `harness.targets.decode_runner.resolve_layout()` (family "cuda_graph_runner"); `decode_runner.make_target`
then constructs `DecodeTargetPre14`, a `DecodeTarget` whose release-specific pieces are replaced here, so the suite
and its oracles use one interface. Everything that is specific to these releases lives in this module.

What runs is SGLang's own: the runner's constructor (`get_batch_sizes_to_capture` of the runner module,
`set_torch_compile_config`, its input buffers, the LoRA manager's `init_cuda_graph_batch_info`, then `capture()`
inside `graph_capture()`: for every size, largest first, `patch_model(...)` looked up as a global of the runner
module at call time, two warm-ups and the capture in `device_module.graph`), and the replay through `can_run` and
`replay` (`replay_prepare`: the buffers' `populate_from_forward_batch`, padding to the next captured size, the
attention backend's replay metadata; the graph replay; the output sliced to the real rows). With the NPU
personality: `NPUGraphRunner.__init__` rebinds `cuda_graph_runner.patch_model` to its `patch_model_npu` (and never
restores it; the target does, after every construction), captures into `torch.npu.NPUGraph` (the device layer's
stand-in) and replays with `graph.update(cpu_update_input=...)` from a thread.

How these releases differ from 0.5.14+, handled here:
- Config: no `runtime_context` nor `CudaGraphConfig`: the runner reads `server_args.cuda_graph_bs` (a list),
  `enable_torch_compile`, `torch_compile_max_bs` and `enable_lora`, set as the scheduler's global server args.
  `ModelRunner.init_device_graphs` picks the runner by `model_runner.device` (cuda: `CudaGraphRunner`, npu:
  `NPUGraphRunner`, cpu: `CPUGraphRunner`, which needs a CPU build of sgl-kernel); the harness constructs the
  personality's runner class directly, as that method does (`NOTE`, recorded with every example).
- `patch_model` and `set_torch_compile_config` live in the runner module itself (the layout's `decoration_module`);
  the NPU override `patch_model_npu` is installed there by `NPUGraphRunner.__init__`. The `patch_model` contract
  applies unchanged.
- Attention-backend API: `init_forward_metadata_capture_cuda_graph` / `init_forward_metadata_replay_cuda_graph`
  and `init_forward_metadata` (0.5.14+: `init_forward_metadata_out_graph`); no forward context: a model reads
  `forward_batch.attn_backend`, which `ForwardBatch.init_new` (eager, replay) and the runner (capture) set.
- LoRA: no "nolora" graph variant (the constructor has no `record_nolora_graph`): such a case runs without it and
  the target lists the option in `dropped_options`, which the suite records.
- NPU branches taken by `is_npu()`: 0.5.10-0.5.13 share input buffers between runners through a process-wide pool
  keyed by name (`input_buffers._forward_input_buffer_pool`) except on NPU; the virtual device cannot make
  `is_npu()` true process-wide, so with the npu personality the runner is constructed with that module's
  `is_npu` answering True (SGLang's own NPU branch: no sharing), as on an NPU.
- `sgl_kernel` is imported unconditionally (memory_pool_host.py): the device layer's import-time stand-in
  (`harness.devices.sgl_kernel_standin`) where the real package cannot load.
"""
from __future__ import annotations

import contextlib
import dataclasses
import importlib
import os
from types import SimpleNamespace
from typing import Any

from harness.models.decode_model import bind_sglang_hooks
from harness.targets import decode_runner
from harness.versions import module_exists

RUNNER_MODULE = "sglang.srt.model_executor.cuda_graph_runner"
NPU_RUNNER_MODULE = "sglang.srt.hardware_backend.npu.graph_runner.npu_graph_runner"
INPUT_BUFFERS_MODULE = "sglang.srt.model_executor.input_buffers"
REQUIRED = (RUNNER_MODULE, INPUT_BUFFERS_MODULE, "sglang.srt.layers.attention.base_attn_backend")
NOTE = ("SGLang <= 0.5.13: the harness constructs the personality's CudaGraphRunner / NPUGraphRunner directly (as "
        "ModelRunner.init_device_graphs does by device) with server_args.cuda_graph_bs, enable_torch_compile, "
        "torch_compile_max_bs and enable_lora (set past the parser) published as the scheduler's global server args")

LAYOUT = decode_runner.Layout(
    name="0.5.9-0.5.13 (srt/model_executor/cuda_graph_runner.py, CudaGraphRunner)",
    runner_module=RUNNER_MODULE,
    runner_class="CudaGraphRunner",
    base_module=RUNNER_MODULE,  # get_batch_sizes_to_capture
    decoration_module=RUNNER_MODULE,  # patch_model, set_torch_compile_config
    npu_runner_module=NPU_RUNNER_MODULE,
    npu_runner_class="NPUGraphRunner",
    npu_patch_name="patch_model_npu",
    full_backend_module=RUNNER_MODULE,  # no separate backend: the runner captures in `_capture_graph` itself
    family="cuda_graph_runner",
    note=NOTE,
)


def resolve_layout(version: str) -> decode_runner.Layout:
    """The pre-0.5.14 layout, or a skip reason naming what this release lacks."""
    missing = [name for name in REQUIRED if not module_exists(name)]
    if missing:
        return dataclasses.replace(LAYOUT, skip_reason=(
            f"sglang {version} has the pre-0.5.14 decode layout but misses module(s) {', '.join(missing)}"))
    from harness.devices import sgl_kernel_standin

    sgl_kernel_standin.ensure()  # before anything imports SGLang's graph runners
    return LAYOUT


def make_server_args(case, device: str) -> Any:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # "dummy" must never be looked up on the Hub
    from sglang.srt.server_args import ServerArgs, set_global_server_args_for_scheduler

    server_args = ServerArgs(model_path="dummy", device=device, cuda_graph_bs=list(case.capture_bs),
                             enable_torch_compile=case.enable_torch_compile,
                             torch_compile_max_bs=case.torch_compile_max_bs,
                             max_running_requests=case.max_running_requests)
    server_args.enable_lora = bool(case.lora)  # the parser would want adapter paths
    set_global_server_args_for_scheduler(server_args)
    return server_args


def make_attention_backend_class():
    """The decode attention double (`decode_runner.make_attention_backend_class`) behind the attention-backend API
    of these releases: capture and replay hand over the runner's static `seq_lens`, eager the batch."""
    base = decode_runner.make_attention_backend_class()

    class DecodeAttentionDoublePre14(base):
        def init_forward_metadata(self, forward_batch) -> None:
            self.init_forward_metadata_out_graph(forward_batch)

        def init_forward_metadata_capture_cuda_graph(self, bs, num_tokens, req_pool_indices, seq_lens,
                                                     encoder_lens, forward_mode, spec_info) -> None:
            self.init_forward_metadata_out_graph(SimpleNamespace(seq_lens=seq_lens), in_capture=True)

        def init_forward_metadata_replay_cuda_graph(self, bs, req_pool_indices, seq_lens, seq_lens_sum,
                                                    encoder_lens, forward_mode, spec_info, seq_lens_cpu=None) -> None:
            self.init_forward_metadata_out_graph(SimpleNamespace(seq_lens=seq_lens))

    return DecodeAttentionDoublePre14


def _attn_backend_of_batch(forward_batch):
    return forward_batch.attn_backend


def _no_lora_variant():
    return None  # these releases capture one graph per size, always with the LoRA step


class DecodeTargetPre14(decode_runner.DecodeTarget):
    """`DecodeTarget` on the <= 0.5.13 layout: same construction (SGLang's constructor captures), oracles and replay
    (`can_run` + `replay`, the fallbacks `DecodeTarget` already takes where `can_run_graph` / `execute` are
    missing); the config, the attention double, the model-runner attributes and the eager context are these
    releases'."""

    FAMILY = "cuda_graph_runner"

    def _publish_config(self, case, device: str) -> Any:
        return make_server_args(case, device)

    def _shared_parts(self, case, device: str):
        bind_sglang_hooks(attn_backend=_attn_backend_of_batch, lora_variant=_no_lora_variant)
        return decode_runner.shared_parts(case.lora, device, make_attention_backend_class)

    def _make_model_runner(self, case, device: str) -> SimpleNamespace:
        model_runner = super()._make_model_runner(case, device)
        model_runner.token_to_kv_pool = None  # read at capture into the ForwardBatch (the model needs no KV cache)
        return model_runner

    @contextlib.contextmanager
    def _npu_backend_selection(self):
        """With the npu personality, while SGLang's constructor runs (and only then), the input-buffer module's
        `is_npu()` answers True, so `share_buffers` takes its NPU branch (0.5.10-0.5.13; 0.5.9 has no pool). The
        0.5.14+ `resolve_decode_backend` selection of the base class does not exist in these releases."""
        module = importlib.import_module(INPUT_BUFFERS_MODULE)
        if self.personality != "npu" or not hasattr(module, "is_npu"):
            yield
            return
        original = module.is_npu
        module.is_npu = lambda: True
        try:
            yield
        finally:
            module.is_npu = original

    def forward_batch(self, batch):
        fb = super().forward_batch(batch)
        fb.attn_backend = self.attn_backend  # what ForwardBatch.init_new binds in these releases
        return fb

    def _model_runner_forward_context(self):
        return contextlib.nullcontext()  # these releases have no forward context

    def _eager_context(self, fb):
        fb.attn_backend = self.eager_attn_backend  # the model reads the batch's backend; no forward context
        return contextlib.nullcontext()
