"""A tiny causal LM for SGLang's prefill graph runner, with outputs you can compute by hand.

Shapes: hidden size 2, vocabulary 4, `NUM_LAYERS` = 2 layers. For a token at flat row t:

    e[t]       = input_embeds[t] if the batch carries embeddings, else (input_ids[t], 0)   # the embedding
    p[t]       = positions[t], or for the multimodal (mRoPE) model sum over the 3 axes of mrope_positions[:, t]
    h0[t]      = e[t] + (0, p[t])
    per layer l:
      x[t]     = h[t] + 1                                            # the "pre-attention" step (compiled piece)
      write x[t] to KV slot out_cache_loc[t] (read inside the compiled region, handed to the split op)
      a[t]     = sum of x over the request's tokens up to and including t, the cached prefix included
                                                                     # the attention split op (eager)
      h[t]     = h[t] + a[t]
    logits[r, v] = (v + 1) * (h[last token of request r, 0] + h[last, 1])   # the eager LM-head tail

So a single text request of ids (3, 5) at positions (0, 1) gives, layer 1: x = (4, 1), (6, 2); a = (4, 1),
(10, 3); h = (7, 1), (15, 4); layer 2: x = (8, 2), (16, 5); a = (8, 2), (24, 7); h = (15, 3), (39, 11);
logits = (v + 1) * 50.  `reference_logits` computes exactly this in plain Python from `initial_hidden`.
mRoPE positions of a request are its text positions shifted per axis (`mrope_delta`, as an image's grid shifts
Qwen2-VL's), so p[t] = 3 * position + sum(mrope_delta): a stale or 1-D position in the body changes the numbers.

What it exercises, the way SGLang's own layers do:
- The attention is a split op registered with SGLang's `register_custom_op` + `register_split_op` (as
  `nemotron_mamba2_with_output` is), so SGLang's piecewise backend splits the compiled graph there and the
  op runs eagerly between captured pieces; it reads per-batch metadata that the attention backend double
  (`harness.targets.prefill.base.HarnessAttnBackend`) prepared out of graph, and the KV cache (written at the
  `out_cache_loc` the compiled body passes it, read through `req_to_token`), so stale metadata or stale static
  buffers change numbers. Under the breakable backend it is an eager break (`eager_on_graph`), as SGLang's models
  mark theirs.
- The compiled body reads, from its arguments and the ForwardBatch, what real models and attention layers read:
  positions (1-D, or mRoPE `[3, T]` whose token axis is the last), `input_embeds` `[T, 2]`, `out_cache_loc`,
  `forward_batch.forward_mode` (prefill or decode code path, as attention layers dispatch) and
  `forward_batch.global_forward_mode` (the batch-wide mode, as DeepSeek-V4's two-batch-overlap check reads it).
  Both mode code paths compute the same numbers, so a batch replayed under the wrong mode is numerically silent,
  exactly like known bug 2: Dynamo's guards on these two fields are what catch it.
- The multimodal model (`multimodal=True`) is what SGLang's VLM wrappers are: `is_mrope_enabled`, an image
  batch's own embeddings handed to the language model as `input_embeds`, a text-only batch's ids alone (the body
  embeds them; the breakable/full graphs read the input_embeds slot SGLang refills from `get_input_embeddings()`).
- Each layer holds SGLang's own `SiluAndMul` (a fused op, as every real MLP holds one) and adds
  `act([0, x]) = silu(0) * x`, exactly 0: SGLang flips fused ops into torch.compile mode for its compile pass, so
  Dynamo traces the op's compile-safe forward, and the capture-context oracle reads the op's mode at each trace.
- LoRA (a LoRA server, `PrefillLoRAManagerDouble`): request r's adapter scale s_r adds (s_r, 0) to e[t] of its
  tokens, read by the body from the manager's batch info (static buffers under a graph).
- Body variants (`BODIES`): "annotated" (the default above); "deepstack", a body that also takes Qwen3-VL's
  `input_deepstack_embeds` [T, 2 * NUM_DEEPSTACK] and adds its first 2 columns to h0 (h0[t] += d[t, :2]), with
  the outer model declaring `num_deepstack_embeddings`, so SGLang's deepstack warm-up applies to it;
  "unannotated", a body whose forward has no annotations (SGLang cannot infer its dynamic dimensions);
  "pipeline", a body ported from vLLM whose hidden states arrive from the previous pipeline stage as SGLang's
  `IntermediateTensors` (`intermediate_tensors: Optional[IntermediateTensors] = None`): the outer model hands it
  {"hidden_states": e} (e as above, computed outside the body into an address-stable receive buffer, as SGLang's
  static pp-proxy buffers are) and the body reads e from it, so the numbers are
  the annotated body's while SGLang must mark the residual's token dimension dynamic from that annotation;
  "blocks", a body keeping its decoder layers under `h` (as GPT-2-style bodies do), which the breakable/full
  backends cannot find (they capture the module that owns `layers`); "lazy_fused", the annotated body whose fused
  ops were never run before the compile pass (every other body runs them once at construction), as on a server.
"""
# No `from __future__ import annotations`: the body's annotations are the objects most SGLang model files hand
# `install_torch_compiled` (the deepstack body below spells them as strings, as files with that import do).
from collections.abc import Sequence

import torch
from torch import nn

from harness.models import capture_queries, fused_ops

HIDDEN = 2
VOCAB = 4
NUM_LAYERS = 2
ATTENTION_OP = "harness_prefill_attention"

_registered: dict = {}


def _default_attn_backend():
    from sglang.srt.model_executor.forward_context import get_attn_backend  # 0.5.14+

    return get_attn_backend()


def _default_in_breakable() -> bool:
    from sglang.srt.model_executor.runner_backend_utils.breakable_cuda_graph.context import (
        is_in_breakable_cuda_graph,
    )

    return is_in_breakable_cuda_graph()


def _default_eager_on_graph():
    from sglang.srt.model_executor.runner_backend_utils.breakable_cuda_graph.breakable_cuda_graph import (
        eager_on_graph,
    )

    return eager_on_graph


# Where the model meets SGLang's per-release plumbing. The target adapter of the installed release binds these
# (`bind_sglang_hooks`); the defaults are the 0.5.14+ ones.
#   attn_backend()     -> the attention backend of the running forward (SGLang's forward context)
#   in_breakable()     -> whether a breakable-graph capture/replay is running
#   eager_on_graph()   -> SGLang's eager-break decorator factory, or None where the release has none
_hooks: dict = {"attn_backend": _default_attn_backend, "in_breakable": _default_in_breakable,
                "eager_on_graph": _default_eager_on_graph}


def bind_sglang_hooks(*, attn_backend=None, in_breakable=None, eager_on_graph=None) -> None:
    """Bind the model to one release's plumbing (see `_hooks`); None keeps the current binding."""
    for name, value in (("attn_backend", attn_backend), ("in_breakable", in_breakable),
                        ("eager_on_graph", eager_on_graph)):
        if value is not None:
            _hooks[name] = value


def in_breakable_graph() -> bool:
    """Whether a breakable-graph capture/replay is running (the bound release's answer)."""
    return _hooks["in_breakable"]()


def _attention_kernel(x: torch.Tensor, output: torch.Tensor, slots: torch.Tensor, layer_id: int,
                      prefix_kv_indices=None, prefix_cu_seq_lens=None) -> None:
    """The attention body: writes x at `slots`, reads the metadata the attention backend prepared for this batch
    (out of graph) and, in a chunked-prefix full graph, the prefix chunk buffers."""
    _hooks["attn_backend"]().harness_attend(x, output, slots, layer_id, prefix_kv_indices, prefix_cu_seq_lens)


def register_attention_op():
    """Register the split op with SGLang's own helpers, then add the CPU kernel SGLang does not register.

    Idempotent; returns (op callable, breakable eager-break callable).
    """
    if _registered:
        return _registered["op"], _registered["breakable"]
    from sglang.srt.compilation.compilation_config import register_split_op
    from sglang.srt.utils.custom_op import register_custom_op

    from harness.devices.custom_ops import add_cpu_kernel

    def harness_prefill_attention(x: torch.Tensor, output: torch.Tensor, slots: torch.Tensor, layer_id: int,
                                  prefix_kv_indices: list[torch.Tensor],
                                  prefix_cu_seq_lens: torch.Tensor | None) -> None:
        _attention_kernel(x, output, slots, layer_id, prefix_kv_indices, prefix_cu_seq_lens)

    op = register_custom_op(mutates_args=["output"])(register_split_op()(harness_prefill_attention))
    add_cpu_kernel(ATTENTION_OP, harness_prefill_attention)
    eager_on_graph = _hooks["eager_on_graph"]()
    breakable = eager_on_graph(True)(harness_prefill_attention) if eager_on_graph is not None else None
    _registered.update(op=op, breakable=breakable)
    return _registered["op"], _registered["breakable"]


class PrefillLayer(nn.Module):
    def __init__(self, layer_id: int):
        super().__init__()
        self.layer_id = layer_id
        self.act = fused_ops.silu_and_mul(resolve=False)  # resolved by the body (`PrefillModel.RESOLVE_FUSED`)

    def forward(self, h: torch.Tensor, forward_batch) -> torch.Tensor:
        capture_queries.ask(f"PrefillLayer[{self.layer_id}].forward", h.device)  # as a real layer asks
        mode = forward_batch.forward_mode
        if mode.is_idle():
            return h
        if mode.is_extend():
            x = h + 1.0  # prefill path
        else:
            x = 1.0 + h  # decode path: same numbers
        batch_mode = forward_batch.global_forward_mode
        if batch_mode is not None and batch_mode.is_extend():
            x = x * 1.0  # batch-wide prefill: same numbers
        x = x + fused_ops.adds_nothing(self.act, x)  # silu(0) * x: adds exactly 0
        output = torch.empty_like(x)
        op, breakable = register_attention_op()
        slots = forward_batch.out_cache_loc
        # A chunked-prefix full capture's batch carries the runner's prefix chunk buffers (SGLang sets them as
        # attributes; absent elsewhere): attention reads the cached prefix through them, as real backends do.
        prefix = (list(getattr(forward_batch, "prefix_chunk_kv_indices", None) or ()),
                  getattr(forward_batch, "prefix_chunk_cu_seq_lens", None))
        if breakable is not None and in_breakable_graph():
            breakable(x, output, slots, self.layer_id, *prefix)
        else:
            op(x, output, slots, self.layer_id, *prefix)
        return h + output


def embed_tokens(input_ids: torch.Tensor) -> torch.Tensor:
    """The token embedding: id v -> (v, 0)."""
    ids = input_ids.to(torch.float32)
    return torch.stack([ids, torch.zeros_like(ids)], dim=-1)


class TokenEmbedding(nn.Module):
    """`get_input_embeddings()`: what SGLang calls to embed a text batch for the input_embeds slot."""

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return embed_tokens(input_ids)


class PrefillModel(nn.Module):
    """The transformer body (what SGLang's breakable/full backends capture and `install_torch_compiled`
    compiles): annotated tensor arguments, so SGLang infers the dynamic dimensions itself."""

    LAYERS = "layers"  # the attribute holding the decoder layers
    RESOLVE_FUSED = True  # run each layer's fused op once at construction, settling its dispatch

    def __init__(self, num_layers: int = NUM_LAYERS):
        super().__init__()
        self.layers = nn.ModuleList(PrefillLayer(i) for i in range(num_layers))
        self.lora_manager: PrefillLoRAManagerDouble | None = None  # a LoRA server's (set by the target)
        if self.RESOLVE_FUSED:  # settle each layer's fused-op dispatch before any compile pass
            for layer in self.layers:
                fused_ops.settle(layer.act)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, forward_batch,
                input_embeds: torch.Tensor | None = None) -> torch.Tensor:
        position = (positions.sum(dim=0) if positions.dim() == 2 else positions).to(torch.float32)
        embedded = embed_tokens(input_ids) if input_embeds is None else input_embeds.to(torch.float32)
        h = embedded + torch.stack([torch.zeros_like(position), position], dim=-1)
        if self.lora_manager is not None:  # each request's adapter delta, from the LoRA batch info
            scale = self.lora_manager.token_scales(h.shape[0])
            h = h + torch.stack([scale, torch.zeros_like(scale)], dim=-1)
        for layer in getattr(self, self.LAYERS):
            h = layer(h, forward_batch)
        return h


class DeepstackPrefillModel(PrefillModel):
    """A body taking Qwen3-VL's deepstack embeddings (string annotations, as in a file with the future import)."""

    def forward(self, input_ids: "torch.Tensor", positions: "torch.Tensor", forward_batch,
                input_embeds: "torch.Tensor | None" = None,
                input_deepstack_embeds: "torch.Tensor | None" = None) -> "torch.Tensor":
        if input_deepstack_embeds is not None:  # the visual features merged into h0, as the first layers do
            embedded = embed_tokens(input_ids) if input_embeds is None else input_embeds.to(torch.float32)
            input_embeds = embedded + input_deepstack_embeds[:, :HIDDEN].to(torch.float32)
        return super().forward(input_ids, positions, forward_batch, input_embeds=input_embeds)


class UnannotatedPrefillModel(PrefillModel):
    """A body whose forward carries no annotations: SGLang cannot infer which dimensions to mark dynamic."""

    def forward(self, input_ids, positions, forward_batch, input_embeds=None):
        return super().forward(input_ids, positions, forward_batch, input_embeds=input_embeds)


class BlocksPrefillModel(PrefillModel):
    """Decoder layers under `h`, not `layers` (GPT-2 style): same numbers."""

    LAYERS = "h"

    def __init__(self, num_layers: int = NUM_LAYERS):
        super().__init__(num_layers)
        self.h = self.layers
        del self.layers


def pipeline_body(num_layers: int = NUM_LAYERS) -> PrefillModel:
    """The "pipeline" body (SGLang's IntermediateTensors is imported here: the annotation needs the object)."""
    from sglang.srt.compilation.compile import IntermediateTensors

    class PipelinePrefillModel(PrefillModel):
        """Hidden states from the previous pipeline stage, as vLLM-ported models take them."""

        def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, forward_batch,
                    input_embeds: torch.Tensor | None = None,
                    intermediate_tensors: IntermediateTensors | None = None) -> torch.Tensor:
            if intermediate_tensors is not None:
                input_embeds = intermediate_tensors["hidden_states"]
            return super().forward(input_ids, positions, forward_batch, input_embeds=input_embeds)

    return PipelinePrefillModel(num_layers)


STAGE_ROWS = 512  # rows of the "pipeline" model's receive buffer: more than any batch the suites send


def stage_input(buffer: torch.Tensor, input_ids: torch.Tensor, input_embeds: torch.Tensor | None) -> dict:
    """What the previous pipeline stage hands the "pipeline" body: its hidden states e (the embedding), received
    into a persistent buffer (address-stable, as SGLang's static pp-proxy buffers are: captured graphs read inputs
    at their capture-time addresses)."""
    from sglang.srt.compilation.compile import IntermediateTensors

    embedded = embed_tokens(input_ids) if input_embeds is None else input_embeds.to(torch.float32)
    assert embedded.shape[0] <= buffer.shape[0], f"{embedded.shape[0]} tokens exceed the stage buffer"
    received = buffer[: embedded.shape[0]]
    received.copy_(embedded)
    return {"intermediate_tensors": IntermediateTensors({"hidden_states": received})}


class LazyFusedPrefillModel(PrefillModel):
    """The annotated body with its fused ops never run before SGLang's compile pass, as a server's are (its
    warm-up runs no forward on a dense model): their dispatch is still unresolved (`_forward_method` None)."""

    RESOLVE_FUSED = False


BODIES = {"annotated": PrefillModel, "deepstack": DeepstackPrefillModel, "unannotated": UnannotatedPrefillModel,
          "pipeline": pipeline_body, "blocks": BlocksPrefillModel, "lazy_fused": LazyFusedPrefillModel}
NUM_DEEPSTACK = 1  # deepstack embeddings per token the "deepstack" body's outer model declares


class PrefillForCausalLM(nn.Module):
    """The outer model: body, then the LM head on each request's last token (eager, like SGLang's logits
    processor runs outside the captured body for the breakable/full backends)."""

    supports_lora = False
    shared_experts_config = None

    def __init__(self, num_layers: int = NUM_LAYERS, multimodal: bool = False, body: str = "annotated",
                 pooled: bool = False):
        super().__init__()
        register_attention_op()
        # a sequence-classification (embedding) model: the same numbers as SGLang's EmbeddingPoolerOutput (last
        # token pooled, the score head its classification logits), which the runner must hand back unsliced
        self.pooled = pooled
        self.model = BODIES[body](num_layers)
        if body == "deepstack":
            self.num_deepstack_embeddings = NUM_DEEPSTACK
        self.from_previous_stage = body == "pipeline"
        if self.from_previous_stage:
            self.register_buffer("stage_hidden", torch.zeros(STAGE_ROWS, HIDDEN))
        self.embed = TokenEmbedding()
        self.is_mrope_enabled = multimodal
        self.register_buffer("lm_head", torch.arange(1, VOCAB + 1, dtype=torch.float32).repeat(HIDDEN, 1))
        self.quant_config = None

    def get_input_embeddings(self):
        return self.embed

    @torch.no_grad()
    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, forward_batch,
                input_embeds: torch.Tensor | None = None, **kwargs):
        """As SGLang's VLM wrappers: mRoPE positions from the batch; an image batch's own embeddings copied into
        the batch's `input_embeds` buffer when it has one; a text-only batch handed to the body as ids alone."""
        from sglang.srt.layers.logits_processor import LogitsProcessorOutput

        if self.is_mrope_enabled:
            if forward_batch.mrope_positions is not None:
                positions = forward_batch.mrope_positions
            # A text-only batch: the body embeds the ids itself (no embeddings handed over), so a graph that
            # captured the input_embeds slot must have it refilled from get_input_embeddings() by the runner.
            if input_embeds is not None and forward_batch.input_embeds is not None:
                forward_batch.input_embeds.copy_(input_embeds)  # the graph's static slot: address-stable
                input_embeds = forward_batch.input_embeds
        stage = stage_input(self.stage_hidden, input_ids, input_embeds) if self.from_previous_stage else {}
        hidden = self.model(input_ids, positions, forward_batch, input_embeds=input_embeds, **stage)
        if forward_batch.forward_mode.is_decode_or_idle() or forward_batch.extend_seq_lens is None:
            last = torch.arange(forward_batch.batch_size, device=hidden.device)
        else:
            last = forward_batch.extend_start_loc + forward_batch.extend_seq_lens - 1
        if self.pooled:
            from sglang.srt.layers.pooler import EmbeddingPoolerOutput

            return EmbeddingPoolerOutput(embeddings=hidden[last] @ self.lm_head)
        return LogitsProcessorOutput(next_token_logits=hidden[last] @ self.lm_head)


class PrefillForConditionalGeneration(nn.Module):
    """A VLM-style wrapper (as Qwen2-VL's): the causal LM behind `language_model` and no `model` of its own, so
    SGLang's breakable/full backends must walk language_model -> .model to the body that owns `layers`. Same
    numbers as the causal LM it wraps."""

    supports_lora = False
    shared_experts_config = None

    def __init__(self, **causal_lm):
        super().__init__()
        self.language_model = PrefillForCausalLM(**causal_lm)
        self.is_mrope_enabled = self.language_model.is_mrope_enabled
        self.quant_config = None

    def get_input_embeddings(self):
        return self.language_model.get_input_embeddings()

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, forward_batch,
                input_embeds: torch.Tensor | None = None, **kwargs):
        return self.language_model(input_ids, positions, forward_batch, input_embeds=input_embeds, **kwargs)


def scores(output) -> torch.Tensor:
    """Per request, the numbers of the docstring's `logits`: a causal LM's next-token logits, or an embedding
    model's pooled classification logits (`EmbeddingPoolerOutput.embeddings`)."""
    logits = getattr(output, "next_token_logits", None)
    return output.embeddings if logits is None else logits


def initial_hidden(tokens: Sequence[int], embeds: Sequence[Sequence[float]] | None = None,
                   mrope_delta: Sequence[int] | None = None, adapter: str | None = None) -> list[list[float]]:
    """h0 of one request's whole sequence (positions 0..len-1), from the module docstring: e + (0, p).
    `embeds`: the request's own embeddings (one pair per token) in place of (id, 0); `mrope_delta`: the per-axis
    shifts of its mRoPE positions (None: a text model, p = position); `adapter`: its LoRA adapter, whose scale
    (`ADAPTER_SCALES`) adds to e0 of every token."""
    rows = []
    for position, token in enumerate(tokens):
        e0, e1 = embeds[position] if embeds is not None else (float(token), 0.0)
        p = position if mrope_delta is None else sum(position + d for d in mrope_delta)
        rows.append([float(e0) + ADAPTER_SCALES[adapter], float(e1) + float(p)])
    return rows


def reference_logits(requests: Sequence[Sequence[Sequence[float]]], num_layers: int = NUM_LAYERS
                     ) -> list[list[float]]:
    """The model's logits computed in plain Python from the formula in the module docstring.

    `requests`: per request, h0 of every token of the sequence so far (`initial_hidden`). The cached prefix holds
    what this model wrote when it computed those tokens, so computing the whole sequence causally gives the same
    numbers as chunked prefill.
    """
    out = []
    for rows in requests:
        h = [list(row) for row in rows]
        for _ in range(num_layers):
            x = [[h0 + 1.0, h1 + 1.0] for h0, h1 in h]
            running = [0.0, 0.0]
            for t in range(len(h)):
                running = [running[0] + x[t][0], running[1] + x[t][1]]
                h[t] = [h[t][0] + running[0], h[t][1] + running[1]]
        last = h[-1][0] + h[-1][1]
        out.append([(v + 1) * last for v in range(VOCAB)])
    return out


# A LoRA server's adapters: the scale each one's (rank-0-free) delta adds to e[t, 0] of its request's tokens.
ADAPTER_SCALES = {None: 0.0, "sql": 1.0, "chat": 2.0}
# The LoRA backend's own request cap for its static prefill batch info (SGLang's backend reports it as
# prefill_cuda_graph_max_bs and may hold fewer rows than the runner asked): a batch of more requests runs eager.
LORA_GRAPH_MAX_REQUESTS = 3


class PrefillLoRAManagerDouble:
    """The part of SGLang's LoRA manager the prefill runner touches, with one scale per adapter
    (`ADAPTER_SCALES`): `prepare_lora_batch` writes the batch's per-token scales into the static batch info sized
    at construction (`init_prefill_cuda_graph_batch_info`) when the batch fits it (`can_use_prefill_cuda_graph`,
    the rule SGLang's manager shares with the runner's admission), else into a fresh tensor; the body reads them
    (`token_scales`) inside the capture, so a graph replaying a batch whose scales went elsewhere, or a capture
    that never prepared them, shows in the numbers or fails naming the contract."""

    attn_dp_enabled = False

    def __init__(self, device: str = "cpu") -> None:
        self.device = device
        self.max_num_tokens: int | None = None
        self.max_num_requests: int | None = None
        self.static_scales: torch.Tensor | None = None
        self.batch_scales: torch.Tensor | None = None  # per token of the prepared batch (padding 0)
        self.routing_resets = 0

    def init_prefill_cuda_graph_batch_info(self, max_num_tokens: int, max_num_requests: int | None = None):
        self.max_num_tokens = max_num_tokens
        self.max_num_requests = min(max_num_requests or max_num_tokens, LORA_GRAPH_MAX_REQUESTS)
        self.static_scales = torch.zeros(max_num_tokens, device=self.device)

    @property
    def prefill_cuda_graph_max_bs(self) -> int | None:
        """The request cap of the static batch info (None before it is sized); 0.5.19's runner clamps to it."""
        return self.max_num_requests

    def can_use_prefill_cuda_graph(self, forward_batch) -> bool:
        if self.max_num_tokens is None or not forward_batch.forward_mode.is_extend():
            return False
        tokens = int(forward_batch.input_ids.shape[0])
        return forward_batch.batch_size <= self.max_num_requests and tokens <= self.max_num_tokens

    def prepare_lora_batch(self, forward_batch) -> None:
        n, bs = int(forward_batch.input_ids.shape[0]), forward_batch.batch_size
        ids = list(forward_batch.lora_ids or [None] * bs)[:bs]
        per_request = torch.tensor([ADAPTER_SCALES[i] for i in ids], device=self.device)
        counts = forward_batch.extend_seq_lens
        rows = (torch.repeat_interleave(per_request, counts[:bs].to(self.device)) if counts is not None
                else per_request)[:n]
        scales = torch.zeros(n, device=self.device)
        scales[: rows.shape[0]] = rows
        if self.can_use_prefill_cuda_graph(forward_batch):
            self.static_scales.zero_()
            self.static_scales[:n].copy_(scales)
            self.batch_scales = self.static_scales
        else:
            self.batch_scales = scales

    def token_scales(self, n: int) -> torch.Tensor:
        assert self.batch_scales is not None, (
            "LoRA batch info read before prepare_lora_batch ran for this forward (the capture must prepare it)")
        return self.batch_scales[:n]

    def reset_routing_cache(self) -> None:
        self.routing_resets += 1

    def fetch_new_loras(self, *args, **kwargs) -> None:
        pass
