"""Oracle `capture-legality`: nothing CUDA refuses while a stream is capturing ran inside a capture.

The virtual device (`harness.devices.legality`) raises CUDA's own error at the refused call, as a GPU would, and
files a violation; this oracle turns the first violation of an example into a failure naming the rule, the call,
CUDA's text and the site, whether SGLang let the error through, wrapped it ("Capture cuda graph failed: ...") or
swallowed it. Ops inside a capture the rules cannot classify are kept as advisories in the record.
"""
from __future__ import annotations

import contextlib
from collections.abc import Iterator

from harness.devices import legality
from harness.oracles import OracleFailure

ORACLE = "capture-legality"


def failure(raised: BaseException | None = None) -> OracleFailure | None:
    """The oracle's failure for the violations filed since the last `legality.reset_log()`, or None."""
    if not legality.VIOLATIONS:
        return None
    first = legality.VIOLATIONS[0]
    details = {"rule": first.rule, "operation": first.operation, "site": first.site}
    if raised is not None:
        details["raised"] = f"{type(raised).__name__}: {raised}"[:600]
    if len(legality.VIOLATIONS) > 1:
        details["more"] = [f"{v.operation} at {v.site}" for v in legality.VIOLATIONS[1:6]]
    return OracleFailure(ORACLE, f"{first.operation} inside a graph capture: {first.message}", **details)


@contextlib.contextmanager
def checking(ex) -> Iterator[None]:
    """Around one example: a violation inside it fails the example (chained to what SGLang raised, if anything)."""
    legality.reset_log()
    try:
        yield
    except Exception as error:
        found = failure(error)
        if found is None or isinstance(error, OracleFailure):
            raise
        raise found from error
    finally:
        if legality.ADVISORIES:
            ex.note("device_advisories", sorted(set(legality.ADVISORIES))[:20])
    found = failure()
    if found is not None:
        raise found
