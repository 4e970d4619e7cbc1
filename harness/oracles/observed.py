"""What an example did, beyond its verdict: the outputs the oracles compared and the padded rows they read, kept in
its record (`behaviour`) so `gate --base` can compare one drawn example on two SGLang trees (a refactor that meant
to change nothing moves no output, no padded row). Oracles call `observe`; `harness.record.example` opens the sink.
"""
from __future__ import annotations

import contextlib
from typing import Any

PER_KIND = 64  # values kept per kind and example: enough to see a change, small enough for examples.jsonl
_open: list[dict[str, list]] = []  # the behaviour of each example being run, innermost last


@contextlib.contextmanager
def observing(behaviour: dict[str, list]):
    """Collect `observe` calls into `behaviour` while the block runs."""
    _open.append(behaviour)
    try:
        yield behaviour
    finally:
        _open.remove(behaviour)


def observe(kind: str, value: Any) -> None:
    """Add `value` (JSON-able, or a tensor: fingerprinted) under `kind` to the running example (none: nothing)."""
    if not _open:
        return
    seen = _open[-1].setdefault(kind, [])
    if len(seen) < PER_KIND:
        seen.append(fingerprint(value))


def fingerprint(value: Any) -> Any:
    """A tensor as its shape and a few float statistics (sum, absolute sum, first and last values, rounded to 6
    significant digits), so two runs compare within a tolerance without storing the tensor; containers, leaf by leaf."""
    import torch

    if isinstance(value, torch.Tensor):
        flat = value.detach().reshape(-1).double().cpu()
        if flat.numel() == 0:
            return {"shape": list(value.shape), "stats": []}
        finite = torch.nan_to_num(flat, nan=0.0, posinf=0.0, neginf=0.0)
        stats = [finite.sum().item(), finite.abs().sum().item(), *flat[:4].tolist(), *flat[-2:].tolist()]
        return {"shape": list(value.shape), "stats": [float(f"{v:.6g}") for v in stats]}
    if isinstance(value, dict):
        return {str(k): fingerprint(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [fingerprint(v) for v in value]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return repr(value)
