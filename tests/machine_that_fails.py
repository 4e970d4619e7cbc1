"""A Hypothesis state machine whose oracle fires once its steps add up to 10; run by tests/test_plugin.py (not
collected by default: its name does not start with test_). Its `runTest` is a bound method, so a replay must put
`@reproduce_failure` on the machine class."""
from hypothesis import settings, strategies as st
from hypothesis.stateful import RuleBasedStateMachine, rule

from harness.oracles import OracleFailure
from harness.record import example


class Adder(RuleBasedStateMachine):
    total = 0

    @rule(n=st.integers(0, 6))
    def add(self, n):
        self.total += n
        with example("adder", n=n, total=self.total):
            if self.total >= 10:
                raise OracleFailure("eager-equality", f"the steps add up to {self.total}")


TestAdder = type("TestAdder", (Adder.TestCase,), {"settings": settings(max_examples=200, database=None)})
