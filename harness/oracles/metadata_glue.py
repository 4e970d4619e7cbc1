"""Oracle `metadata-glue`: with `SGLANG_ENABLE_METADATA_GLUE_GRAPH`, SGLang's glue graph really serves the replay
metadata prep the case implies, so the outputs (checked against eager) came from glued prep.

A LoRA-free replay is routed to the glue when it is unpadded (its size captured); one replay key per such size.
Per key the first two preps are warm-ups, the third captures, every later one is a glued replay; a padded replay
is not routed, and counts as an eager prep once any key exists:

    glued replays = sum over captured sizes of max(0, replays of that size - 3)
    eager preps   = padded replays after the first unpadded one

e.g. capture list [2, 4], size 2 replayed 6 times, size 4 twice, then size 3 twice: 3 glued replays, 2 eager
preps. The glue is never disabled (a prep the capture refused). Read from SGLang's `MetadataGlueGraph` counters as
evidence. A DSPARK target verify runner whose attention backend declares no host-free verify prep builds no glue
graph at all, switch on or not (`check_glue_declined`)."""
from __future__ import annotations

import collections

from harness.oracles import OracleFailure

ORACLE = "metadata-glue"


def replayed_sizes(batches) -> list[int]:
    """Each drawn batch is replayed twice in a row (as drawn, then shifted:
    `decode_replay.check_replays_match_eager`)."""
    return [b.batch_size for b in batches for _ in range(2)]


def expected_glue_counts(batches, captured) -> dict:
    """(glued replays, eager preps) by the arithmetic in the module docstring."""
    sizes = replayed_sizes(batches)
    per_size = collections.Counter(s for s in sizes if s in captured)
    first_routed = next((i for i, s in enumerate(sizes) if s in captured), len(sizes))
    return {"glued_replays": sum(max(0, n - 3) for n in per_size.values()),
            "eager_preps": sum(1 for s in sizes[first_routed:] if s not in captured)}


class GlueGraphs:
    """`serve_graphs` for `decode_replay.check_replays_match_eager`: the glue graphs each replay creates and
    replays, by the count above (the third prep of a captured size captures one graph and replays it; each later
    one replays it; a padded replay, never routed, none). `captured`: the capture list, known once the runner
    is built (`routing`)."""

    def __init__(self) -> None:
        self.preps = collections.Counter()
        self.captured: list[int] = []

    def routing(self, capture_bs: list[int]) -> list[int]:
        self.captured = list(capture_bs)
        return capture_bs

    def __call__(self, batch) -> dict:
        if batch.batch_size not in self.captured:
            return {}
        self.preps[batch.batch_size] += 1
        n = self.preps[batch.batch_size]
        return {"replays": int(n >= 3), "new_graphs": int(n == 3), "new_captures": int(n == 3)}


def check_glue_served(target, batches) -> None:
    glue = getattr(target.runner, "_metadata_glue", None)
    expected = expected_glue_counts(batches, target.capture_bs)
    if glue is None:
        raise OracleFailure(ORACLE, "SGLANG_ENABLE_METADATA_GLUE_GRAPH is set but the runner built no metadata glue "
                            "graph", **expected)
    found = {"glued_replays": glue.replays, "eager_preps": glue.eager}
    if found != expected or glue.disabled:
        raise OracleFailure(ORACLE, f"the metadata glue graph served {glue.replays} replay(s) and {glue.eager} "
                            f"eager prep(s), the batches imply {expected['glued_replays']} and "
                            f"{expected['eager_preps']} (replayed sizes {replayed_sizes(batches)}, captured "
                            f"{target.capture_bs}: two warm-ups and a capture per captured size first, padded "
                            f"sizes not routed); disabled {glue.disabled}",
                            expected=expected, disabled=glue.disabled, **found)


def check_glue_declined(target) -> None:
    glue = getattr(target.runner, "_metadata_glue", None)
    if glue is not None:
        raise OracleFailure(ORACLE, "SGLANG_OPT_DSV41_TARGET_VERIFY_METADATA_GLUE is set but the attention backend "
                            "declares no host-free target verify prep (glue_target_verify_metadata gives a reason), "
                            f"yet the runner built a metadata glue graph (replays {glue.replays}, eager {glue.eager}, "
                            f"disabled {glue.disabled})", glue_disabled=glue.disabled)
