"""Oracles: each one checks one contract and raises `OracleFailure` naming that contract.

A failure message names the oracle, what was expected and what happened; the record writer adds the drawn
case, the seed, the versions and the replay command.
"""
from __future__ import annotations


class OracleFailure(AssertionError):
    """A contract of SGLang's code was broken. `oracle` names the contract; `details` carry the evidence."""

    def __init__(self, oracle: str, diagnosis: str, **details):
        self.oracle = oracle
        self.diagnosis = diagnosis
        self.details = details
        lines = [f"[{oracle}] {diagnosis}"]
        lines += [f"    {key}: {value}" for key, value in details.items()]
        super().__init__("\n".join(lines))
