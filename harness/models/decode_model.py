"""A tiny decode model whose every output is derivable by hand, shaped like an SGLang model for the decode runner.

For token row `i` of a batch (one token per request in plain decode):

    h_i     = 3 * input_ids[i] + 0.5 * positions[i] + 19          embedding-like step
    h_i    += 0.25 * seq_lens[i]                                    attention-like step; `seq_lens` is the metadata
                                                                    the attention backend published
                                                                    (`forward_metadata.seq_lens` of the backend
                                                                    the release hands the forward; see
                                                                    `bind_sglang_hooks`)
    h_i    *= 2            when forward_batch.forward_mode.is_decode()   (a Python branch on the forward mode)
    h_i    += scale_i * h_i  when LoRA is on and this graph is not the "nolora" variant; `scale_i` is the
                                                                    request's adapter scale (LORA_SCALES; 0 for a
                                                                    request without adapter)
    next_token_logits[i, v] = h_i * (v + 1)        for v in 0..VOCAB-1

Example: input_id 2, position 4, seq_len 5, DECODE, adapter "a1" (scale 1):
h = 6 + 2 + 19 = 27; + 1.25 = 28.25; * 2 = 56.5; + 56.5 = 113; logits = [113, 226, 339, ...].

All values are small multiples of 0.25, so float32 holds them exactly: replay and eager must agree bit for bit with
the eager compile backend.

`forward(input_ids, positions, forward_batch)` returns SGLang's `LogitsProcessorOutput`; the LoRA scales come from a
`LoRAManagerDouble`, whose `prepare_lora_batch` is what SGLang calls before a LoRA batch (at capture inside the runner,
at replay where `ForwardBatch.init_new` would).
"""
from __future__ import annotations

from typing import Optional

import torch

VOCAB = 8
HIDDEN = 4
LORA_SCALES = {None: 0.0, "a1": 1.0, "a2": 2.0, "a3": -0.5}


def expected_logits(input_ids, positions, seq_lens, *, decode=True, lora_scales=None) -> torch.Tensor:
    """The closed form above, computed in float64 from plain lists, for hand-checkable expectations."""
    rows = []
    for k, (t, p, s) in enumerate(zip(input_ids, positions, seq_lens)):
        h = 3 * t + 0.5 * p + 19 + 0.25 * s
        if decode:
            h *= 2
        if lora_scales is not None:
            h += lora_scales[k] * h
        rows.append([h * (v + 1) for v in range(VOCAB)])
    return torch.tensor(rows, dtype=torch.float64).reshape(-1, VOCAB)


class LoRAManagerDouble:
    """The part of SGLang's LoRA manager the decode runner touches, holding one scale per request.

    `prepare_lora_batch` writes the batch's scales into a static buffer when the batch fits the captured graphs
    (what SGLang's manager does with its cuda-graph batch info), else into a fresh tensor.
    """

    attn_dp_enabled = False

    def __init__(self, device: str = "cpu") -> None:
        self.device = device
        self.graph_scales: Optional[torch.Tensor] = None
        self.batch_scales: Optional[torch.Tensor] = None
        self.lora_backend = type("LoRABackendDouble", (), {"skip_inactive_dense_lora": False})()
        self.prepared = 0

    def init_decode_cuda_graph_batch_info(self, max_bs_in_cuda_graph: int, num_tokens_per_req: int = 1,
                                          capacity: int = 64) -> None:
        rows = max(max_bs_in_cuda_graph * num_tokens_per_req, capacity)  # fixed shape: no Dynamo shape guard churn
        if self.graph_scales is None or self.graph_scales.shape[0] < rows:
            self.graph_scales = torch.zeros(rows, device=self.device)

    def init_cuda_graph_batch_info(self, max_bs_in_cuda_graph: int, num_tokens_per_req: int = 1,
                                   num_tokens_per_bs: Optional[int] = None) -> None:
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
    """See the module docstring. `lora_manager` None: no LoRA step."""

    def __init__(self, lora_manager: Optional[LoRAManagerDouble] = None) -> None:
        super().__init__()
        self.lora_manager = lora_manager
        self.register_buffer("vocab_weight", torch.arange(1, VOCAB + 1, dtype=torch.float32))
        self.shared_experts_config = None  # read by SGLang's BaseRunner.model_context

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, forward_batch, **kwargs):
        from sglang.srt.layers.logits_processor import LogitsProcessorOutput

        h = 3.0 * input_ids.to(torch.float32) + 0.5 * positions.to(torch.float32) + 19.0
        seq_lens = _hooks["attn_backend"](forward_batch).forward_metadata.seq_lens
        h = h + 0.25 * seq_lens[: h.shape[0]].to(torch.float32)
        if forward_batch.forward_mode.is_decode():
            h = h * 2.0
        if self.lora_manager is not None and _hooks["lora_variant"]() != "nolora":
            h = h + self.lora_manager.batch_scales[: h.shape[0]] * h
        logits = h[:, None] * self.vocab_weight[None, :]
        return LogitsProcessorOutput(next_token_logits=logits)
