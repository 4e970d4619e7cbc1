"""Eager equality: a compiled or replayed output must equal what eager execution computes.

Judged the way `torch._dynamo.utils.same` judges compiled models: when an fp64 reference is given, the
candidate's RMSE against it may not exceed `multiplier` times eager's own RMSE against it (plus a small floor),
so low-precision dtypes are judged by how far eager itself drifts. Without a reference, `torch.allclose`-style
tolerances by dtype. `exact=True` (the eager backend, a replay of recorded work) demands bit equality.
NaN or Inf in the candidate where eager has a finite value never passes.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any
from collections.abc import Iterator

import torch

from harness.oracles import OracleFailure, observed

ORACLE = "eager-equality"

# (rtol, atol) by dtype when no fp64 reference is given.
_TOLERANCES = {
    torch.float64: (1e-7, 1e-7),
    torch.float32: (1e-4, 1e-5),
    torch.float16: (1e-2, 1e-3),
    torch.bfloat16: (2e-2, 1e-2),
}


def _leaves(value: Any, path: str = "output") -> Iterator[tuple[str, Any]]:
    """Yield (path, leaf) for tensors and scalars inside tuples, lists, dicts and dataclasses."""
    if isinstance(value, torch.Tensor) or value is None or isinstance(value, (int, float, bool, str)):
        yield path, value
    elif isinstance(value, dict):
        for key in sorted(value, key=str):
            yield from _leaves(value[key], f"{path}[{key!r}]")
    elif isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            yield from _leaves(item, f"{path}[{index}]")
    elif dataclasses.is_dataclass(value):
        for field in dataclasses.fields(value):
            yield from _leaves(getattr(value, field.name), f"{path}.{field.name}")
    else:
        raise TypeError(f"eager oracle cannot compare a {type(value).__name__} at {path}")


def _worst(actual: torch.Tensor, expected: torch.Tensor) -> dict:
    diff = (actual.double() - expected.double()).abs()
    diff = torch.where(torch.isnan(diff), torch.full_like(diff, math.inf), diff)
    flat = int(diff.reshape(-1).argmax()) if diff.numel() else 0
    index = tuple(int(i) for i in torch.unravel_index(torch.tensor(flat), diff.shape)) if diff.numel() else ()
    return {
        "worst_index": index,
        "actual": actual.reshape(-1)[flat].item() if diff.numel() else None,
        "expected": expected.reshape(-1)[flat].item() if diff.numel() else None,
        "abs_error": diff.reshape(-1)[flat].item() if diff.numel() else 0.0,
    }


def _rmse(a: torch.Tensor, b: torch.Tensor) -> float:
    return torch.sqrt(torch.mean((a.double() - b.double()) ** 2)).item() if a.numel() else 0.0


def _compare_tensor(path, actual, expected, reference, exact, multiplier) -> None:
    if actual.shape != expected.shape or actual.dtype != expected.dtype:
        raise OracleFailure(ORACLE, f"{path}: shape or dtype differs from eager",
                            actual=f"{tuple(actual.shape)} {actual.dtype}",
                            expected=f"{tuple(expected.shape)} {expected.dtype}")
    actual, expected = actual.detach().cpu(), expected.detach().cpu()
    if not (actual.is_floating_point() or actual.is_complex()):
        if not torch.equal(actual, expected):
            raise OracleFailure(ORACLE, f"{path}: integer values differ from eager", **_worst(actual, expected))
        return
    bad = ~torch.isfinite(actual) & torch.isfinite(expected)
    if bool(bad.any()):
        raise OracleFailure(ORACLE, f"{path}: NaN/Inf where eager is finite", **_worst(actual, expected))
    if exact:
        if not torch.equal(actual.nan_to_num(), expected.nan_to_num()):
            raise OracleFailure(ORACLE, f"{path}: not bit-equal to eager (exact comparison)",
                                **_worst(actual, expected))
        return
    if reference is not None:
        reference = reference.detach().cpu().double()
        finite = torch.isfinite(reference)
        candidate_error = _rmse(actual[finite], reference[finite])
        eager_error = _rmse(expected[finite], reference[finite])
        floor = 1e-4 if actual.dtype in (torch.float16, torch.bfloat16) else 1e-6
        if candidate_error > multiplier * eager_error + floor:
            raise OracleFailure(
                ORACLE, f"{path}: error against the fp64 reference exceeds {multiplier}x eager's own",
                candidate_rmse=candidate_error, eager_rmse=eager_error, **_worst(actual, expected))
        return
    rtol, atol = _TOLERANCES.get(actual.dtype, (1e-4, 1e-5))
    if not torch.allclose(actual, expected, rtol=rtol, atol=atol, equal_nan=True):
        raise OracleFailure(ORACLE, f"{path}: differs from eager beyond rtol={rtol} atol={atol}",
                            **_worst(actual, expected))


def assert_matches_eager(actual: Any, expected: Any, *, fp64_reference: Any = None, exact: bool = False,
                         multiplier: float = 3.0) -> None:
    """Raise `OracleFailure("eager-equality")` unless `actual` equals eager's `expected`, leaf by leaf."""
    observed.observe("outputs", actual)
    actual_leaves = list(_leaves(actual))
    expected_leaves = list(_leaves(expected))
    reference_leaves = list(_leaves(fp64_reference)) if fp64_reference is not None else [(None, None)] * len(
        expected_leaves)
    if [p for p, _ in actual_leaves] != [p for p, _ in expected_leaves]:
        raise OracleFailure(ORACLE, "output structure differs from eager",
                            actual=[p for p, _ in actual_leaves], expected=[p for p, _ in expected_leaves])
    for (path, a), (_, e), (_, r) in zip(actual_leaves, expected_leaves, reference_leaves):
        if isinstance(a, torch.Tensor) and isinstance(e, torch.Tensor):
            _compare_tensor(path, a, e, r if isinstance(r, torch.Tensor) else None, exact, multiplier)
        elif isinstance(a, torch.Tensor) or isinstance(e, torch.Tensor):
            kind = lambda value: "a tensor" if isinstance(value, torch.Tensor) else repr(value)  # noqa: E731
            raise OracleFailure(ORACLE, f"{path}: the replay gave {kind(a)}, eager {kind(e)}")
        elif a != e and not (isinstance(a, float) and isinstance(e, float) and math.isclose(a, e, rel_tol=1e-6)):
            raise OracleFailure(ORACLE, f"{path}: value differs from eager", actual=a, expected=e)
