"""Speed of the prefill suite: gate wall time and examples per second on clean SGLang, and for each mutant of
tests/test_prefill_mutants.py the seconds from the suite's start (a fresh process: imports included) until its
first failing example."""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import print_table, run_suite  # noqa: E402
from tests.test_prefill_mutants import MUTANTS, SUITE  # noqa: E402


def main() -> None:
    rows = [run_suite(SUITE)]
    for name, (edits, *_rest) in sorted(MUTANTS.items()):
        rows.append(run_suite(SUITE, edits, name))
    print_table(rows)


if __name__ == "__main__":
    main()
