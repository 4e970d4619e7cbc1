"""Benchmarks that print figures (never timed tests): campaign and gate speed, mutants a minute, per-suite example
rates, release checks, repro searches, the real-model captures, and `device_cuda.sh`, the nightly GPU run. Each
script's docstring says what it measures and how to run it; `common.py` holds what they share."""
