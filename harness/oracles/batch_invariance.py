"""Batch invariance: a request's next-token logits in a scheduler-built batch are the ones its own token history
gives it alone.

The expectation is derived from the drawn case, not from SGLang's state: each request is also run alone, in
lockstep, on pools of its own (its prompt prefilled, then one eager decode step of a batch of one per step of the
batch, with the tokens the batch chose for it; `harness.targets.decode.scheduled.Alone`). A replayed decode batch
must give each of its requests the logits it gets alone within float32 tolerance, whatever joined or left the
batch before. Replay against eager cannot see a batch SGLang assembled
wrongly (rows, lengths, ids or KV slots of another request after a finish or a merge): both run the same wrong
batch. This check does, and names the request, its history and the batch fields that disagree with it.

Under `--enable-deterministic-inference` SGLang promises more: bit-identical results whatever the batch. Its Triton
backend keeps that promise by splitting each request's KV into tiles of a fixed size
(`SGLANG_TRITON_DECODE_SPLIT_TILE_SIZE`), so a request's reduction order follows its own length alone;
`check_split_counts` holds the split counts a decode graph's kernels read to that arithmetic.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from harness.oracles import OracleFailure
from harness.oracles.eager import assert_matches_eager

ORACLE = "batch-invariance"


def check_requests_alone(logits: torch.Tensor, histories: Sequence[Sequence[int]],
                         alone: Sequence[torch.Tensor], where: str,
                         fields: Callable[[int], str] = lambda i: "") -> None:
    """`logits[i]`: request i's row of the batch's output; `histories[i]`: its tokens so far (the last one the
    input of this step); `alone[i]`: its next-token logits decoded alone; `fields(i)`: what the batch held for
    request i (a diagnosis)."""
    for index, (history, expected) in enumerate(zip(histories, alone)):
        try:
            assert_matches_eager(logits[index], expected, exact=False)
        except OracleFailure as failure:
            worst = (logits[index] - expected).abs().max().item()
            raise OracleFailure(ORACLE, f"{where}: request {index} (history of {len(history)} tokens, last "
                                f"{list(history[-4:])}) gets logits that it does not get alone (largest "
                                f"difference {worst:.3g}): {failure.diagnosis.replace('from eager', 'from alone')}"
                                f"{fields(index)}", request=index,
                                history=list(history)) from None


def check_split_counts(splits: Sequence[int], seq_lens: Sequence[int], tile: int, where: str) -> None:
    """`splits[i]`: the KV splits request i's decode attention runs (the graph's static buffer after the replay's
    planning); SGLang's deterministic rule gives ceil(seq_len / tile). Example: tile 8, seq_lens [17, 5] -> [3, 1]."""
    expected = [-(-n // tile) for n in seq_lens]
    if list(splits) != expected:
        raise OracleFailure(ORACLE, f"{where}: under --enable-deterministic-inference the decode attention runs "
                            f"{list(splits)} KV splits per request where tiles of {tile} over seq_lens "
                            f"{list(seq_lens)} give {expected} (ceil(seq_len / {tile})): a request's reduction "
                            "order then depends on the batch it is in", splits=list(splits), expected=expected)
