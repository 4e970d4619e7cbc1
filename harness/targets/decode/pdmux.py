"""PD-multiplexing (`--enable-pdmux`) on the virtual device: SGLang's own stream groups, its green contexts doubled.

Under pdmux SGLang's scheduler splits the GPU's SMs between prefill and decode with CUDA green contexts: its
`initialize_stream_groups` (`srt/multiplex/pdmux_context.py`) asks `sgl_kernel.spatial` for the SM count and one
(prefill, decode) stream pair per partition. The model runner builds one decode attention backend per group
(`--sm-group-num`), and the decode runner captures every size once per stream group, each on its group's backend,
then replays the graph of the group the scheduler last set (`set_current_stream_idx`) on that group's backend.

Green contexts are a CUDA driver feature, so `spatial` is the one double here: an H100 (132 SMs, compute
capability 9.0) whose partitions are pairs of the virtual device's streams. SGLang's own partition arithmetic
(`divide_sm`), config and bookkeeping run as they are. `groups(sm_group_num)` is that world for a block: it yields
the stream groups SGLang made and restores pdmux_context's globals after.
"""
from __future__ import annotations

import contextlib
import sys
import types
from collections.abc import Iterator
from unittest import mock

SM_COUNT = 132  # an H100 SXM
CAPABILITY = (9, 0)
MODULE = "sglang.srt.multiplex.pdmux_context"


def missing() -> str | None:
    """Why the installed SGLang cannot be driven under pdmux (its release and the missing name), or None."""
    from harness.versions import module_exists, sglang_version

    if not module_exists(MODULE):
        return f"SGLang {sglang_version()} has no {MODULE}: no PD-multiplexing"
    import importlib

    context = importlib.import_module(MODULE)
    for name in ("initialize_stream_groups", "set_current_stream_idx", "get_stream_groups", "PDMuxConfig"):
        if not hasattr(context, name):
            return f"SGLang {sglang_version()} has no {MODULE}.{name}"
    return None


def _spatial():
    """`sgl_kernel.spatial`'s two calls SGLang makes: the SMs available, and a green-context stream pair."""
    import torch

    spatial = types.ModuleType("sgl_kernel.spatial")
    spatial.get_sm_available = lambda gpu_id: SM_COUNT
    spatial.create_greenctx_stream_by_value = lambda prefill_sm, decode_sm, gpu_id: (
        torch.cuda.Stream(gpu_id), torch.cuda.Stream(gpu_id))
    return spatial


@contextlib.contextmanager
def groups(sm_group_num: int) -> Iterator[list]:
    """SGLang's stream groups for `PDMuxConfig(sm_group_num=...)` (no config file: its SM split is derived), made
    by SGLang's `initialize_stream_groups` on the virtual device; pdmux_context's globals restored on exit."""
    import importlib

    import torch

    context = importlib.import_module(MODULE)
    saved = {name: getattr(context, name) for name in ("STREAM_GROUPS", "SM_COUNTS", "CURRENT_STREAM_IDX",
                                                         "CURRENT_STREAM_GROUP")}
    kernel = sys.modules.get("sgl_kernel") or types.ModuleType("sgl_kernel")
    spatial = _spatial()
    with mock.patch.dict(sys.modules, {"sgl_kernel": kernel, "sgl_kernel.spatial": spatial}), \
            mock.patch.object(kernel, "spatial", spatial, create=True), \
            mock.patch.object(torch.cuda, "current_device", lambda: 0), \
            mock.patch.object(torch.cuda, "get_device_capability", lambda device=None: CAPABILITY):
        context.initialize_stream_groups(0, context.PDMuxConfig(sm_group_num=sm_group_num))
    try:
        yield context.get_stream_groups()
    finally:
        for name, value in saved.items():
            setattr(context, name, value)


def set_stream(index: int) -> None:
    """What SGLang's scheduler does before a decode step under pdmux: pick the stream group (and with it the
    decode graph and attention backend)."""
    import importlib

    importlib.import_module(MODULE).set_current_stream_idx(index)
