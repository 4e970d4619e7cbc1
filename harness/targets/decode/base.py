"""What every decode layout shares: the case and batch types, the doubles (attention backend, model runner), the
target (SGLang's constructor captures; `replay` goes through the runner's own execute) and the observation of
`patch_model` by the identity of its generator function. A layout module subclasses `DecodeTarget` for what its
releases do differently and names that subclass in its `Layout`."""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import inspect
import time
from types import SimpleNamespace
from typing import Any, ClassVar
from collections.abc import Callable
from unittest import mock

import torch

from harness.models.decode_model import HIDDEN, VOCAB, DecodeModel, LoRAManagerDouble, visible_draft_counts
from harness.oracles import batch_consistency, state_at_rest
from harness.targets.decode.overlap import shared_table
from harness.targets.decode.switches import DEFAULT_ARCHITECTURE, RunnerSwitches
from harness.targets.sglang_plumbing import ensure_tp_group, load, tp_group


@dataclasses.dataclass(frozen=True)
class Layout:
    """Where one range of releases keeps the decode path, and the target class that drives it."""

    name: str
    runner_module: str  # the CUDA runner class lives here
    runner_class: str
    decoration_module: str  # patch_model, set_torch_compile_config
    npu_runner_module: str
    npu_runner_class: str
    target_class: type
    npu_patch_name: str = "patch_model_npu"  # the NPU override of patch_model
    note: str = ""  # what the adapter does differently on this layout, recorded with every example

    def make_target(self, case: DecodeCase, **kwargs) -> DecodeTarget:
        """Construct the real runner for `case` (which captures); keyword arguments as `DecodeTarget`."""
        return self.target_class(case, layout=self, **kwargs)

    def speculative_missing(self) -> str | None:
        """Why this release cannot run the speculative TARGET_VERIFY cases or the pre-planned batches (naming the
        release and the missing name), or None when it can."""
        from harness.versions import module_exists, sglang_version

        needed = ((self.runner_module, f"{self.runner_class}.get_spec_info"),
                  ("sglang.srt.speculative.eagle_info", "EagleVerifyInput"),
                  ("sglang.srt.model_executor.forward_batch_info", "ForwardBatch.needs_forward_metadata_init"))
        for module, name in needed:
            if not module_exists(module):
                return f"SGLang {sglang_version()} has no {module}: no speculative TARGET_VERIFY graphs to drive"
            owner = load(module)
            for part in name.split("."):
                owner = getattr(owner, part, None)
            if owner is None:
                return (f"SGLang {sglang_version()} has no {module}.{name}: no speculative TARGET_VERIFY graphs or "
                        "pre-planned batches to drive")
        return None

    def planning_missing(self, personality: str) -> str | None:
        """Why the pre-planned batches cannot run here (the personality's runner has no `load_batch` to plan with,
        e.g. the NPU runner of main trees of June 2026, or `speculative_missing`), or None when they can."""
        from harness.versions import sglang_version

        module, name = (self.npu_runner_module, self.npu_runner_class) if personality == "npu" else \
            (self.runner_module, self.runner_class)
        if not hasattr(load(module, name), "load_batch"):
            return f"SGLang {sglang_version()} has no {module}.{name}.load_batch: no pre-planned batches to drive"
        return self.speculative_missing()

    def runner_accepts(self, option: str) -> bool:
        """Whether the CUDA runner's constructor takes keyword `option` on this release."""
        runner_class = load(self.runner_module, self.runner_class)
        return option in inspect.signature(runner_class.__init__).parameters


@dataclasses.dataclass(frozen=True)
class SpecSettings:
    """Speculative decoding as a user sets it: the algorithm (EAGLE, STANDALONE: EAGLE's verify without hidden
    states, NGRAM, DFLASH, DSPARK: the compact ragged verify's), draft steps, top-k per step, draft tokens per request
    (the width of each TARGET_VERIFY request)."""

    num_steps: int
    topk: int
    num_draft_tokens: int
    algorithm: str = "EAGLE"
    # --speculative-use-rejection-sampling (EAGLE, top-k 1): the draft runner captures a greedy variant beside the
    # sampling one and replays the variant each batch's sampling asks for
    rejection_sampling: bool = False
    # --speculative-draft-window-size / --speculative-draft-sink-size: the draft attends a recent window of its
    # prefix (EAGLE: its sink tokens too, in the multi-step backend's rails; EAGLE3: its layers' own sliding window)
    draft_window: int | None = None
    draft_sink: int | None = None

    @property
    def captures_hidden(self) -> bool:
        """Whether the target verify returns hidden states (EAGLE's draft reads them)."""
        return self.algorithm in ("EAGLE", "DFLASH", "DSPARK")


@dataclasses.dataclass(frozen=True)
class DllmSettings:
    """A diffusion LLM as a user serves it (`--dllm-algorithm`, a checkpoint declaring `architecture`, the block
    size in `--dllm-algorithm-config`): one DLLM_EXTEND request is a block of `block_size` tokens. Gemma4Renoise
    encodes the context apart (the forward reads `input_embeds`), prepared in the graph from a per-token state
    when `capture_input_preparation`."""

    algorithm: str
    architecture: str
    block_size: int
    capture_input_preparation: bool = False


@dataclasses.dataclass(frozen=True)
class DecodeCase:
    """What one example captures: the published config and the runner's options (`spec`: EAGLE TARGET_VERIFY)."""

    capture_bs: tuple[int, ...]
    max_running_requests: int
    enable_torch_compile: bool = False
    torch_compile_max_bs: int = 32
    lora: bool = False
    record_nolora_graph: bool = False
    compile_backend: str = "eager"  # "eager": patch_model's inductor compiles use Dynamo's eager backend instead
    spec: SpecSettings | None = None
    disable_padding: bool = False  # --disable-cuda-graph-padding: only captured sizes replay
    default_max_bs: int | None = None  # capture list left to SGLang's default for this --cuda-graph-max-bs
    dllm: DllmSettings | None = None  # a diffusion LLM's DLLM_EXTEND graphs (`decode/dllm.py`)
    switches: RunnerSwitches = RunnerSwitches()  # profiling, metadata glue, replay log, architecture
    # The read end the attention double declares for a scheduler-shared table it reads (`decode/overlap.py`;
    # a SharedReadEnds name), None: no shared table, the base class's declaration
    shared_reads: str | None = None

    @property
    def tokens_per_request(self) -> int:
        if self.dllm:
            return self.dllm.block_size
        return self.spec.num_draft_tokens if self.spec else 1

    def drawn(self) -> dict:
        return dataclasses.asdict(self)


@dataclasses.dataclass
class DecodeBatch:
    """One batch as the scheduler (or, for TARGET_VERIFY, the EAGLE worker) would hand it over: request rows only,
    no padding. Per request: seq_lens, req_pool_indices, lora_ids, draft_visibility; per token (requests x
    tokens per request): input_ids, positions, out_cache_loc."""

    input_ids: list[int]
    positions: list[int]
    seq_lens: list[int]
    lora_ids: list[str | None] | None = None
    forward_mode: str = "DECODE"
    req_pool_indices: list[int] | None = None  # None: 0..bs-1
    out_cache_loc: list[int] | None = None  # None: 0..tokens-1
    draft_visibility: list[list[list[bool]]] | None = None  # TARGET_VERIFY: per request, draft rows x columns
    host_seq_lens: bool = True  # False: no CPU mirror of seq_lens (ForwardBatch.seq_lens_cpu None), as some workers
    dp_fields: bool = False  # the scheduler's DP-attention fields of one rank (its tokens, the gathered length)
    mrope_positions: list[list[int]] | None = None  # an mRoPE model's: 3 sections x tokens
    # what variants carry (RaggedBatch, DllmBatch) and a plain decode batch has none of
    verify_lens: ClassVar[list[int] | None] = None
    input_embeds: ClassVar[list[list[float]] | None] = None
    preparation_state: ClassVar[list[list[float]] | None] = None
    real_tokens: ClassVar[int | None] = None  # rows of the output that are the batch's (None: all)

    @property
    def batch_size(self) -> int:
        return len(self.seq_lens)

    def shifted(self) -> DecodeBatch:
        """The same requests with every input id and position one further (mRoPE sections move with them)."""
        mrope = self.mrope_positions
        return dataclasses.replace(self, input_ids=[i + 1 for i in self.input_ids],
                                   positions=[p + 1 for p in self.positions],
                                   mrope_positions=None if mrope is None else [[m + 1 for m in row] for row in mrope])

    @property
    def pool_rows(self) -> list[int]:
        return self.req_pool_indices if self.req_pool_indices is not None else list(range(self.batch_size))

    @property
    def cache_slots(self) -> list[int]:
        return self.out_cache_loc if self.out_cache_loc is not None else list(range(len(self.input_ids)))

    def custom_mask(self) -> list[bool] | None:
        """The EAGLE verify mask, flattened: per request, per draft row, its prefix (all visible) then its drafts."""
        if self.draft_visibility is None:
            return None
        return [bit for prefix, rows in zip(self.seq_lens, self.draft_visibility) for row in rows
                for bit in [True] * prefix + list(row)]

    def visible_drafts(self) -> list[int]:
        if self.draft_visibility is None:
            return [0] * len(self.input_ids)
        return [sum(row) for rows in self.draft_visibility for row in rows]

    def to_forward_batch(self, device: str = "cpu", spec: SpecSettings | None = None):
        from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode, ForwardBatch, ForwardMode

        def tensor(values):
            return torch.tensor(values, dtype=torch.int64, device=device)

        seq_lens = tensor(self.seq_lens)
        verify = spec is not None  # a speculative target worker's batch: TARGET_VERIFY, or IDLE
        tokens = len(self.input_ids)
        dp = {} if not self.dp_fields else dict(
            global_num_tokens_cpu=[tokens], global_num_tokens_gpu=torch.tensor([tokens], dtype=torch.int32,
                                                                              device=device),
            global_num_tokens_for_logprob_cpu=[tokens], global_num_tokens_for_logprob_gpu=torch.tensor(
                [tokens], dtype=torch.int32, device=device), global_dp_buffer_len=tokens,
            can_run_decode_cuda_graph=True)  # the scheduler's MLP sync agreed on a graph replay
        return ForwardBatch(**dp,
            forward_mode=ForwardMode[self.forward_mode],
            batch_size=self.batch_size,
            input_ids=tensor(self.input_ids),
            req_pool_indices=tensor(self.pool_rows),
            seq_lens=seq_lens,
            seq_lens_cpu=seq_lens.cpu() if self.host_seq_lens else None,
            out_cache_loc=tensor(self.cache_slots),
            seq_lens_sum=int(sum(self.seq_lens)),
            positions=tensor(self.positions),
            lora_ids=list(self.lora_ids) if self.lora_ids is not None else None,
            global_forward_mode=ForwardMode[self.forward_mode],
            capture_hidden_mode=CaptureHiddenMode.FULL if verify and spec.captures_hidden else CaptureHiddenMode.NULL,
            spec_info=self.verify_input(device, spec) if verify else None,
            mrope_positions=None if self.mrope_positions is None else tensor(self.mrope_positions),
        )

    def width(self, spec: SpecSettings) -> int:
        """Tokens per request of this verify batch: its own (an adaptive speculative worker may verify another count
        than the runner captured), the configured draft tokens for a batch of no requests."""
        return len(self.input_ids) // self.batch_size if self.batch_size else spec.num_draft_tokens

    def verify_input(self, device: str, spec: SpecSettings):
        """SGLang's own verify input for this batch (`EagleVerifyInput`, `NgramVerifyInput`), as the worker's
        prepare-for-verify builds it (the retrieve_* tree tensors feed only the sampling kernel after the forward,
        never the runner); for an IDLE batch SGLang's idle input (NGRAM, and releases whose idle input is made on
        "cuda" only: none)."""
        from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode
        from sglang.srt.speculative.eagle_info import EagleVerifyInput

        if spec.algorithm in ("DFLASH", "DSPARK"):  # DSPARK verifies with DFLASH's input
            if self.forward_mode == "IDLE":
                return None
            from sglang.srt.speculative.dflash_info import DFlashVerifyInput

            return DFlashVerifyInput(
                draft_token=torch.tensor(self.input_ids, dtype=torch.int64, device=device),
                positions=torch.tensor(self.positions, dtype=torch.int64, device=device),
                draft_token_num=self.width(spec),
                custom_mask=torch.tensor(self.custom_mask(), dtype=torch.bool, device=device))
        if spec.algorithm == "NGRAM":
            if self.forward_mode == "IDLE":
                return None
            from sglang.srt.speculative.ngram_info import NgramVerifyInput

            mask = "custom_mask" if "custom_mask" in inspect.signature(NgramVerifyInput).parameters else "tree_mask"
            return NgramVerifyInput(  # the mask is `tree_mask` in main trees of June 2026
                draft_token=torch.tensor(self.input_ids, dtype=torch.int64, device=device),
                positions=torch.tensor(self.positions, dtype=torch.int64, device=device),
                retrieve_index=None, retrieve_next_token=None, retrieve_next_sibling=None,
                draft_token_num=self.width(spec),
                **{mask: torch.tensor(self.custom_mask(), dtype=torch.bool, device=device)})
        if self.forward_mode == "IDLE":
            if "device" not in inspect.signature(EagleVerifyInput.create_idle_input).parameters:
                return None  # up to 0.5.1x the idle input is made on "cuda" only
            return EagleVerifyInput.create_idle_input(topk=spec.topk, spec_steps=spec.num_steps,
                                                      num_verify_tokens=spec.num_draft_tokens, device=device)
        return EagleVerifyInput(
            draft_token=torch.tensor(self.input_ids, dtype=torch.int64, device=device),
            custom_mask=torch.tensor(self.custom_mask(), dtype=torch.bool, device=device),
            positions=torch.tensor(self.positions, dtype=torch.int64, device=device),
            retrieve_index=None, retrieve_next_token=None, retrieve_next_sibling=None, retrieve_cum_len=None,
            spec_steps=spec.num_steps, topk=spec.topk, draft_token_num=self.width(spec),
            capture_hidden_mode=CaptureHiddenMode.FULL if spec.captures_hidden else CaptureHiddenMode.NULL,
            seq_lens_sum=int(sum(self.seq_lens)),
            seq_lens_cpu=torch.tensor(self.seq_lens, dtype=torch.int64))


# -- doubles --------------------------------------------------------------------------------------------------
STATIC_CAPACITY = 128  # rows of the doubles' static buffers: fixed, so their shapes (Dynamo guards) never change


class DecodeAttention:
    """An attention backend double (its methods; `make_attention_backend_class` puts SGLang's `AttentionBackend`
    under it). Its metadata is what a real backend plans out of the graph from the batch: the seq_lens, the sum it
    was handed against those seq_lens (`sum_gap`, 0 when they agree), and from spec info the visible draft tokens
    of each row of the verify mask (`decode_model.visible_draft_counts`).

    Static buffers: at capture and replay the runner calls `init_forward_metadata_out_graph` with the padded
    static batch; the double writes into its buffers and publishes views of them, so the captured graph reads the
    buffers each replay refills. Eager batches get fresh tensors."""

    def __init__(self, seq_len_fill_value: int = 1, device: str = "cpu") -> None:
        self.seq_len_fill_value = seq_len_fill_value
        self.device = device
        self.graph: SimpleNamespace | None = None
        self.forward_metadata = None
        self.metadata_inits = 0
        self.shared_table: torch.Tensor | None = None  # a scheduler-shared table it reads (overlap.py)
        self.shared_reads: str | None = None  # where those reads end (SharedReadEnds name)

    def shared_read_ends(self, fm):
        from sglang.srt.layers.attention.base_attn_backend import SharedReadEnds

        return super().shared_read_ends(fm) if self.shared_reads is None else SharedReadEnds[self.shared_reads]

    def init_cuda_graph_state(self, max_bs: int, max_num_tokens: int) -> None:
        rows = max(max_bs, max_num_tokens, STATIC_CAPACITY)
        if self.graph is None or self.graph.seq_lens.shape[0] < rows:
            self.graph = SimpleNamespace(
                seq_lens=torch.full((rows,), self.seq_len_fill_value, dtype=torch.int64, device=self.device),
                visible_drafts=torch.zeros((rows,), dtype=torch.int64, device=self.device),
                sum_gap=torch.zeros((), dtype=torch.int64, device=self.device))

    def get_cuda_graph_seq_len_fill_value(self) -> int:
        return self.seq_len_fill_value

    def init_forward_metadata_out_graph(self, forward_batch, in_capture: bool = False) -> None:
        self.metadata_inits += 1
        seq_lens = forward_batch.seq_lens
        bs = seq_lens.shape[0]
        rows = forward_batch.input_ids.shape[0] if getattr(forward_batch, "input_ids", None) is not None \
            else bs
        spec_info = getattr(forward_batch, "spec_info", None)
        width = getattr(spec_info, "draft_token_num", None) or 1
        visible = visible_draft_counts(seq_lens.tolist(), getattr(spec_info, "custom_mask", None), width,
                                       max(rows, bs * width))
        total = getattr(forward_batch, "seq_lens_sum", None)
        gap = torch.tensor(0 if total is None else total - int(seq_lens.sum()), dtype=torch.int64)
        from sglang.srt.model_executor.forward_batch_info import ForwardBatch

        static = self.graph is not None and (in_capture or not isinstance(
            forward_batch, ForwardBatch)) and visible.shape[0] <= self.graph.seq_lens.shape[0]
        if self.shared_table is not None:  # out-of-graph prep reads the shared rows of the batch
            self.shared_table[forward_batch.req_pool_indices.to(torch.int64)].sum()
        if static:
            self.graph.seq_lens[:bs].copy_(seq_lens)
            self.graph.visible_drafts[: visible.shape[0]].copy_(visible)
            self.graph.sum_gap.copy_(gap)
            self.forward_metadata = SimpleNamespace(seq_lens=self.graph.seq_lens[:bs],
                                                    visible_drafts=self.graph.visible_drafts,
                                                    sum_gap=self.graph.sum_gap)
            if self.shared_table is not None and self.shared_reads != "PRE_REPLAY":
                self.forward_metadata.shared_table = self.shared_table  # the graph reads it too
            if type(spec_info).__name__ == "DFlashVerifyInput":  # the KV lengths with the draft block, per
                # row of the static batch (padded rows: the fill value), which SGLang's NPU runner hands to
                # the graph update as they are (a DFlash backend's `seq_lens_cpu_list`)
                self.forward_metadata.seq_lens_cpu_list = (seq_lens + width).tolist()
        else:
            self.forward_metadata = SimpleNamespace(seq_lens=seq_lens.clone(), visible_drafts=visible.to(
                self.device), sum_gap=gap.to(self.device))


def make_attention_backend_class():
    """The double as an `AttentionBackend` subclass, made on demand: SGLang is imported late (not at the
    harness's import), and its base class's defaults apply where the double defines nothing."""
    from sglang.srt.layers.attention.base_attn_backend import AttentionBackend

    return type("DecodeAttentionDouble", (DecodeAttention, AttentionBackend), {"__doc__": DecodeAttention.__doc__})


_SHARED: dict = {}


def shared_parts(lora: bool, device: str, make_attention: Callable, mrope: bool = False):
    """(model, LoRA manager or None, attention backend for the runner, attention backend for eager), one per
    process and setting: Dynamo caches compiled frames per model instance, so reuse keeps compiled forwards."""
    key = (lora, device, make_attention, mrope)
    if key not in _SHARED:
        manager = LoRAManagerDouble(device) if lora else None
        attention_class = make_attention()
        _SHARED[key] = (DecodeModel(manager, mrope).to(device), manager, attention_class(device=device),
                        attention_class(device=device))
    return _SHARED[key]


class _GraphSharedOutput:
    def __init__(self, device: str) -> None:
        self.device = device

    def get_logits_buffer(self, vocab_size: int, rows: int) -> torch.Tensor:
        return torch.zeros((rows, vocab_size), dtype=torch.float32, device=self.device)


class _KvIndexTranslator:
    def bind_runner_slots(self, forward_batch) -> None:
        pass


def make_model_runner(model: DecodeModel, attn_backend, *, device: str, max_running_requests: int,
                      server_args: Any, lora_manager: LoRAManagerDouble | None,
                      spec: SpecSettings | None = None,
                      architecture: str = DEFAULT_ARCHITECTURE) -> SimpleNamespace:
    """The attributes of SGLang's ModelRunner that the decode runners (and NPU subclasses) of every layout read;
    `spec`: a speculative target worker's."""
    from sglang.srt.distributed import parallel_state
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

    hf_config = SimpleNamespace(architectures=[architecture], max_source_positions=0)
    model_config = SimpleNamespace(
        is_encoder_decoder=False, hidden_size=HIDDEN, vocab_size=VOCAB, dtype=torch.float32,
        hf_config=hf_config, hf_text_config=hf_config, attention_arch=None, context_len=4096,
        quantization=None,  # read by the CUDA warmup (flashinfer autotune only for quantised models)
    )
    model_runner = SimpleNamespace(
        device=device, gpu_id=0, model=model, model_config=model_config, server_args=server_args,
        dtype=torch.float32, attn_backend=attn_backend,
        decode_attn_backend_group=[],  # what SGLang's model runner builds without pdmux (members only under it)
        req_to_token_pool=SimpleNamespace(size=max_running_requests), lora_manager=lora_manager,
        ngram_embedding_manager=SimpleNamespace(enabled=False, table=None),
        use_ngram_embedding=False,  # up to 0.5.1x (0.5.2x: ngram_embedding_manager)
        token_table=None,
        tp_group=parallel_state.get_tp_group(),  # up to 0.5.1x patch_model's tp_group (0.5.2x: get_parallel())
        war_fastpath_read_done_event=None,  # up to 0.5.1x (0.5.2x: shared_read_done_event)
        spec_algorithm=SpeculativeAlgorithm.from_string(spec.algorithm if spec else None), is_draft_worker=False,
        graph_shared_output=_GraphSharedOutput(device),
        get_pp_proxy_topk_size=lambda: None, get_pp_proxy_residual_num_blocks=lambda: None,
        get_pp_proxy_dspark_hidden_size=lambda: None, get_aux_hidden_states_width=lambda: None,
        attn_tp_sequence_sharded=lambda num_tokens: False, kv_index_translator=_KvIndexTranslator(),
        hisparse_coordinator=None, capture_head_hooks=[], capture_tail_hooks=[], canary_manager=None,
        device_timer=None, shared_read_done_event=None, _kernel_warmed_up=False,
    )
    model_runner.decode_num_tokens_per_req = tokens_per_request_rule(model_runner)
    return model_runner


def tokens_per_request_rule(model_runner) -> Callable:
    """SGLang's own `ModelRunner.decode_num_tokens_per_req` bound to the double where the release has it (the
    verify width by the speculative algorithm), else the pre-speculative rule of one token."""
    from sglang.srt.model_executor import model_runner as module

    rule = getattr(module.ModelRunner, "decode_num_tokens_per_req", None)
    if rule is None:
        return lambda num_draft_tokens=None: 1
    return functools.partial(rule, model_runner)


_LAST_COMPILER: list = [None]


def fresh_dynamo_when_compiler_changes(case: DecodeCase, personality: str) -> None:
    """Compiled frames are reused across examples with the same compiler (the suite's speed), but a target that
    compiles with another one (another personality's backend, inductor instead of eager) starts from a reset
    Dynamo: what one platform's capture left in Dynamo's caches must not decide whether the next one compiles.
    Call it before any compile callback is registered: a reset drops Dynamo's callbacks."""
    compiler = (personality, case.compile_backend) if case.enable_torch_compile else None
    if compiler is not None and compiler != _LAST_COMPILER[0]:
        if _LAST_COMPILER[0] is not None:
            torch._dynamo.reset()
        _LAST_COMPILER[0] = compiler


# -- the target -----------------------------------------------------------------------------------------------
class DecodeTarget:
    """The real decode runner (or, with personality "npu", SGLang's NPU runner) captured on the current device.

    Construction publishes the case's config, builds the doubles and constructs the runner: SGLang's constructor
    computes the capture/compile sizes and captures every size (and LoRA variant) at once. `hooks` (a
    `HookRecorder`) sees every `patch_model` call SGLang made and what each yielded.
    """

    def __init__(self, case: DecodeCase, *, layout: Layout, personality: str = "cuda", device: str = "cpu",
                 hooks: Any = None) -> None:
        self.case = case
        self.personality = personality
        self.device = device
        self.layout = layout
        self.dropped_options: list[str] = []
        self.drawn_case = case  # as drawn; `case` is what ran (SGLang's default capture list filled in)
        if case.default_max_bs is not None:
            resolved = self.default_capture_list(case, device)
            if resolved is None:
                self.dropped_options.append("default_max_bs")
                resolved = case.capture_bs
            self.case = case = dataclasses.replace(case, capture_bs=tuple(resolved))
        if case.record_nolora_graph and not layout.runner_accepts("record_nolora_graph"):
            # A release whose runner has no such option: the case runs as the release can run it, and the
            # target's case says so, for the oracles.
            self.case = case = dataclasses.replace(case, record_nolora_graph=False)
            self.dropped_options.append("record_nolora_graph")
        self.server_args = self.publish_config(case, device)
        ensure_tp_group()
        self.model, self.lora_manager, self.attn_backend, self.eager_attn_backend = self.build_parts(case, device)
        if hasattr(self.attn_backend, "shared_reads"):  # the double (re-used across examples): this case's table
            self.attn_backend.shared_reads = case.shared_reads
            self.attn_backend.shared_table = None if case.shared_reads is None else shared_table(device)
        self.model_runner = self.make_model_runner(case, device)
        self.decoration = load(layout.decoration_module)
        self.runner_class = self._runner_class()
        self.hooks = hooks
        self.patch_model_seen: list = []
        t0 = time.perf_counter()
        with self._restore_patch_model(), self._compile_backend(), self._watch_patch_model(), \
                self.construction_patches(), state_at_rest.watching(
                    self.model, f"the decode runner's capture of {list(case.capture_bs)}"
                                f"{' with torch.compile' if case.enable_torch_compile else ''}", tp_group=tp_group()):
            kwargs = {"record_nolora_graph": True} if case.record_nolora_graph and personality == "cuda" else {}
            self.runner = self.runner_class(self.model_runner, **kwargs)
        self.capture_seconds = time.perf_counter() - t0

    # -- what a layout provides --------------------------------------------------------------------------------
    attention_backend_class = staticmethod(make_attention_backend_class)
    world_rank = 0  # this process's rank in its world (`harness.worlds`: one process per rank)
    is_draft_worker = False  # the oracles' view: whether this target's runner serves a draft worker

    def attention_backend_for(self, case: DecodeCase) -> Callable:
        """The attention double's class factory for `case` (a layout may pick another for a switch)."""
        return self.attention_backend_class

    def build_parts(self, case: DecodeCase, device: str) -> tuple:
        """(model, LoRA manager or None, the runner's attention backend, eager's); a real-model target builds its
        own (`real_model.py`)."""
        return shared_parts(case.lora, device, self.attention_backend_for(case), case.switches.mrope)

    def publish_config(self, case: DecodeCase, device: str) -> Any:
        raise NotImplementedError

    def server_args(self, case: DecodeCase, device: str) -> Any:
        """The case's ServerArgs, unpublished (layouts that build them apart from publishing)."""
        return None

    def default_capture_list(self, case: DecodeCase, device: str) -> list[int] | None:
        """The decode capture list SGLang's own config code generates for `--cuda-graph-max-bs
        case.default_max_bs` when no list is given (with the case's padding and speculative args), None where the
        release has no such generator the harness can call."""
        server_args = self.server_args(case, device)
        if server_args is None:
            return None
        from harness.versions import module_exists

        if module_exists("sglang.srt.arg_groups.cuda_graph_hook"):
            generate = getattr(load("sglang.srt.arg_groups.cuda_graph_hook"),
                               "generate_decode_cuda_graph_batch_sizes", None)
            if generate is not None:
                return list(generate(server_args, case.default_max_bs))
        method = getattr(server_args, "_generate_decode_cuda_graph_batch_sizes", None)
        return None if method is None else list(method(case.default_max_bs))

    def make_model_runner(self, case: DecodeCase, device: str) -> SimpleNamespace:
        runner = make_model_runner(
            self.model, self.attn_backend, device=device, max_running_requests=case.max_running_requests,
            server_args=self.server_args, lora_manager=self.lora_manager, spec=case.spec,
            architecture=case.switches.architecture)
        if case.switches.dsv41_span:  # the text config DeepSeek-V4.1's candidate graph variants are built from
            from harness.targets.decode.dsv41 import text_config_fields

            vars(runner.model_config.hf_text_config).update(text_config_fields(case.switches.dsv41_span))
        # --enable-pdmux: SGLang's model runner builds a decode backend per SM group (attention_backend_setup)
        runner.decode_attn_backend_group = [type(self.attn_backend)(device=device)
                                            for _ in range(case.switches.pdmux_groups)]
        return runner

    def construction_patches(self) -> contextlib.AbstractContextManager:
        """What the layout changes while SGLang's constructor runs (and only then)."""
        return contextlib.nullcontext()

    def replay_context(self) -> contextlib.AbstractContextManager:
        """What SGLang's model runner wraps `execute` in on this release."""
        return contextlib.nullcontext()

    def eager_context(self, fb) -> contextlib.AbstractContextManager:
        """How the release hands the eager attention backend to the model."""
        raise NotImplementedError

    # -- construction ------------------------------------------------------------------------------------------
    def _runner_class(self):
        if self.personality == "npu":
            return load(self.layout.npu_runner_module, self.layout.npu_runner_class)
        return load(self.layout.runner_module, self.layout.runner_class)

    @contextlib.contextmanager
    def _restore_patch_model(self):
        """SGLang's NPU runner rebinds `patch_model` on its module and never restores it (process-wide state).
        Every construction starts from SGLang's own `patch_model`, and the module gets it back after, so each
        example exercises the rebinding afresh and none inherits another's."""
        module = self.decoration
        original = _ORIGINAL_PATCH_MODEL.setdefault(module.__name__, _sglang_patch_model(module))
        with mock.patch.object(module, "patch_model", original):
            try:
                yield
            finally:
                self.patch_model_after_capture = module.patch_model

    @contextlib.contextmanager
    def _compile_backend(self):
        """patch_model compiles with inductor; with compile_backend "eager" (or "aot_eager") those compiles use that
        backend instead (still Dynamo: guards, graph breaks, recompiles; aot_eager adds AOTAutograd's
        functionalisation and every op's fake kernel), by wrapping torch.compile during construction only. A
        platform's own backend (the NPU override's npugraph_ex stand-in) is left as it is."""
        if not self.case.enable_torch_compile or self.case.compile_backend == "inductor":
            yield
            return
        original, backend = torch.compile, self.case.compile_backend

        def compile_eager(model=None, *args, **kwargs):
            if kwargs.get("backend", "inductor") == "inductor":
                kwargs.pop("mode", None)
                kwargs.pop("options", None)
                kwargs["backend"] = backend
            return original(model, *args, **kwargs)

        with mock.patch.object(torch, "compile", compile_eager):
            yield

    @contextlib.contextmanager
    def _watch_patch_model(self):
        """Observe every `patch_model` variant that runs during construction, however it was referenced (the
        generator function sits in the closure cell that a by-value import shares; see observe_context_manager)."""
        if self.hooks is None:
            yield
            return
        functions = {"patch_model": _ORIGINAL_PATCH_MODEL[self.decoration.__name__]}
        if self.personality == "npu":
            functions[self.layout.npu_patch_name] = load(self.layout.npu_runner_module, self.layout.npu_patch_name)
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

    @property
    def promises_padding(self) -> bool:
        """Whether the release pads static inputs by a declared policy (0.5.2x's buffer registry)."""
        return hasattr(self.runner, "buffer_registry")

    def seq_len_fill_value(self) -> int:
        """What padded seq_lens rows must hold: the attention backend's fill value (a dLLM's: its block size)."""
        return self.attn_backend.get_cuda_graph_seq_len_fill_value()

    def static_buffer(self, name: str) -> torch.Tensor | None:
        """The runner's static input buffer `name` (what the captured graph reads), None where it has none."""
        return getattr(getattr(self.runner, "buffers", None), name, None)

    def forward_batch(self, batch: DecodeBatch):
        fb = batch.to_forward_batch(self.device, self.case.spec)
        if self.lora_manager is not None and fb.lora_ids is not None:
            # what ForwardBatch.init_new does for a LoRA server: SGLang's manager first loads the batch's adapters
            # into its memory pool (the double has no pool)
            # (none with --enable-lora-overlap-loading: the scheduler's overlap loader already did)
            fetch = getattr(self.lora_manager, "fetch_new_loras", None)
            if fetch is not None and not getattr(self.lora_manager, "enable_lora_overlap_loading", False):
                fetch(set(fb.lora_ids))
            self.lora_manager.prepare_lora_batch(fb)
        return fb

    def _can_run_graph(self, fb) -> bool:
        """The runner's graph-eligibility check, under the name the release gives it."""
        check = getattr(self.runner, "can_run_graph", None) or self.runner.can_run
        return bool(check(fb))

    def can_replay(self, batch: DecodeBatch) -> bool:
        return self._can_run_graph(self.forward_batch(batch))

    # -- what the replay oracles expect (`harness.oracles.replay_target.ReplayTarget`); variants override ------
    def expected_servable(self, batch: DecodeBatch) -> bool:
        """With padding every batch is served (the strategies draw within the captured maximum); without, only a
        captured size."""
        from harness.oracles.patch_contract import expected_sizes

        return not self.case.disable_padding or batch.batch_size in expected_sizes(self.case)[0]

    def returned_logits(self, output, batch: DecodeBatch) -> torch.Tensor:
        return output.next_token_logits

    def padded_extent(self, batch: DecodeBatch) -> tuple[int, int] | None:
        return None

    def replayed_backend(self):
        """Under pdmux the current stream group's decode backend (SGLang's `decode_attn_backend_group`), else the
        runner's."""
        group = self.model_runner.decode_attn_backend_group
        if not group:
            return self.attn_backend
        from sglang.srt.multiplex.pdmux_context import get_current_stream_idx

        return group[get_current_stream_idx()]

    def stale_layout(self, batch: DecodeBatch) -> str:
        return ""

    def stale_embeddings(self, batch: DecodeBatch) -> str:
        return ""

    def replay(self, batch: DecodeBatch):
        """Load the batch into the static buffers, replay the graph, slice the real rows: SGLang's `execute`
        (`replay` where the release has no `execute`, same contract)."""
        fb = self.forward_batch(batch)
        if not self._can_run_graph(fb):
            raise RuntimeError(f"runner refuses to replay batch size {batch.batch_size} "
                               f"(captured {self.capture_bs})")
        execute = getattr(self.runner, "execute", None) or self.runner.replay
        raw = batch_consistency.raw_fields(fb)
        with self.replay_context():
            output = execute(fb)
        batch_consistency.check_restored(raw, fb, f"the decode runner's replay of a batch of {batch.batch_size}")
        return output

    def eager(self, batch: DecodeBatch, forward: Callable | None = None):
        """The model's forward (or `forward`, e.g. a compiled one patch_model yielded) on the real rows, no graph,
        with a fresh attention backend and LoRA scales."""
        fb = batch.to_forward_batch(self.device, self.case.spec)
        if self.lora_manager is not None and fb.lora_ids is not None:
            self.lora_manager.prepare_lora_batch(fb, static=False)
        self.eager_attn_backend.init_forward_metadata(fb)
        with torch.no_grad(), self.eager_context(fb):
            return (forward or self.model.forward)(fb.input_ids, fb.positions, fb)


_ORIGINAL_PATCH_MODEL: dict = {}


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
                            capturing: Callable[[], bool] | None = None):
    """Record each entry of the `contextmanager` function `fn` (by identity of its generator function).

    Each entry appends to `sink` a namespace (name, enable_compile, num_tokens, forward, calls) and records the call
    in `hooks` under `name`; the yielded forward is replaced by `hooks.wrap(f"{name}:forward", ...)`, which records
    every call of it and whether a graph capture was in progress at the time.
    """
    cell = _generator_cell(fn)
    original = cell.cell_contents
    capturing = capturing or torch.cuda.is_current_stream_capturing

    def recording(model, enable_compile, num_tokens, tp_group, *args, **kwargs):
        entry = SimpleNamespace(name=name, enable_compile=bool(enable_compile), num_tokens=num_tokens,
                                forward=None, calls=[])
        with contextlib.contextmanager(original)(model, enable_compile, num_tokens, tp_group, *args,
                                                  **kwargs) as forward:
            entry.forward = forward

            @functools.wraps(forward)
            def forward_call(*a, **k):
                entry.calls.append("capture" if capturing() else "eager")
                return forward(*a, **k)

            hooks.record(name, (model, bool(enable_compile)), {"num_tokens": num_tokens}, forward)
            sink.append(entry)
            yield hooks.wrap(f"{name}:forward", forward_call)

    recording.__name__ = getattr(original, "__name__", name)
    cell.cell_contents = recording  # a closure cell: mock.patch would delete and re-create its contents
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
