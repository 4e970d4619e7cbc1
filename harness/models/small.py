"""Small modules for torch.compile checks: a few shapes and dtypes, deterministic weights from a seed."""
from __future__ import annotations

import dataclasses
import math

import torch
from torch import nn

KINDS = ("mlp", "norm_residual", "attention")
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


class Mlp(nn.Module):
    def __init__(self, features: int):
        super().__init__()
        self.up = nn.Linear(features, 2 * features)
        self.down = nn.Linear(2 * features, features)

    def forward(self, x):
        return self.down(torch.nn.functional.gelu(self.up(x)))


class NormResidual(nn.Module):
    def __init__(self, features: int):
        super().__init__()
        self.norm = nn.LayerNorm(features)
        self.proj = nn.Linear(features, features)

    def forward(self, x):
        return x + self.proj(self.norm(x))


class Attention(nn.Module):
    """One head of self-attention over the middle dimension: softmax(q k^T / sqrt(d)) v."""

    def __init__(self, features: int):
        super().__init__()
        self.qkv = nn.Linear(features, 3 * features, bias=False)
        self.scale = 1.0 / math.sqrt(features)

    def forward(self, x):
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        return torch.softmax(q @ k.transpose(-1, -2) * self.scale, dim=-1) @ v


_CLASSES = {"mlp": Mlp, "norm_residual": NormResidual, "attention": Attention}


@dataclasses.dataclass(frozen=True)
class ModuleSpec:
    kind: str
    batch: int
    features: int
    dtype: str
    seed: int = 0

    def build(self) -> nn.Module:
        torch.manual_seed(self.seed)
        return _CLASSES[self.kind](self.features).to(DTYPES[self.dtype]).eval()

    def input(self, salt: int) -> torch.Tensor:
        generator = torch.Generator().manual_seed(self.seed * 1000 + salt)
        shape = (self.batch, 4, self.features) if self.kind == "attention" else (self.batch, self.features)
        return torch.randn(shape, generator=generator).to(DTYPES[self.dtype])
