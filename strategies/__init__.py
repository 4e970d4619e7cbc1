"""Hypothesis strategies: what the harness draws. Public and thin; the machinery lives in `harness/`."""
