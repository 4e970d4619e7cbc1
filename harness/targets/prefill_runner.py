"""Adapter for SGLang's prefill graph runner (`PrefillCudaGraphRunner`): the real constructor (which compiles and
captures), the real dispatch (`ModelRunner._forward_raw`: `can_run_graph`, then `execute` = `load_batch` + the
backend's replay, or SGLang's own `EagerRunner`), and eager references.

Backends:
- `tc_piecewise`: SGLang's `TcPiecewiseCudaGraphBackend` -> `install_torch_compiled` -> `SGLangBackend` (split at
  the registered split ops, pieces compiled with `eager` or `inductor`) -> `CUDAPiecewiseBackend` per piece, whose
  graphs are the virtual device's. SGLang 0.5.23 no longer lets the config choose it ("tc_piecewise was removed;
  select breakable, full, or disabled"; `resolve_prefill_backend` raises for it) but ships the backend, and the
  runner still dispatches on `Backend.TC_PIECEWISE`. This adapter sets `PhaseConfig.backend = "tc_piecewise"` and
  `tc_compiler` directly (the dataclass takes them) and, for the runner's constructor only, has the runner
  module's `resolve_prefill_backend` construct `TcPiecewiseCudaGraphBackend(runner)` for that name (the real
  function for every other name). Every suite records that as a note.
- `breakable`, `full`: the live 0.5.23 prefill backends, chosen through the config as a server would.

The harness supplies only: the model (`harness.models.prefill_model`), the device (`harness.devices.cpu`), an
attention backend double subclassing SGLang's `AttentionBackend`, a KV cache of its own, and a model-runner double
(a `ModelRunner` whose constructor is skipped and whose attributes are set here, so SGLang's own `_forward_raw`,
`_extend_forward_kwargs`, `prepare_dummy_forward_batch` ... run).

Layouts: 0.5.14 and later releases (this module); 0.5.9-0.5.13 (`prefill_runner_pre14`); main-branch trees of
mid-2026 (between the two in shape: the runner/ layout, no `runtime_context`, no `EagerRunner`, eager extend in
`ModelRunner.forward_extend`, `DRAFT_EXTEND` beside `DRAFT_EXTEND_V2`), resolved feature by feature here.
"""
from __future__ import annotations

import contextlib
import dataclasses
import importlib
import inspect
from types import SimpleNamespace
from typing import Any, Optional

import torch

from harness.errors import PathMissing
from harness.versions import module_exists
# One gloo TP group per process and one way of publishing config, shared with the decode adapter
from harness.targets.decode_runner import can_publish_config, ensure_tp_group, publish_server_args, runtime_context
from harness.versions import sglang_version
from harness.models.prefill_model import HIDDEN, NUM_LAYERS, VOCAB, PrefillForCausalLM

# ---------------------------------------------------------------------------------------------------------------
# Layouts
# ---------------------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Layout:
    name: str
    runner_module: str = "sglang.srt.model_executor.runner.prefill_cuda_graph_runner"
    runner_class: str = "PrefillCudaGraphRunner"
    tc_backend_module: str = "sglang.srt.model_executor.runner_backend.tc_piecewise_cuda_graph_backend"
    tc_backend_class: str = "TcPiecewiseCudaGraphBackend"
    compile_module: str = "sglang.srt.compilation.compile"
    sglang_backend_module: str = "sglang.srt.compilation.backend"
    piece_backend_module: str = "sglang.srt.compilation.cuda_piecewise_backend"
    compile_phase_module: str = "sglang.srt.compilation.compile_phase"
    config_module: str = "sglang.srt.model_executor.cuda_graph_config"
    model_runner_module: str = "sglang.srt.model_executor.model_runner"
    eager_runner_module: str = "sglang.srt.model_executor.runner.eager_runner"
    skip_reason: Optional[str] = None
    # "runner": 0.5.14+ PrefillCudaGraphRunner (this module); "piecewise": <= 0.5.13 PiecewiseCudaGraphRunner
    # (harness.targets.prefill_runner_pre14)
    family: str = "runner"
    backends: tuple[str, ...] = ("tc_piecewise", "breakable", "full")
    # modes the runner refuses (SGLang's eager path or its own error), for the refusal test
    refused_modes: tuple[str, ...] = ("TARGET_VERIFY", "DECODE", "IDLE", "SPLIT_PREFILL", "PREBUILT")
    # modes the runner does not refuse but this configuration's scheduler never hands it (kept as findings)
    unproduced_modes: tuple[str, ...] = ("DRAFT_EXTEND", "DRAFT_EXTEND_V2", "DLLM_EXTEND")
    note: str = ""


LAYOUT_0_5_14 = Layout(name="0.5.14+ (srt/model_executor/runner/prefill_cuda_graph_runner.py)")


def _layout_pre14() -> Layout:
    from harness.targets import prefill_runner_pre14 as pre14

    return Layout(
        name="0.5.9-0.5.13 (srt/model_executor/piecewise_cuda_graph_runner.py, replay_prepare)",
        family="piecewise", runner_module=pre14.RUNNER_MODULE, runner_class="PiecewiseCudaGraphRunner",
        tc_backend_module="", tc_backend_class="", compile_phase_module=pre14.CONTEXT_MODULE, config_module="",
        eager_runner_module="", backends=pre14.BACKENDS, refused_modes=pre14.REFUSED_MODES,
        unproduced_modes=pre14.UNPRODUCED_MODES, note=pre14.TC_PIECEWISE_NOTE)
REQUIRED = ("runner_module", "tc_backend_module", "compile_module", "sglang_backend_module",
            "piece_backend_module", "compile_phase_module", "config_module", "model_runner_module",
            "eager_runner_module")


def resolve_layout() -> Layout:
    """The layout of the installed SGLang; `skip_reason` names the version and what is missing otherwise."""
    version = sglang_version()
    if module_exists("sglang.srt.model_executor.piecewise_cuda_graph_runner") and not module_exists(
            LAYOUT_0_5_14.runner_module):
        from harness.targets import prefill_runner_pre14 as pre14

        layout = _layout_pre14()
        missing = [name for name in pre14.REQUIRED if not module_exists(name)]
        if missing:
            return dataclasses.replace(layout, skip_reason=(
                f"sglang {version} has the pre-0.5.14 layout but misses module(s) {', '.join(missing)}"))
        pre14.prepare_imports()  # before anything imports SGLang's graph runners
        return layout
    layout = LAYOUT_0_5_14
    if not module_exists(layout.eager_runner_module):
        layout = dataclasses.replace(layout, eager_runner_module="", name=layout.name + ", no eager_runner")
    missing = [getattr(layout, field) for field in REQUIRED if getattr(layout, field)
               and not module_exists(getattr(layout, field))]
    if missing:
        return dataclasses.replace(layout, name="unknown", skip_reason=(
            f"sglang {version}: the prefill graph path is incomplete, missing module(s) {', '.join(missing)}"))
    if not can_publish_config():
        return dataclasses.replace(layout, skip_reason=(
            f"sglang {version} has the 0.5.14+ runner layout but neither runtime_context.publish nor "
            "server_args.set_global_server_args_for_scheduler to publish config through"))
    return layout


def make_target(case: "PrefillCase", layout: Layout):
    """The target for `case` on the installed layout (constructs the real runner: compiles and captures)."""
    if layout.family == "piecewise":
        from harness.targets import prefill_runner_pre14

        return prefill_runner_pre14.PrefillTarget(case, layout)
    return PrefillTarget(case, layout)


def backend_gap(layout: Layout, backend: str) -> Optional[str]:
    """Why `backend` cannot run on this release and the virtual device (None: it can): the release's config
    does not offer it for prefill, or its graph code calls CUDA APIs the virtual device does not stand in for."""
    version = sglang_version()
    if backend not in layout.backends:
        return f"SGLang {version} ({layout.name}) has no {backend!r} prefill backend"
    if layout.family != "runner" or backend == "tc_piecewise":
        return None
    config = load(layout, "config_module")
    allowed = getattr(config, "ALLOWED_BACKENDS_PER_PHASE", None)  # 0.5.14-0.5.1x
    if allowed is not None:
        names = {str(getattr(b, "value", b)) for b in allowed.get(getattr(config, "Phase").PREFILL, ())}
        if backend not in names:
            return (f"SGLang {version}: the config rejects prefill backend {backend!r} "
                    f"(ALLOWED_BACKENDS_PER_PHASE[prefill] = {sorted(names)})")
    if backend == "breakable":
        from sglang.srt.model_executor.runner_backend_utils.breakable_cuda_graph import breakable_cuda_graph

        replay = inspect.getsource(breakable_cuda_graph.BreakableCUDAGraph.replay)
        if "torch.cuda.current_stream" in replay:
            return (f"SGLang {version}: BreakableCUDAGraph.replay calls torch.cuda.current_stream() (and its capture "
                    "torch.cuda.stream / cuda-python's cudaStreamGetCaptureInfo) directly; the virtual device "
                    "(harness/devices/cpu.py) does not stand in for those, so this backend needs a GPU here")
    return None


def note(layout: Layout) -> str:
    """What the harness sets past SGLang's config for the tc_piecewise path on this layout (recorded per example)."""
    return layout.note or TC_PIECEWISE_NOTE


def require_layout() -> Layout:
    layout = resolve_layout()
    if layout.skip_reason:
        raise PathMissing(layout.skip_reason)
    return layout


def load(layout: Layout, module_field: str, name: Optional[str] = None):
    module = importlib.import_module(getattr(layout, module_field))
    return module if name is None else getattr(module, name)


# ---------------------------------------------------------------------------------------------------------------
# Case and config
# ---------------------------------------------------------------------------------------------------------------
BACKENDS = ("tc_piecewise", "breakable", "full")
TC_PIECEWISE_NOTE = ("SGLang 0.5.23 config rejects tc_piecewise ('tc_piecewise was removed'): the harness sets "
                     "PhaseConfig.backend='tc_piecewise' directly and constructs TcPiecewiseCudaGraphBackend "
                     "for the runner in place of resolve_prefill_backend")


@dataclasses.dataclass(frozen=True)
class PrefillCase:
    backend: str = "tc_piecewise"
    capture_tokens: tuple[int, ...] = (4, 8, 16)
    compiler: str = "eager"  # tc_piecewise only: the compiler of the pieces
    max_requests: int = 8  # req_to_token_pool rows (row 0 is reserved as the padding row)
    max_context: int = 64  # req_to_token_pool columns
    full_prefill_max_req: int = 4
    capture_mode: str = "auto"  # virtual device: "record" | "rerun" | "auto" (record for eager, rerun for inductor)

    @property
    def device_capture_mode(self) -> str:
        if self.capture_mode != "auto":
            return self.capture_mode
        if self.backend == "tc_piecewise" and self.compiler == "inductor":
            return "rerun"
        return "record"


def publish_config(case: PrefillCase) -> Any:
    """Publish a ServerArgs whose prefill phase uses `case.backend` (tc_piecewise set past the parser)."""
    from sglang.srt.model_executor.cuda_graph_config import CudaGraphConfig, PhaseConfig
    from sglang.srt.server_args import ServerArgs

    backend = "breakable" if case.backend == "tc_piecewise" else case.backend
    fields = {f.name for f in dataclasses.fields(PhaseConfig)}
    extra = {}
    if "full_prefill_max_req" in fields:  # 0.5.2x; 0.5.14's PhaseConfig has no such field
        extra["full_prefill_max_req"] = case.full_prefill_max_req if case.backend == "full" else None
    prefill = PhaseConfig(backend=backend, bs=list(case.capture_tokens), **extra)
    server_args = ServerArgs(
        model_path="dummy", device="cpu",
        cuda_graph_config=CudaGraphConfig(decode=PhaseConfig(backend="disabled"), prefill=prefill),
        max_running_requests=case.max_requests, chunked_prefill_size=max(case.capture_tokens),
        disable_radix_cache=True, disable_chunked_prefix_cache=True,
    )
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


# ---------------------------------------------------------------------------------------------------------------
# Doubles: KV cache, attention backend, model runner
# ---------------------------------------------------------------------------------------------------------------
PAD_SLOT = 0  # KV slot every padding / dummy token writes to; never handed to a real request


class KvCache:
    """The harness's KV cache: `req_to_token[row, position] -> slot`, `values[layer, slot] -> hidden`."""

    def __init__(self, max_requests: int, max_context: int, num_layers: int = NUM_LAYERS):
        self.size = max_requests
        self.req_to_token = torch.zeros((max_requests, max_context), dtype=torch.int32)
        self.num_slots = max_requests * max_context + 1
        self.values = torch.zeros((num_layers, self.num_slots, HIDDEN), dtype=torch.float32)

    def slot(self, row: int, position: int) -> int:
        return 1 + row * self.req_to_token.shape[1] + position

    def bind(self, row: int, length: int) -> None:
        positions = torch.arange(length, dtype=torch.int32)
        self.req_to_token[row, :length] = 1 + row * self.req_to_token.shape[1] + positions


def make_attention_backend_class():
    from sglang.srt.layers.attention.base_attn_backend import AttentionBackend

    class HarnessAttnBackend(AttentionBackend):
        """Attention backend double. Out of graph, for every batch (`init_forward_metadata[_out_graph]`, as
        SGLang's backends do), it writes the batch's metadata into its own capture-stable buffers: per flat token
        the `req_to_token` row, the position (-1 for padding) and the KV slot to write. The attention split op
        (`harness_attend`) computes from those buffers with fixed-shape tensor ops only, so the same code is right
        when it runs eagerly between pieces (tc_piecewise, breakable) and when a full graph captured it."""

        dllm_attention = None
        prefill_cuda_graph_default_max_seq_len = None
        supports_prefill_cuda_graph_max_context_size = False
        supports_full_cuda_graph_chunked_prefix = False
        use_captured_forward_metadata_for_breakable_cuda_graph = False
        skips_prefill_metadata_on_idle_dp_rank = False

        def __init__(self, kv: KvCache):
            self.kv = kv
            self.req_to_token_pool = SimpleNamespace(req_to_token=kv.req_to_token, size=kv.size)
            self.token_to_kv_pool = None
            self.forward_metadata = None
            self.metadata_inits = 0
            max_tokens = kv.num_slots
            self.token_row = torch.zeros(max_tokens, dtype=torch.int64)
            self.token_position = torch.full((max_tokens,), -1, dtype=torch.int64)
            self.write_slot = torch.full((max_tokens,), PAD_SLOT, dtype=torch.int64)
            self.context = torch.arange(kv.req_to_token.shape[1], dtype=torch.int64)

        def init_cuda_graph_state(self, max_bs: int, max_num_tokens: int) -> None:
            pass

        def get_cuda_graph_seq_len_fill_value(self) -> int:
            return 1

        def init_forward_metadata(self, forward_batch) -> None:
            self.init_forward_metadata_out_graph(forward_batch)

        def init_forward_metadata_out_graph(self, forward_batch, in_capture: bool = False) -> None:
            self.metadata_inits += 1
            bs = forward_batch.batch_size
            rows = [int(r) for r in forward_batch.req_pool_indices[:bs].tolist()]
            seq_lens = [int(s) for s in forward_batch.seq_lens[:bs].tolist()]
            if forward_batch.extend_seq_lens is not None and not forward_batch.forward_mode.is_decode_or_idle():
                new = [int(n) for n in forward_batch.extend_seq_lens[:bs].tolist()]
            else:
                new = [1] * bs
            token_row, token_position = [], []
            for row, seq_len, count in zip(rows, seq_lens, new):
                token_row += [row] * count
                token_position += range(seq_len - count, seq_len)
            n = len(token_row)
            self.token_row.zero_()
            self.token_position.fill_(-1)
            self.write_slot.fill_(PAD_SLOT)
            if n:
                self.token_row[:n] = torch.tensor(token_row, dtype=torch.int64)
                self.token_position[:n] = torch.tensor(token_position, dtype=torch.int64)
                self.write_slot[:n] = forward_batch.out_cache_loc[:n].to(torch.int64)
            self.forward_metadata = SimpleNamespace(num_tokens=n, rows=rows, seq_lens=seq_lens, new=new)

        def harness_attend(self, x: torch.Tensor, output: torch.Tensor, layer_id: int) -> None:
            """output[t] = sum of the cached x over positions 0..position(t) of token t's request."""
            t = x.shape[0]
            values = self.kv.values[layer_id]
            values.index_copy_(0, self.write_slot[:t], x)
            values[PAD_SLOT].zero_()
            slots = self.kv.req_to_token.index_select(0, self.token_row[:t]).to(torch.int64)  # (t, context)
            visible = self.context.unsqueeze(0) <= self.token_position[:t].unsqueeze(1)  # (t, context)
            gathered = values.index_select(0, slots.reshape(-1)).reshape(t, -1, x.shape[1])
            output.copy_((gathered * visible.unsqueeze(-1)).sum(dim=1))

        def forward_extend(self, *args, **kwargs):  # the model's attention never goes through here
            raise NotImplementedError("the harness model attends through its split op")

        forward_decode = forward_extend

    return HarnessAttnBackend


class _GraphSharedOutput:
    max_rows = 0

    def get_logits_buffer(self, vocab_size: int, rows: int):
        return None


def make_kv_index_translator(kv: "KvCache"):
    """SGLang's own `KVIndexTranslator` over the harness's `req_to_token` (no unified pool: no translation)."""
    if not module_exists("sglang.srt.mem_cache.kv_index_translator"):
        return None  # up to 0.5.1x: no translator, the runner reads req_to_token directly
    from sglang.srt.mem_cache.kv_index_translator import KVIndexTranslator

    return KVIndexTranslator(req_to_token=kv.req_to_token, token_to_kv_pool_allocator=None, token_to_kv_pool=None,
                             page_size=1, device="cpu")


def make_model_runner(layout: Layout, model, attn_backend, kv: KvCache, server_args, case: PrefillCase):
    """A `ModelRunner` (SGLang's class, so its `_forward_raw` dispatch and helpers are the real ones) with its
    constructor skipped: the attributes the 0.5.23 prefill runner, eager runner and dispatch read."""
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    ModelRunner = load(layout, "model_runner_module", "ModelRunner")
    runner = ModelRunner.__new__(ModelRunner)
    hf_config = SimpleNamespace(architectures=["HarnessPrefillModel"], model_type="harness_prefill",
                                max_source_positions=0)
    model_config = SimpleNamespace(
        is_encoder_decoder=False, hidden_size=HIDDEN, vocab_size=VOCAB, dtype=torch.float32, hf_config=hf_config,
        hf_text_config=hf_config, attention_arch=None, context_len=kv.req_to_token.shape[1], is_multimodal=False,
        hc_hidden_size=None, num_hidden_layers=NUM_LAYERS)
    pp_group = SimpleNamespace(is_first_rank=True, is_last_rank=True, world_size=1, rank_in_group=0)
    attributes = dict(
        device="cpu", gpu_id=0, model=model, model_config=model_config, server_args=server_args,
        dtype=torch.float32, attn_backend=attn_backend, decode_attn_backend=attn_backend,
        req_to_token_pool=attn_backend.req_to_token_pool, token_to_kv_pool=SimpleNamespace(
            layer_transfer_counter=None), lora_manager=None,
        ngram_embedding_manager=SimpleNamespace(enabled=False, table=None),
        spec_algorithm=SpeculativeAlgorithm.NONE, is_draft_worker=False, is_generation=True, support_pp=False,
        graph_shared_output=_GraphSharedOutput(), kv_index_translator=make_kv_index_translator(kv),
        pp_group=pp_group, attention_layers=[None] * NUM_LAYERS, mha_companion_layers=[None] * NUM_LAYERS,
        moe_layers=[None] * NUM_LAYERS, moe_fusions=[None] * NUM_LAYERS, kv_cache_dtype=torch.float32,
        hisparse_coordinator=None, device_timer=None, canary_manager=None, shared_read_done_event=None,
        max_running_requests=case.max_requests, max_total_num_tokens=kv.num_slots,
        decode_cuda_graph_runner=None, prefill_cuda_graph_runner=None, _kernel_warmed_up=False,
        layer_info=SimpleNamespace(start_layer=0, end_layer=NUM_LAYERS), capture_head_hooks=[],
        # up to 0.5.19 the runner's own parallel view (`ModelRunner.ps`); one rank of one
        ps=SimpleNamespace(tp_rank=0, tp_size=1, pp_rank=0, pp_size=1, dp_rank=None, dp_size=1, attn_dp_size=1,
                           moe_dp_size=1, moe_ep_rank=0, moe_ep_size=1, attn_cp_size=1, attn_dcp_rank=0,
                           attn_dcp_size=1),
        capture_tail_hooks=[],
    )
    from sglang.srt.distributed import parallel_state

    attributes["tp_group"] = parallel_state.get_tp_group()  # read off the runner up to 0.5.19
    # Plain attributes up to 0.5.1x that later releases derive (properties there): set only where the class
    # does not define them.
    for name, value in dict(is_multimodal=False, is_hybrid_swa=False, is_hybrid=False, tp_size=1, tp_rank=0,
                            pp_size=1, dp_size=1, moe_ep_rank=0, moe_ep_size=1, page_size=1,
                            token_to_kv_pool_allocator=None, forward_pass_id=0, eplb_manager=None,
                            graph_runner=None, piecewise_cuda_graph_runner=None).items():
        if not hasattr(ModelRunner, name):
            attributes.setdefault(name, value)
    # Main trees of mid-June 2026: the eager path copies each batch into registries the constructor makes.
    registry_class = getattr(importlib.import_module(layout.model_runner_module), "_EagerBufferRegistry", None)
    if registry_class is not None:
        attributes.update(_eager_decode_registry=registry_class(), _eager_prefill_registry=registry_class())
    for name, value in attributes.items():
        object.__setattr__(runner, name, value)
    return runner


# ---------------------------------------------------------------------------------------------------------------
# Batches
# ---------------------------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Request:
    """One request of a batch: the tokens this forward computes, after `prefix` tokens already in the KV cache
    (`prefix > 0` and one new token is a decoding request inside a mixed batch; more is a chunk)."""
    row: int
    tokens: tuple[int, ...]
    prefix: int = 0
    history: tuple[int, ...] = ()  # the `prefix` token ids already cached (for the by-hand reference)


@dataclasses.dataclass(frozen=True)
class Batch:
    requests: tuple[Request, ...]
    forward_mode: Any  # ForwardMode
    global_forward_mode: Any = None  # ForwardMode or None

    @property
    def num_tokens(self) -> int:
        return sum(len(r.tokens) for r in self.requests)


def build_forward_batch(batch: Batch, kv: KvCache, translator=None):
    """The ForwardBatch the scheduler would hand the model runner for `batch` (KV slots bound per request)."""
    from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode, ForwardBatch

    input_ids, positions, out_cache_loc = [], [], []
    seq_lens, prefix_lens, extend_lens, starts = [], [], [], []
    for request in batch.requests:
        seq_len = request.prefix + len(request.tokens)
        kv.bind(request.row, seq_len)
        starts.append(len(input_ids))
        for offset, token in enumerate(request.tokens):
            position = request.prefix + offset
            input_ids.append(token)
            positions.append(position)
            out_cache_loc.append(kv.slot(request.row, position))
        seq_lens.append(seq_len)
        prefix_lens.append(request.prefix)
        extend_lens.append(len(request.tokens))
    bs = len(batch.requests)
    tensor = lambda values: torch.tensor(values, dtype=torch.int64)  # noqa: E731
    is_extend = batch.forward_mode.is_extend()
    forward_batch = ForwardBatch(
        forward_mode=batch.forward_mode, batch_size=bs, input_ids=tensor(input_ids),
        req_pool_indices=tensor([r.row for r in batch.requests]), seq_lens=tensor(seq_lens),
        orig_seq_lens=tensor(seq_lens), seq_lens_cpu=tensor(seq_lens), out_cache_loc=tensor(out_cache_loc),
        seq_lens_sum=sum(seq_lens), positions=tensor(positions), return_logprob=False,
        extend_num_tokens=len(input_ids) if is_extend else None,
        extend_seq_lens=tensor(extend_lens) if is_extend else None,
        extend_prefix_lens=tensor(prefix_lens) if is_extend else None,
        extend_start_loc=tensor(starts) if is_extend else None,
        extend_prefix_lens_cpu=prefix_lens if is_extend else None,
        extend_seq_lens_cpu=extend_lens if is_extend else None,
        extend_logprob_start_lens_cpu=extend_lens if is_extend else None,
        capture_hidden_mode=CaptureHiddenMode.NULL, global_forward_mode=batch.global_forward_mode,
        spec_algorithm=None, spec_info=None, encoder_lens=None,
    )
    if translator is not None and hasattr(translator, "own_plan"):
        # what ForwardBatch.init_new does from 0.5.2x: the iteration's KV write plan
        translator.own_plan(forward_batch).bind(forward_batch, translator)
    return forward_batch


# ---------------------------------------------------------------------------------------------------------------
# The target
# ---------------------------------------------------------------------------------------------------------------
@contextlib.contextmanager
def _tc_piecewise_resolution(layout: Layout, case: PrefillCase):
    """While the runner is constructed, `resolve_prefill_backend` in the runner module builds the
    TcPiecewiseCudaGraphBackend for 'tc_piecewise' (0.5.23's resolver raises for that name)."""
    runner_module = load(layout, "runner_module")
    original = runner_module.resolve_prefill_backend
    if case.backend != "tc_piecewise" or not hasattr(runtime_context(), "get_exec"):
        yield  # up to 0.5.1x the config still offers tc_piecewise: SGLang's own resolver builds it
        return
    backend_class = load(layout, "tc_backend_module", layout.tc_backend_class)

    def resolve_prefill_backend(cuda_graph_runner):
        from sglang.srt.runtime_context import get_exec

        if get_exec().graph.cuda_graph_config.prefill.backend == "tc_piecewise":
            return backend_class(cuda_graph_runner)
        return original(cuda_graph_runner)

    runner_module.resolve_prefill_backend = resolve_prefill_backend
    try:
        yield
    finally:
        runner_module.resolve_prefill_backend = original


class PrefillTarget:
    """Publishes config, builds the doubles and constructs the real runner (which compiles and captures).

    Use inside the virtual device (`harness.devices.cpu.install()`), which must stay installed while replaying.
    """

    def __init__(self, case: PrefillCase, layout: Optional[Layout] = None):
        self.layout = layout or require_layout()
        self.case = case
        self.server_args = publish_config(case)
        ensure_tp_group()
        self.kv = KvCache(case.max_requests, case.max_context)
        self.model = PrefillForCausalLM()
        self.attn_backend = make_attention_backend_class()(self.kv)
        self.model_runner = make_model_runner(self.layout, self.model, self.attn_backend, self.kv,
                                              self.server_args, case)
        runner_class = load(self.layout, "runner_module", self.layout.runner_class)
        if self.layout.eager_runner_module:  # absent where ModelRunner.forward_extend runs eager itself
            EagerRunner = load(self.layout, "eager_runner_module", "EagerRunner")
            self.model_runner.eager_runner = EagerRunner(self.model_runner)  # its warm-up is a no-op off CUDA
        with _tc_piecewise_resolution(self.layout, case):
            self.runner = runner_class(self.model_runner)
        self.model_runner.prefill_cuda_graph_runner = self.runner

    # -- running ------------------------------------------------------------------------------------------------
    def forward(self, batch: Batch):
        """SGLang's own dispatch for a forward: `ModelRunner._forward_raw` (prefill graph when
        `can_run_graph`, else SGLang's eager runner). Returns (logits tensor, whether the graph path ran)."""
        forward_batch = build_forward_batch(batch, self.kv, self.model_runner.kv_index_translator)
        out = type(self.model_runner)._forward_raw(self.model_runner, forward_batch, None)
        return out.logits_output.next_token_logits, bool(out.can_run_graph), forward_batch

    def eager(self, batch: Batch) -> torch.Tensor:
        """The model's own forward on the real batch, no graph and no compile: the eager reference."""
        from sglang.srt.model_executor.forward_context import ForwardContext, forward_context

        forward_batch = build_forward_batch(batch, self.kv, self.model_runner.kv_index_translator)
        self.attn_backend.init_forward_metadata(forward_batch)
        takes_batch = "forward_batch" in inspect.signature(forward_context).parameters  # 0.5.2x
        with forward_context(ForwardContext(attn_backend=self.attn_backend),
                             **({"forward_batch": forward_batch} if takes_batch else {})):
            return self.model(forward_batch.input_ids, forward_batch.positions, forward_batch).next_token_logits

    def can_run_graph(self, batch: Batch) -> bool:
        return bool(self.runner.can_run_graph(build_forward_batch(batch, self.kv, self.model_runner.kv_index_translator)))


# ---------------------------------------------------------------------------------------------------------------
# Process-wide state that a finished forward must leave as it found it
# ---------------------------------------------------------------------------------------------------------------
def state_probes(layout: Layout) -> dict:
    """name -> (callable reading SGLang's process state, the value it must have between forwards)."""
    if layout.family == "piecewise":
        from harness.targets import prefill_runner_pre14

        return prefill_runner_pre14.state_probes()
    compile_phase = load(layout, "compile_phase_module")
    from sglang.srt.model_executor.forward_context import has_forward_context
    from sglang.srt.model_executor.runner_backend_utils.breakable_cuda_graph.context import (
        is_in_breakable_cuda_graph,
    )
    from sglang.srt.model_executor.runner_backend_utils.tc_piecewise_cuda_graph import (
        get_tc_piecewise_forward_context,
        is_in_tc_piecewise_cuda_graph,
    )
    from harness.devices import cpu

    probes = {
        "compile_phase.pcg_capture_stream": (compile_phase.get_pcg_capture_stream, None),
        "compile_phase.in_torch_compile_warmup": (compile_phase.is_in_torch_compile_warmup, False),
        "tc_piecewise.in_cuda_graph": (is_in_tc_piecewise_cuda_graph, False),
        "tc_piecewise.forward_context": (get_tc_piecewise_forward_context, None),
        "breakable.in_cuda_graph": (is_in_breakable_cuda_graph, False),
        "forward_context.active": (has_forward_context, False),
        "device.stream_capturing": (cpu.is_current_stream_capturing, False),
    }
    get_flags = getattr(runtime_context(), "get_flags", None)  # absent up to 0.5.1x
    if get_flags is not None and hasattr(get_flags().dp, "capturing_prefill_graph"):  # 0.5.2x
        probes["dp_flags.capturing_prefill_graph"] = (lambda: get_flags().dp.capturing_prefill_graph, False)
    return probes
