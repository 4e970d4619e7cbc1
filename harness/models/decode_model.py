"""A tiny decode model whose every output is derivable by hand, shaped like an SGLang model for the decode runner.

It reads, inside the captured or compiled region, every input the runner prepares for a real model. For token row
`i` of a batch of `bs` requests with `w` tokens each (w = 1 in plain decode, the draft-token count in TARGET_VERIFY),
request `r = i // w`:

    h_i  = 3 * input_ids[i] + 0.5 * positions[i] + 19                 embedding-like step
    h_i += 0.25 * seq_lens[r]                                          attention metadata: the seq_lens the backend
                                                                       published (`forward_metadata.seq_lens`)
    h_i += 0.5 * req_pool_indices[r] + 0.125 * out_cache_loc[i]        the batch's pool rows and cache slots
    h_i += 0.5 * visible_drafts[i]                                     attention metadata from spec info: the True
                                                                       entries of row i's draft columns in the
                                                                       verify custom mask (0 without spec info)
    h_i += 0.25 * (seq_lens_sum - sum(seq_lens))                       the backend's plan: the sum it was handed
                                                                       against the seq_lens it was handed (0 when
                                                                       they agree, padding included)
    h_i += 0.125 * (verify_lens[r] - q_len_r + i - qo_indptr[r])      compact ragged verify only (the spec info's
                                                                       `RaggedVerifyLayout`): request r of row i is
                                                                       the one whose qo_indptr span (q_len_r rows)
                                                                       holds i, not i // w; the term is the keys past
                                                                       its prefix a causal verify kernel lets row i
                                                                       see (cache length seq_lens + verify_lens, as
                                                                       SGLang's ragged geometry has it, less the span,
                                                                       plus the row's offset): on a consistent layout
                                                                       0.125 * (i - start of request r), whatever
                                                                       padding the tier added after the real rows;
                                                                       rows past the last span count as its last row
    h_i += 0.25 * sum(input_embeds[i])                                 a DFLASH draft worker's verify: the embeddings
                                                                       the runner hands the forward (`input_embeds`,
                                                                       else the batch's own; none: 0)
                                                                       a dLLM preparing them in the graph:
                                                                       input_embeds[i] = state[i] + 0.5 * input_ids[i]
                                                                       (`prepare_dllm_input_embeds`, from the batch's
                                                                       `dllm_input_preparation_state`)
    h_i += 0.125 * sum over k of (k + 1) * (mrope_positions[k, i]     an mRoPE model only (a VLM's decode): its
                                           - positions[i])            rotary offsets per section (t, h, w), read
                                                                       from the staged mrope_positions against the
                                                                       staged positions
    h_i += 0.0625 * ((sum(global_num_tokens_gpu) - n)                 with DP-attention fields (`n` rows in the
                     + (global_dp_buffer_len - n))                     forward): the gathered buffers' lengths
                                                                       against the rows they gather (0 when they
                                                                       agree, padding included; 0 without them)
    h_i += silu(0) * h_i = 0                                          SGLang's own `SiluAndMul` (a fused op, which
                                                                       patch_model flips into compile mode)
    h_i *= 2               when forward_batch.forward_mode.is_decode()   (a Python branch on the forward mode)
    h_i += scale_r * h_i   when LoRA is on and this graph is not the "nolora" variant; `scale_r` is the
                                                                       request's adapter scale (LORA_SCALES; 0 for a
                                                                       request without adapter)
    next_token_logits[i, v] = h_i * (v + 1)        for v in 0..VOCAB-1 (DLLM_EXTEND: `full_logits` too, as a
                                                   diffusion LLM returns logits for every token of its block)
    hidden_states[i, k]     = h_i                  for k in 0..HIDDEN-1, when the batch's capture_hidden_mode
                                                   asks for hidden states (EAGLE's TARGET_VERIFY: FULL)

Example: input_id 2, position 4, seq_len 5, pool row 2, cache slot 8, DECODE, adapter "a1" (scale 1):
h = 6 + 2 + 19 = 27; + 1.25 + 1 + 1 = 30.25; * 2 = 60.5; + 60.5 = 121; logits = [121, 242, 363, ...].

All values are small multiples of 0.125, so float32 holds them exactly: replay and eager must agree bit for bit with
the eager compile backend. Rows past the real batch (padding) are computed too and must never reach the output.

`forward(input_ids, positions, forward_batch)` returns SGLang's `LogitsProcessorOutput`; the LoRA scales come from a
`LoRAManagerDouble`, whose `prepare_lora_batch` is what SGLang calls before a LoRA batch (at capture inside the runner,
at replay where `ForwardBatch.init_new` would).
"""
from __future__ import annotations

from collections.abc import Sequence

import torch

from harness.models import capture_queries, fused_ops

VOCAB = 8
HIDDEN = 4
LORA_SCALES = {None: 0.0, "a1": 1.0, "a2": 2.0, "a3": -0.5}


def expected_output(input_ids, positions, seq_lens, *, req_pool_indices, out_cache_loc, visible_drafts=None,
                    decode=True, lora_scales=None, verify_lens=None,
                    input_embeds=None, preparation_state=None,
                    mrope_positions=None) -> tuple[torch.Tensor, torch.Tensor]:
    """(next_token_logits, hidden_states) of the closed form above, in float64 from plain lists (per request:
    seq_lens, req_pool_indices, lora_scales, verify_lens; per token: the rest). With `verify_lens` (ragged verify)
    only the real rows, the first sum(verify_lens)."""
    width = len(input_ids) // len(seq_lens) if seq_lens else 0
    visible_drafts = visible_drafts or [0] * len(input_ids)
    ragged = [(r, j) for r, n in enumerate(verify_lens) for j in range(n)] if verify_lens is not None else None
    rows = []
    for i, (t, p) in enumerate(zip(input_ids, positions)):
        if ragged is not None and i >= len(ragged):
            break
        r = ragged[i][0] if ragged is not None else i // width
        h = 3 * t + 0.5 * p + 19 + 0.25 * seq_lens[r] + 0.5 * req_pool_indices[r] + 0.125 * out_cache_loc[i] \
            + 0.5 * visible_drafts[i]
        if ragged is not None:
            h += 0.125 * ragged[i][1]
        if input_embeds is not None:
            h += 0.25 * sum(input_embeds[i])
        if preparation_state is not None:
            h += 0.25 * (sum(preparation_state[i]) + HIDDEN * 0.5 * t)
        if mrope_positions is not None:
            h += 0.125 * sum((k + 1) * (mrope_positions[k][i] - p) for k in range(3))
        if decode:
            h *= 2
        if lora_scales is not None:
            h += lora_scales[r] * h
        rows.append(h)
    h = torch.tensor(rows, dtype=torch.float64).reshape(-1, 1)
    return h * torch.arange(1, VOCAB + 1, dtype=torch.float64), h.expand(-1, HIDDEN)


def visible_draft_counts(seq_lens: Sequence[int], custom_mask: torch.Tensor | None, width: int,
                         rows: int) -> torch.Tensor:
    """Per token row, the True entries of its draft columns in an EAGLE verify mask: request r owns `width` rows of
    `seq_lens[r] + width` columns (its prefix, then its drafts), requests one after another. Rows the mask does not
    cover (padding) count 0. What a verify attention backend plans from `spec_info.custom_mask`."""
    counts = torch.zeros(rows, dtype=torch.int64)
    if custom_mask is None:
        return counts
    mask = custom_mask.to("cpu", torch.int64)
    offset = 0
    for r, prefix in enumerate(seq_lens):
        span = prefix + width
        for j in range(width):
            start = offset + j * span + prefix
            if start + width > mask.numel() or r * width + j >= rows:
                return counts
            counts[r * width + j] = int(mask[start:start + width].sum())
        offset += width * span
    return counts


def ragged_rows(layout, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(request of each of `n` token rows, its ragged term) from a `RaggedVerifyLayout`'s qo_indptr and verify_lens,
    as a ragged verify kernel finds a row's request: fixed shapes, no host read (legal inside a capture)."""
    qo_indptr = layout.qo_indptr_device.to(torch.int64)
    tokens = torch.arange(n, device=qo_indptr.device)
    request = torch.searchsorted(qo_indptr[1:], tokens, right=True).clamp(max=layout.verify_lens.shape[0] - 1)
    span = qo_indptr[request + 1] - qo_indptr[request]
    term = 0.125 * (layout.verify_lens.to(torch.int64)[request] - span + tokens - qo_indptr[request]).to(torch.float32)
    return request, term


class LoRAManagerDouble:
    """The part of SGLang's LoRA manager the decode runner touches, holding one scale per request.

    `prepare_lora_batch` writes the batch's scales into a static buffer when the batch fits the captured graphs
    (what SGLang's manager does with its cuda-graph batch info), else into a fresh tensor.
    """

    attn_dp_enabled = False

    def __init__(self, device: str = "cpu") -> None:
        self.device = device
        self.graph_scales: torch.Tensor | None = None
        self.batch_scales: torch.Tensor | None = None
        self.lora_backend = type("LoRABackendDouble", (), {"skip_inactive_dense_lora": False})()
        self.prepared = 0

    def init_decode_cuda_graph_batch_info(self, max_bs_in_cuda_graph: int, num_tokens_per_req: int = 1,
                                          capacity: int = 64) -> None:
        rows = max(max_bs_in_cuda_graph * num_tokens_per_req, capacity)  # fixed shape: no Dynamo shape guard churn
        if self.graph_scales is None or self.graph_scales.shape[0] < rows:
            self.graph_scales = torch.zeros(rows, device=self.device)

    def init_cuda_graph_batch_info(self, max_bs_in_cuda_graph: int, num_tokens_per_req: int = 1,
                                   num_tokens_per_bs: int | None = None) -> None:
        """Up to 0.5.1x's name for `init_decode_cuda_graph_batch_info` (0.5.14 passes `num_tokens_per_bs`,
        0.5.19 `num_tokens_per_req`)."""
        self.init_decode_cuda_graph_batch_info(
            max_bs_in_cuda_graph, num_tokens_per_bs if num_tokens_per_bs is not None else num_tokens_per_req)

    def prepare_lora_batch(self, forward_batch, *, static: bool = True) -> None:
        self.prepared += 1
        ids = list(forward_batch.lora_ids or [])
        scales = torch.tensor([LORA_SCALES[i] for i in ids], dtype=torch.float32, device=self.device)
        if static and self.graph_scales is not None and len(ids) <= self.graph_scales.shape[0]:
            self.graph_scales[: len(ids)].copy_(scales)
            self.batch_scales = self.graph_scales  # rows past the batch: padding, whatever they held
        else:
            self.batch_scales = scales

    def reset_routing_cache(self) -> None:
        pass

    def fetch_new_loras(self, *args, **kwargs) -> None:
        pass


def _dp_gap(forward_batch, rows: int):
    """The DP-attention gathered lengths against the forward's rows (one rank: both equal them), 0 without them."""
    tokens, length = getattr(forward_batch, "global_num_tokens_gpu", None), getattr(forward_batch,
                                                                                    "global_dp_buffer_len", None)
    if tokens is None or length is None:
        return 0.0
    return (tokens.sum() - rows).to(torch.float32) + float(length - rows)


def _default_attn_backend(forward_batch):
    from sglang.srt.model_executor.forward_context import get_attn_backend

    return get_attn_backend()


def _default_lora_variant():
    from sglang.srt.model_executor.runner_utils.capture_mode import get_capture_lora_variant

    return get_capture_lora_variant()


# Where the model meets SGLang's per-release plumbing. The target adapter of the installed release binds these
# (`bind_sglang_hooks`); the defaults are the 0.5.14+ ones.
#   attn_backend(forward_batch) -> the attention backend of the running forward (SGLang's forward context)
#   lora_variant()              -> the LoRA graph variant being captured ("nolora" skips the LoRA step)
_hooks: dict = {"attn_backend": _default_attn_backend, "lora_variant": _default_lora_variant}


def bind_sglang_hooks(*, attn_backend=None, lora_variant=None) -> None:
    """Bind the model to one release's plumbing (see `_hooks`); None keeps the current binding."""
    for name, value in (("attn_backend", attn_backend), ("lora_variant", lora_variant)):
        if value is not None:
            _hooks[name] = value


class DecodeModel(torch.nn.Module):
    """See the module docstring. `lora_manager` None: no LoRA step; `mrope`: an mRoPE model."""

    def __init__(self, lora_manager: LoRAManagerDouble | None = None, mrope: bool = False) -> None:
        super().__init__()
        self.lora_manager = lora_manager
        self.mrope = mrope
        self.register_buffer("vocab_weight", torch.arange(1, VOCAB + 1, dtype=torch.float32))
        self.shared_experts_config = None  # read by SGLang's BaseRunner.model_context
        self.act = fused_ops.silu_and_mul()  # SGLang's own fused op, adding exactly 0 (`harness.models.fused_ops`)

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, forward_batch,
                input_embeds: torch.Tensor | None = None, **kwargs):
        from sglang.srt.layers.logits_processor import LogitsProcessorOutput

        capture_queries.ask("DecodeModel.forward", input_ids.device)  # as a real layer asks (see that module)
        n = input_ids.shape[0]
        request = torch.arange(n, device=input_ids.device) // max(n // max(forward_batch.batch_size, 1), 1)
        metadata = _hooks["attn_backend"](forward_batch).forward_metadata
        layout = getattr(getattr(forward_batch, "spec_info", None), "ragged_verify_layout", None)
        if layout is not None:
            request, ragged_term = ragged_rows(layout, n)
        per_request = 0.25 * metadata.seq_lens.to(torch.float32) + \
            0.5 * forward_batch.req_pool_indices.to(torch.float32)[: metadata.seq_lens.shape[0]]
        h = 3.0 * input_ids.to(torch.float32) + 0.5 * positions.to(torch.float32) + 19.0
        h = h + per_request[request] + 0.125 * forward_batch.out_cache_loc[:n].to(torch.float32)
        h = h + 0.5 * metadata.visible_drafts[:n].to(torch.float32) + 0.25 * metadata.sum_gap.to(torch.float32)
        if layout is not None:
            h = h + ragged_term
        embeds = input_embeds if input_embeds is not None else getattr(forward_batch, "input_embeds", None)
        # DLLM_EXTEND only (never compiled): older Dynamo cannot trace a getattr of a field the release lacks
        dllm = forward_batch.forward_mode.name == "DLLM_EXTEND"
        state = getattr(forward_batch, "dllm_input_preparation_state", None) if dllm else None
        if embeds is None and state is not None:  # eager: the model prepares them itself (as Gemma4 diffusion)
            embeds = self.prepare_dllm_input_embeds(input_ids, state)
        if embeds is not None:
            h = h + 0.25 * embeds[:n].to(torch.float32).sum(-1)
        if self.mrope:
            sections = forward_batch.mrope_positions[:, :n].to(torch.float32) - positions[None, :n].to(torch.float32)
            h = h + 0.125 * (sections * torch.arange(1, 4, device=h.device, dtype=torch.float32)[:, None]).sum(0)
        h = h + 0.0625 * _dp_gap(forward_batch, n)
        shared = getattr(metadata, "shared_table", None)  # a scheduler-shared table the graph reads (value 0)
        if shared is not None:
            h = h + 0.0 * shared[forward_batch.req_pool_indices.to(torch.int64)].sum().to(torch.float32)
        h = h + fused_ops.adds_nothing(self.act, h[:, None])[:, 0]  # silu(0) * h = 0
        if forward_batch.forward_mode.is_decode():
            h = h * 2.0
        if self.lora_manager is not None and _hooks["lora_variant"]() != "nolora":
            h = h + self.lora_manager.batch_scales[request] * h
        logits = h[:, None] * self.vocab_weight[None, :]
        hidden = h[:, None].expand(n, HIDDEN).clone() if forward_batch.capture_hidden_mode.need_capture() else None
        return LogitsProcessorOutput(next_token_logits=logits, hidden_states=hidden,
                                     **({"full_logits": logits} if dllm else {}))

    def prepare_dllm_input_embeds(self, input_ids: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
        """A dLLM's in-graph input preparation (what Gemma4Renoise's `prepare_graph_inputs` calls): see above."""
        return state + 0.5 * input_ids.to(state.dtype)[:, None]
