"""Differential testing and fuzzing harness for SGLang's graph-capture and torch.compile paths.

The library lives here; `strategies/` draws cases, `suites/` composes them with targets and oracles,
`reports/` writes what happened. See README.md.
"""
