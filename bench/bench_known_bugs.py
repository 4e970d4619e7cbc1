"""Seconds from a cold start until the harness first detects each of the three known bugs (../shared/KNOWN_BUGS.md).

Each bug is re-introduced into a scratch copy of the installed SGLang (the edits of the self-tests' mutant tables)
and the suite that owns the path runs whole, `-x`, in a fresh process, with empty compile caches (Inductor's and
the rebinding scan's in new temporary folders): imports, compiles and captures all count. Printed per bug: the
process's wall time, the seconds until the first failing example was recorded, and the oracle that judged it.

Usage: python bench/bench_known_bugs.py
"""
from __future__ import annotations

import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import print_table, run_suite  # noqa: E402
from tests.mutant_tables import BUG1, BUG2_MIXED_NOT_NORMALISED, KWARGS_MUTANTS, KWARGS_SUITE  # noqa: E402

# bug, suite (as the gate runs it for that file), edits, extra options
BUGS = (
    ("bug1 patch_model by value (npu)", "suites/test_decode_capture.py", BUG1, ("--personality", "npu")),
    ("bug2 MIXED not normalised", "suites/test_prefill_pcg.py", BUG2_MIXED_NOT_NORMALISED, ()),
    ("bug3 mode with options", KWARGS_SUITE, KWARGS_MUTANTS["mode_with_options"].edits, ()),
)


def cold_env() -> dict:
    """Empty compile caches for one run."""
    return {"TORCHINDUCTOR_CACHE_DIR": tempfile.mkdtemp(prefix="bench-inductor-"),
            "HARNESS_CACHE_DIR": tempfile.mkdtemp(prefix="bench-harness-cache-")}


def main() -> None:
    rows = [run_suite(suite, edits, name, extra=("--profile", "gate", *extra), env=cold_env())
            for name, suite, edits, extra in BUGS]
    print_table(rows)


if __name__ == "__main__":
    main()
