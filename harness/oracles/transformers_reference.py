"""SGLang's model against transformers: the same checkpoint through both implementations must give the same
next-token logits (`harness.models.real.transformers_reference` builds the checkpoint and both models).

The one check here that does not compare SGLang with itself: a model-code bug that replay, eager, the torch-native
backend and a request alone all share (a layer's rotary embedding not built, a shard loaded into the wrong slice of
a fused weight) shows only against another implementation. Float32 tolerance (`eager.assert_matches_eager`
without exactness), the worst element named.
"""
from __future__ import annotations

import torch

from harness.oracles import OracleFailure
from harness.oracles.eager import assert_matches_eager

ORACLE = "transformers-reference"


def check(got: torch.Tensor, reference: torch.Tensor, *, history: list[int], where: str) -> None:
    """`got`: SGLang's next-token logits for one request whose tokens so far are `history`; `reference`:
    transformers' for the same tokens."""
    try:
        assert_matches_eager(got, reference, exact=False)
    except OracleFailure as failure:
        raise OracleFailure(ORACLE, f"{where}: SGLang's next-token logits after {len(history)} tokens {history} "
                            f"differ from transformers' for the same checkpoint: {failure.diagnosis}",
                            **failure.details) from None
