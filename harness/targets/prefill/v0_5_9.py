"""Prefill layout of SGLang 0.5.9 to 0.5.13: `PiecewiseCudaGraphRunner` in
`srt/model_executor/piecewise_cuda_graph_runner.py`, before the 0.5.14 runner refactor.

What runs is SGLang's own: the runner's constructor (`install_torch_compiled` with `SGLangBackend`, the warm-up
compile of every size, `capture()` with the pieces' `CUDAPiecewiseBackend`), and the dispatch of every forward
(`ModelRunner._forward_raw` -> `forward_extend` -> `can_run` / `replay` -> `replay_prepare`, or SGLang's eager
paths). Known bug 2 lives in 0.5.9's `replay_prepare`; 0.5.10 normalises MIXED.

What differs from 0.5.14+: config is `server_args.piecewise_cuda_graph_tokens` / `piecewise_cuda_graph_compiler`
(set past the parser, which disables PCG on a CPU; the harness constructs the runner directly: `NOTE`); process
state lives in `compilation/piecewise_context_manager.py` (0.5.9 also gates the compiled forward with
`compile._COMPILE_ENABLED`); only the torch.compile piecewise backend; `can_run` checks the token count only, so
every extend-family mode replays the EXTEND capture (the server disables PCG with speculative decoding or dLLM:
`unproduced_modes`); `sgl_kernel` is imported unconditionally (the device layer's stand-in); the attention op finds
its backend through the piecewise forward context's batch, or the model runner's on SGLang's eager path.
"""
from __future__ import annotations

import contextlib
from types import SimpleNamespace
from typing import Any

import torch

from harness.devices import sgl_kernel_standin
from harness.models.prefill_model import HIDDEN, NUM_LAYERS, VOCAB, PrefillForCausalLM, bind_sglang_hooks
from harness.oracles import state_at_rest
from harness.targets.prefill.base import (
    KvCache, Layout, PrefillTarget, build_forward_batch, make_attention_backend_class,
)
from harness.targets.sglang_plumbing import ensure_tp_group, load, tp_group
from harness.targets import require_modules
from harness.versions import module_exists

RUNNER_MODULE = "sglang.srt.model_executor.piecewise_cuda_graph_runner"
CONTEXT_MODULE = "sglang.srt.compilation.piecewise_context_manager"
COMPILE_MODULE = "sglang.srt.compilation.compile"
REQUIRED = (RUNNER_MODULE, CONTEXT_MODULE, COMPILE_MODULE, "sglang.srt.compilation.backend",
            "sglang.srt.compilation.cuda_piecewise_backend", "sglang.srt.model_executor.model_runner")
NOTE = ("SGLang <= 0.5.13: the harness constructs PiecewiseCudaGraphRunner directly (as "
        "ModelRunner.init_piecewise_cuda_graphs does) with server_args.piecewise_cuda_graph_tokens / "
        "piecewise_cuda_graph_compiler set past the parser (ServerArgs disables PCG on a CPU)")


def make_server_args(case, device: str) -> Any:
    from sglang.srt.server_args import ServerArgs

    server_args = ServerArgs(model_path="dummy", device=device, max_running_requests=case.max_requests,
                             chunked_prefill_size=max(case.capture_tokens), disable_radix_cache=True)
    server_args.piecewise_cuda_graph_tokens = list(case.capture_tokens)
    server_args.piecewise_cuda_graph_compiler = case.compiler
    if hasattr(server_args, "enable_piecewise_cuda_graph"):  # 0.5.9
        server_args.enable_piecewise_cuda_graph = True
    if hasattr(server_args, "disable_piecewise_cuda_graph"):  # 0.5.10+
        server_args.disable_piecewise_cuda_graph = False
    try:  # what the scheduler publishes process-wide in these releases
        from sglang.srt.server_args import set_global_server_args_for_scheduler

        set_global_server_args_for_scheduler(server_args)
    except ImportError:
        pass
    return server_args


def make_model_runner(model, attn_backend, kv, server_args, case):
    """A `ModelRunner` (SGLang's class: its `_forward_raw`, `forward_extend`, `forward_decode` ... are the real
    ones) with its constructor skipped: the attributes the <= 0.5.13 piecewise runner and dispatch read."""
    from sglang.srt.distributed import parallel_state
    from sglang.srt.model_executor.model_runner import ModelRunner
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    runner = ModelRunner.__new__(ModelRunner)
    hf_config = SimpleNamespace(architectures=["HarnessPrefillModel"], model_type="harness_prefill")
    model_config = SimpleNamespace(
        is_encoder_decoder=False, hidden_size=HIDDEN, vocab_size=VOCAB, dtype=torch.float32, hf_config=hf_config,
        hf_text_config=hf_config, attention_arch=None, context_len=kv.req_to_token.shape[1], is_multimodal=False,
        num_hidden_layers=NUM_LAYERS)
    attributes = dict(
        device=kv.device, gpu_id=0, model=model, model_config=model_config, server_args=server_args,
        dtype=torch.float32, attn_backend=attn_backend, decode_attn_backend=attn_backend,
        req_to_token_pool=attn_backend.req_to_token_pool, token_to_kv_pool=None, token_to_kv_pool_allocator=None,
        lora_manager=None, spec_algorithm=SpeculativeAlgorithm.NONE, is_draft_worker=False, is_generation=True,
        support_pp=False, is_multimodal=False, is_hybrid_swa=False, is_hybrid=False,
        pp_group=SimpleNamespace(is_first_rank=True, is_last_rank=True, world_size=1, rank_in_group=0),
        pp_size=1, tp_size=1, tp_rank=0, dp_size=1, dp_rank=None, moe_ep_rank=0, moe_ep_size=1,
        attention_layers=[None] * NUM_LAYERS, moe_layers=[None] * NUM_LAYERS, moe_fusions=[None] * NUM_LAYERS,
        max_running_requests=case.max_requests, max_total_num_tokens=kv.num_slots,
        graph_runner=None, piecewise_cuda_graph_runner=None, eplb_manager=None, forward_pass_id=0,
        hisparse_coordinator=None,  # read by _forward_raw from 0.5.10
        tp_group=parallel_state.get_tp_group(),
    )
    for name, value in attributes.items():
        object.__setattr__(runner, name, value)
    return runner


def _attention_backend_of_forward(fallback):
    """The attention backend of the running forward: the piecewise forward context's batch (capture, replay),
    else the model runner's (SGLang's eager path sets no context in these releases)."""
    context = load(CONTEXT_MODULE)

    def attn_backend():
        forward_context = context.get_forward_context()
        batch = getattr(forward_context, "forward_batch", None)
        backend = getattr(batch, "attn_backend", None)
        return backend if backend is not None else fallback

    return attn_backend


def _never() -> bool:
    return False


def _no_breakable():
    return None


class Target(PrefillTarget):
    """Builds the doubles and constructs the real <= 0.5.13 runner (which compiles and captures)."""

    def __init__(self, case, layout: Layout, device: str = "cpu"):
        super().__init__(case, layout, device)
        self.server_args = make_server_args(case, device)
        ensure_tp_group()
        self.kv = KvCache(case.max_requests, case.max_context, device=device)
        self.attn_backend = make_attention_backend_class()(self.kv)
        bind_sglang_hooks(attn_backend=_attention_backend_of_forward(self.attn_backend), in_breakable=_never,
                          eager_on_graph=_no_breakable)
        self.model = PrefillForCausalLM(body=case.body).to(device)
        self.model_runner = make_model_runner(self.model, self.attn_backend, self.kv, self.server_args, case)
        with state_at_rest.watching(self.model, f"the piecewise runner's capture of {list(case.capture_tokens)}",
                                    tp_group=tp_group()):
            self.runner = load(RUNNER_MODULE, "PiecewiseCudaGraphRunner")(self.model_runner)
        self.model_runner.piecewise_cuda_graph_runner = self.runner

    def _forward_batch(self, batch):
        forward_batch = build_forward_batch(batch, self.kv)
        # what ScheduleBatch -> ForwardBatch.init_new binds in these releases
        forward_batch.req_to_token_pool = self.model_runner.req_to_token_pool
        forward_batch.attn_backend = self.attn_backend
        return forward_batch

    def forward(self, batch):
        forward_batch = self._forward_batch(batch)
        out = type(self.model_runner)._forward_raw(self.model_runner, forward_batch, False, None)
        return out.logits_output.next_token_logits, bool(out.can_run_graph), forward_batch

    def eager(self, batch) -> torch.Tensor:
        forward_batch = self._forward_batch(batch)
        self.attn_backend.init_forward_metadata(forward_batch)
        with _compiled_forward_off():
            return self.model(forward_batch.input_ids, forward_batch.positions, forward_batch).next_token_logits

    def can_run_graph(self, batch) -> bool:
        return bool(self.runner.can_run(self._forward_batch(batch)))

    def state_probes(self) -> dict:
        context = load(CONTEXT_MODULE)
        compile_module = load(COMPILE_MODULE)

        probes = {
            "piecewise_context.pcg_capture_stream": (context.get_pcg_capture_stream, None),
            "piecewise_context.in_piecewise_cuda_graph": (context.is_in_piecewise_cuda_graph, False),
            "piecewise_context.in_pcg_torch_compile": (context.is_in_pcg_torch_compile, False),
            "piecewise_context.forward_context": (context.get_forward_context, None),
            "device.stream_capturing": (torch.get_device_module(self.device).is_current_stream_capturing, False),
        }
        enabled = getattr(compile_module, "_COMPILE_ENABLED", None)  # 0.5.9: set_compiled's context variable
        if enabled is not None:
            probes["compile.compile_enabled"] = (enabled.get, False)
        return probes


@contextlib.contextmanager
def _compiled_forward_off():
    """The eager reference runs the original forward: outside every gate of the compiled trampoline."""
    compile_module = load(COMPILE_MODULE)
    set_compiled = getattr(compile_module, "set_compiled", None)  # 0.5.9
    with (set_compiled(False) if set_compiled is not None else contextlib.nullcontext()):
        yield


LAYOUT = Layout(name="0.5.9-0.5.13 (srt/model_executor/piecewise_cuda_graph_runner.py, replay_prepare)",
                target_class=Target, backends=("tc_piecewise",),
                refused_modes=("DECODE", "IDLE", "SPLIT_PREFILL", "PREBUILT"),
                unproduced_modes=("TARGET_VERIFY", "DRAFT_EXTEND", "DRAFT_EXTEND_V2", "DLLM_EXTEND"), note=NOTE)


def detect() -> Layout | None:
    if not module_exists(RUNNER_MODULE):
        return None
    require_modules(REQUIRED, "the pre-0.5.14 prefill layout")
    sgl_kernel_standin.ensure()  # before anything imports SGLang's graph runners
    return LAYOUT
