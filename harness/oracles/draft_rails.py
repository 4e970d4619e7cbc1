"""Draft rails: what each EAGLE draft step's attention reads, derived from the batch.

An EAGLE draft of `topk` branches and `num_steps` steps gives each request, past its committed prefix of `seq_len`
tokens, `topk * num_steps` slots of its `req_to_token` row (branch-major: branch k's step j at column
`seq_len + k * num_steps + j`). Step i of branch k reads the prefix, then its branch's slots for steps 0..i (the
tokens drafted so far, the current one included: it writes its K/V before attending). So the step's KV rail of
branch (r, k) has `seq_len_r + i + 1` entries:

    row_r[:seq_len_r] + row_r[seq_len_r + k * num_steps : seq_len_r + k * num_steps + i + 1]

and the rails of a step are these segments one after another (the indptr their running sum). A padded branch of
a replay (the runner zeroes its positions, pool row and write slots) reads only SGLang's padding slot 0.

Under `--speculative-draft-window-size W` (and `--speculative-draft-sink-size S`, default 0) a draft that has no
window of its own reads, of its prefix, the first `min(S, seq_len)` slots and then the most recent ones, up to
`min(seq_len, W + S)` in all (StreamingLLM's sink and recent window), then its chain as above. A draft head whose
layers carry the window themselves (EAGLE3: the flag becomes its layers' sliding window) keeps the full rail and
gets a window rail beside it: of the full segment, the last `min(seq_len + step + 1, W)` slots.
"""
from __future__ import annotations

import itertools

import torch

from harness.oracles import OracleFailure

ORACLE = "draft-rails"


def expected_segments(seq_lens: list[int], rows: list[list[int]], topk: int, num_steps: int,
                      step: int, window: int = 0, sink: int = 0) -> list[list[int]]:
    """Per branch (request-major), the KV slots step `step` reads; `rows[r]`: request r's `req_to_token` row;
    `window` / `sink` (0: none): the prefix clipped to its sink and recent window (module docstring)."""
    segments = []
    for seq_len, row in zip(seq_lens, rows):
        prefix = list(row[:seq_len])
        if window > 0:
            kept, sunk = min(seq_len, window + sink), min(sink, seq_len)
            prefix = prefix[:sunk] + prefix[seq_len - (kept - sunk):]
        for branch in range(topk):
            start = seq_len + branch * num_steps
            segments.append(prefix + list(row[start:start + step + 1]))
    return segments


def window_segments(segments: list[list[int]], window: int) -> list[list[int]]:
    """A window layer's rail of each branch: the last `window` slots of its full segment."""
    return [segment[-window:] for segment in segments]


def check_rails(indptr: torch.Tensor, indices: torch.Tensor, segments: list[list[int]], padded_branches: int,
                *, topk: int, step: int | None, what: str, where: str) -> None:
    """`indptr` / `indices`: the rail of draft step `step` (None: a draft extend's) as `what` holds it (indptr of
    every branch, padded ones after the real ones). The real branches' segments must be `segments`, each padded
    branch's only slot 0."""
    rail = what if step is None else f"draft step {step}'s {what}"
    reads = "its prefix" if step is None else f"its prefix plus {step + 1} draft token(s)"
    indptr = [int(x) for x in indptr.tolist()]
    lengths = [len(segment) for segment in segments]
    real = len(segments)
    expected_indptr = list(itertools.accumulate(lengths, initial=0))
    if indptr[:real + 1] != expected_indptr:
        branch = next((z for z in range(real) if indptr[z + 1] - indptr[z] != lengths[z]), None)
        which = "it starts elsewhere" if branch is None else \
            f"branch {branch} (request {branch // topk}) reads {indptr[branch + 1] - indptr[branch]} slots, not " \
            f"{lengths[branch]}"
        raise OracleFailure(ORACLE, f"{where}: {rail} kv_indptr is {indptr[:real + 1]}; the batch gives "
                            f"{expected_indptr} (each branch reads {reads}); {which}",
                            step=step, indptr=indptr[:real + 1], expected_indptr=expected_indptr)
    flat = [int(x) for x in indices[:expected_indptr[-1]].tolist()]
    for branch, segment in enumerate(segments):
        got = flat[expected_indptr[branch]:expected_indptr[branch + 1]]
        if got != segment:
            raise OracleFailure(ORACLE, f"{where}: {rail} kv_indices of branch {branch} are {got}; what it "
                                f"reads ({reads}) is {segment}",
                                step=step, branch=branch, got=got, expected=segment)
    for branch in range(real, real + padded_branches):
        start, end = indptr[branch], indptr[branch + 1]
        slots = sorted({int(x) for x in indices[start:end].tolist()})
        if slots and slots != [0]:
            raise OracleFailure(ORACLE, f"{where}: padded branch {branch} reads KV slots {slots} from the "
                                f"{rail} rails; a padded row may read only SGLang's padding slot 0",
                                step=step, branch=branch, slots=slots)



def check_extend_rails(qo_indptr: torch.Tensor, kv_indptr: torch.Tensor, kv_indices: torch.Tensor,
                       prefixes: list[list[int]], width: int, padded_rows: int, *, what: str, where: str) -> None:
    """The rails of an EAGLE draft extend (`DRAFT_EXTEND_V2`): every request, padded ones too, extends by the whole
    verify window (`qo_indptr` steps of `width`); a request's KV rail is its prefix before the window (`prefixes[r]`:
    those slots of its row; the window's own K/V the extend kernel takes apart), a padded row's is empty or the
    padding slot."""
    rows = len(prefixes) + padded_rows
    qo = [int(x) for x in qo_indptr[:rows + 1].tolist()]
    if qo != [width * r for r in range(rows + 1)]:
        raise OracleFailure(ORACLE, f"{where}: the draft extend's {what} qo_indptr is {qo}; every request extends by "
                            f"the {width}-token verify window: {[width * r for r in range(rows + 1)]}",
                            qo_indptr=qo)
    segments = [list(prefix) for prefix in prefixes]
    check_rails(kv_indptr[:rows + 1], kv_indices, segments, padded_rows, topk=1, step=None,
                what=f"draft extend's {what}", where=where)
