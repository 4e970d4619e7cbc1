"""What a rank sends back to the parent: plain picklable values, no SGLang objects.

`IterationRecord`: one scheduler iteration as this rank lived it: its local work, what SGLang's DP sync gathered
(`global_num_tokens` and the vote), whether `ModelRunner._forward_raw` replayed a graph and which bucket the
runner padded to (the prefill runner's, with prefill graphs: its vote, a decode batch SGLang converted to
extends), the pad mask it published (`num_token_non_padded`), each local request's token history and
next-token logits, and the replay-against-eager verdict the rank checked itself. `RankRecord`: the rank's
placement as SGLang published it, its capture list and its iterations; or the failure that stopped it.
"""
from __future__ import annotations

import dataclasses


@dataclasses.dataclass
class RequestRow:
    rid: str
    history: list[int]  # the request's tokens so far: the logits predict the next one
    logits: list[float]


@dataclasses.dataclass
class IterationRecord:
    index: int
    work: str  # the rank's own work (world.describe)
    forward_mode: str | None  # of the batch that ran (IDLE for an idle rank the DP group kept busy), None: none
    local_tokens: int
    global_num_tokens: list[int] | None  # what the DP sync gathered (ScheduleBatch.global_num_tokens)
    vote: bool | None  # the DP group's decode-graph verdict (can_run_decode_cuda_graph)
    graph: bool  # ModelRunner._forward_raw replayed the decode graph
    bucket: int | None  # the batch size the runner padded to (graph only)
    raw_bs: int | None
    non_padded: int | None  # num_token_non_padded the runner wrote (graph only; None: the runner has no slot)
    requests: list[RequestRow] = dataclasses.field(default_factory=list)
    replay_vs_eager: str | None = None  # a diagnosis when the replay differed from the eager twin, else None
    eager_twin: bool = False  # the eager twin ran (a graph replayed)
    prefill_vote: bool | None = None  # the DP group's prefill-graph verdict (can_run_dp_prefill_cuda_graph)
    converted: bool = False  # a decode batch SGLang turned into one-token extends (a peer prefills this step)
    prefill_graph: bool = False  # the replay was the prefill runner's (breakable prefill graphs)


@dataclasses.dataclass
class RankRecord:
    rank: int
    placement: dict  # SGLang's published ranks for this process (tp_rank, attn_dp_rank, ...)
    capture_bs: list[int]
    iterations: list[IterationRecord] = dataclasses.field(default_factory=list)
    seconds: dict = dataclasses.field(default_factory=dict)  # startup, capture, program
    prefill_capture: list[int] = dataclasses.field(default_factory=list)  # the prefill runner's token counts
    failure: dict | None = None  # {"oracle", "diagnosis", "details", "traceback"}: what stopped it


def said(error: BaseException) -> str:
    """An exception as a diagnosis: its type and the first lines of its message (SGLang's own words)."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return f"{type(error).__name__}: {' '.join(lines[:4])[:800]}" if lines else type(error).__name__
