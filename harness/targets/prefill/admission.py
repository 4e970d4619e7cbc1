"""What the prefill graphs must not serve, from the case and the batch alone (SGLang's `can_run_graph` /
`can_replay_locally` contract): such a batch falls back to eager, and a graph replay of it is wrong even when
its numbers happen to match."""
from __future__ import annotations

from typing import NamedTuple

from harness.models.prefill_model import LORA_GRAPH_MAX_REQUESTS, PrefillForCausalLM
from harness.targets.prefill.base import Batch, PrefillCase


PADDING_FACTOR = 2  # SGLang 0.5.2x: a graph serves a batch only while its bucket is at most twice its tokens


def padding_refusal(capture_tokens, num_tokens: int) -> str | None:
    """Why the release's prefill runner pads `num_tokens` too much to serve them from a graph (None: it may).
    SGLang 0.5.2x rejects "disproportionate padding waste": a bucket above PADDING_FACTOR x the batch's tokens
    (the release is known by its `_MAX_PREFILL_CUDA_GRAPH_PADDING_FACTOR`; the factor is the harness's
    expectation, so a release that changes it shows)."""
    from harness.targets.prefill.v0_5_14 import RUNNER_MODULE
    from harness.versions import module_exists

    if not module_exists(RUNNER_MODULE):
        return None
    import importlib

    if not hasattr(importlib.import_module(RUNNER_MODULE), "_MAX_PREFILL_CUDA_GRAPH_PADDING_FACTOR"):
        return None
    fits = [c for c in capture_tokens if c >= num_tokens]
    if fits and min(fits) > num_tokens * PADDING_FACTOR:
        return (f"its {num_tokens} tokens would be padded to {min(fits)}, more than {PADDING_FACTOR}x (SGLang's "
                "limit on prefill graph padding)")
    return None


def must_run_eager(case: PrefillCase, batch: Batch) -> str | None:
    """Why the graphs cannot serve `batch` (None: they may).

    Examples, grid (4, 8, 16): 17 tokens -> beyond the largest capture; an image request's own embeddings ->
    input_embeds; capture_hidden_mode FULL -> more hidden states than the NULL capture keeps; return_logprob on
    tc_piecewise -> no eager logits tail; a request of 30 cached + 4 new tokens under max_context_size 32 -> a
    context beyond the limit; a full backend with 4 request slots and 5 requests -> too many requests; breakable
    with MHA companion layers (virtual device) and any request with a cached prefix -> the companion's prefix path;
    an attention backend admitting extends of at most 6 tokens and a request of 7 new tokens -> the backend's own
    refusal; captured attention metadata of at most 2 requests and 3 requests -> that metadata's cap.
    """
    largest = max(case.capture_tokens)
    if batch.num_tokens > largest:
        return f"its {batch.num_tokens} tokens exceed the largest capture ({largest})"
    padding = padding_refusal(case.capture_tokens, batch.num_tokens)
    if padding:
        return padding
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
    widest = max((len(r.tokens) for r in batch.requests), default=0)
    if case.backend_max_extend is not None and widest > case.backend_max_extend:
        return (f"a request extends by {widest} tokens and the attention backend admits at most "
                f"{case.backend_max_extend} (its own can_run_prefill_cuda_graph)")
    from harness.targets.prefill.v0_5_14 import captured_metadata_cap

    cap = captured_metadata_cap(case)
    if cap is not None and len(batch.requests) > cap:
        return (f"its {len(batch.requests)} requests exceed the {cap} a replay of the attention backend's captured "
                "metadata carries (prefill_cuda_graph_max_batch_size)")
    if case.lora and len(batch.requests) > LORA_GRAPH_MAX_REQUESTS:
        return (f"its {len(batch.requests)} requests exceed the LoRA backend's {LORA_GRAPH_MAX_REQUESTS} static "
                "prefill batch-info rows (can_use_prefill_cuda_graph)")
    return None


class Rule(NamedTuple):
    """A refusal predicted from the case before the run: `name` is short and stable (the summary counts expected
    errors by it), `reason` says why in words."""
    name: str
    reason: str


def refused_at_construction(case: PrefillCase) -> str | None:
    """Why SGLang must refuse to build the runner for `case` (None: it must build it), from the case alone.

    Examples, a 64-column req_to_token: max_context_size 80 -> more than the table holds (any backend, checked
    first); full with max_context_size 32 and an attention backend without fixed-context metadata -> unsupported
    (tc_piecewise drops the limit before that check, so it builds); tc_piecewise with the "unannotated" body ->
    no annotation to infer the compiled forward's dynamic dimensions from; tc_piecewise with enable_mixed_chunk
    -> mixed chunks need a padded backend (breakable or full); breakable/full with the "blocks" body (decoder
    layers under `h`) -> no module owning `layers` to capture.
    """
    rule = construction_rule(case)
    return rule.reason if rule else None


def construction_rule(case: PrefillCase) -> Rule | None:
    """`refused_at_construction` with its rule's name ("construction-refused:NAME")."""
    def rule(name, reason):
        return Rule(f"construction-refused:{name}", reason)
    if case.backend == "tc_piecewise" and case.enable_mixed_chunk:
        return rule("mixed-chunk-on-tc-piecewise", "mixed-chunk prefill needs a padded prefill graph backend "
                    "(breakable or full), not tc_piecewise")
    if case.backend != "tc_piecewise" and case.body == "blocks":
        return rule("layerless-body", "the model body keeps its decoder layers under `h`: no module owning "
                    "`layers` to capture")
    if case.backend == "tc_piecewise" and case.body == "unannotated":
        return rule("unannotated-body", "the model body's forward carries no annotations to infer its dynamic "
                    "dimensions from")
    if case.max_context_size is not None and case.max_context_size > case.max_context:
        return rule("context-beyond-table", f"max_context_size {case.max_context_size} exceeds the "
                    f"request-to-token pool's {case.max_context} columns")
    if case.max_context_size is not None and case.backend != "tc_piecewise" and not case.fixed_context_metadata:
        return rule("no-fixed-metadata", "max_context_size needs an attention backend with fixed-context prefill "
                    "graph metadata")
    return None


def expected_refusal(case: PrefillCase, batch: Batch | None = None) -> Rule | None:
    """The refusal SGLang must answer with, from the case (and the batch) before the run; None: it must serve it.

    No batch: building the runner (`refused_at_construction`, rule "construction-refused:NAME"). A batch: a mode
    the runner's dispatch has no path for. PREBUILT -> "mode-without-forward:PREBUILT" (ModelRunner's forward has
    no branch for it: "Invalid forward mode"); SPLIT_PREFILL -> "mode-needs-model-hook:forward_split_prefill"
    while the harness model lacks that hook (SGLang calls it on the model). DECODE, TARGET_VERIFY, IDLE and the
    graph modes: None (SGLang runs them, eager or replayed).
    """
    if batch is None:
        return construction_rule(case)
    mode = batch.forward_mode.name
    if mode == "PREBUILT":
        return Rule("mode-without-forward:PREBUILT", "ModelRunner's forward has no branch for a PREBUILT batch")
    if mode == "SPLIT_PREFILL" and not hasattr(PrefillForCausalLM, "forward_split_prefill"):
        return Rule("mode-needs-model-hook:forward_split_prefill", "SPLIT_PREFILL runs the model's "
                    "forward_split_prefill, which the harness model does not define")
    return None


def execute_refusal(batch: Batch) -> Rule | None:
    """What `execute` called directly (skipping can_run_graph) must refuse on a NULL capture (the harness
    captures NULL: no speculative decoding, a generation model): any hidden-state mode above it."""
    if batch.capture_hidden_mode != "NULL":
        return Rule("execute-hidden-mode-above-capture", f"capture_hidden_mode={batch.capture_hidden_mode} exceeds "
                    "the NULL capture")
    return None
