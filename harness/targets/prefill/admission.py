"""What the prefill graphs must not serve, from the case and the batch alone (SGLang's `can_run_graph` /
`can_replay_locally` contract): such a batch falls back to eager, and a graph replay of it is wrong even when
its numbers happen to match."""
from __future__ import annotations

from typing import Optional

from harness.targets.prefill.base import Batch, PrefillCase


def must_run_eager(case: PrefillCase, batch: Batch) -> Optional[str]:
    """Why the graphs cannot serve `batch` (None: they may).

    Examples, grid (4, 8, 16): 17 tokens -> beyond the largest capture; an image request's own embeddings ->
    input_embeds; capture_hidden_mode FULL -> more hidden states than the NULL capture keeps; return_logprob on
    tc_piecewise -> no eager logits tail; a full backend with 4 request slots and 5 requests -> too many requests.
    """
    largest = max(case.capture_tokens)
    if batch.num_tokens > largest:
        return f"its {batch.num_tokens} tokens exceed the largest capture ({largest})"
    if any(r.embeds is not None for r in batch.requests):
        return "it carries input_embeds (an image request's own embeddings), which the captured graphs never read"
    if batch.capture_hidden_mode != "NULL":
        return (f"capture_hidden_mode={batch.capture_hidden_mode} asks for hidden states the capture (mode NULL) "
                "does not keep")
    if batch.return_logprob and case.backend == "tc_piecewise":
        return "return_logprob needs the eager logits tail that tc_piecewise does not have"
    if case.backend == "full" and len(batch.requests) > case.full_prefill_max_req:
        return (f"its {len(batch.requests)} requests exceed the full graph's {case.full_prefill_max_req} request "
                "slots (full_prefill_max_req)")
    return None
