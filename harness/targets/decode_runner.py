"""Adapter for SGLang's decode graph runner: the real constructor (which captures), the real replay, and eager.

Everything version-specific about driving the 0.5.14+ decode runner lives here: module paths and names per layout,
the runtime config published before construction, the single-process gloo tensor-parallel group, and the
model-runner double (the attributes the runner reads from SGLang's `ModelRunner`); the 0.5.9-0.5.13 layout
(`CudaGraphRunner` in `srt/model_executor/cuda_graph_runner.py`) is `harness.targets.decode_runner_pre14`, a
subclass of `DecodeTarget` that `resolve_layout` and `make_target` select. Suites call:

    layout = resolve_layout()                 # or skip with `layout.skip_reason`
    case = DecodeCase(capture_bs=[1, 2, 4], max_running_requests=8, enable_torch_compile=False, ...)
    target = make_target(case, personality="cuda")      # publishes config, builds doubles, constructs the runner
    out = target.replay(batch)                # runner.can_run_graph + runner.execute (load_batch + graph replay)
    ref = target.eager(batch)                 # the model's forward on the real rows, no graph

Only the model (`harness.models.decode_model`), the device layer and thin doubles (model runner, attention backend,
LoRA manager) are the harness's; the runner, its buffers, `get_batch_sizes_to_capture`, `patch_model`, the graph
backend and the NPU runner class are SGLang's own.
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import importlib
import os
import socket
import time
from types import SimpleNamespace
from typing import Any, Callable, Optional, Sequence

import torch

from harness.models.decode_model import HIDDEN, VOCAB, DecodeModel, LoRAManagerDouble
from harness.versions import module_exists

# ---------------------------------------------------------------------------------------------------------------
# Layouts
# ---------------------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Layout:
    name: str
    runner_module: str  # DecodeCudaGraphRunner lives here
    runner_class: str
    base_module: str  # get_batch_sizes_to_capture
    decoration_module: str  # patch_model, set_torch_compile_config
    npu_runner_module: str
    npu_runner_class: str
    npu_patch_name: str  # the NPU override of patch_model
    full_backend_module: str
    skip_reason: Optional[str] = None
    # "runner": 0.5.14+ DecodeCudaGraphRunner (this module); "cuda_graph_runner": <= 0.5.13 CudaGraphRunner
    # (harness.targets.decode_runner_pre14)
    family: str = "runner"
    note: str = ""  # what the adapter does differently on this layout, recorded with every example


LAYOUT_0_5_14 = Layout(
    name="0.5.14+ (srt/model_executor/runner/...)",
    runner_module="sglang.srt.model_executor.runner.decode_cuda_graph_runner",
    runner_class="DecodeCudaGraphRunner",
    base_module="sglang.srt.model_executor.runner.base_cuda_graph_runner",
    decoration_module="sglang.srt.compilation.torch_compile_decoration",
    npu_runner_module="sglang.srt.hardware_backend.npu.graph_runner.npu_graph_runner",
    npu_runner_class="NPUGraphRunner",
    npu_patch_name="patch_model_npu",
    full_backend_module="sglang.srt.model_executor.runner_backend.full_cuda_graph_backend",
)


def resolve_layout() -> Layout:
    """The layout of the installed SGLang; `skip_reason` set for a layout this adapter does not drive."""
    try:
        import sglang
    except ImportError as e:  # pragma: no cover - the environment always has it
        return dataclasses.replace(LAYOUT_0_5_14, name="none", skip_reason=f"sglang is not importable: {e}")
    version = getattr(sglang, "__version__", "?")
    if module_exists(LAYOUT_0_5_14.runner_module):
        if not (module_exists("sglang.srt.model_executor.cuda_graph_config") and can_publish_config()):
            return dataclasses.replace(LAYOUT_0_5_14, skip_reason=(
                f"sglang {version} has the 0.5.14+ runner layout but neither runtime_context.publish nor "
                "server_args.set_global_server_args_for_scheduler to publish config through"))
        return LAYOUT_0_5_14
    from harness.targets import decode_runner_pre14

    if module_exists(decode_runner_pre14.RUNNER_MODULE):
        return decode_runner_pre14.resolve_layout(version)
    return dataclasses.replace(LAYOUT_0_5_14, name="unknown", skip_reason=(
        f"sglang {version}: no decode graph runner found at {LAYOUT_0_5_14.runner_module} "
        f"nor at {decode_runner_pre14.RUNNER_MODULE}"))


def runtime_context() -> Optional[Any]:
    """`sglang.srt.runtime_context` (0.5.14 and later releases), or None: main trees of May-June 2026 have none."""
    if not module_exists("sglang.srt.runtime_context"):
        return None
    return importlib.import_module("sglang.srt.runtime_context")


def _scheduler_global_server_args_setter() -> Optional[Callable]:
    return getattr(importlib.import_module("sglang.srt.server_args"), "set_global_server_args_for_scheduler", None)


def can_publish_config() -> bool:
    """Whether `publish_server_args` has a way to publish on the installed SGLang."""
    return hasattr(runtime_context(), "publish") or _scheduler_global_server_args_setter() is not None


def publish_server_args(server_args) -> bool:
    """Publish `server_args` (last publish wins), as the decode and prefill adapters both do: through
    `runtime_context.publish` where it exists (0.5.19+; returns True), else as the scheduler's global server args
    (0.5.14 and main trees without runtime_context, whose runner reads `model_runner.server_args`; returns False)."""
    context = runtime_context()
    if not hasattr(context, "publish"):
        _scheduler_global_server_args_setter()(server_args)  # keeps this object: later edits are seen
        return False
    spawn_ranks = getattr(context, "SpawnRanks", None)  # 0.5.2x reads ranks from a launcher bundle
    ranks = {"ranks": spawn_ranks(world_rank=0, gpu_id=0)} if spawn_ranks is not None else {}
    context.publish(server_args, role="test", **ranks)
    return True


def load(layout: Layout, module: str, name: str):
    return getattr(importlib.import_module(getattr(layout, module)), name)


# ---------------------------------------------------------------------------------------------------------------
# Process-wide setup: published config and the gloo TP group (once per process)
# ---------------------------------------------------------------------------------------------------------------
_DIST_READY = [False]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def publish_config(*, capture_bs: Sequence[int], max_running_requests: int, enable_torch_compile: bool,
                   torch_compile_max_bs: int, device: str = "cpu", lora: bool = False) -> Any:
    """Publish a ServerArgs for this case (`publish_server_args`)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # "dummy" must never be looked up on the Hub
    from sglang.srt.model_executor.cuda_graph_config import CudaGraphConfig, PhaseConfig
    from sglang.srt.server_args import ServerArgs

    server_args = ServerArgs(
        model_path="dummy",
        device=device,
        cuda_graph_config=CudaGraphConfig(decode=PhaseConfig(backend="full", bs=list(capture_bs))),
        enable_torch_compile=enable_torch_compile,
        torch_compile_max_bs=torch_compile_max_bs,
        max_running_requests=max_running_requests,
    )
    if not publish_server_args(server_args):
        # Their decode runner decides on LoRA from `server_args.enable_lora` (0.5.2x: a LoRA manager being there);
        # set past the parser, which would want adapter paths.
        server_args.enable_lora = bool(lora)
    return server_args


def ensure_tp_group() -> None:
    """A single-process gloo world and SGLang's model-parallel groups, created once per process."""
    if _DIST_READY[0]:
        return
    from sglang.srt.distributed import parallel_state

    if not parallel_state.model_parallel_is_initialized():
        parallel_state.init_distributed_environment(
            world_size=1, rank=0, local_rank=0, backend="gloo",
            distributed_init_method=f"tcp://127.0.0.1:{_free_port()}")
        parallel_state.initialize_model_parallel()
    _DIST_READY[0] = True


# ---------------------------------------------------------------------------------------------------------------
# Doubles
# ---------------------------------------------------------------------------------------------------------------
def make_attention_backend_class():
    """An attention backend double subclassing SGLang's `AttentionBackend`: its metadata is the batch's seq_lens.

    Graph state: one static `seq_lens` buffer of `max_bs` rows. At capture and replay the runner calls
    `init_forward_metadata_out_graph` with the padded static batch; the double copies its seq_lens into the static
    buffer and publishes a view of it, so the captured graph reads the buffer that each replay refills. Eager
    batches get a fresh tensor.
    """
    from sglang.srt.layers.attention.base_attn_backend import AttentionBackend

    class DecodeAttentionDouble(AttentionBackend):
        def __init__(self, seq_len_fill_value: int = 1, device: str = "cpu") -> None:
            self.seq_len_fill_value = seq_len_fill_value
            self.device = device
            self.graph_seq_lens: Optional[torch.Tensor] = None
            self.forward_metadata = None
            self.metadata_inits = 0

        def init_cuda_graph_state(self, max_bs: int, max_num_tokens: int) -> None:
            rows = max(max_bs, STATIC_CAPACITY)
            if self.graph_seq_lens is None or self.graph_seq_lens.shape[0] < rows:
                self.graph_seq_lens = torch.full((rows,), self.seq_len_fill_value, dtype=torch.int64,
                                                 device=self.device)

        def get_cuda_graph_seq_len_fill_value(self) -> int:
            return self.seq_len_fill_value

        def init_forward_metadata_out_graph(self, forward_batch, in_capture: bool = False) -> None:
            self.metadata_inits += 1
            seq_lens = forward_batch.seq_lens
            static = self.graph_seq_lens is not None and (in_capture or not isinstance(
                forward_batch, _forward_batch_class())) and seq_lens.shape[0] <= self.graph_seq_lens.shape[0]
            if static:
                self.graph_seq_lens[: seq_lens.shape[0]].copy_(seq_lens)
                self.forward_metadata = SimpleNamespace(seq_lens=self.graph_seq_lens[: seq_lens.shape[0]])
            else:
                self.forward_metadata = SimpleNamespace(seq_lens=seq_lens.clone())

    return DecodeAttentionDouble


def _forward_batch_class():
    from sglang.srt.model_executor.forward_batch_info import ForwardBatch

    return ForwardBatch


STATIC_CAPACITY = 64  # rows of the doubles' static buffers: fixed, so their shapes (Dynamo guards) never change
_SHARED: dict = {}


def shared_parts(lora: bool, device: str = "cpu", make_attention: Callable = make_attention_backend_class):
    """(model, LoRA manager or None, attention backend for the runner, attention backend for eager);
    `make_attention` builds the attention double's class for the release's attention-backend API."""
    key = (lora, device, make_attention)
    if key not in _SHARED:
        manager = LoRAManagerDouble(device) if lora else None
        attention_class = make_attention()
        _SHARED[key] = (DecodeModel(manager).to(device), manager, attention_class(device=device),
                        attention_class(device=device))
    return _SHARED[key]


_LAST_COMPILER: list = [None]


def fresh_dynamo_when_compiler_changes(case: "DecodeCase", personality: str) -> None:
    """Compiled frames are reused across examples with the same compiler (the suite's speed), but a target that
    compiles with another one (another personality's backend, inductor instead of eager) starts from a reset
    Dynamo: what one platform's capture left in Dynamo's caches must not decide whether the next one compiles
    (torch 2.13 then raises "fullgraph=True found no compiled frames" in SGLang's capture). Call it before any
    compile callback is registered: a reset drops Dynamo's callbacks."""
    compiler = (personality, case.compile_backend) if case.enable_torch_compile else None
    if compiler is not None and compiler != _LAST_COMPILER[0]:
        if _LAST_COMPILER[0] is not None:
            torch._dynamo.reset()
        _LAST_COMPILER[0] = compiler


class _GraphSharedOutput:
    def __init__(self, device: str) -> None:
        self.device = device

    def get_logits_buffer(self, vocab_size: int, rows: int) -> torch.Tensor:
        return torch.zeros((rows, vocab_size), dtype=torch.float32, device=self.device)


class _KvIndexTranslator:
    def bind_runner_slots(self, forward_batch) -> None:
        pass


def make_model_runner(model: DecodeModel, attn_backend, *, device: str, max_running_requests: int,
                      server_args: Any, lora_manager: Optional[LoRAManagerDouble]) -> SimpleNamespace:
    """The attributes of SGLang's ModelRunner that the 0.5.14 to 0.5.23 decode runners (and NPU subclasses) read."""
    from sglang.srt.distributed import parallel_state
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    hf_config = SimpleNamespace(architectures=["HarnessDecodeModel"], max_source_positions=0)
    model_config = SimpleNamespace(
        is_encoder_decoder=False, hidden_size=HIDDEN, vocab_size=VOCAB, dtype=torch.float32,
        hf_config=hf_config, hf_text_config=hf_config, attention_arch=None, context_len=4096,
        quantization=None,  # read by the CUDA warmup (flashinfer autotune only for quantised models)
    )
    return SimpleNamespace(
        device=device,
        gpu_id=0,
        model=model,
        model_config=model_config,
        server_args=server_args,
        dtype=torch.float32,
        attn_backend=attn_backend,
        decode_attn_backend_group=[attn_backend],
        req_to_token_pool=SimpleNamespace(size=max_running_requests),
        lora_manager=lora_manager,
        ngram_embedding_manager=SimpleNamespace(enabled=False, table=None),
        use_ngram_embedding=False,  # up to 0.5.1x (0.5.2x: ngram_embedding_manager)
        token_table=None,
        tp_group=parallel_state.get_tp_group(),  # up to 0.5.1x patch_model's tp_group (0.5.2x: get_parallel())
        war_fastpath_read_done_event=None,  # up to 0.5.1x (0.5.2x: shared_read_done_event)
        spec_algorithm=SpeculativeAlgorithm.NONE,
        is_draft_worker=False,
        decode_num_tokens_per_req=lambda num_draft_tokens=None: 1,
        graph_shared_output=_GraphSharedOutput(device),
        get_pp_proxy_topk_size=lambda: None,
        get_pp_proxy_residual_num_blocks=lambda: None,
        get_pp_proxy_dspark_hidden_size=lambda: None,
        get_aux_hidden_states_width=lambda: None,
        attn_tp_sequence_sharded=lambda num_tokens: False,
        kv_index_translator=_KvIndexTranslator(),
        hisparse_coordinator=None,
        capture_head_hooks=[],
        capture_tail_hooks=[],
        canary_manager=None,
        device_timer=None,
        shared_read_done_event=None,
        _kernel_warmed_up=False,
    )


# ---------------------------------------------------------------------------------------------------------------
# Cases, batches and the target
# ---------------------------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class DecodeCase:
    """What one example captures: the published config and the runner's options."""

    capture_bs: tuple[int, ...]
    max_running_requests: int
    enable_torch_compile: bool = False
    torch_compile_max_bs: int = 32
    lora: bool = False
    record_nolora_graph: bool = False
    compile_backend: str = "eager"  # "eager": patch_model's inductor compiles use Dynamo's eager backend instead

    def drawn(self) -> dict:
        return dataclasses.asdict(self)


@dataclasses.dataclass
class DecodeBatch:
    """One decode batch as the scheduler would hand it over (request rows only, no padding)."""

    input_ids: list[int]
    positions: list[int]
    seq_lens: list[int]
    lora_ids: Optional[list[Optional[str]]] = None
    forward_mode: str = "DECODE"

    @property
    def batch_size(self) -> int:
        return len(self.input_ids)

    def to_forward_batch(self, device: str = "cpu"):
        from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode, ForwardBatch, ForwardMode

        bs = self.batch_size
        seq_lens = torch.tensor(self.seq_lens, dtype=torch.int64, device=device)
        return ForwardBatch(
            forward_mode=ForwardMode[self.forward_mode],
            batch_size=bs,
            input_ids=torch.tensor(self.input_ids, dtype=torch.int64, device=device),
            req_pool_indices=torch.arange(bs, dtype=torch.int64, device=device),
            seq_lens=seq_lens,
            seq_lens_cpu=seq_lens.cpu(),
            out_cache_loc=torch.arange(bs, dtype=torch.int64, device=device),
            seq_lens_sum=int(sum(self.seq_lens)),
            positions=torch.tensor(self.positions, dtype=torch.int64, device=device),
            lora_ids=list(self.lora_ids) if self.lora_ids is not None else None,
            global_forward_mode=ForwardMode[self.forward_mode],
            capture_hidden_mode=CaptureHiddenMode.NULL,
        )


class DecodeTarget:
    """The real decode runner (or, with personality "npu", SGLang's NPU runner) captured on the current device.

    Construction publishes the case's config, builds the doubles and constructs the runner: SGLang's constructor
    computes the capture/compile sizes and captures every size (and LoRA variant) at once.
    `hooks` wraps the personality's `patch_model` before construction (a `HookRecorder`), so the suite sees
    every call SGLang made and what each yielded.
    """

    def __init__(self, case: DecodeCase, *, personality: str = "cuda", device: str = "cpu",
                 hooks: Any = None, layout: Optional[Layout] = None) -> None:
        self.case = case
        self.personality = personality
        self.device = device
        self.layout = layout or resolve_layout()
        if self.layout.skip_reason:
            raise RuntimeError(self.layout.skip_reason)
        if self.layout.family != self.FAMILY:
            raise RuntimeError(f"{type(self).__name__} drives the {self.FAMILY!r} layout, not {self.layout.name}: "
                               "construct targets with make_target()")
        self.server_args = self._publish_config(case, device)
        ensure_tp_group()
        # One model (and its doubles) per process and LoRA setting: Dynamo caches compiled frames per model
        # instance, so reusing it caches compiled forwards per (batch size, mode) across examples.
        self.model, self.lora_manager, self.attn_backend, self.eager_attn_backend = self._shared_parts(case, device)
        self.model_runner = self._make_model_runner(case, device)
        self.decoration = importlib.import_module(self.layout.decoration_module)
        self.runner_class = self._runner_class()
        self.dropped_options: list[str] = []
        if case.record_nolora_graph and not _accepts(self.layout, "record_nolora_graph"):
            # Up to 0.5.1x the decode runner has no such option (nothing turns its nolora variant on): the case
            # runs as the release can run it, and the target's case says so, for the oracles.
            self.case = case = dataclasses.replace(case, record_nolora_graph=False)
            self.dropped_options.append("record_nolora_graph")
        self.hooks = hooks
        self.patch_model_seen: list = []
        t0 = time.perf_counter()
        with self._restore_patch_model(), self._compile_backend(), self._watch_patch_model(), \
                self._npu_backend_selection():
            kwargs = {}
            if case.record_nolora_graph and personality == "cuda":
                kwargs["record_nolora_graph"] = True
            self.runner = self.runner_class(self.model_runner, **kwargs)
        self.capture_seconds = time.perf_counter() - t0

    # -- construction helpers (a layout's subclass overrides the release-specific ones) --------------------------
    FAMILY = "runner"

    def _publish_config(self, case: DecodeCase, device: str) -> Any:
        return publish_config(
            capture_bs=case.capture_bs, max_running_requests=case.max_running_requests,
            enable_torch_compile=case.enable_torch_compile, torch_compile_max_bs=case.torch_compile_max_bs,
            device=device, lora=case.lora)

    def _shared_parts(self, case: DecodeCase, device: str):
        return shared_parts(case.lora, device)

    def _make_model_runner(self, case: DecodeCase, device: str) -> SimpleNamespace:
        return make_model_runner(
            self.model, self.attn_backend, device=device, max_running_requests=case.max_running_requests,
            server_args=self.server_args, lora_manager=self.lora_manager)

    def _runner_class(self):
        if self.personality == "npu":
            return load(self.layout, "npu_runner_module", self.layout.npu_runner_class)
        return load(self.layout, "runner_module", self.layout.runner_class)

    @contextlib.contextmanager
    def _restore_patch_model(self):
        """SGLang's NPU runner rebinds `torch_compile_decoration.patch_model` and never restores it (process-wide
        state). Every construction starts from SGLang's own `patch_model` and the module gets it back after, so
        each example exercises the rebinding afresh and no example inherits another's."""
        module = self.decoration
        original = _ORIGINAL_PATCH_MODEL.setdefault(module.__name__, _sglang_patch_model(module))
        module.patch_model = original
        try:
            yield
        finally:
            self.patch_model_after_capture = module.patch_model
            module.patch_model = original

    @contextlib.contextmanager
    def _npu_backend_selection(self):
        """Up to 0.5.1x (and main trees of May-June 2026) SGLang's `resolve_decode_backend` picks its
        `NPUCudaGraphBackend` by `model_runner.device == "npu"` alone (0.5.2x asks the platform's
        `get_full_graph_backend_cls`, which the npu personality answers). A CPU tensor device cannot be "npu", so
        with the npu personality, while SGLang's own resolver runs (and only then), the model-runner double reports
        device "npu"; everything else (buffers, streams) keeps the real device."""
        if self.personality != "npu":
            yield
            return
        import inspect

        runner_module = importlib.import_module(self.layout.runner_module)
        original = getattr(runner_module, "resolve_decode_backend", None)
        if original is None or "get_full_graph_backend_cls" in inspect.getsource(original):
            yield
            return

        def resolve_decode_backend(cuda_graph_runner):
            model_runner = cuda_graph_runner.model_runner
            device, model_runner.device = model_runner.device, "npu"
            try:
                return original(cuda_graph_runner)
            finally:
                model_runner.device = device

        runner_module.resolve_decode_backend = resolve_decode_backend
        try:
            yield
        finally:
            runner_module.resolve_decode_backend = original

    @contextlib.contextmanager
    def _compile_backend(self):
        """patch_model compiles with inductor; with compile_backend "eager" those compiles use Dynamo's eager backend
        (still Dynamo: guards, graph breaks, recompiles), by wrapping torch.compile during construction only. A
        platform's own backend (the NPU override's npugraph_ex stand-in) is left as it is."""
        if not self.case.enable_torch_compile or self.case.compile_backend == "inductor":
            yield
            return
        original = torch.compile

        def compile_eager(model=None, *args, **kwargs):
            if kwargs.get("backend", "inductor") == "inductor":  # a platform's own backend (npugraph_ex) stays
                kwargs.pop("mode", None)
                kwargs.pop("options", None)
                kwargs["backend"] = "eager"
            return original(model, *args, **kwargs)

        torch.compile = compile_eager
        try:
            yield
        finally:
            torch.compile = original

    @contextlib.contextmanager
    def _watch_patch_model(self):
        """Observe every `patch_model` variant that runs during construction, however it was referenced.

        Both SGLang's `patch_model` and the NPU override are `contextlib.contextmanager` functions; the generator
        function sits in the closure cell of the function object, which a by-value import shares. The cell is
        swapped for a recording generator for the duration of construction, so calls through the module
        attribute and through a by-value import are both seen, under the name of the function that really ran.
        """
        if self.hooks is None:
            yield
            return
        functions = {"patch_model": _ORIGINAL_PATCH_MODEL[self.decoration.__name__]}
        if self.personality == "npu":
            functions[self.layout.npu_patch_name] = load(self.layout, "npu_runner_module", self.layout.npu_patch_name)
        with contextlib.ExitStack() as stack:
            for name, fn in functions.items():
                if fn is functions["patch_model"] and name != "patch_model":
                    raise RuntimeError(f"{name} is the same function as patch_model: nothing to tell apart")
                stack.enter_context(observe_context_manager(
                    fn, name, self.hooks, self.patch_model_seen,
                    capturing=torch.get_device_module(self.device).is_current_stream_capturing))
            yield

    # -- running ------------------------------------------------------------------------------------------------
    @property
    def capture_bs(self) -> list[int]:
        return list(self.runner.capture_bs)

    @property
    def compile_bs(self) -> list[int]:
        return list(self.runner.compile_bs)

    def forward_batch(self, batch: DecodeBatch):
        fb = batch.to_forward_batch(self.device)
        if self.lora_manager is not None and fb.lora_ids is not None:
            self.lora_manager.prepare_lora_batch(fb)  # what ForwardBatch.init_new does for a LoRA server
        return fb

    def _can_run_graph(self, fb) -> bool:
        """The runner's graph-eligibility check: `can_run_graph` (0.5.14 on), `can_run` (main trees without it)."""
        check = getattr(self.runner, "can_run_graph", None) or self.runner.can_run
        return bool(check(fb))

    def _execute(self, fb):
        """Load the batch, replay, slice: `execute` (0.5.14 on), `replay` (main trees without it, same contract)."""
        execute = getattr(self.runner, "execute", None) or self.runner.replay
        return execute(fb)

    def can_replay(self, batch: DecodeBatch) -> bool:
        return self._can_run_graph(self.forward_batch(batch))

    def replay(self, batch: DecodeBatch):
        """SGLang's `execute`: load the batch into the static buffers, replay the graph, slice the real rows."""
        fb = self.forward_batch(batch)
        if not self._can_run_graph(fb):
            raise RuntimeError(f"runner refuses to replay batch size {batch.batch_size} "
                               f"(captured {self.capture_bs})")
        with self._model_runner_forward_context():
            return self._execute(fb)

    def _model_runner_forward_context(self):
        """What SGLang's `ModelRunner._forward_raw` wraps `execute` in up to 0.5.1x (whose `forward_context` takes no
        batch): a forward context with the runner's attention backend, unless one is active. From 0.5.2x the decode
        runner's `run_once` enters its own and `_forward_raw` does not: nothing to add."""
        from sglang.srt.model_executor.forward_context import ForwardContext, forward_context, has_forward_context

        if _forward_context_takes_batch() or has_forward_context():
            return contextlib.nullcontext()
        return forward_context(ForwardContext(attn_backend=self.model_runner.attn_backend))

    def eager(self, batch: DecodeBatch, forward: Optional[Callable] = None):
        """The model's forward (or `forward`, e.g. a compiled one patch_model yielded) on the real rows, no graph,
        with a fresh attention backend and LoRA scales."""
        fb = batch.to_forward_batch(self.device)
        if self.lora_manager is not None and fb.lora_ids is not None:
            self.lora_manager.prepare_lora_batch(fb, static=False)
        self.eager_attn_backend.init_forward_metadata(fb)
        with torch.no_grad(), self._eager_context(fb):
            return (forward or self.model.forward)(fb.input_ids, fb.positions, fb)

    def _eager_context(self, fb):
        """How the release hands the eager attention backend to the model: SGLang's forward context."""
        from sglang.srt.model_executor.forward_context import ForwardContext, forward_context

        return forward_context(ForwardContext(attn_backend=self.eager_attn_backend),
                               **({"forward_batch": fb} if _forward_context_takes_batch() else {}))


@functools.lru_cache(maxsize=None)
def _forward_context_takes_batch() -> bool:
    """Whether SGLang's `forward_context` takes the batch (0.5.2x); asked once, not on every replay."""
    import inspect

    from sglang.srt.model_executor.forward_context import forward_context

    return "forward_batch" in inspect.signature(forward_context).parameters


def make_target(case: DecodeCase, *, layout: Optional[Layout] = None, **kwargs) -> DecodeTarget:
    """The target for `case` on the installed layout (constructs the real runner, which captures); keyword
    arguments as `DecodeTarget`."""
    layout = layout or resolve_layout()
    if layout.family == "cuda_graph_runner":
        from harness.targets import decode_runner_pre14

        return decode_runner_pre14.DecodeTargetPre14(case, layout=layout, **kwargs)
    return DecodeTarget(case, layout=layout, **kwargs)


_ORIGINAL_PATCH_MODEL: dict = {}


def _accepts(layout: Layout, option: str) -> bool:
    """Whether the decode runner's constructor takes keyword `option` on this release."""
    import inspect

    runner_class = load(layout, "runner_module", layout.runner_class)
    return option in inspect.signature(runner_class.__init__).parameters


def _sglang_patch_model(module):
    """SGLang's own `patch_model` of `module` (not an override a runner left bound there)."""
    fn = module.patch_model
    wrapped = getattr(fn, "__wrapped__", fn)
    if getattr(wrapped, "__module__", None) != module.__name__ or wrapped.__name__ != "patch_model":
        raise RuntimeError(f"{module.__name__}.patch_model is {wrapped.__module__}.{wrapped.__name__}, not SGLang's "
                           "own: an override was left installed before the harness first saw the module")
    return fn


@contextlib.contextmanager
def observe_context_manager(fn: Callable, name: str, hooks: Any, sink: list,
                            capturing: Optional[Callable[[], bool]] = None):
    """Record each entry of the `contextmanager` function `fn` (by identity of its generator function).

    Each entry appends to `sink` a namespace (name, enable_compile, num_tokens, forward, calls) and records the call
    in `hooks` (a HookRecorder) under `name`; the yielded forward is replaced by `hooks.wrap(f"{name}:forward", ...)`
    which records every call of it and whether a graph capture was in progress at the time.
    """
    cell = _generator_cell(fn)
    original = cell.cell_contents

    if capturing is None:
        capturing = torch.cuda.is_current_stream_capturing

    def recording(model, enable_compile, num_tokens, tp_group, *args, **kwargs):
        entry = SimpleNamespace(name=name, enable_compile=bool(enable_compile), num_tokens=num_tokens,
                                forward=None, calls=[])
        with contextlib.contextmanager(original)(model, enable_compile, num_tokens, tp_group, *args,
                                                  **kwargs) as forward:
            entry.forward = forward

            def forward_call(*a, **k):
                entry.calls.append("capture" if capturing() else "eager")
                return forward(*a, **k)

            import functools
            functools.update_wrapper(forward_call, forward)
            hooks.record(name, (model, bool(enable_compile)), {"num_tokens": num_tokens}, forward)
            sink.append(entry)
            yield hooks.wrap(f"{name}:forward", forward_call)

    recording.__name__ = getattr(original, "__name__", name)
    cell.cell_contents = recording
    try:
        yield
    finally:
        cell.cell_contents = original


def _generator_cell(fn: Callable):
    wrapped = getattr(fn, "__wrapped__", None)
    for cell in fn.__closure__ or ():
        if cell.cell_contents is wrapped:
            return cell
    raise TypeError(f"{fn!r} is not a contextlib.contextmanager function; cannot observe it by identity")
