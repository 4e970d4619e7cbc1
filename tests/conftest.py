"""The tests' cost tiers (markers in pyproject.toml): a `subprocess` test is `slow` too, so `pytest -m "not slow"`
runs the fast unit tests alone, `-m "slow and not subprocess"` the in-process suite self-tests and `-m subprocess`
the mutant runs and commands.

Collection also puts the longest files first (`LONGEST_FIRST`, each over a minute of CPU a test on the 2-core
development machine): xdist's worksteal then hands the short tests out last, so no worker ends the run alone on
a bisect or a release environment's gate."""
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
