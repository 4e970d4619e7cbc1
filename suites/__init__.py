"""The pytest suites, one per targeted SGLang path (registered in `harness/registry.py`): each draws cases with
`strategies/`, drives SGLang's own code through a `harness/targets` adapter and judges it with `harness/oracles`.
What the decode suites share lives in `decode_common.py` and `conftest.py`, never in a test module another imports;
`regressions/` pins known bugs as explicit cases."""
