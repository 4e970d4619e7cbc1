"""Wall time of the gate profile of every suite, on one process and with `-n 2` (pytest-xdist), each in a
fresh process against the installed SGLang; prints examples per second for each."""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import print_table, run_suite  # noqa: E402


def main() -> None:
    rows = []
    for name, extra in (("gate, all suites, 1 process", ()), ("gate, all suites, -n 2", ("-n", "2"))):
        rows.append(run_suite("suites", name=name, extra=extra))
    print_table(rows)


if __name__ == "__main__":
    main()
