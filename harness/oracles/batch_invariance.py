"""Batch invariance: a request's next-token logits in a scheduler-built batch are the ones its own token history
gives it alone.

The expectation is derived from the drawn case, not from SGLang's state: each request is also run alone, in
lockstep, on pools of its own (its prompt prefilled, then one eager decode step of a batch of one per step of the
batch, with the tokens the batch chose for it; `harness.targets.decode.scheduled.Alone`). A replayed decode batch
must give each of its requests the logits it gets alone within float32 tolerance, whatever joined or left the
batch before. Replay against eager cannot see a batch SGLang assembled
wrongly (rows, lengths, ids or KV slots of another request after a finish or a merge): both run the same wrong
batch. This check does, and names the request, its history and the batch fields that disagree with it.
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
