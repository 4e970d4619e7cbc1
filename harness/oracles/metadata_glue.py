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
    is built (`routing`); `key(batch)`: the glue's key beyond the size (an attention variant), default none."""

    def __init__(self, key=lambda batch: None) -> None:
        self.preps = collections.Counter()
        self.captured: list[int] = []
        self.key = key

    def routing(self, capture_bs: list[int]) -> list[int]:
        self.captured = list(capture_bs)
        return capture_bs

    def __call__(self, batch) -> dict:
        if batch.batch_size not in self.captured:
            return {}
        key = (batch.batch_size, self.key(batch))
        self.preps[key] += 1
        n = self.preps[key]
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


def expected_candidate_variant(batch, width: int, span: int) -> str:
    """DeepSeek-V4.1's variant for a DSPARK verify `batch`: the unfiltered graph while its longest request's
    committed tokens and the verify's `width` fit the candidate span, else the filtered one, which is also the
    answer for a batch without a host mirror of its lengths (the variant then knows no length), e.g. span 16,
    width 3: longest 13 -> unfiltered, 14 -> filtered."""
    from sglang.srt.layers.attention.graph_variants import DSV41_CANDIDATE_FILTERED, DSV41_CANDIDATE_UNFILTERED

    fits = batch.host_seq_lens and max(batch.seq_lens) + width <= span
    return DSV41_CANDIDATE_UNFILTERED if fits else DSV41_CANDIDATE_FILTERED


def watch_early_verify(span: int, width: int, capture_bs, graphs: GlueGraphs):
    """`capture_and_check`'s `checked` for DeepSeek-V4.1's variants under early verify metadata: after each replay,
    the graph it replayed has the variant its batch implies (`expected_candidate_variant`), and the runner's
    staging counts moved as the replay's kind implies. An early stage must be accepted exactly when the batch is a
    captured size (unpadded) on the unfiltered variant whose glue graph is captured (SGLang's contract:
    `stage_verify_metadata_early`; a key's glue is captured by its third unpadded prep, the module docstring,
    counted by `graphs`, keyed by `expected_candidate_variant`, after each replay is checked here), and the verify
    must then take it (same key, same tensors); no replay rejects a stage. Each failure names the replay, its batch
    and the relation broken."""
    from sglang.srt.layers.attention.graph_variants import DSV41_EARLY_VERIFY_VARIANTS

    def checked(target, replay):
        def run(batch, step):
            early = target.runner._early_verify_metadata
            if early is None:
                raise OracleFailure(ORACLE, "SGLANG_OPT_DSV41_TARGET_METADATA_EARLY is set for a DSPARK target verify "
                                    "runner with its metadata glue, yet it keeps no EarlyVerifyMetadata")
            before = (early.staged_ct, early.taken_ct, early.rejected_ct)
            result = replay(batch, step)
            found = tuple(now - then for now, then in zip((early.staged_ct, early.taken_ct, early.rejected_ct),
                                                          before))
            longest = max(batch.seq_lens)
            variant = expected_candidate_variant(batch, width, span)
            where = (f"replay {step} ({target.kinds_taken[-1]}, {batch.batch_size} request(s), longest {longest} "
                     f"tokens + {width} verify, candidate span {span}, captured sizes {list(capture_bs)})")
            replayed = getattr(target.runner._replay_graph_key, "attention_variant", None)
            if replayed != variant:
                raise OracleFailure(ORACLE, f"{where}: replayed the {replayed!r} graph, the batch implies {variant!r}",
                                    expected_variant=variant, replayed_variant=replayed)
            staged = target.kinds_taken[-1] == "early" and batch.batch_size in capture_bs and \
                variant in DSV41_EARLY_VERIFY_VARIANTS and graphs.preps[(batch.batch_size, variant)] >= 3
            if target.early_staged[-1] is not None and target.early_staged[-1] != staged:
                raise OracleFailure(ORACLE, f"{where}: stage_verify_metadata_early answered "
                                    f"{target.early_staged[-1]}, the batch implies {staged}",
                                    expected_staged=staged, found_staged=target.early_staged[-1])
            expected = (int(staged), int(staged), 0)
            if found != expected:
                raise OracleFailure(ORACLE, f"{where}: the early metadata staged, taken and rejected "
                                    f"{found}, the replay implies {expected}", expected=expected, found=found)
            return result
        return run
    return checked
