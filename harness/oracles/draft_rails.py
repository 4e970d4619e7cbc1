"""Draft rails: what each EAGLE draft step's attention reads, derived from the batch.

An EAGLE draft of `topk` branches and `num_steps` steps gives each request, past its committed prefix of `seq_len`
tokens, `topk * num_steps` slots of its `req_to_token` row (branch-major: branch k's step j at column
`seq_len + k * num_steps + j`). Step i of branch k reads the prefix, then its branch's slots for steps 0..i (the
tokens drafted so far, the current one included: it writes its K/V before attending). So the step's KV rail of
branch (r, k) has `seq_len_r + i + 1` entries:

    row_r[:seq_len_r] + row_r[seq_len_r + k * num_steps : seq_len_r + k * num_steps + i + 1]

and the rails of a step are these segments one after another (the indptr their running sum). A padded branch of
a replay (the runner zeroes its positions, pool row and write slots) reads only SGLang's padding slot 0.
"""
from __future__ import annotations

import itertools

import torch

from harness.oracles import OracleFailure

ORACLE = "draft-rails"


def expected_segments(seq_lens: list[int], rows: list[list[int]], topk: int, num_steps: int,
                      step: int) -> list[list[int]]:
    """Per branch (request-major), the KV slots step `step` reads; `rows[r]`: request r's `req_to_token` row."""
    segments = []
    for seq_len, row in zip(seq_lens, rows):
        for branch in range(topk):
            start = seq_len + branch * num_steps
            segments.append(list(row[:seq_len]) + list(row[start:start + step + 1]))
    return segments


def check_rails(indptr: torch.Tensor, indices: torch.Tensor, segments: list[list[int]], padded_branches: int,
                *, topk: int, step: int, what: str, where: str) -> None:
    """`indptr` / `indices`: the rail of draft step `step` as `what` holds it (indptr of every branch, padded ones
    after the real ones). The real branches' segments must be `segments`, each padded branch's only slot 0."""
    indptr = [int(x) for x in indptr.tolist()]
    lengths = [len(segment) for segment in segments]
    real = len(segments)
    expected_indptr = list(itertools.accumulate(lengths, initial=0))
    if indptr[:real + 1] != expected_indptr:
        branch = next(z for z in range(real) if indptr[z + 1] - indptr[z] != lengths[z])
        raise OracleFailure(ORACLE, f"{where}: draft step {step}'s {what} kv_indptr is {indptr[:real + 1]}; the "
                            f"batch gives {expected_indptr} (each branch reads its prefix plus {step + 1} draft "
                            f"token(s)); branch {branch} (request {branch // topk}) reads "
                            f"{indptr[branch + 1] - indptr[branch]} slots, not {lengths[branch]}",
                            step=step, indptr=indptr[:real + 1], expected_indptr=expected_indptr)
    flat = [int(x) for x in indices[:expected_indptr[-1]].tolist()]
    for branch, segment in enumerate(segments):
        got = flat[expected_indptr[branch]:expected_indptr[branch + 1]]
        if got != segment:
            raise OracleFailure(ORACLE, f"{where}: draft step {step}'s {what} kv_indices of branch {branch} are "
                                f"{got}; its request's prefix and draft slots through step {step} are {segment}",
                                step=step, branch=branch, got=got, expected=segment)
    for branch in range(real, real + padded_branches):
        start, end = indptr[branch], indptr[branch + 1]
        slots = sorted({int(x) for x in indices[start:end].tolist()})
        if slots and slots != [0]:
            raise OracleFailure(ORACLE, f"{where}: padded branch {branch} of draft step {step} reads KV slots "
                                f"{slots} from the {what} rails; a padded row may read only SGLang's padding slot 0",
                                step=step, branch=branch, slots=slots)

