"""`dp-gather`: a decode runner that gathers DP buffers publishes, for each graph it captures, the gathered lengths
that graph's rows imply.

With `--moe-dense-tp-size 1` (or DP attention) SGLang's decode runner requires gathered buffers
(`require_attn_tp_gather` / `require_mlp_tp_gather`). Before each capture forward it publishes the gather's sizes
with `set_dp_buffer_len(global_dp_buffer_len, num_tokens, max_padding, global_num_tokens)`; the layers of a real
model size their gathered buffers from that (`get_global_dp_buffer`), and a CUDA graph keeps what they were at
capture. A runner that captures with the lengths left out (None) or wrong serves every replay from buffers sized
for nothing, while outputs of a one-rank model can stay right.

Derived from the rows, not read back: on one rank (the harness's), a graph of `num_tokens` rows gathers
`[num_tokens]` per rank, `global_dp_buffer_len` = their sum = `num_tokens`. `observing(module)` records every call
of the runner module's `set_dp_buffer_len` (the name it imported, as its forward calls it); `check_published`
holds each call to that arithmetic and each captured size to at least one call.
"""
from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator
from typing import Any

import pytest

from harness.oracles import OracleFailure


UNPUBLISHED = "not a parameter of this release's set_dp_buffer_len"


@dataclasses.dataclass(frozen=True)
class Published:
    global_dp_buffer_len: Any
    num_tokens: int
    global_num_tokens: Any


@contextlib.contextmanager
def observing(runner_module: Any) -> Iterator[list[Published]]:
    """Record the runner module's `set_dp_buffer_len` calls in the block (undone after)."""
    import inspect

    calls: list[Published] = []
    real = runner_module.set_dp_buffer_len
    lists = "global_num_tokens" in inspect.signature(real).parameters  # releases before publish no per-rank list

    def recorded(global_dp_buffer_len, local_dp_buffer_len, *args, **kwargs):
        tokens = args[1] if len(args) > 1 else kwargs.get("global_num_tokens")
        calls.append(Published(global_dp_buffer_len, int(local_dp_buffer_len),
                               (list(tokens) if tokens is not None else None) if lists else UNPUBLISHED))
        return real(global_dp_buffer_len, local_dp_buffer_len, *args, **kwargs)

    with pytest.MonkeyPatch.context() as patches:
        patches.setattr(runner_module, "set_dp_buffer_len", recorded)
        yield calls


def check_published(calls: list[Published], captured_tokens: list[int], ranks: int = 1) -> None:
    """Each published gather: `[num_tokens] * ranks` gathered, `num_tokens * ranks` buffer rows; each captured
    token count (`captured_tokens`: size x tokens per request) published at least once."""
    for call in calls:
        expected = ([call.num_tokens] * ranks, call.num_tokens * ranks)
        tokens = expected[0] if call.global_num_tokens == UNPUBLISHED else call.global_num_tokens
        if (tokens, call.global_dp_buffer_len) != expected:
            raise OracleFailure("dp-gather", f"a graph of {call.num_tokens} rows was run with global_num_tokens "
                                f"{call.global_num_tokens} and global_dp_buffer_len {call.global_dp_buffer_len}, "
                                f"where {ranks} rank(s) of {call.num_tokens} rows gather {expected[0]} into "
                                f"{expected[1]} rows (set_dp_buffer_len, which the model's gathered buffers are "
                                "sized from)")
    unpublished = sorted(set(captured_tokens) - {call.num_tokens for call in calls})
    if unpublished:
        raise OracleFailure("dp-gather", f"the graphs of {unpublished} rows were captured without publishing their "
                            f"DP gather lengths (set_dp_buffer_len called for {sorted({c.num_tokens for c in calls})})")
