"""No Dynamo graph break where SGLang compiles with `fullgraph=True`.

`install_torch_compiled` compiles the prefill body with `fullgraph=True`, so anything Dynamo cannot trace (a
data-dependent branch, a host read, an untraceable call) raises `torch._dynamo.exc.Unsupported` (or a subclass; or
`UserError`, what Dynamo raises for code valid in eager that it will not trace) instead of splitting the graph.
SGLang's prefill runner wraps it in its own `RuntimeError("Capture prefill CUDA graph failed: ...")`; a serve-time
retrace raises it from the forward.
Either way it is its own verdict, not a crash: `check(error)` walks the exception chain and raises
`OracleFailure("graph-break", ...)` with Dynamo's reason (its graph-break type) and the user-code site (file:line)
Dynamo names in the exception's `real_stack`.
"""
from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator

from harness.oracles import OracleFailure

ORACLE = "graph-break"


def find_unsupported(error: BaseException) -> BaseException | None:
    """The first Dynamo `Unsupported` or `UserError` in `error`'s chain (itself, its causes, its contexts), else
    None."""
    from torch._dynamo.exc import Unsupported, UserError

    seen = set()
    while error is not None and id(error) not in seen:
        if isinstance(error, (Unsupported, UserError)):
            return error
        seen.add(id(error))
        error = error.__cause__ or error.__context__
    return None


def reason_of(unsupported: BaseException) -> str:
    """Dynamo's graph-break type (`gb_type`, e.g. 'Data-dependent branching'), else the message's first line (a
    UserError's prefixed by its type, e.g. 'DYNAMIC_CONTROL_FLOW: ...')."""
    gb_type = getattr(unsupported, "gb_type", None)
    if gb_type:
        return str(gb_type)
    text = str(getattr(unsupported, "msg", None) or unsupported).strip()
    first = text.splitlines()[0] if text else type(unsupported).__name__
    kind = getattr(getattr(unsupported, "error_type", None), "name", None)
    return f"{kind}: {first}" if kind else first


def site_of(unsupported: BaseException) -> str:
    """The innermost user-code frame Dynamo was tracing (`file:line in function`), or 'unknown'."""
    stack = getattr(unsupported, "real_stack", None) or ()
    if stack:
        frame = stack[-1]
        return f"{frame.filename}:{frame.lineno} in {frame.name}"
    found = re.findall(r'File "([^"]+)", line (\d+), in (\w+)', str(unsupported))
    return f"{found[-1][0]}:{found[-1][1]} in {found[-1][2]}" if found else "unknown"


def check(error: BaseException, *, where: str) -> None:
    """Raise the graph-break verdict when `error` is (or wraps) a Dynamo graph break; return otherwise."""
    unsupported = find_unsupported(error)
    if unsupported is None:
        return
    reason, site = reason_of(unsupported), site_of(unsupported)
    explanation = next((line.strip() for line in str(unsupported).splitlines()
                        if line.strip().startswith("Explanation:")), "")
    raise OracleFailure(ORACLE, f"Dynamo broke the graph during {where}, which SGLang compiles with "
                        f"fullgraph=True: {reason} at {site}", reason=reason, site=site,
                        exception=type(unsupported).__name__, explanation=explanation[:300]) from error


@contextlib.contextmanager
def graph_breaks_as_verdict(where: str) -> Iterator[None]:
    """Around a call of a fullgraph-compiled forward: a graph break leaves as the oracle's verdict."""
    try:
        yield
    except Exception as error:  # noqa: BLE001 - anything else is re-raised unchanged
        check(error, where=where)
        raise
