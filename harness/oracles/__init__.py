"""Oracles: each one checks one contract and raises `OracleFailure` naming that contract.

A failure message names the oracle, what was expected and what happened; the record writer adds the drawn
case, the seed, the versions and the replay command.
"""
from __future__ import annotations

from harness.oracles.registry import require


class OracleFailure(AssertionError):
    """A contract of SGLang's code was broken. `oracle` names the contract (one of `registry.ORACLES`: an unknown
    name is a ValueError, so a typo cannot make a verdict nobody counts); `details` carry the evidence."""

    def __init__(self, oracle: str, diagnosis: str, **details):
        self.oracle = require(oracle)
        self.diagnosis = diagnosis
        self.details = details
        lines = [f"[{oracle}] {diagnosis}"]
        lines += [f"    {key}: {value}" for key, value in details.items()]
        super().__init__("\n".join(lines))
