"""The tests' cost tiers (markers in pyproject.toml): a `subprocess` test is `slow` too, so `pytest -m "not slow"`
runs the fast unit tests alone, `-m "slow and not subprocess"` the in-process suite self-tests and `-m subprocess`
the mutant runs and commands.

Collection also puts the longest files first (`LONGEST_FIRST`, each over a minute of CPU a test on the 2-core
development machine): xdist's worksteal then hands the short tests out last, so no worker ends the run alone on
a bisect or a release environment's gate.

`family`: the real-model families the in-process real-model self-tests run (dense in every run; MLA and the
mRoPE VLM slow), on the cpu virtual device under the cuda personality."""
from __future__ import annotations

import pytest

LONGEST_FIRST = ("test_bisect.py", "test_release_envs.py", "test_plugin.py", "test_isolation.py")


def _cost(item) -> int:
    name = item.path.name
    if name in LONGEST_FIRST:
        return LONGEST_FIRST.index(name)
    return len(LONGEST_FIRST) + (0 if item.get_closest_marker("subprocess") else 1 if item.get_closest_marker("slow")
                                 else 2)


def pytest_collection_modifyitems(items):
    for item in items:
        if item.get_closest_marker("subprocess") and not item.get_closest_marker("slow"):
            item.add_marker(pytest.mark.slow)
    items.sort(key=_cost)  # stable: within a tier, the files' own order


# the dense family in every self-test run; the MLA and mRoPE VLM families (the same backend, MLA's latent pool and
# kernel tiling, the VLM's mRoPE positions) are slow: each builds and captures its own model
REAL_FAMILIES = ["dense", pytest.param("mla", marks=pytest.mark.slow), pytest.param("vlm", marks=pytest.mark.slow)]


@pytest.fixture(params=REAL_FAMILIES)
def family(request):
    """A real-model family the installed SGLang can build (a skip naming what it lacks), the device installed."""
    from harness.devices import get_device
    from harness.targets.decode.real_model import family_missing, load

    load()
    reason = family_missing(request.param)
    if reason:
        pytest.skip(reason)
    with get_device("cpu").install("cuda"):
        yield request.param
