"""Hook contract: a hook that a platform overrides is the one that ran, as often and with the arguments expected.

`HookRecorder.wrap(name, fn)` returns a stand-in that records each call (args, kwargs, return) and then calls
`fn`; the assertions compare the record with what SGLang's contract says should happen.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Any
from collections.abc import Callable

from harness.oracles import OracleFailure

ORACLE = "hook-contract"


@dataclasses.dataclass
class HookCall:
    args: tuple
    kwargs: dict
    result: Any = None


class HookRecorder:
    def __init__(self) -> None:
        self.calls: dict[str, list[HookCall]] = {}

    def wrap(self, name: str, fn: Callable) -> Callable:
        self.calls.setdefault(name, [])

        @functools.wraps(fn)
        def recorded(*args, **kwargs):
            call = HookCall(args, kwargs)
            self.calls[name].append(call)
            call.result = fn(*args, **kwargs)
            return call.result

        return recorded

    def record(self, name: str, args: tuple, kwargs: dict, result: Any = None) -> HookCall:
        """Record a call observed some other way (e.g. a context manager whose body the recorder cannot wrap)."""
        call = HookCall(args, kwargs, result)
        self.calls.setdefault(name, []).append(call)
        return call

    def count(self, name: str) -> int:
        return len(self.calls.get(name, []))

    def assert_called(self, name: str, *, times: int | None = None, at_least: int = 1,
                      why: str = "") -> list[HookCall]:
        calls = self.calls.get(name, [])
        if times is not None and len(calls) != times:
            raise OracleFailure(ORACLE, f"hook {name} ran {len(calls)} time(s), expected {times}"
                                + (f": {why}" if why else ""), calls=[(c.args, c.kwargs) for c in calls])
        if times is None and len(calls) < at_least:
            raise OracleFailure(ORACLE, f"hook {name} ran {len(calls)} time(s), expected at least {at_least}"
                                + (f": {why}" if why else ""))
        return calls

    def assert_not_called(self, name: str, *, why: str = "") -> None:
        self.assert_called(name, times=0, why=why)

    def assert_argument(self, name: str, position: int, keyword: str, expected: Any, *, why: str = "") -> None:
        """Every call of `name` received `expected`, positionally at `position` or as `keyword`: the very object
        (a module must be the one being compiled), or an equal value for plain data (a mode string)."""
        for call in self.assert_called(name, why=why):
            got = call.args[position] if len(call.args) > position else call.kwargs.get(keyword, "<missing>")
            plain = isinstance(expected, (str, int, float, bool, type(None)))
            if not (got is expected or (plain and type(got) is type(expected) and got == expected)):
                raise OracleFailure(ORACLE, f"hook {name} received {keyword}={_short(got)}, expected {_short(expected)}"
                                    + (f": {why}" if why else ""))


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) < 80 else text[:77] + "..."
