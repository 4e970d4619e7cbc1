"""Oracle `graph-key`: a replay replays exactly one graph, the one SGLang captured for the batch: keyed
(`ShapeKey`) by the batch's padded size and the variant its requests imply, derived from the case and the batch:

    size    = the smallest captured size >= the batch's requests
    variant = under `record_nolora_graph`: "lora" when a request names an adapter, "nolora" when none does (every
              id None, or no ids at all); an EAGLE draft batch under rejection sampling: "greedy" when every request
              is greedy, else None; otherwise None (one graph a size)

e.g. capture sizes [1, 3] with `record_nolora_graph`, a batch of two requests on no adapter: the graph of size 3,
variant "nolora". A wrong pick often replays equal to eager (a LoRA graph serves base-model requests at rank 0, a
larger graph pads more rows), so the outputs cannot show it; the virtual device counts each graph's replays.
"""
from __future__ import annotations

from harness.oracles import OracleFailure

ORACLE = "graph-key"


def replay_counts(runner) -> dict:
    """Each captured graph's replays so far, by its key (`backend._graphs`); {} where the runner keeps none there."""
    graphs = getattr(getattr(runner, "backend", None), "_graphs", None) or {}
    return {key: getattr(graph, "replays", 0) for key, graph in graphs.items()}


def expected_variant(lora_ids, record_nolora_graph: bool) -> str | None:
    """The LoRA variant a batch of `lora_ids` (None: the batch names none) replays (see the module docstring)."""
    if not record_nolora_graph:
        return None
    return "lora" if lora_ids is not None and any(uid is not None for uid in lora_ids) else "nolora"


def expected_sampling_variant(all_greedy: bool, rejection_sampling: bool) -> str | None:
    """The sampling variant an EAGLE draft batch replays: under rejection sampling "greedy" when every request is
    greedy (top_k 1), which skips the proposal distribution, else None (the sampling graph); None without it."""
    return "greedy" if rejection_sampling and all_greedy else None


def check_replayed_key(before: dict, after: dict, *, requests: int, capture_bs, variant: str | None,
                       where: str) -> None:
    """Exactly one graph replayed between `before` and `after` (`replay_counts`), keyed by the padded size and
    `variant`."""
    replayed = [key for key, count in after.items() if count != before.get(key, 0)]
    size = min(s for s in capture_bs if s >= requests)
    described = ", ".join(f"size {getattr(k, 'size', k)} variant {getattr(k, 'variant_label', None)!r}"
                          for k in replayed) or "none"
    if len(replayed) != 1 or getattr(replayed[0], "size", None) != size or \
            getattr(replayed[0], "variant_label", None) != variant:
        raise OracleFailure(ORACLE, f"{where}: a batch of {requests} request(s) must replay the graph of size "
                            f"{size} variant {variant!r} (captured sizes {list(capture_bs)}); it replayed: "
                            f"{described}", replayed=described, expected_size=size, expected_variant=variant)
