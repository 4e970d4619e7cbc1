"""Prefill layout of SGLang 0.5.14 and later (and main trees of mid-2026): `PrefillCudaGraphRunner` in
`srt/model_executor/runner/`, dispatched by SGLang's own `ModelRunner._forward_raw` (`can_run_graph`, then
`execute` = `load_batch` + the backend's replay, or SGLang's eager runner).

Backends: `breakable` and `full` chosen through the config as a server would; `tc_piecewise`
(`TcPiecewiseCudaGraphBackend` -> `install_torch_compiled` -> `SGLangBackend` -> `CUDAPiecewiseBackend` per piece),
which 0.5.2x's config no longer offers though the runner still dispatches on it: the harness sets it past the
config and builds that backend for the runner's constructor only (`NOTE`, recorded with every example).
Main trees differ by feature, resolved where used: no `runtime_context` (config as the scheduler's global server
args), no `EagerRunner` (eager extend in `ModelRunner.forward_extend`), eager buffer registries (mid-June 2026).
"""
from __future__ import annotations

import contextlib
import dataclasses
import importlib
import inspect
from types import SimpleNamespace
from typing import Any
from unittest import mock

import torch

from harness.errors import PathMissing
from harness.models.prefill_model import (
    HIDDEN, NUM_LAYERS, VOCAB, PrefillForCausalLM, PrefillForConditionalGeneration,
    PrefillLoRAManagerDouble, scores,
)
from harness.oracles import state_at_rest
from harness.targets import require_modules
from harness.targets.prefill.base import (
    BACKEND_ADMISSION, CAPTURE_FAILURE_MESSAGE, CONTEXT_LIMITS, DEEPSTACK_WARMUP, EXECUTE_HIDDEN_GUARD, LORA_CAPTURE,
    MIXED_CHUNK_CHECK, POOLED_OUTPUT, Batch, KvCache, Layout, PrefillCase, PrefillTarget, build_forward_batch,
    make_attention_backend_class,
)
from harness.targets.sglang_plumbing import (
    can_publish_config, ensure_tp_group, forward_context, load, publish_server_args, runtime_context, tp_group,
)
from harness.versions import module_exists, sglang_version

RUNNER_MODULE = "sglang.srt.model_executor.runner.prefill_cuda_graph_runner"
TC_BACKEND_MODULE = "sglang.srt.model_executor.runner_backend.tc_piecewise_cuda_graph_backend"
COMPILE_PHASE_MODULE = "sglang.srt.compilation.compile_phase"
CONFIG_MODULE = "sglang.srt.model_executor.cuda_graph_config"
MODEL_RUNNER_MODULE = "sglang.srt.model_executor.model_runner"
EAGER_RUNNER_MODULE = "sglang.srt.model_executor.runner.eager_runner"
REQUIRED = (RUNNER_MODULE, TC_BACKEND_MODULE, "sglang.srt.compilation.compile", "sglang.srt.compilation.backend",
            "sglang.srt.compilation.cuda_piecewise_backend", COMPILE_PHASE_MODULE, CONFIG_MODULE, MODEL_RUNNER_MODULE)
# feature -> (the runner class, or None for its module; the name the feature needs there). MIXED_CHUNK_CHECK and
# LORA_CAPTURE: a name the constructor's source must read (a check inside __init__, not a name of its own).
SOURCE_FEATURES = (MIXED_CHUNK_CHECK, LORA_CAPTURE)
FEATURE_NAMES = {CONTEXT_LIMITS: ("PrefillCudaGraphRunner", "_validate_max_context_capacity"),
                 EXECUTE_HIDDEN_GUARD: ("PrefillCudaGraphRunner", "_validate_capture_hidden_mode"),
                 CAPTURE_FAILURE_MESSAGE: (None, "prefill_failure_msg"),
                 DEEPSTACK_WARMUP: ("PrefillCudaGraphRunner", "run_dummy_multimodal_deepstack_forward"),
                 MIXED_CHUNK_CHECK: ("PrefillCudaGraphRunner", "enable_mixed_chunk"),
                 POOLED_OUTPUT: (None, "EmbeddingPoolerOutput"),
                 LORA_CAPTURE: ("PrefillCudaGraphRunner", "_capture_lora"),
                 BACKEND_ADMISSION: ("PrefillCudaGraphRunner", "_backend_can_run_prefill_cuda_graph")}
NOTE = ("SGLang 0.5.23 config rejects tc_piecewise ('tc_piecewise was removed'): the harness sets "
        "PhaseConfig.backend='tc_piecewise' directly and constructs TcPiecewiseCudaGraphBackend "
        "for the runner in place of resolve_prefill_backend")


def captured_metadata_cap(case: PrefillCase) -> int | None:
    """The request cap of a bucket's captured attention metadata the runner must honour (None: none): the case's
    `captured_metadata_max_requests` on breakable with the captured-metadata contract, where the release's runner
    reads the backend's `prefill_cuda_graph_max_batch_size` (its `_captured_attn_metadata_max_bs`, 0.5.23)."""
    if case.backend != "breakable" or not case.captured_attn_metadata or case.captured_metadata_max_requests is None:
        return None
    if not module_exists(RUNNER_MODULE):
        return None
    runner = getattr(importlib.import_module(RUNNER_MODULE), "PrefillCudaGraphRunner", None)
    return case.captured_metadata_max_requests if hasattr(runner, "_captured_attn_metadata_max_bs") else None


def extend_limit(limit: int):
    """An attention backend's `can_run_prefill_cuda_graph` (the double's): a batch where some request extends by
    more than `limit` tokens is refused, read from the batch as dLLM's backend reads it (`extend_seq_lens_cpu`)."""
    def can_run_prefill_cuda_graph(forward_batch) -> bool:
        return max(forward_batch.extend_seq_lens_cpu or [0]) <= limit

    return can_run_prefill_cuda_graph


def publish_config(case: PrefillCase, device: str, flags: dict | None = None, validate=None) -> Any:
    """Publish a ServerArgs whose prefill phase uses `case.backend` (tc_piecewise set past the parser), with further
    server `flags`, passed through `validate` (SGLang's own checks of them) before it is published."""
    from sglang.srt.model_executor.cuda_graph_config import CudaGraphConfig, PhaseConfig
    from sglang.srt.server_args import ServerArgs

    backend = "breakable" if case.backend == "tc_piecewise" else case.backend
    fields = {f.name for f in dataclasses.fields(PhaseConfig)}
    extra = {}
    if "full_prefill_max_req" in fields:  # 0.5.2x; 0.5.14's PhaseConfig has no such field
        extra["full_prefill_max_req"] = case.full_prefill_max_req if case.backend == "full" else None
    chunk_budget = max(case.capture_tokens)
    if case.prefix_chunk_tokens is not None:  # chunked-prefix full capture (0.5.2x), its capacity from the source
        if case.prefix_chunk_source == "config":
            extra["full_prefill_prefix_chunk_tokens"] = case.prefix_chunk_tokens
        elif case.prefix_chunk_source == "chunked_prefill_size":
            chunk_budget = case.prefix_chunk_tokens
        else:  # "max_bs": no chunk budget (chunked prefill off)
            chunk_budget, extra["max_bs"] = -1, case.prefix_chunk_tokens
    if case.max_context_size is not None:  # fixed-context graphs (0.5.2x)
        extra["max_context_size"] = case.max_context_size
    prefill = PhaseConfig(backend=backend, bs=list(case.capture_tokens), **extra)
    server_args = ServerArgs(
        model_path="dummy", device=device,
        cuda_graph_config=CudaGraphConfig(decode=PhaseConfig(backend="disabled"), prefill=prefill),
        max_running_requests=case.max_requests, chunked_prefill_size=chunk_budget,
        disable_radix_cache=True, disable_chunked_prefix_cache=case.prefix_chunk_tokens is None,
        enable_mixed_chunk=case.enable_mixed_chunk,
        **({"enable_deterministic_inference": True} if case.deterministic else {}), **(flags or {}),
    )
    if validate is not None:
        server_args = validate(server_args)
    if not publish_server_args(server_args):
        # 0.5.14 to 0.5.1x and main trees without runtime_context: no published config namespaces; the runner
        # and the backends read `model_runner.server_args.cuda_graph_config`.
        # Their EagerRunner sizes its static input buffers by chunked_prefill_size; the suite sends batches beyond
        # the largest capture (the eager fallback) up to the context length, as a larger chunk size would.
        server_args.chunked_prefill_size = max(case.max_context, max(case.capture_tokens))
        if case.backend == "tc_piecewise":
            server_args.cuda_graph_config.prefill.backend = "tc_piecewise"
            server_args.cuda_graph_config.prefill.tc_compiler = case.compiler
        return server_args
    if case.backend == "tc_piecewise":
        live = runtime_context().get_exec().graph.cuda_graph_config.prefill
        live.backend = "tc_piecewise"
        live.tc_compiler = case.compiler
    return server_args


class _GraphSharedOutput:
    max_rows = 0

    def get_logits_buffer(self, vocab_size: int, rows: int):
        return None


def make_kv_index_translator(kv: KvCache):
    """SGLang's own `KVIndexTranslator` over the harness's `req_to_token` (no unified pool: no translation)."""
    if not module_exists("sglang.srt.mem_cache.kv_index_translator"):
        return None  # up to 0.5.1x: no translator, the runner reads req_to_token directly
    from sglang.srt.mem_cache.kv_index_translator import KVIndexTranslator

    return KVIndexTranslator(req_to_token=kv.req_to_token, token_to_kv_pool_allocator=None, token_to_kv_pool=None,
                             page_size=1, device=kv.device)



def parallel_view() -> SimpleNamespace:
    """Up to 0.5.19 the runner's own parallel view (`ModelRunner.ps`): one rank of one."""
    return SimpleNamespace(tp_rank=0, tp_size=1, pp_rank=0, pp_size=1, dp_rank=None, dp_size=1, attn_dp_size=1,
                           moe_dp_size=1, moe_ep_rank=0, moe_ep_size=1, attn_cp_size=1, attn_dcp_rank=0,
                           attn_dcp_size=1)


def make_model_runner(model, attn_backend, kv: KvCache, server_args, case: PrefillCase):
    """A `ModelRunner` (SGLang's class, so its `_forward_raw` dispatch and helpers are the real ones) with its
    constructor skipped: the attributes the 0.5.23 prefill runner, eager runner and dispatch read."""
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    ModelRunner = load(MODEL_RUNNER_MODULE, "ModelRunner")
    runner = ModelRunner.__new__(ModelRunner)
    hf_config = SimpleNamespace(architectures=["HarnessPrefillModel"], model_type="harness_prefill",
                                max_source_positions=0)
    model_config = SimpleNamespace(
        is_encoder_decoder=False, hidden_size=HIDDEN, vocab_size=VOCAB, dtype=torch.float32, hf_config=hf_config,
        hf_text_config=hf_config, attention_arch=None, context_len=kv.req_to_token.shape[1],
        is_multimodal=case.multimodal,
        hc_hidden_size=None, num_hidden_layers=NUM_LAYERS)
    pp_group = SimpleNamespace(is_first_rank=True, is_last_rank=True, world_size=1, rank_in_group=0)
    attributes = dict(
        device=kv.device, gpu_id=0, model=model, model_config=model_config, server_args=server_args,
        dtype=torch.float32, attn_backend=attn_backend, decode_attn_backend=attn_backend,
        req_to_token_pool=attn_backend.req_to_token_pool, token_to_kv_pool=SimpleNamespace(
            layer_transfer_counter=None),
        lora_manager=None,
        ngram_embedding_manager=SimpleNamespace(enabled=False, table=None),
        spec_algorithm=SpeculativeAlgorithm.NONE, is_draft_worker=False, is_generation=True, support_pp=False,
        graph_shared_output=_GraphSharedOutput(), kv_index_translator=make_kv_index_translator(kv),
        pp_group=pp_group, attention_layers=[None] * NUM_LAYERS,
        mha_companion_layers=[SimpleNamespace(kind="MHA companion") if case.mha_companion else None] * NUM_LAYERS,
        moe_layers=[None] * NUM_LAYERS, moe_fusions=[None] * NUM_LAYERS, kv_cache_dtype=torch.float32,
        hisparse_coordinator=None, device_timer=None, canary_manager=None, shared_read_done_event=None,
        max_running_requests=case.max_requests, max_total_num_tokens=kv.num_slots,
        decode_cuda_graph_runner=None, prefill_cuda_graph_runner=None, _kernel_warmed_up=False,
        layer_info=SimpleNamespace(start_layer=0, end_layer=NUM_LAYERS), capture_head_hooks=[],
        ps=parallel_view(),
        capture_tail_hooks=[],
    )
    from sglang.srt.distributed import parallel_state

    attributes["tp_group"] = parallel_state.get_tp_group()  # read off the runner up to 0.5.19
    # Plain attributes up to 0.5.1x that later releases derive (properties there): set only where the class
    # does not define them.
    for name, value in dict(is_multimodal=case.multimodal, is_hybrid_swa=False, is_hybrid=False, tp_size=1, tp_rank=0,
                            pp_size=1, dp_size=1, moe_ep_rank=0, moe_ep_size=1, page_size=1,
                            token_to_kv_pool_allocator=None, forward_pass_id=0, eplb_manager=None,
                            graph_runner=None, piecewise_cuda_graph_runner=None).items():
        if not hasattr(ModelRunner, name):
            attributes.setdefault(name, value)
    # Main trees of mid-June 2026: the eager path copies each batch into registries the constructor makes.
    registry_class = getattr(load(MODEL_RUNNER_MODULE), "_EagerBufferRegistry", None)
    if registry_class is not None:
        attributes.update(_eager_decode_registry=registry_class(), _eager_prefill_registry=registry_class())
    for name, value in attributes.items():
        object.__setattr__(runner, name, value)
    return runner



@contextlib.contextmanager
def _tc_piecewise_resolution(case: PrefillCase):
    """While the runner is constructed, `resolve_prefill_backend` in the runner module builds the
    TcPiecewiseCudaGraphBackend for 'tc_piecewise' (0.5.2x's resolver raises for that name)."""
    runner_module = load(RUNNER_MODULE)
    if case.backend != "tc_piecewise" or not hasattr(runtime_context(), "get_exec"):
        yield  # up to 0.5.1x the config still offers tc_piecewise: SGLang's own resolver builds it
        return
    original = runner_module.resolve_prefill_backend
    backend_class = load(TC_BACKEND_MODULE, "TcPiecewiseCudaGraphBackend")

    def resolve_prefill_backend(cuda_graph_runner):
        from sglang.srt.runtime_context import get_exec

        if get_exec().graph.cuda_graph_config.prefill.backend == "tc_piecewise":
            return backend_class(cuda_graph_runner)
        return original(cuda_graph_runner)

    with mock.patch.object(runner_module, "resolve_prefill_backend", resolve_prefill_backend):
        yield


def _runner_lacks(name: str, what: str) -> str | None:
    """Why the installed runner cannot drive `what`: it has no method `name` (None: it has)."""
    if hasattr(load(RUNNER_MODULE, "PrefillCudaGraphRunner"), name):
        return None
    return f"SGLang {sglang_version()}: PrefillCudaGraphRunner has no {name} ({what})"


class _InterpretedKernel:
    """One of SGLang's Triton kernels run by Triton's own CPU interpreter: the virtual device has no Triton driver.
    Launched as SGLang launches it (`kernel[grid](*args)`); `tl.cdiv` is interpreted too while it runs."""

    def __init__(self, kernel):
        from triton.runtime.interpreter import InterpretedFunction

        self.interpreted = InterpretedFunction(kernel.fn)

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            import triton.language as tl
            from triton.runtime.interpreter import InterpretedFunction

            with mock.patch.object(tl, "cdiv", InterpretedFunction(tl.cdiv.fn)):
                return self.interpreted[grid](*args, **kwargs)
        return launch


class Target(PrefillTarget):
    """Publishes config, builds the doubles and constructs the real runner (which compiles and captures)."""

    def __init__(self, case: PrefillCase, layout: Layout, device: str = "cpu"):
        super().__init__(case, layout, device)
        self._patches = contextlib.ExitStack()
        try:
            self._build(case, device)
        except BaseException:
            # a runner SGLang refused to build: its kernel stand-ins must not wrap the next target's
            self._patches.close()
            raise

    def _build(self, case: PrefillCase, device: str) -> None:
        if device == "cpu" and case.prefix_chunk_tokens is not None:
            runner_module = load(RUNNER_MODULE)
            kernel = runner_module.create_chunked_prefix_cache_kv_indices
            self._patches.enter_context(mock.patch.object(
                runner_module, "create_chunked_prefix_cache_kv_indices", _InterpretedKernel(kernel)))
        self.server_args = publish_config(case, device)
        ensure_tp_group()
        self.kv = KvCache(case.max_requests, case.max_context, device=device)
        model_class = PrefillForConditionalGeneration if case.wrapped else PrefillForCausalLM
        self.model = model_class(multimodal=case.multimodal, body=case.body, pooled=case.pooled).to(device)
        self.attn_backend = make_attention_backend_class()(self.kv)
        self.attn_backend.prefill_cuda_graph_default_max_seq_len = case.backend_max_seq_len
        if case.backend_max_extend is not None:  # the backend's own admission, read by the runner at construction
            self.attn_backend.can_run_prefill_cuda_graph = extend_limit(case.backend_max_extend)
        self.attn_backend.supports_prefill_cuda_graph_max_context_size = case.fixed_context_metadata
        self.attn_backend.use_captured_forward_metadata_for_breakable_cuda_graph = case.captured_attn_metadata
        self.attn_backend.prefill_cuda_graph_max_batch_size = captured_metadata_cap(case)
        self.model_runner = make_model_runner(self.model, self.attn_backend, self.kv, self.server_args, case)
        if case.lora:  # a LoRA server: SGLang's manager (a double) and the body reading its batch info
            self.model_runner.lora_manager = self.model.model.lora_manager = PrefillLoRAManagerDouble(device)
        if module_exists(EAGER_RUNNER_MODULE):  # absent where ModelRunner.forward_extend runs eager itself
            EagerRunner = load(EAGER_RUNNER_MODULE, "EagerRunner")
            self.model_runner.eager_runner = EagerRunner(self.model_runner)  # its warm-up is a no-op off CUDA
        with _tc_piecewise_resolution(case), state_at_rest.watching(
                self.model, f"the prefill runner's {case.backend} capture of {list(case.capture_tokens)}",
                tp_group=tp_group()):
            self.runner = load(RUNNER_MODULE, "PrefillCudaGraphRunner")(self.model_runner)
        self.model_runner.prefill_cuda_graph_runner = self.runner

    @classmethod
    def backend_gap(cls, backend: str, device: str) -> str | None:
        """The release's config does not offer `backend` for prefill, or (on the virtual device) its graph code
        calls CUDA APIs the virtual device does not stand in for."""
        version = sglang_version()
        if backend == "tc_piecewise":
            return None
        config = load(CONFIG_MODULE)
        allowed = getattr(config, "ALLOWED_BACKENDS_PER_PHASE", None)  # 0.5.14-0.5.1x
        if allowed is not None:
            names = {str(getattr(b, "value", b)) for b in allowed.get(getattr(config, "Phase").PREFILL, ())}
            if backend not in names:
                return (f"SGLang {version}: the config rejects prefill backend {backend!r} "
                        f"(ALLOWED_BACKENDS_PER_PHASE[prefill] = {sorted(names)})")
        if backend == "breakable" and device == "cpu":
            from sglang.srt.model_executor.runner_backend_utils.breakable_cuda_graph import breakable_cuda_graph

            if "torch.cuda.current_stream" in inspect.getsource(breakable_cuda_graph.BreakableCUDAGraph.replay):
                return (f"SGLang {version}: BreakableCUDAGraph.replay calls torch.cuda.current_stream() (and its "
                        "capture torch.cuda.stream / cuda-python's cudaStreamGetCaptureInfo) directly; the virtual "
                        "device does not stand in for those, so this backend needs a GPU here")
        return None

    @classmethod
    def multimodal_gap(cls) -> str | None:
        """Multimodal replay (the input_embeds slot refreshed from the live embeddings) arrived after 0.5.14."""
        return _runner_lacks("_fill_input_embeds_slot", "multimodal prefill replay")

    @classmethod
    def chunked_prefix_gap(cls) -> str | None:
        """Chunked-prefix full capture arrived in 0.5.2x."""
        return _runner_lacks("_prepare_chunked_prefix_capture", "chunked-prefix full capture")

    @classmethod
    def feature_gap(cls, feature: str) -> str | None:
        """Each feature arrived in 0.5.2x with a runner name it needs (`FEATURE_NAMES`)."""
        owner, name = FEATURE_NAMES[feature]
        where = load(RUNNER_MODULE, owner) if owner else load(RUNNER_MODULE)
        if feature in SOURCE_FEATURES:
            if name in inspect.getsource(where.__init__):
                return None
        elif hasattr(where, name):
            return None
        return f"SGLang {sglang_version()}: the prefill runner has no {name} ({feature})"

    @staticmethod
    def compile_pass_failing(cause: str):
        """While active, the tc_piecewise compile pass raises RuntimeError(cause), as an OOM inside it does."""
        backend_class = load(TC_BACKEND_MODULE, "TcPiecewiseCudaGraphBackend")
        return mock.patch.object(backend_class, "_run_compile_pass", side_effect=RuntimeError(cause))

    def execute(self, batch: Batch):
        """The runner's `execute` called directly, as a caller that skips `can_run_graph` would."""
        return self.runner.execute(self._forward_batch(batch))

    def close(self) -> None:
        self._patches.close()

    def _forward_batch(self, batch: Batch):
        forward_batch = build_forward_batch(batch, self.kv, self.model_runner.kv_index_translator,
                                            mrope=self.case.multimodal, lora=self.case.lora)
        if self.case.lora:  # what ForwardBatch.init_new does on a LoRA server
            self.model_runner.lora_manager.prepare_lora_batch(forward_batch)
        return forward_batch

    def forward(self, batch: Batch):
        forward_batch = self._forward_batch(batch)
        out = type(self.model_runner)._forward_raw(self.model_runner, forward_batch, None)
        return scores(out.logits_output), bool(out.can_run_graph), forward_batch

    def eager(self, batch: Batch) -> torch.Tensor:
        forward_batch = self._forward_batch(batch)
        self.attn_backend.init_forward_metadata(forward_batch)
        with forward_context(self.attn_backend, forward_batch):
            return scores(self.model(forward_batch.input_ids, forward_batch.positions, forward_batch,
                                     input_embeds=forward_batch.input_embeds))

    def can_run_graph(self, batch: Batch) -> bool:
        return bool(self.runner.can_run_graph(self._forward_batch(batch)))

    def state_probes(self) -> dict:
        from sglang.srt.model_executor.forward_context import has_forward_context
        from sglang.srt.model_executor.runner_backend_utils.breakable_cuda_graph.context import (
            is_in_breakable_cuda_graph,
        )
        from sglang.srt.model_executor.runner_backend_utils.tc_piecewise_cuda_graph import (
            get_tc_piecewise_forward_context,
            is_in_tc_piecewise_cuda_graph,
        )
        compile_phase = load(COMPILE_PHASE_MODULE)
        probes = {
            "compile_phase.pcg_capture_stream": (compile_phase.get_pcg_capture_stream, None),
            "compile_phase.in_torch_compile_warmup": (compile_phase.is_in_torch_compile_warmup, False),
            "tc_piecewise.in_cuda_graph": (is_in_tc_piecewise_cuda_graph, False),
            "tc_piecewise.forward_context": (get_tc_piecewise_forward_context, None),
            "breakable.in_cuda_graph": (is_in_breakable_cuda_graph, False),
            "forward_context.active": (has_forward_context, False),
            "device.stream_capturing": (torch.get_device_module(self.device).is_current_stream_capturing, False),
        }
        get_flags = getattr(runtime_context(), "get_flags", None)  # absent up to 0.5.1x
        if get_flags is not None and hasattr(get_flags().dp, "capturing_prefill_graph"):  # 0.5.2x
            probes["dp_flags.capturing_prefill_graph"] = (lambda: get_flags().dp.capturing_prefill_graph, False)
        return probes


LAYOUT = Layout(name="0.5.14+ (srt/model_executor/runner/prefill_cuda_graph_runner.py)", target_class=Target,
                backends=("tc_piecewise", "breakable", "full"),
                refused_modes=("TARGET_VERIFY", "DECODE", "IDLE", "SPLIT_PREFILL", "PREBUILT"),
                unproduced_modes=("DRAFT_EXTEND", "DRAFT_EXTEND_V2", "DLLM_EXTEND"), note=NOTE)


def detect() -> Layout | None:
    """This layout when the installed SGLang has it (PathMissing when it has it only in part), else None."""
    if not module_exists(RUNNER_MODULE):
        return None
    require_modules(REQUIRED, "the 0.5.14+ prefill runner")
    if not can_publish_config():
        raise PathMissing(f"SGLang {sglang_version()} has the 0.5.14+ prefill runner but neither "
                          "runtime_context.publish "
                          "nor server_args.set_global_server_args_for_scheduler to publish config through")
    if not module_exists(EAGER_RUNNER_MODULE):
        return dataclasses.replace(LAYOUT, name=LAYOUT.name + ", no eager_runner")
    return LAYOUT
