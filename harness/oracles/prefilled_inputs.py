"""Oracle `prefilled-inputs`: with `SGLANG_OPT_DSV41_DSPARK_SKIP_PREFILLED_INPUTS`, a DSPARK target verify runner
records the input_ids / positions tensors each load_batch staged, and a pre-planned replay (a marked batch) skips
re-copying the ones that are the very tensors recorded (it still copies any that differ: the eager equality checks
that). Each pre-planned replay that found a record counts one skip and clears it, so from the way each replay
reached the runner (`planned.KINDS`, as taken):

    skips = pre-planned replays (planned, stale_mark, planned_ahead) with a load (execute, planned, replanned,
            planned_ahead) since the last one

e.g. execute, stale_mark, planned, stale_mark: 2 (the last mark finds the record cleared by `planned`'s replay).
Read from SGLang's `num_prefilled_input_skips` as evidence."""
from __future__ import annotations

from harness.oracles import OracleFailure

ORACLE = "prefilled-inputs"
# execute plans an unmarked or resized batch itself; planned_ahead loads the batch and the next step's, then replays
LOADS = ("execute", "planned", "replanned", "planned_ahead")
PRE_PLANNED = ("planned", "stale_mark", "planned_ahead")


def expected_prefilled_skips(kinds_taken) -> int:
    skips, recorded = 0, False
    for kind in kinds_taken:
        recorded = recorded or kind in LOADS  # planned: load_batch, then its pre-planned replay
        if kind in PRE_PLANNED:
            skips, recorded = skips + recorded, False
    return skips


def check_prefilled_skips(target) -> None:
    taken = target.kinds_taken
    expected = expected_prefilled_skips(taken)
    found = getattr(target.runner, "num_prefilled_input_skips", None)
    if found != expected:
        raise OracleFailure(ORACLE, f"the DSPARK verify runner noted {found} pre-planned input re-copy skip(s), the "
                            f"replays imply {expected} (each pre-planned replay finding the inputs a load_batch "
                            f"staged since the last one), replays taken {taken}",
                            expected_skips=expected, found_skips=found, kinds_taken=taken)
