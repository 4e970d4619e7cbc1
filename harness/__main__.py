"""Command line: `python -m harness campaign|selftest|targets [...]` (README has the details).

Anything after the known options goes to pytest unchanged (e.g. `-k decode`, `-n 2`, `--hypothesis-seed 7`).
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent


def _pytest(args: list[str]) -> int:
    import pytest

    os.chdir(REPO_ROOT)
    code = int(pytest.main(args))
    return 0 if code == 5 and "--profile=repro" in args else code


def isolated(extra: list[str]) -> list[str]:
    """Run examples in an xdist worker (one, unless the caller chose -n): a target that segfaults, aborts or hangs
    takes down only its worker, which xdist replaces; the plugin records the example it was running."""
    if any(a == "-n" or a.startswith(("-n", "--numprocesses")) for a in extra):
        return extra
    return ["-n", "1", "--max-worker-restart", "100", *extra]


def campaign(options, extra: list[str]) -> int:
    if options.no_stream_order:
        os.environ["HARNESS_STREAM_ORDER"] = "off"  # the workers inherit it; every record says so
    report_dir = Path(options.report_dir or f"reports/campaign-{time.strftime('%Y%m%d-%H%M%S')}")
    args = [*options.suites, f"--device={options.device}", f"--profile={options.profile}",
            f"--report-dir={report_dir}", "-q", "-rfEs", "--sglang-coverage"]
    code = _pytest(args + isolated(extra))
    print(f"\n[harness] campaign {'passed' if code == 0 else 'FAILED'}; reports in {REPO_ROOT / report_dir}: "
          "summary.md, examples.jsonl, failures.jsonl, junit.xml")
    return code


def source_root(path: str) -> Path:
    """The folder holding the `sglang` package of a source checkout (PATH/python or PATH itself)."""
    tree = Path(path).resolve()
    for root in (tree / "python", tree):
        if (root / "sglang" / "__init__.py").exists():
            return root
    from harness.errors import HarnessError

    raise HarnessError(f"{path} is not an SGLang source tree: neither {tree / 'python' / 'sglang'} nor "
                     f"{tree / 'sglang'} holds an __init__.py. Pass the root of a checkout of SGLang.")


def gate(options, extra: list[str]) -> int:
    """Pre-merge gate: the gate profile of every suite against a source tree, imported ahead of the installed
    SGLang (its pure-Python changes need no install); JUnit XML for the CI system; non-zero on any failure."""
    from harness.errors import HarnessError

    try:
        root = source_root(options.tree)
    except HarnessError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    report_dir = Path(options.report_dir or f"reports/gate-{time.strftime('%Y%m%d-%H%M%S')}")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(root), str(REPO_ROOT), os.environ.get("PYTHONPATH", "")]))
    import subprocess

    command = [sys.executable, "-m", "pytest", "suites", "--profile=gate", f"--device={options.device}",
               f"--report-dir={report_dir}", f"--junitxml={report_dir / 'junit.xml'}", "-q", "-rfEs", *isolated(extra)]
    print(f"[harness] gate on {root / 'sglang'}: {' '.join(command[2:])}")
    code = subprocess.run(command, cwd=REPO_ROOT, env=env).returncode
    print(f"[harness] gate {'passed' if code == 0 else 'FAILED'} for {options.tree}; JUnit XML: "
          f"{REPO_ROOT / report_dir / 'junit.xml'}")
    return code


def selftest(options, extra: list[str]) -> int:
    return _pytest(["tests", "-q", "-rfEs"] + extra)


def targets(options, extra: list[str]) -> int:
    from harness import registry
    from harness.compat import prepare_torchvision
    from harness.errors import HarnessError, PathMissing
    from harness.versions import versions

    try:
        found = versions()
        prepare_torchvision()
    except HarnessError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(f"SGLang {found['sglang']} at {found['sglang_path']}; torch {found['torch']}")
    for suite in registry.SUITES:
        try:
            suite.load()
            print(f"  {suite.name:<16} available")
        except PathMissing as missing:
            print(f"  {suite.name:<16} missing: {missing}")
        except Exception as error:  # an adapter that cannot even load is worth a line, not a traceback
            print(f"  {suite.name:<16} broken: {type(error).__name__}: {error}")
    return 0


def repro(options, extra: list[str]) -> int:
    from harness.errors import HarnessError
    from harness.repro import repro as run_repro

    try:
        return run_repro(options.file, options.budget, Path(options.out))
    except HarnessError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2


def main(argv: list[str] | None = None) -> int:
    from harness.profiles import PROFILES
    from harness.devices import DEVICES

    parser = argparse.ArgumentParser(prog="python -m harness", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    run = commands.add_parser("campaign", help="fuzz every suite against the installed SGLang, with a report")
    run.add_argument("--device", default="cpu", choices=DEVICES)
    run.add_argument("--profile", default="gate", choices=PROFILES)
    run.add_argument("--report-dir", default=None, help="default reports/campaign-TIMESTAMP")
    run.add_argument("--suites", nargs="+", default=["suites"], metavar="PATH",
                     help="suite files or folders to run (default: all of suites/)")
    run.add_argument("--no-stream-order", action="store_true",
                     help="turn the virtual device's stream-order check off (the report says so)")
    run.set_defaults(handler=campaign)
    pre_merge = commands.add_parser("gate", help="pre-merge gate: every suite's gate profile on an SGLang source tree")
    pre_merge.add_argument("tree", help="an SGLang checkout (the folder holding python/sglang)")
    pre_merge.add_argument("--device", default="cpu", choices=DEVICES)
    pre_merge.add_argument("--report-dir", default=None, help="default reports/gate-TIMESTAMP")
    pre_merge.set_defaults(handler=gate)
    commands.add_parser("selftest", help="the harness's own tests").set_defaults(handler=selftest)
    commands.add_parser("targets", help="which targeted SGLang paths the installed release has").set_defaults(
        handler=targets)
    again = commands.add_parser("repro", help="reproduce a reported crash from a log, traceback or failure record")
    again.add_argument("file", help="a pasted log or traceback, or a line of a run's failures.jsonl")
    again.add_argument("--budget", type=float, default=300.0, help="seconds to search (default 300)")
    again.add_argument("--out", default="reports/repro", help="where the standalone script goes")
    again.set_defaults(handler=repro)
    options, extra = parser.parse_known_args(argv)
    return options.handler(options, extra)


if __name__ == "__main__":
    sys.exit(main())
