"""Multi-LoRA serving against merged models: a request served with adapter X must get what the base model with X
merged into its weights gives (PEFT's definition of an adapter: W + (lora_alpha / r) * B @ A on each targeted
weight), and a request with no adapter what the base model gives, whatever else shares its batch
(`harness.models.real.lora` builds the adapters and the merged models).

Replay against eager compares SGLang's LoRA path with itself: a scaling never written, a rank left at zero, the
wrong slot's weights, an adapter whose weights never reach SGLang's memory pool move both together. The merged
model runs no LoRA code (SGLang's plain class, its own loader), so those show here. Float32 tolerance
(`eager.assert_matches_eager` without exactness), the worst element named.
"""
from __future__ import annotations

from collections.abc import Callable

import torch

from harness.oracles import OracleFailure
from harness.oracles.eager import assert_matches_eager

ORACLE = "lora-reference"


def check(got: torch.Tensor, reference: torch.Tensor, *, adapter: str | None, where: str,
          batch_info: Callable[[], str] = lambda: "") -> None:
    """`got`: SGLang's logits for one request served with `adapter` (None: the base model); `reference`: the
    merged model's for the same request on the same cache. `batch_info()`: the LoRA backend's view of the batch,
    read for the diagnosis of a failure only."""
    try:
        assert_matches_eager(got, reference, exact=False)
    except OracleFailure as failure:
        served = "no adapter (the base model)" if adapter is None else f"adapter {adapter!r}"
        raise OracleFailure(ORACLE, f"{where}: served with {served}, its logits differ from those of the model "
                            f"with that adapter merged into its weights: {failure.diagnosis}{batch_info()}",
                            **failure.details, adapter=adapter) from None
