"""Draft token map: an EAGLE3 head drafts in a vocabulary of its own, and every token it hands the verify is a
target token id.

An EAGLE3 checkpoint's `d2t` gives each of the head's `draft_vocab_size` tokens its id in the target's vocabulary
(SGLang loads it as `hot_token_id`, `d2t + arange`). `EagleDraftWorker.draft_forward` maps the top-k handed in and
each step's top-k through it, so every token of the draft tree lies in the map's image: the set of `hot_token_id`'s
values. A tree token outside it is a draft-vocabulary id that reached the tree unmapped (the target would verify a
token the head never meant). Both the graph's tree and eager's are held to it: a differential check cannot see a
mapping dropped from the code both run.
"""
from __future__ import annotations

import torch

from harness.oracles import OracleFailure

ORACLE = "draft-token-map"


def check_tokens_mapped(tokens: torch.Tensor, hot_token_id: torch.Tensor | None, requests: int, *, what: str,
                        where: str) -> None:
    """`tokens`: the draft tree's tokens, a row a request (the first `requests` rows real); `hot_token_id`: the
    head's map (None: a head drafting in the target's vocabulary, nothing to check)."""
    if hot_token_id is None:
        return
    image = set(int(t) for t in hot_token_id.tolist())
    for request, row in enumerate(tokens[:requests].tolist()):
        stray = [t for t in row if t not in image]
        if stray:
            raise OracleFailure(ORACLE, f"{where}: {what} of request {request} holds token(s) {stray} that are no "
                                f"target id of the EAGLE3 head's map (`hot_token_id`, {len(image)} of the target's "
                                f"ids): draft-vocabulary ids reached the tree unmapped; the tree is {row}",
                                request=request, stray=stray, tokens=row)
