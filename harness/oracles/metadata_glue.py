"""Oracle `metadata-glue`: with `SGLANG_ENABLE_METADATA_GLUE_GRAPH`, SGLang's glue graph really serves the replay
metadata prep the case implies, so the outputs (checked against eager) came from glued prep.

Per replay key (one per replayed size: the batches are unpadded and LoRA-free, so every one is routed to the
glue) the first two preps are warm-ups, the third captures, every later one is a glued replay:

    glued replays = sum over sizes of max(0, replays of that size - 3)

e.g. size 2 replayed 6 times and size 4 twice: 3 glued replays. The glue is never disabled (a prep the capture
refused) and no routed prep runs eagerly. Read from SGLang's `MetadataGlueGraph` counters as evidence. A DSPARK
target verify runner whose attention backend declares no host-free verify prep builds no glue graph at all, switch
on or not (`check_glue_declined`)."""
from __future__ import annotations

import collections

from harness.oracles import OracleFailure

ORACLE = "metadata-glue"


def expected_glued_replays(batches) -> int:
    """Each drawn batch is replayed twice (as drawn, then shifted: `decode_replay.check_replays_match_eager`)."""
    per_size = collections.Counter(b.batch_size for b in batches for _ in range(2))
    return sum(max(0, n - 3) for n in per_size.values())


class GlueGraphs:
    """`serve_graphs` for `decode_replay.check_replays_match_eager`: the glue graphs each replay creates and
    replays, by the count above (the third prep of a size captures one graph and replays it; each later one
    replays it)."""

    def __init__(self) -> None:
        self.preps = collections.Counter()

    def __call__(self, batch) -> dict:
        self.preps[batch.batch_size] += 1
        n = self.preps[batch.batch_size]
        return {"replays": int(n >= 3), "new_graphs": int(n == 3), "new_captures": int(n == 3)}


def check_glue_served(target, batches) -> None:
    glue = getattr(target.runner, "_metadata_glue", None)
    expected = expected_glued_replays(batches)
    if glue is None:
        raise OracleFailure(ORACLE, "SGLANG_ENABLE_METADATA_GLUE_GRAPH is set but the runner built no metadata glue "
                            "graph", expected_glued_replays=expected)
    found = {"glued_replays": glue.replays, "eager_preps": glue.eager, "disabled": glue.disabled}
    if found != {"glued_replays": expected, "eager_preps": 0, "disabled": False}:
        raise OracleFailure(ORACLE, f"the metadata glue graph served {glue.replays} replay(s), the batches imply "
                            f"{expected} (sizes {[b.batch_size for b in batches]}, each replayed twice: two warm-ups "
                            f"and a capture per size first); eager preps {glue.eager}, disabled {glue.disabled}",
                            expected_glued_replays=expected, **found)


def check_glue_declined(target) -> None:
    glue = getattr(target.runner, "_metadata_glue", None)
    if glue is not None:
        raise OracleFailure(ORACLE, "SGLANG_OPT_DSV41_TARGET_VERIFY_METADATA_GLUE is set but the attention backend "
                            "declares no host-free target verify prep (glue_target_verify_metadata gives a reason), "
                            f"yet the runner built a metadata glue graph (replays {glue.replays}, eager {glue.eager}, "
                            f"disabled {glue.disabled})", glue_disabled=glue.disabled)
