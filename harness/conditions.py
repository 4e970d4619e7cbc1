"""Narrowing the strategies to a reported crash's conditions.

`python -m harness repro` sets HARNESS_CONDITIONS to a JSON object {drawn name: [allowed values]}; a strategy
built with `narrow(name, strategy)` then draws only those values (those its own domain has). Without the
variable, strategies are unchanged.
"""
from __future__ import annotations

import json
import os

from hypothesis import strategies as st

ENV = "HARNESS_CONDITIONS"


def conditions() -> dict[str, list]:
    raw = os.environ.get(ENV)
    return json.loads(raw) if raw else {}


def narrow(name: str, strategy: st.SearchStrategy, domain=None) -> st.SearchStrategy:
    """`strategy`, or only the reported values of `name` (intersected with `domain` when given)."""
    allowed = conditions().get(name)
    if not allowed:
        return strategy
    if domain is not None:
        by_text = {_text(v): v for v in domain}
        allowed = [by_text[str(a)] for a in allowed if str(a) in by_text] or list(domain)
    return st.sampled_from(allowed)


def _text(value) -> str:
    """How a value is named in a record: functions by name, enums by member name, the rest as text."""
    return str(getattr(value, "__name__", None) or getattr(value, "name", None) or value)
