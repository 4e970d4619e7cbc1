"""What the prefill graphs must not serve, from the case and the batch alone (SGLang's `can_run_graph` /
`can_replay_locally` contract): such a batch falls back to eager, and a graph replay of it is wrong even when
its numbers happen to match."""
from __future__ import annotations

from typing import Optional

from harness.models.prefill_model import LORA_GRAPH_MAX_REQUESTS
from harness.targets.prefill.base import Batch, PrefillCase


def must_run_eager(case: PrefillCase, batch: Batch) -> Optional[str]:
    """Why the graphs cannot serve `batch` (None: they may).

    Examples, grid (4, 8, 16): 17 tokens -> beyond the largest capture; an image request's own embeddings ->
    input_embeds; capture_hidden_mode FULL -> more hidden states than the NULL capture keeps; return_logprob on
    tc_piecewise -> no eager logits tail; a request of 30 cached + 4 new tokens under max_context_size 32 -> a
    context beyond the limit; a full backend with 4 request slots and 5 requests -> too many requests; breakable
    with MHA companion layers (virtual device) and any request with a cached prefix -> the companion's prefix path.
    """
    largest = max(case.capture_tokens)
    if batch.num_tokens > largest:
        return f"its {batch.num_tokens} tokens exceed the largest capture ({largest})"
    if any(r.embeds is not None for r in batch.requests):
        return "it carries input_embeds (an image request's own embeddings), which the captured graphs never read"
    if batch.replace_embeds:
        return "it carries token-embedding overrides (replace_embeds), which the captured graphs never read"
    if batch.capture_hidden_mode != "NULL":
        return (f"capture_hidden_mode={batch.capture_hidden_mode} asks for hidden states the capture (mode NULL) "
                "does not keep")
    if batch.return_logprob and case.backend == "tc_piecewise":
        return "return_logprob needs the eager logits tail that tc_piecewise does not have"
    limit = case.context_limit()
    longest = max((r.prefix + len(r.tokens) for r in batch.requests), default=0)
    if limit is not None and longest > limit:
        return (f"its longest context ({longest} tokens, cached prefix + new) exceeds the graphs' context limit "
                f"({limit}: max_context_size / the attention backend's max_seq_len)")
    if case.backend == "breakable" and case.mha_companion and any(r.prefix for r in batch.requests):
        return ("a request has a cached prefix and the MHA companion's prefix path cannot be captured by a "
                "breakable graph off CUDA")
    if case.backend == "full" and len(batch.requests) > case.full_prefill_max_req:
        return (f"its {len(batch.requests)} requests exceed the full graph's {case.full_prefill_max_req} request "
                "slots (full_prefill_max_req)")
    if case.lora and len(batch.requests) > LORA_GRAPH_MAX_REQUESTS:
        return (f"its {len(batch.requests)} requests exceed the LoRA backend's {LORA_GRAPH_MAX_REQUESTS} static "
                "prefill batch-info rows (can_use_prefill_cuda_graph)")
    return None


def refused_at_construction(case: PrefillCase) -> Optional[str]:
    """Why SGLang must refuse to build the runner for `case` (None: it must build it), from the case alone.

    Examples, a 64-column req_to_token: max_context_size 80 -> more than the table holds (any backend, checked
    first); full with max_context_size 32 and an attention backend without fixed-context metadata -> unsupported
    (tc_piecewise drops the limit before that check, so it builds); tc_piecewise with the "unannotated" body ->
    no annotation to infer the compiled forward's dynamic dimensions from; tc_piecewise with enable_mixed_chunk
    -> mixed chunks need a padded backend (breakable or full); breakable/full with the "blocks" body (decoder
    layers under `h`) -> no module owning `layers` to capture.
    """
    if case.backend == "tc_piecewise" and case.enable_mixed_chunk:
        return "mixed-chunk prefill needs a padded prefill graph backend (breakable or full), not tc_piecewise"
    if case.backend != "tc_piecewise" and case.body == "blocks":
        return "the model body keeps its decoder layers under `h`: no module owning `layers` to capture"
    if case.backend == "tc_piecewise" and case.body == "unannotated":
        return "the model body's forward carries no annotations to infer its dynamic dimensions from"
    if case.max_context_size is not None and case.max_context_size > case.max_context:
        return (f"max_context_size {case.max_context_size} exceeds the request-to-token pool's "
                f"{case.max_context} columns")
    if case.max_context_size is not None and case.backend != "tc_piecewise" and not case.fixed_context_metadata:
        return "max_context_size needs an attention backend with fixed-context prefill graph metadata"
    return None
