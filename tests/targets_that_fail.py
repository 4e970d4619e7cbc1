"""A Hypothesis test whose oracle fires from n = 10 on, found by generation and shrunk to 10; run by
tests/test_plugin.py (not collected by default: its name does not start with test_)."""
from hypothesis import given, strategies as st

from harness.oracles import OracleFailure
from harness.record import example


@given(n=st.integers(0, 1000))
def test_fails_from_ten(n):
    with example("threshold", n=n):
        if n >= 10:
            raise OracleFailure("eager-equality", f"n={n} is at least 10")  # a registered name: any will do
