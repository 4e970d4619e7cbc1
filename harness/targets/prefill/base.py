"""What every prefill layout shares: the case and batch types, the harness's KV cache, the attention backend double,
the ForwardBatch a scheduler would build, and the target's interface. A layout module subclasses `PrefillTarget`
and names that subclass in its `Layout`."""
from __future__ import annotations

import dataclasses
from types import SimpleNamespace
from typing import Any

import torch

from harness.models.prefill_model import HIDDEN, NUM_LAYERS, in_breakable_graph

BACKENDS = ("tc_piecewise", "breakable", "full")
# Paths a release may lack, asked of a layout by name (`Layout.feature_gap`).
CONTEXT_LIMITS = "fixed-context prefill graphs"
BACKEND_ADMISSION = "the attention backend's own prefill-graph admission"
EXECUTE_HIDDEN_GUARD = "execute's capture_hidden_mode check"
CAPTURE_FAILURE_MESSAGE = "the prefill capture-failure message"
DEEPSTACK_WARMUP = "the Qwen3-VL deepstack warm-up"
MIXED_CHUNK_CHECK = "the runner's mixed-chunk backend check"
POOLED_OUTPUT = "embedding models' pooled outputs"
LORA_CAPTURE = "LoRA batch info captured by breakable/full"
FEATURES = (CONTEXT_LIMITS, EXECUTE_HIDDEN_GUARD, CAPTURE_FAILURE_MESSAGE, DEEPSTACK_WARMUP, MIXED_CHUNK_CHECK,
            POOLED_OUTPUT, LORA_CAPTURE, BACKEND_ADMISSION)


@dataclasses.dataclass(frozen=True)
class Layout:
    """Where one range of releases keeps the prefill path, and the target class that drives it."""

    name: str
    target_class: type
    backends: tuple[str, ...]
    refused_modes: tuple[str, ...]  # modes the runner refuses (SGLang's eager path or its own error)
    unproduced_modes: tuple[str, ...]  # modes it does not refuse but this configuration never hands it (findings)
    note: str  # what the harness sets past SGLang's config on this layout, recorded with every example

    def make_target(self, case: PrefillCase, device: str = "cpu") -> PrefillTarget:
        """Construct the real runner for `case` on `device` (it compiles and captures)."""
        return self.target_class(case, self, device)

    def backend_gap(self, backend: str, device: str = "cpu") -> str | None:
        """Why `backend` cannot run on this release and `device` (None: it can)."""
        if backend not in self.backends:
            from harness.versions import sglang_version

            return f"SGLang {sglang_version()} ({self.name}) has no {backend!r} prefill backend"
        return self.target_class.backend_gap(backend, device)

    def multimodal_gap(self) -> str | None:
        return self.target_class.multimodal_gap()

    def chunked_prefix_gap(self) -> str | None:
        return self.target_class.chunked_prefix_gap()

    def feature_gap(self, feature: str) -> str | None:
        """Why this release cannot drive `feature` (one of `FEATURES`; None: it can)."""
        return self.target_class.feature_gap(feature)


@dataclasses.dataclass(frozen=True)
class PrefillCase:
    backend: str = "tc_piecewise"
    capture_tokens: tuple[int, ...] = (4, 8, 16)
    compiler: str = "eager"  # tc_piecewise only: the compiler of the pieces
    max_requests: int = 8  # req_to_token_pool rows (row 0 is reserved as the padding row)
    max_context: int = 64  # req_to_token_pool columns
    full_prefill_max_req: int = 4
    capture_mode: str = "auto"  # virtual device: "record" | "rerun" | "auto" (record for eager, rerun for inductor)
    multimodal: bool = False  # a VLM: mRoPE positions, embeddings handed to the language model, input_embeds slot
    prefix_chunk_tokens: int | None = None  # full only: chunked-prefix capture, aggregate tokens per prefix chunk
    # where SGLang reads that capacity: "config" (full_prefill_prefix_chunk_tokens), "chunked_prefill_size" (left
    # unset, so the scheduler's chunk budget carries it) or "max_bs" (both unset: the prefill phase's max_bs)
    prefix_chunk_source: str = "config"
    # Context limits of the graphs: `--cuda-graph-prefill-max-context` (metadata planned at that fixed extent;
    # SGLang ignores it on tc_piecewise) and the attention backend's default replay cap
    # (`prefill_cuda_graph_default_max_seq_len`); a longer context (prefix + new tokens) runs eager.
    max_context_size: int | None = None
    backend_max_seq_len: int | None = None
    # The attention backend's own admission (`can_run_prefill_cuda_graph`, as SGLang's dLLM and DeepSeek V4
    # backends define one, which the runner must honour): it refuses a batch where a request extends by more than
    # this many tokens (dLLM's query limit). None: the backend defines no such method.
    backend_max_extend: int | None = None
    fixed_context_metadata: bool = True  # the attention backend plans fixed-extent metadata (max_context_size)
    body: str = "annotated"  # the model body's variant (`harness.models.prefill_model.BODIES`)
    enable_mixed_chunk: bool = False  # `--enable-mixed-chunk`: decode requests ride in prefill batches (MIXED)
    # breakable only: the attention backend opts into SGLang's captured-metadata contract (per-bucket metadata
    # built at capture, refreshed in place at replay)
    captured_attn_metadata: bool = False
    # with it: the most requests one replay of a bucket's captured metadata can carry (the backend's
    # `prefill_cuda_graph_max_batch_size`, as hybrid linear attention sizes its static tables); None: no bound
    captured_metadata_max_requests: int | None = None
    pooled: bool = False  # an embedding model: SGLang's EmbeddingPoolerOutput in place of logits
    wrapped: bool = False  # the causal LM behind a VLM-style `language_model` wrapper (no `model` of its own)
    # breakable, virtual device only: the attention layers have MHA companions (an MLA model's), whose prefix path
    # a breakable graph off CUDA cannot capture
    mha_companion: bool = False
    lora: bool = False  # a LoRA server (SGLang's lora_manager set; requests on the base model)
    # --enable-deterministic-inference: SGLang's Triton backend runs extend attention through its unified
    # one-stage kernel (the real-model target; the attention doubles read no such switch)
    deterministic: bool = False

    def context_limit(self) -> int | None:
        """The longest context a graph may serve (None: any). Example: full, max_context_size 32 -> 32;
        tc_piecewise, max_context_size 32 -> None (SGLang ignores it there, with a warning)."""
        fixed = None if self.backend == "tc_piecewise" else self.max_context_size
        limits = [limit for limit in (fixed, self.backend_max_seq_len) if limit is not None]
        return min(limits) if limits else None

    @property
    def device_capture_mode(self) -> str:
        if self.capture_mode != "auto":
            return self.capture_mode
        if self.backend == "tc_piecewise" and self.compiler == "inductor":
            return "rerun"
        return "record"



def body_forward(case: PrefillCase):
    """The forward `install_torch_compiled` compiles for the case (the body's class forward), from the case alone,
    so a refusal to compile it can be judged even when no target was built."""
    from harness.models.prefill_model import BODIES

    body = BODIES[case.body]
    return (body if isinstance(body, type) else type(body(1))).forward


PAD_SLOT = 0  # KV slot every padding / dummy token writes to; never handed to a real request


class KvCache:
    """The harness's KV cache: `req_to_token[row, position] -> slot`, `values[layer, slot] -> hidden`."""

    def __init__(self, max_requests: int, max_context: int, num_layers: int = NUM_LAYERS, device: str = "cpu"):
        self.size = max_requests
        self.device = device  # every tensor of a batch and of the attention double lives here
        self.req_to_token = torch.zeros((max_requests, max_context), dtype=torch.int32, device=device)
        self.num_slots = max_requests * max_context + 1
        self.values = torch.zeros((num_layers, self.num_slots, HIDDEN), dtype=torch.float32, device=device)

    def slot(self, row: int, position: int) -> int:
        return 1 + row * self.req_to_token.shape[1] + position

    def bind(self, row: int, length: int) -> None:
        positions = torch.arange(length, dtype=torch.int32, device=self.device)
        self.req_to_token[row, :length] = 1 + row * self.req_to_token.shape[1] + positions


class HarnessAttention:
    """Attention backend double (its methods; `make_attention_backend_class` puts SGLang's `AttentionBackend`
    under it). Out of graph, for every batch (`init_forward_metadata[_out_graph]`, as
    SGLang's backends do), it writes the batch's metadata into its own capture-stable buffers: per flat token
    the `req_to_token` row and the position (-1 for padding). The attention split op (`harness_attend`) writes
    the KV at the slots the compiled body hands it (`out_cache_loc`) and computes from those buffers with
    fixed-shape tensor ops only, so the same code is right when it runs eagerly between pieces (tc_piecewise,
    breakable) and when a full graph captured it."""

    dllm_attention = None
    prefill_cuda_graph_default_max_seq_len = None
    supports_prefill_cuda_graph_max_context_size = False
    supports_full_cuda_graph_chunked_prefix = True
    use_captured_forward_metadata_for_breakable_cuda_graph = False
    prefill_cuda_graph_max_batch_size = None  # with the contract above: requests one captured replay carries
    skips_prefill_metadata_on_idle_dp_rank = False

    def __init__(self, kv: KvCache):
        self.kv = kv
        self.req_to_token_pool = SimpleNamespace(req_to_token=kv.req_to_token, size=kv.size)
        self.token_to_kv_pool = None
        self.forward_metadata = None
        self.metadata_inits = 0
        self.context = torch.arange(kv.req_to_token.shape[1], dtype=torch.int64, device=kv.device)
        self.tables = self._new_tables()  # what the attention reads: the current batch's metadata
        self.bucket_tables: dict = {}  # captured-metadata contract only: token count -> that bucket's tables

    def _new_tables(self) -> SimpleNamespace:
        """Capture-stable per-token metadata buffers: the token's req_to_token row, its position (-1:
        padding), its request's index in the batch and cached prefix; `extent`, the columns of req_to_token
        the metadata covers (the batch's max_seq_len_override, a fixed-context graph's extent, or all)."""
        max_tokens, device = self.kv.num_slots, self.kv.device
        return SimpleNamespace(
            token_row=torch.zeros(max_tokens, dtype=torch.int64, device=device),
            token_position=torch.full((max_tokens,), -1, dtype=torch.int64, device=device),
            token_request=torch.zeros(max_tokens, dtype=torch.int64, device=device),
            token_prefix=torch.zeros(max_tokens, dtype=torch.int64, device=device),
            extent=torch.tensor(self.kv.req_to_token.shape[1], dtype=torch.int64, device=device))

    # The captured-metadata contract (`use_captured_forward_metadata_for_breakable_cuda_graph`, as hybrid
    # linear attention opts in): each captured bucket (token count) gets tables of its own, which the replay
    # refreshes in place from the live batch; inside a breakable graph the attention reads its bucket's
    # tables, so a replay that skips the refresh computes with the capture's or an earlier batch's metadata.
    def init_forward_metadata_for_breakable_cuda_graph_capture(self, forward_batch) -> SimpleNamespace:
        tables = self.bucket_tables[int(forward_batch.input_ids.shape[0])] = self._new_tables()
        self._write_tables(forward_batch, tables)
        return tables

    def prepare_forward_metadata_for_breakable_cuda_graph_replay(self, metadata, forward_batch,
                                                                static_forward_batch=None) -> None:
        cap = self.prefill_cuda_graph_max_batch_size
        if cap is not None and forward_batch.batch_size > cap:  # a real backend's static tables overflow here
            raise RuntimeError(f"captured prefill metadata holds {cap} request(s) (prefill_cuda_graph_max_batch_size)"
                               f"; the replay refreshes it with {forward_batch.batch_size}")
        self._write_tables(forward_batch, metadata)

    def _tables_for(self, num_tokens: int) -> SimpleNamespace:
        if self.bucket_tables and in_breakable_graph():
            return self.bucket_tables[num_tokens]
        return self.tables

    def init_cuda_graph_state(self, max_bs: int, max_num_tokens: int) -> None:
        pass

    def get_cuda_graph_seq_len_fill_value(self) -> int:
        return 1

    def init_forward_metadata(self, forward_batch) -> None:
        self.init_forward_metadata_out_graph(forward_batch)

    def init_forward_metadata_out_graph(self, forward_batch, in_capture: bool = False) -> None:
        self._write_tables(forward_batch, self.tables)

    def _write_tables(self, forward_batch, tables: SimpleNamespace) -> None:
        self.metadata_inits += 1
        bs = forward_batch.batch_size
        host_rows = getattr(forward_batch, "req_pool_indices_cpu", None)  # planned from the host copy
        pool_rows = forward_batch.req_pool_indices if host_rows is None else host_rows
        rows = [int(r) for r in pool_rows[:bs].tolist()]
        seq_lens = [int(s) for s in forward_batch.seq_lens[:bs].tolist()]
        if forward_batch.extend_seq_lens is not None and not forward_batch.forward_mode.is_decode_or_idle():
            new = [int(n) for n in forward_batch.extend_seq_lens[:bs].tolist()]
        else:
            new = [1] * bs
        token_row, token_position, token_request, token_prefix = [], [], [], []
        for index, (row, seq_len, count) in enumerate(zip(rows, seq_lens, new)):
            token_row += [row] * count
            token_position += range(seq_len - count, seq_len)
            token_request += [index] * count
            token_prefix += [seq_len - count] * count
        n = len(token_row)
        tables.token_row.zero_()
        tables.token_position.fill_(-1)
        tables.token_request.fill_(forward_batch.batch_size)  # padding: the request slot past the last
        tables.token_prefix.zero_()
        for name, values in (("token_row", token_row), ("token_position", token_position),
                             ("token_request", token_request), ("token_prefix", token_prefix)):
            if n:
                getattr(tables, name)[:n] = torch.tensor(values, dtype=torch.int64, device=self.kv.device)
        override = getattr(forward_batch, "max_seq_len_override", None)
        tables.extent.fill_(self.kv.req_to_token.shape[1] if override is None else override)
        self.forward_metadata = SimpleNamespace(num_tokens=n, rows=rows, seq_lens=seq_lens, new=new)

    def harness_attend(self, x: torch.Tensor, output: torch.Tensor, slots: torch.Tensor, layer_id: int,
                       prefix_kv_indices=None, prefix_cu_seq_lens=None) -> None:
        """KV[slots[t]] = x[t] (padding writes PAD_SLOT); output[t] = sum of the cached x over positions
        0..position(t) of token t's request, within the metadata's extent (positions past it are not read, as
        a fixed-context backend's metadata ends there). With a chunked-prefix full graph's buffers
        (`prefix_*`, what the
        captured body hands the op) the cached prefix is read through them, the new tokens through
        req_to_token."""
        t = x.shape[0]
        tables = self._tables_for(t)
        values = self.kv.values[layer_id]
        values.index_copy_(0, slots[:t].to(torch.int64), x)
        values[PAD_SLOT].zero_()
        slots = self.kv.req_to_token.index_select(0, tables.token_row[:t]).to(torch.int64)  # (t, context)
        visible = self.context.unsqueeze(0) <= tables.token_position[:t].unsqueeze(1)  # (t, context)
        visible = visible & (self.context < tables.extent).unsqueeze(0)
        if prefix_kv_indices:  # the prefix comes from SGLang's chunk buffers, not req_to_token
            visible = visible & (self.context.unsqueeze(0) >= tables.token_prefix[:t].unsqueeze(1))
        gathered = values.index_select(0, slots.reshape(-1)).reshape(t, -1, x.shape[1])
        output.copy_((gathered * visible.unsqueeze(-1)).sum(dim=1))
        if prefix_kv_indices:
            sums = self._prefix_sums(values, prefix_kv_indices, prefix_cu_seq_lens)
            output.add_(sums.index_select(0, tables.token_request[:t]))

    @staticmethod
    def _prefix_sums(values: torch.Tensor, kv_indices, cu_seq_lens: torch.Tensor) -> torch.Tensor:
        """Per request slot (plus one for padding), the sum of its cached prefix KV, read chunk by chunk
        through the KV indices SGLang's `create_chunked_prefix_cache_kv_indices` wrote (entries past a chunk's
        last request are slot 0, PAD_SLOT, whose values are zero)."""
        slots = cu_seq_lens.shape[1] - 1
        sums = torch.zeros((slots + 1, values.shape[1]), dtype=values.dtype, device=values.device)
        for chunk, chunk_indices in enumerate(kv_indices):
            indices = chunk_indices.to(torch.int64)
            ends = cu_seq_lens[chunk, 1:].to(torch.int64)
            entry = torch.arange(indices.shape[0], device=values.device)
            owner = torch.searchsorted(ends, entry, right=True)  # request slot of each entry (slots: none)
            sums.index_add_(0, owner, values.index_select(0, indices))
        return sums

    def forward_extend(self, *args, **kwargs):  # the model's attention never goes through here
        raise NotImplementedError("the harness model attends through its split op")

    forward_decode = forward_extend


def make_attention_backend_class():
    """The double as an `AttentionBackend` subclass, made on demand: SGLang is imported late (not at the
    harness's import), and its base class's defaults apply where the double defines nothing."""
    from sglang.srt.layers.attention.base_attn_backend import AttentionBackend

    return type("HarnessAttnBackend", (HarnessAttention, AttentionBackend), {"__doc__": HarnessAttention.__doc__})


@dataclasses.dataclass(frozen=True)
class Request:
    """One request of a batch: the tokens this forward computes, after `prefix` tokens already in the KV cache
    (`prefix > 0` and one new token is a decoding request inside a mixed batch; more is a chunk)."""
    row: int
    tokens: tuple[int, ...]
    prefix: int = 0
    history: tuple[int, ...] = ()  # the `prefix` token ids already cached (for the by-hand reference)
    embeds: tuple[tuple[int, int], ...] | None = None  # an image request's own embeddings, one per new token
    mrope_delta: tuple[int, int, int] = (0, 0, 0)  # per-axis shift of its mRoPE positions (multimodal model)
    adapter: str | None = None  # its LoRA adapter on a LoRA server (None: the base model)


@dataclasses.dataclass(frozen=True)
class Batch:
    requests: tuple[Request, ...]
    forward_mode: Any  # ForwardMode
    global_forward_mode: Any = None  # ForwardMode or None
    capture_hidden_mode: str = "NULL"  # CaptureHiddenMode name: hidden states the caller wants back
    return_logprob: bool = False
    # token-embedding overrides (SGLang's replace_embeds at replace_positions): the first token's embedding replaced
    # by its own (id, 0), so the numbers stay the text batch's and only the admission is under test
    replace_embeds: bool = False

    @property
    def num_tokens(self) -> int:
        return sum(len(r.tokens) for r in self.requests)


def build_forward_batch(batch: Batch, kv: KvCache, translator=None, *, mrope: bool = False, lora: bool = False):
    """The ForwardBatch the scheduler would hand the model runner for `batch` (KV slots bound per request);
    `mrope`: a multimodal model's batch, with mRoPE positions `[3, T]` (position + the request's delta per axis)
    and, when a request brings its own embeddings, `input_embeds` `[T, 2]` (others embedded as (id, 0)); `lora`: a
    LoRA server's batch, carrying each request's adapter (`lora_ids`)."""
    from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode, ForwardBatch

    input_ids, positions, out_cache_loc, mrope_positions, embeds = [], [], [], [], []
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
            mrope_positions.append([position + d for d in request.mrope_delta])
            embeds.append(request.embeds[offset] if request.embeds is not None else (token, 0))
        seq_lens.append(seq_len)
        prefix_lens.append(request.prefix)
        extend_lens.append(len(request.tokens))
    bs = len(batch.requests)
    tensor = lambda values: torch.tensor(values, dtype=torch.int64, device=kv.device)  # noqa: E731
    is_extend = batch.forward_mode.is_extend()
    forward_batch = ForwardBatch(
        forward_mode=batch.forward_mode, batch_size=bs, input_ids=tensor(input_ids),
        req_pool_indices=tensor([r.row for r in batch.requests]), seq_lens=tensor(seq_lens),
        orig_seq_lens=tensor(seq_lens), seq_lens_cpu=torch.tensor(seq_lens, dtype=torch.int64),
        out_cache_loc=tensor(out_cache_loc),
        seq_lens_sum=sum(seq_lens), positions=tensor(positions), return_logprob=batch.return_logprob,
        extend_num_tokens=len(input_ids) if is_extend else None,
        extend_seq_lens=tensor(extend_lens) if is_extend else None,
        extend_prefix_lens=tensor(prefix_lens) if is_extend else None,
        extend_start_loc=tensor(starts) if is_extend else None,
        extend_prefix_lens_cpu=prefix_lens if is_extend else None,
        extend_seq_lens_cpu=extend_lens if is_extend else None,
        extend_logprob_start_lens_cpu=extend_lens if is_extend else None,
        capture_hidden_mode=CaptureHiddenMode[batch.capture_hidden_mode],
        global_forward_mode=batch.global_forward_mode, spec_algorithm=None, spec_info=None, encoder_lens=None,
        mrope_positions=tensor(mrope_positions).reshape(-1, 3).T.contiguous() if mrope else None,
        input_embeds=(torch.tensor(embeds, dtype=torch.float32, device=kv.device).reshape(-1, 2)
                      if any(r.embeds is not None for r in batch.requests) else None),
        lora_ids=[r.adapter for r in batch.requests] if lora else None,
    )
    if batch.replace_embeds:
        forward_batch.replace_positions = tensor([0])
        forward_batch.replace_embeds = torch.tensor([[float(input_ids[0]), 0.0]], device=kv.device)
    if hasattr(forward_batch, "req_pool_indices_cpu"):  # 0.5.2x: the scheduler's host copy, which planning reads
        forward_batch.req_pool_indices_cpu = torch.tensor([r.row for r in batch.requests], dtype=torch.int64)
    if translator is not None and hasattr(translator, "own_plan"):
        # what ForwardBatch.init_new does from 0.5.2x: the iteration's KV write plan
        translator.own_plan(forward_batch).bind(forward_batch, translator)
    return forward_batch



class PrefillTarget:
    """The real prefill runner for one case on one device (the virtual device must stay installed while replaying).

    `forward(batch)` runs SGLang's own dispatch and returns (logits, whether the graph path ran, the ForwardBatch);
    `eager(batch)` is the model's own forward with no graph and no compile; `can_run_graph(batch)` the runner's
    admission; `state_probes()` maps a name to (a reader of SGLang's process state, its value at rest)."""

    runner: Any

    def __init__(self, case: PrefillCase, layout: Layout, device: str = "cpu") -> None:
        self.case = case
        self.layout = layout
        self.device = device

    @classmethod
    def backend_gap(cls, backend: str, device: str) -> str | None:
        return None

    def close(self) -> None:
        """Undo what the target patched for its lifetime (nothing by default)."""

    @classmethod
    def chunked_prefix_gap(cls) -> str | None:
        """Why this release's runner has no chunked-prefix full capture (None: it has)."""
        return f"the {cls.__module__} target drives no chunked-prefix capture"

    @classmethod
    def feature_gap(cls, feature: str) -> str | None:
        """Why this release's target cannot drive `feature` (one of `FEATURES`; None: it can)."""
        return f"the {cls.__module__} target drives no {feature}"

    @classmethod
    def multimodal_gap(cls) -> str | None:
        """Why this release's runner cannot take the multimodal model (None: it can)."""
        return f"the {cls.__module__} target builds no multimodal batches"

    def forward(self, batch: Batch):
        raise NotImplementedError

    def execute(self, batch: Batch):
        raise NotImplementedError

    def eager(self, batch: Batch) -> torch.Tensor:
        raise NotImplementedError

    def can_run_graph(self, batch: Batch) -> bool:
        raise NotImplementedError

    def state_probes(self) -> dict:
        raise NotImplementedError
