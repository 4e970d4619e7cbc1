"""What the decode-replay oracles read of a target, as one typed protocol: they call these and never ask which
target they hold. The closed-form `DecodeTarget` gives the defaults; a variant (ragged verify, dLLM) overrides the
few it changes, so the question "which kind of target is this?" is answered by the target, not by the oracle."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol

import torch


class ReplayTarget(Protocol):
    case: Any  # the DecodeCase that ran
    lora_manager: Any
    attn_backend: Any
    patch_model_seen: list

    @property
    def capture_bs(self) -> list[int]: ...

    @property
    def promises_padding(self) -> bool:
        """Whether the release pads static inputs by a declared policy (its buffer registry)."""

    def replay(self, batch) -> Any: ...

    def eager(self, batch, forward: Callable | None = None) -> Any: ...

    def can_replay(self, batch) -> bool: ...

    def static_buffer(self, name: str) -> torch.Tensor | None: ...

    def seq_len_fill_value(self) -> int: ...

    def expected_servable(self, batch) -> bool:
        """Whether the case says the runner must offer `batch` a graph."""

    def returned_logits(self, output, batch) -> torch.Tensor:
        """The logits a replay returns for `batch`, held to the target's contract."""

    def padded_extent(self, batch) -> tuple[int, int] | None:
        """(request rows, token rows) the static buffers hold for `batch` where they are not the case's padded
        size times its width; None where they are."""

    def replayed_backend(self) -> Any:
        """The attention backend the next replay reads its metadata from (under pdmux, the current stream
        group's)."""

    def stale_layout(self, batch) -> str:
        """Where the layout the graph reads differs from `batch`'s, in words ("" where it agrees or has none)."""

    def stale_embeddings(self, batch) -> str:
        """Where the embeddings or state the graph reads differ from `batch`'s ("" where they agree or it has none)."""
