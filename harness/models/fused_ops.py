"""SGLang's own fused ops in the tiny models, as every real MLP holds one, contributing exactly nothing.

SGLang flips fused ops (`BaseFusedOp`; `MultiPlatformOp` before 0.5.19) into torch.compile mode for its compile
passes (`patch_model`'s `_to_torch` for decode, tc_piecewise's `_toggle_fused_ops`), so Dynamo traces their
compile-safe forward; the capture-context oracle reads that mode at each trace. The tiny models call the op on
`[0, x]`: `SiluAndMul` gives silu(0) * x = 0, so their closed forms are unchanged.
"""
from __future__ import annotations

import torch
from torch import nn


def silu_and_mul(resolve: bool = True) -> nn.Module:
    """SGLang's `SiluAndMul`. `resolve`: run it once now, so its dispatch (`_forward_method`, resolved lazily from
    0.5.19) is settled before any compile pass; a server's is not (see the prefill "lazy_fused" body)."""
    from sglang.srt.layers.activation import SiluAndMul

    op = SiluAndMul()
    if resolve:
        settle(op)
    return op


def settle(op: nn.Module) -> None:
    """Run `op` once on `[0, 0]`, so its dispatch is resolved before any compile pass."""
    op(torch.zeros(1, 2))


def adds_nothing(op: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """`op([0, x])` over x's last axis: 0 for a gated op (silu(0) * x), shaped like x."""
    return op(torch.cat([torch.zeros_like(x), x], dim=-1))


def fused_ops_of(owner: object) -> dict[str, nn.Module]:
    """The fused ops under a module (they have `enter_torch_compile`), by module name; none for a non-module."""
    if not isinstance(owner, nn.Module):
        return {}
    return {name: module for name, module in owner.named_modules()
            if hasattr(module, "enter_torch_compile") and hasattr(module, "is_torch_compile")}
