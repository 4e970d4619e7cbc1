"""Hypothesis settings profiles: gate (pre-merge), nightly, repro.

gate: a fixed seed (0 unless --hypothesis-seed says otherwise), so a pull request sees the same examples on
every run while the example database still stores failures (Hypothesis's `derandomize` would drop the
database); small budgets.
nightly: random with a seed printed and recorded; ten times the examples.
repro: runs only explicit examples and failures stored in the example database.
No deadlines anywhere: a torch.compile costs seconds, and a slow example is not a failure.
Each profile derives from Hypothesis's "default" profile, never from the one active at import: under a CI
variable Hypothesis activates its "ci" profile (derandomize=True, no database), which would give CI other
examples than a developer's machine and make a CI failure's replay command replay something else.
"""
from __future__ import annotations

import os

from hypothesis import HealthCheck, Phase, settings

PROFILES = ("gate", "nightly", "repro")
NIGHTLY_FACTOR = 10
_SLOW_OK = [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much]


def activate(name: str, database) -> None:
    """Register the three profiles over `database` and load `name`; called by the pytest plugin."""
    from harness.conditions import conditions

    common = dict(parent=settings.get_profile("default"), deadline=None, print_blob=True, database=database,
                  suppress_health_check=_SLOW_OK)
    settings.register_profile("gate", max_examples=20, **common)
    # A repro search (conditions set) must find the failure by generation, not by a pinned explicit example.
    search = dict(phases=[Phase.generate, Phase.target, Phase.shrink]) if conditions() else {}
    settings.register_profile("nightly", max_examples=20 * NIGHTLY_FACTOR, **common, **search)
    settings.register_profile("repro", max_examples=20, phases=[Phase.explicit, Phase.reuse], **common)
    settings.load_profile(name)


def suite_settings(gate_examples: int, *, shrink_in_gate: bool = True, **overrides) -> settings:
    """Settings for one test: `gate_examples` in gate and repro, ten times that in nightly.

    `shrink_in_gate=False` for tests whose every shrink step captures graphs again (minutes on a CPU): the gate
    then reports the first failing example as found; nightly and repro searches still shrink. A mutant
    self-test run (HARNESS_MUTANT set) needs only the verdict and never shrinks.
    """
    active = settings.get_current_profile_name()
    factor = NIGHTLY_FACTOR if active == "nightly" else 1
    no_shrink = os.environ.get("HARNESS_MUTANT") or (active == "gate" and not shrink_in_gate)
    if no_shrink and active != "repro" and "phases" not in overrides:
        overrides["phases"] = [Phase.explicit, Phase.reuse, Phase.generate, Phase.target]
    return settings(max_examples=gate_examples * factor, **overrides)
