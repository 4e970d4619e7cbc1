"""The decode suites' fixtures: the installed layout (skipping, with the reason, where the release lacks the
path) and the device installed under the run's personality. A suite with a target of its own (real models)
defines both for itself."""
from __future__ import annotations

import pytest

from harness.devices import get_device
from harness.errors import PathMissing
from harness.targets import decode


@pytest.fixture(scope="module")
def layout():
    try:
        return decode.load()
    except PathMissing as missing:
        pytest.skip(str(missing))


@pytest.fixture(scope="module")
def device(device_name, personality, layout):  # the layout first: it prepares SGLang's imports
    found = get_device(device_name)
    if not found.available:
        pytest.skip(found.skip_reason)
    with found.install(personality):
        yield found


# The suites' modules, dearest first. xdist hands each worker runs of consecutive items and the last few one by one,
# so cheap modules at the end fill the tail of whichever worker frees first (the gate of 2026-12-07 ended with
# one worker idle for 8 s while the other ran the server-lifetime machine, collected last). The world items come
# first, so that xdist's first batch gives them all to one worker, which pays the world fork server's start once.
DEAREST_FIRST = ("test_parallel_worlds.py", "test_real_models.py", "test_server_lifetime.py", "test_decode_npu.py",
                 "test_decode_switches.py")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    rank = {name: position for position, name in enumerate(DEAREST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(DEAREST_FIRST)))  # stable: modules stay together
