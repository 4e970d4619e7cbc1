"""What every targeted path needs from SGLang's process-wide plumbing: module lookup, publishing server args,
the single-rank tensor-parallel group and the forward context's signature. Layouts of every path import this;
it imports no layout."""
from __future__ import annotations

import functools
import importlib
import os
import socket
from typing import Any
from collections.abc import Callable

from harness.versions import module_exists


def load(module: str, name: str | None = None) -> Any:
    """Module `module` of the installed SGLang, or its attribute `name`."""
    found = importlib.import_module(module)
    return found if name is None else getattr(found, name)


def runtime_context() -> Any | None:
    """`sglang.srt.runtime_context` (0.5.14 and later releases), or None (main trees of May-June 2026)."""
    if not module_exists("sglang.srt.runtime_context"):
        return None
    return importlib.import_module("sglang.srt.runtime_context")


def _scheduler_global_server_args_setter() -> Callable | None:
    return getattr(importlib.import_module("sglang.srt.server_args"), "set_global_server_args_for_scheduler", None)


def can_publish_config() -> bool:
    """Whether `publish_server_args` has a way to publish on the installed SGLang."""
    return hasattr(runtime_context(), "publish") or _scheduler_global_server_args_setter() is not None


def publish_server_args(server_args, rank: int = 0) -> bool:
    """Publish `server_args` (last publish wins) for this process, TP rank `rank` of its world: through
    `runtime_context.publish` where it exists (returns True), else as the scheduler's global server args, whose
    readers see later edits of this object (returns False)."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # "dummy" must never be looked up on the Hub
    context = runtime_context()
    if not hasattr(context, "publish"):
        _scheduler_global_server_args_setter()(server_args)
        return False
    spawn_ranks = getattr(context, "SpawnRanks", None)  # 0.5.2x reads ranks from a launcher bundle
    ranks = {"ranks": spawn_ranks(world_rank=rank, gpu_id=rank)} if spawn_ranks is not None else {}
    context.publish(server_args, role="test", **ranks)
    return True


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@functools.lru_cache(maxsize=1)
def tp_group():
    """SGLang's TP group coordinator of this process (its `ca_comm` is state `patch_model` backs up), or None before
    the model-parallel groups exist."""
    from sglang.srt.distributed import parallel_state

    return parallel_state.get_tp_group() if parallel_state.model_parallel_is_initialized() else None


def ensure_tp_group() -> None:
    """A single-process gloo world and SGLang's model-parallel groups, created once per process."""
    from sglang.srt.distributed import parallel_state

    if not parallel_state.model_parallel_is_initialized():
        parallel_state.init_distributed_environment(
            world_size=1, rank=0, local_rank=0, backend="gloo",
            distributed_init_method=f"tcp://127.0.0.1:{_free_port()}")
        parallel_state.initialize_model_parallel()


@functools.cache
def forward_context_takes_batch() -> bool:
    """Whether SGLang's `forward_context` takes the batch (0.5.2x); asked once, not on every replay."""
    import inspect

    from sglang.srt.model_executor.forward_context import forward_context

    return "forward_batch" in inspect.signature(forward_context).parameters


def forward_context(attn_backend, forward_batch=None):
    """SGLang's forward context holding `attn_backend` (and the batch, where the release's context takes one)."""
    from sglang.srt.model_executor.forward_context import ForwardContext, forward_context as enter

    extra = {"forward_batch": forward_batch} if forward_context_takes_batch() else {}
    return enter(ForwardContext(attn_backend=attn_backend), **extra)
