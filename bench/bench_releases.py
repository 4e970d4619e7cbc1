"""The prefill suite on every SGLang release environment (.venvs/, or $HARNESS_RELEASE_ENVS) and the default
.venv: pass/fail, the first failing oracle with its diagnosis, the time, and whether that matches the release
history of known bug 2 (MIXED is normalised before the piecewise replay from 0.5.10: 0.5.9 must fail, later
releases pass).

    python bench/bench_releases.py [--suite suites/test_prefill_pcg.py] [--only 0.5.9 0.5.10] [--out FILE.json]
                                   [-- extra pytest args]

Each release runs in a fresh process with its own environment's Python (`<env>/bin/python -m pytest ...`), the
gate profile (seed 0 unless --hypothesis-seed is passed through).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from harness.releases import BUG2_ORACLES, REPO, SUITE, envs_dir, expected, run_release, sglang_version  # noqa: E402


def environments() -> list[tuple[str, Path]]:
    """(label, python) for .venv and every release environment (harness.releases.envs_dir()) that has a Python."""
    found = []
    default = REPO / ".venv" / "bin" / "python"
    if default.exists():
        found.append((".venv", default))
    for env in sorted(envs_dir().glob("*")):
        python = env / "bin" / "python"
        if python.exists():
            found.append((env.name, python))
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--suite", default=SUITE)
    parser.add_argument("--only", nargs="*", help="SGLang versions to run (default: every environment)")
    parser.add_argument("--out", help="also write the rows as JSON here")
    args, extra = parser.parse_known_args(argv)
    extra = [a for a in extra if a != "--"]
    rows = []
    print(f"{'env':<16}{'sglang':<10}{'expect':<8}{'got':<6}{'wall s':>8}  first failing oracle / counts")
    for label, python in environments():
        version = sglang_version(python)
        if version is None or (args.only and version not in args.only):
            continue
        row = {"env": label, "sglang": version, "expected": expected(version),
               **run_release(python, suite=args.suite, extra=tuple(extra))}
        row["as_expected"] = row["verdict"] == row["expected"] and (
            row["verdict"] == "pass" or row["first_oracle"] in BUG2_ORACLES)
        rows.append(row)
        detail = (f"[{row['first_oracle']}] {row['first_diagnosis'][:110]}" if row["first_oracle"]
                  else row["counts"])
        mark = "" if row["as_expected"] else "  <-- UNEXPECTED"
        print(f"{label:<16}{version:<10}{row['expected']:<8}{row['verdict']:<6}{row['wall_s']:>8.1f}  "
              f"{detail}{mark}", flush=True)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(rows, indent=2, default=repr))
    return 0 if rows and all(r["as_expected"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
