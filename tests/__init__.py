"""The harness's own tests, by cost (markers in pyproject.toml): unmarked ones are fast unit tests of oracles,
strategies, devices, records and commands; `suite` ones drive SGLang in this process (seconds each); `slow` ones run
a suite in another process, on a mutant of SGLang or a release environment (`mutant_runs.py`: the mutant tables'
`Mutant` records and the warm runs). `pytest -m "not slow and not suite"` is the quick check; `./harness.sh
selftest` runs all. `repro_logs/` holds the crash logs the repro tests parse."""
