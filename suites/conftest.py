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
