"""Decode layout of SGLang 0.5.9 to 0.5.13: `CudaGraphRunner` in `srt/model_executor/cuda_graph_runner.py` (with
`--personality npu` its subclass `NPUGraphRunner`), before the 0.5.14 runner refactor.

What differs from 0.5.14+: config is `server_args.cuda_graph_bs`, `enable_torch_compile`, `torch_compile_max_bs`
and `enable_lora` as the scheduler's global server args (the harness constructs the personality's runner class
directly, as `ModelRunner.init_device_graphs` does by device: `NOTE`); `patch_model` lives in the runner module;
the attention backend's capture/replay API is `init_forward_metadata_{capture,replay}_cuda_graph` and the model
reads `forward_batch.attn_backend` (no forward context); no "nolora" graph variant; 0.5.10-0.5.13 share input
buffers through a process-wide pool except on NPU (`is_npu()`, answered True for the npu personality while
SGLang's constructor runs); `sgl_kernel` is imported unconditionally (the device layer's stand-in)."""
from __future__ import annotations

import contextlib
import dataclasses
from types import SimpleNamespace
from typing import Any
from unittest import mock

from harness.devices import sgl_kernel_standin
from harness.models.decode_model import bind_sglang_hooks
from harness.targets.decode.base import DecodeTarget, Layout, make_attention_backend_class
from harness.targets.sglang_plumbing import load
from harness.targets import require_modules
from harness.versions import module_exists

RUNNER_MODULE = "sglang.srt.model_executor.cuda_graph_runner"
INPUT_BUFFERS_MODULE = "sglang.srt.model_executor.input_buffers"
REQUIRED = (RUNNER_MODULE, INPUT_BUFFERS_MODULE, "sglang.srt.layers.attention.base_attn_backend")
NOTE = ("SGLang <= 0.5.13: the harness constructs the personality's CudaGraphRunner / NPUGraphRunner directly (as "
        "ModelRunner.init_device_graphs does by device) with server_args.cuda_graph_bs, enable_torch_compile, "
        "torch_compile_max_bs and enable_lora (set past the parser) published as the scheduler's global server args")


def attention_backend_class():
    """The decode attention double behind these releases' API: capture and replay hand over the runner's static
    `seq_lens`, eager the batch."""

    class DecodeAttentionDoublePre14(make_attention_backend_class()):
        def init_forward_metadata(self, forward_batch) -> None:
            self.init_forward_metadata_out_graph(forward_batch)

        def init_forward_metadata_capture_cuda_graph(self, bs, num_tokens, req_pool_indices, seq_lens,
                                                     encoder_lens, forward_mode, spec_info) -> None:
            self.init_forward_metadata_out_graph(SimpleNamespace(
                seq_lens=seq_lens, seq_lens_sum=int(seq_lens.sum()), spec_info=spec_info), in_capture=True)

        def init_forward_metadata_replay_cuda_graph(self, bs, req_pool_indices, seq_lens, seq_lens_sum,
                                                    encoder_lens, forward_mode, spec_info, seq_lens_cpu=None) -> None:
            self.init_forward_metadata_out_graph(SimpleNamespace(seq_lens=seq_lens, seq_lens_sum=seq_lens_sum,
                                                                 spec_info=spec_info))

    return DecodeAttentionDoublePre14


def _no_lora_variant():
    return None  # these releases capture one graph per size, always with the LoRA step


class Target(DecodeTarget):
    attention_backend_class = staticmethod(attention_backend_class)

    def __init__(self, *args, **kwargs) -> None:
        from sglang.srt.model_executor.forward_batch_info import ForwardBatch

        self.batch_holds_backend = "attn_backend" in {f.name for f in dataclasses.fields(ForwardBatch)}
        bind_sglang_hooks(attn_backend=self._attn_backend_of_batch, lora_variant=_no_lora_variant)
        super().__init__(*args, **kwargs)

    def _attn_backend_of_batch(self, forward_batch):
        """The releases bind it on the batch (a ForwardBatch field); main's trees between them and the 0.5.14
        refactor (this runner module, no such field) publish it only in SGLang's forward context, which a replay
        does not enter: there, the one the harness set for an eager run, else the runner's, captured with."""
        if self.batch_holds_backend:  # decided before any trace: Dynamo cannot trace dataclasses.fields
            return forward_batch.attn_backend
        return getattr(forward_batch, "attn_backend", None) or self.attn_backend

    def publish_config(self, case, device: str) -> Any:
        from sglang.srt.server_args import ServerArgs, set_global_server_args_for_scheduler

        server_args = ServerArgs(model_path="dummy", device=device, cuda_graph_bs=list(case.capture_bs),
                                 enable_torch_compile=case.enable_torch_compile,
                                 torch_compile_max_bs=case.torch_compile_max_bs,
                                 max_running_requests=case.max_running_requests,
                                 disable_cuda_graph_padding=case.disable_padding)
        server_args.enable_lora = bool(case.lora)  # the parser would want adapter paths
        set_global_server_args_for_scheduler(server_args)
        return server_args

    def make_model_runner(self, case, device: str) -> SimpleNamespace:
        model_runner = super().make_model_runner(case, device)
        model_runner.token_to_kv_pool = None  # read at capture into the ForwardBatch (the model needs no KV cache)
        return model_runner

    def construction_patches(self):
        module = load(INPUT_BUFFERS_MODULE)
        if self.personality != "npu" or not hasattr(module, "is_npu"):
            return contextlib.nullcontext()
        return mock.patch.object(module, "is_npu", lambda: True)

    def forward_batch(self, batch):
        fb = super().forward_batch(batch)
        fb.attn_backend = self.attn_backend  # what ForwardBatch.init_new binds in these releases
        return fb

    def eager_context(self, fb):
        fb.attn_backend = self.eager_attn_backend  # the model reads the batch's backend; no forward context
        return contextlib.nullcontext()


LAYOUT = Layout(
    name="0.5.9-0.5.13 (srt/model_executor/cuda_graph_runner.py, CudaGraphRunner)",
    runner_module=RUNNER_MODULE,
    runner_class="CudaGraphRunner",
    decoration_module=RUNNER_MODULE,
    npu_runner_module="sglang.srt.hardware_backend.npu.graph_runner.npu_graph_runner",
    npu_runner_class="NPUGraphRunner",
    target_class=Target,
    note=NOTE,
)


def detect() -> Layout | None:
    if not module_exists(RUNNER_MODULE):
        return None
    require_modules(REQUIRED, "the pre-0.5.14 decode layout")
    sgl_kernel_standin.ensure()  # before anything imports SGLang's graph runners
    return LAYOUT
