"""What the in-process prefill self-tests share: the installed prefill layout on the cpu virtual device, or a skip
that names what is missing (no virtual device, no prefill path, a backend the release lacks)."""
from __future__ import annotations

from typing import Any

import pytest

from harness.devices import get_device
from harness.errors import PathMissing


def cpu_prefill_layout(backend: str | None = None) -> Any:
    """The layout, with prefill sessions set to the virtual device and none open; skips naming the gap."""
    from harness.targets import prefill
    from harness.targets.prefill.session import PrefillSession

    device = get_device("cpu")
    if not device.available:
        pytest.skip(device.skip_reason)
    try:
        layout = prefill.load()
    except PathMissing as missing:
        pytest.skip(str(missing))
    gap = layout.backend_gap(backend, "cpu") if backend else None
    if gap:
        pytest.skip(gap)
    PrefillSession.use_device("cpu")
    PrefillSession.close_current()
    return layout
