"""Command line: `python -m harness campaign|gate|selftest|targets|repro|mutate|bisect [...]` (README has the details).

Anything after the known options goes to pytest unchanged (e.g. `-k decode`, `-n 2`, `--hypothesis-seed 7`).
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from harness.checkout import REPO_ROOT

# What runs the suites, the self-tests or mutant and bisect runs from the checkout (its pytest configuration,
# conftest.py, tests/, requirements/); the wheel (docs/ci.md) carries the plugin and `targets`, `oracles`.
NEEDS_CHECKOUT = ("campaign", "gate", "selftest", "repro", "mutate", "bisect")


def in_checkout() -> bool:
    """Whether this harness runs from its repository rather than from an installed wheel."""
    return (REPO_ROOT / "conftest.py").is_file() and (REPO_ROOT / "requirements" / "harness.txt").is_file()


def _pytest(args: list[str]) -> int:
    import pytest

    os.chdir(REPO_ROOT)
    code = int(pytest.main(args))
    return 0 if code == 5 and "--profile=repro" in args else code


def isolated(extra: list[str]) -> list[str]:
    """Run examples in an xdist worker (one, unless the caller chose -n): a target that segfaults, aborts or hangs
    takes down only its worker, which xdist replaces; the plugin records the example it was running."""
    if _chose_workers(extra):
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


def gate(options, extra: list[str]) -> int:
    """Pre-merge gate (harness/gate): the gate profile against a source tree, imported ahead of the installed SGLang
    (its pure-Python changes need no install); JUnit XML for the CI system; non-zero on any failure."""
    from harness.errors import HarnessError
    from harness.gate import Request, run_gate

    if options.no_behaviour_change and not options.base:
        print("error: --no-behaviour-change compares with a base: give --base TREE", file=sys.stderr)
        return 2
    report_dir = Path(options.report_dir or f"reports/gate-{time.strftime('%Y%m%d-%H%M%S')}")
    try:
        return run_gate(Request(options.tree, options.device, report_dir, options.base, options.no_behaviour_change,
                                Path(options.select) if options.select else None, options.rtol, options.suites,
                                (f"--device={options.device}", *isolated(extra))))
    except HarnessError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2


SELFTEST_WORKERS = 4  # each worker, and the mutant runs it starts, holds torch and SGLang (about 2 GiB)


def _chose_workers(extra: list[str]) -> bool:
    return any(a == "-n" or a.startswith(("-n", "--numprocesses")) for a in extra)


def selftest(options, extra: list[str]) -> int:
    """The harness's own tests, spread over the cores (at most SELFTEST_WORKERS): most of them are mutant runs,
    each a pytest of its own; worksteal evens out their minute-long tails. `-n 0` runs them in one process."""
    spread = [] if _chose_workers(extra) else ["-n", str(min(os.cpu_count() or 1, SELFTEST_WORKERS)),
                                              "--dist", "worksteal"]
    # the extended tier (the same oracle on the same path again) only when asked, or when -m chooses itself
    tier = [] if options.extended or "-m" in extra else ["-m", "not extended"]
    # the slowest 40 in the log: where CI's minutes go, for whoever trims it next
    return _pytest(["tests", "-q", "-rfEs", "--durations=40", *tier, *spread] + extra)


def oracles(options, extra: list[str]) -> int:
    """The oracle registry as docs/oracles.md's table (`--write-docs`: written there)."""
    from harness.oracles import registry

    if options.write_docs:
        registry.write_docs()
        print(f"wrote the table of {len(registry.ORACLES)} oracles into {registry.DOCS}")
    else:
        print(registry.markdown_table())
    return 0


def axes(options, extra: list[str]) -> int:
    """The settings and batch fields the targeted files read, and whether the harness draws, fixes or leaves each."""
    from harness.axes import axes as read_axes, table
    from harness.errors import HarnessError
    from harness.mutants import require_sglang

    try:
        rows = read_axes(Path(require_sglang()))
    except HarnessError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    text = table(rows)
    if options.write:
        Path(options.write).write_text("# Configuration axes (`python -m harness axes`)\n\n" + text)
        print(f"wrote {len(rows)} axes to {options.write}")
    else:
        print(text)
    return 0


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
        return run_repro(options.file, options.budget, Path(options.out), Path(options.pin_dir))
    except HarnessError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2


def _seed(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"the seed must be a whole number (e.g. --seed 0), not {text!r}") from None


def mutate(options, extra: list[str]) -> int:
    """Mutants of the targeted functions, judged by the suites that drive them; the report and the HTML page."""
    from harness.errors import HarnessError
    from harness.mutate import Request, mutate as run_mutate
    from harness.mutate.targets import narrow, targeted_functions
    from harness.source_tree import source_root
    from harness.versions import require_sglang

    try:
        root = source_root(options.tree) if options.tree else None
        sglang_dir = root / "sglang" if root else Path(require_sglang())
        if options.list:
            for target in narrow(targeted_functions(sglang_dir), options.functions):
                print(f"{target.file}::{target.function}")
            return 0
        report_dir = Path(options.report_dir)
        if options.edits and options.functions:
            raise HarnessError("--edits judges the given edits; --functions draws mutants: give one of them")
        rows = run_mutate(Request(sglang_dir, root, report_dir, options.count, options.seed, options.functions,
                                  options.workers, options.budget, options.timeout, options.thorough,
                                  Path(options.edits) if options.edits else None, not options.cold))
    except HarnessError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    from reports.html import render
    from reports.summary import load

    campaign = load(report_dir, "examples")
    page = render(report_dir, campaign[0]["run_id"]) if campaign else None
    print(f"[harness] mutate: {len(rows)} judged; records {report_dir / 'mutants.jsonl'}, report "
          f"{report_dir / 'mutate.md'}" + (f", HTML {page}" if page else ""))
    return 0


def bisect(options, extra: list[str]) -> int:
    """The first commit of a git checkout where a test (or a repro script) fails; the checkout is only read."""
    from harness.bisect import Request, bisect as run_bisect
    from harness.errors import HarnessError
    from harness.releases import release_python

    python = options.python or sys.executable
    if python[:1].isdigit():  # a release: its environment (e.g. 0.5.14, which pins torch 2.11 as main did)
        python = str(release_python(python))
    started = time.monotonic()
    try:
        if not Path(python).exists():
            raise HarnessError(f"--python {options.python}: no interpreter at {python}")
        if options.repro and not Path(options.repro).is_file():
            raise HarnessError(f"--repro {options.repro}: no such file (give the script `python -m harness repro` "
                               "wrote)")
        candidates, steps = run_bisect(Request(options.tree, options.good, options.bad, options.test,
                                               options.repro and str(Path(options.repro).resolve()), python,
                                               Path(options.report_dir), options.timeout, tuple(extra)))
    except HarnessError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    wall = time.monotonic() - started
    print(f"\n[harness] bisect: {len(steps)} steps, {wall:.0f} s in all "
          f"({sum(s.seconds for s in steps) / max(1, len(steps)):.0f} s a step)")
    for done in steps:
        print(f"  {done.line()}")
    if len(candidates) == 1:
        print(f"first bad commit: {candidates[0]}")
        return 0
    print("skipped commits leave the first bad commit among:\n" + "\n".join(f"  {c}" for c in candidates))
    return 3


def main(argv: list[str] | None = None, prog: str = "python -m harness") -> int:
    from harness.profiles import PROFILES
    from harness.devices import DEVICES

    parser = argparse.ArgumentParser(prog=prog, description=__doc__)
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
    pre_merge.add_argument("--suites", nargs="+", default=["suites"], metavar="PATH",
                           help="suite files, folders or test ids to run (default: all of suites/)")
    pre_merge.add_argument("--base", default=None, metavar="TREE",
                           help="the pull request's base checkout: run the same examples there and report every "
                                "behaviour that differs (outputs, graphs, capture sizes, compiles, padded rows)")
    pre_merge.add_argument("--no-behaviour-change", action="store_true",
                           help="with --base: fail on any behaviour difference (for refactors)")
    pre_merge.add_argument("--rtol", type=float, default=1e-4,
                           help="relative tolerance of an output's difference under --base (default 1e-4)")
    pre_merge.add_argument("--select", default=None, metavar="DIR",
                           help="run only the tests whose recorded coverage executes a changed line: DIR holds the "
                                "base's campaign line map (built there when missing); changed lines against --base, "
                                "or against the installed SGLang")
    pre_merge.set_defaults(handler=gate)
    own = commands.add_parser("selftest", help="the harness's own tests")
    own.add_argument("--extended", action="store_true",
                     help="also the extended tier: every row of the mutant tables, every release tree (nightly)")
    own.set_defaults(handler=selftest)
    commands.add_parser("targets", help="which targeted SGLang paths the installed release has").set_defaults(
        handler=targets)
    space = commands.add_parser("axes", help="the settings and batch fields the targeted files read, and what the "
                                             "harness does with each")
    space.add_argument("--write", default=None, metavar="FILE", help="write the tables to FILE (e.g. docs/axes.md)")
    space.set_defaults(handler=axes)
    table = commands.add_parser("oracles", help="the oracle registry, as docs/oracles.md's table")
    table.add_argument("--write-docs", action="store_true", help="write it into docs/oracles.md")
    table.set_defaults(handler=oracles)
    again = commands.add_parser("repro", help="reproduce a reported crash from a log, traceback or failure record")
    again.add_argument("file", help="a pasted log or traceback, or a line of a run's failures.jsonl")
    again.add_argument("--budget", type=float, default=300.0, help="seconds to search (default 300)")
    again.add_argument("--out", default="reports/repro", help="where the standalone script goes")
    again.add_argument("--pin-dir", default="suites/regressions",
                       help="where the regression test goes (default suites/regressions, run by later repros first)")
    again.set_defaults(handler=repro)
    change = commands.add_parser("mutate", help="mutants of SGLang's targeted functions: which does no check kill?")
    change.add_argument("--count", type=int, default=None, help="mutants to draw (default: all)")
    change.add_argument("--seed", type=_seed, default=0, help="which mutants are drawn (default 0)")
    change.add_argument("--functions", nargs="+", default=(), metavar="NAME",
                        help="only these targeted functions (`function`, `Class.method` or `Class`)")
    change.add_argument("-n", dest="workers", type=int, default=1, help="mutants judged at a time (default 1)")
    change.add_argument("--budget", type=float, default=None, help="seconds after which no new mutant starts")
    change.add_argument("--timeout", type=float, default=600.0,
                        help="seconds one mutant's suite may run before it is judged timed out (default 600)")
    change.add_argument("--tree", default=None, help="an SGLang checkout to mutate (default: the installed one)")
    change.add_argument("--report-dir", default="reports/mutate",
                        help="the gate campaign (coverage), mutants.jsonl, mutate.md, report.html")
    change.add_argument("--list", action="store_true", help="list the targeted functions and stop")
    change.add_argument("--thorough", action="store_true",
                        help="judge each mutant by every suite that drives its file (default: only the test items "
                             "the campaign's line map says execute its line, fastest first)")
    change.add_argument("--edits", default=None, metavar="FILE",
                        help='judge these text edits instead of drawn mutants: a JSON list of {"file", "old", "new"} '
                             "(file inside the sglang package), e.g. the reverse of a fix about to be merged")
    change.add_argument("--cold", action="store_true",
                        help="start a fresh interpreter for each mutant run (default: fork it from a warm parent per "
                             "worker that imported torch, Hypothesis, pytest and SGLang's third-party imports, never "
                             "SGLang)")
    change.set_defaults(handler=mutate)
    search = commands.add_parser("bisect", help="the first commit of an SGLang checkout where a test fails")
    search.add_argument("--tree", required=True, help="a git checkout of SGLang (only read: never checked out)")
    search.add_argument("--good", required=True, help="a revision where the test passes")
    search.add_argument("--bad", required=True, help="a later revision where it fails")
    which = search.add_mutually_exclusive_group(required=True)
    which.add_argument("--test", help="a pytest node id of the harness, e.g. suites/regressions/test_x.py")
    which.add_argument("--repro", help="a standalone script written by `python -m harness repro`")
    search.add_argument("--python", default=None,
                        help="the interpreter whose environment runs each step, or a release (e.g. 0.5.14) for its "
                             "environment under HARNESS_RELEASE_ENVS (default: this one)")
    search.add_argument("--timeout", type=float, default=1200.0, help="seconds one step may run (default 1200)")
    search.add_argument("--report-dir", default="reports/bisect", help="bisect.jsonl and each step's records")
    search.set_defaults(handler=bisect)
    options, extra = parser.parse_known_args(argv)
    if (options.command in NEEDS_CHECKOUT or getattr(options, "write_docs", False)) and not in_checkout():
        print(f"error: `{options.command}` runs from a checkout of the harness, and this one is installed at "
              f"{REPO_ROOT / 'harness'}: run `./harness.sh {options.command} ...` in a clone (docs/ci.md)",
              file=sys.stderr)
        return 2
    return options.handler(options, extra)


def script() -> int:
    """The wheel's console script (`sglang-harness`): `main` under that name in its usage and errors."""
    return main(prog="sglang-harness")


if __name__ == "__main__":
    sys.exit(main())
