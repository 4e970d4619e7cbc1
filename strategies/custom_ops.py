"""Cases for `torch.library.opcheck` of SGLang's custom ops whose own implementation runs off-GPU: which op, and
the sizes and dtype of its inputs (built by `harness.targets.custom_ops.inputs` from these)."""
from __future__ import annotations

import dataclasses

from hypothesis import strategies as st

from harness.targets.custom_ops import RUNNABLE


@dataclasses.dataclass(frozen=True)
class OpCase:
    op: str
    rows: int  # tokens: the leading size of every tensor input
    cols: int  # the output's last size (a GEMM's out features, a collective's width)
    inner: int  # a GEMM's in features
    dtype: str
    bias: bool  # a GEMM's optional bias
    seed: int


def op_cases(ops: tuple[str, ...] = tuple(sorted(RUNNABLE))) -> st.SearchStrategy[OpCase]:
    return st.builds(OpCase, op=st.sampled_from(ops), rows=st.integers(1, 8), cols=st.integers(1, 16),
                     inner=st.integers(1, 16), dtype=st.sampled_from(["float32", "bfloat16"]), bias=st.booleans(),
                     seed=st.integers(0, 2**16))
