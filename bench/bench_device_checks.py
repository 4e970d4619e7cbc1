"""Overhead of the virtual device's two checks (capture legality is always on; the stream-order checker is the
one with a cost, a dispatch mode over every op): the gate campaign of every suite with the stream-order check on
and off (`HARNESS_STREAM_ORDER=off`), alternated in the same run, each in a fresh process. Prints wall and CPU
seconds (CPU time of the pytest processes: steadier than wall time on a shared machine) and the overhead of on
over off; the target is at most 20%."""
from __future__ import annotations

import argparse
import resource
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import run_suite  # noqa: E402

SETTINGS = {"on": {}, "off": {"HARNESS_STREAM_ORDER": "off"}}


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=1, help="on/off pairs to run (default 1)")
    parser.add_argument("--suites", default="suites", help="suite files or folder (default: all of suites/)")
    options = parser.parse_args()
    totals = {name: {"wall": 0.0, "cpu": 0.0} for name in SETTINGS}
    print(f"{'run':<10}{'exit':>5}{'wall s':>9}{'cpu s':>9}{'examples':>10}")
    for round_ in range(options.rounds):
        for name in (("on", "off") if round_ % 2 == 0 else ("off", "on")):
            before = cpu_seconds()
            row = run_suite(options.suites, name=f"stream-order {name}", env=SETTINGS[name])
            cpu = cpu_seconds() - before
            totals[name]["wall"] += row["wall_s"]
            totals[name]["cpu"] += cpu
            print(f"{name:<10}{row['exit']:>5}{row['wall_s']:>9.1f}{cpu:>9.1f}{row['examples']:>10}")
    for measure in ("wall", "cpu"):
        on, off = totals["on"][measure], totals["off"][measure]
        print(f"overhead ({measure}): {100 * (on - off) / off:+.1f}% (on {on:.1f} s, off {off:.1f} s)")


if __name__ == "__main__":
    main()
