"""The harness's pytest plugin, loaded by the root conftest.py: device, personality and profile options,
Hypothesis profiles and example database, per-example JSONL records, failure records with a replay command,
JUnit XML properties, a summary and an HTML page per run; under xdist, the example a dead worker was running.

Each process keeps its view of the run in `config.stash[RUN]`; the controller hands the run's seed and id to
its xdist workers through `workerinput`. Imports are done in the hooks that need them, so collection pays only
for what it uses. The HARNESS_* environment variables are listed in the README ("Options").
"""
from __future__ import annotations

import dataclasses
import json
import shlex
import time
from pathlib import Path
from typing import Any

import pytest

from harness.devices import DEVICES, PERSONALITIES  # the device layer's names (its import is light)

DEVICE = "--device"
PERSONALITY = "--personality"
PROFILE = "--profile"
REPORT_DIR = "--report-dir"
EXAMPLE_DB = "--example-db"
SGLANG_COVERAGE = "--sglang-coverage"
EXAMPLE_TIMEOUT = "--example-timeout"
REPLAY_BLOB = "--replay-blob"
TORCH_TRACE = "--torch-trace"
ABLATE = "--ablate"
EVIDENCE_LIMIT = "--evidence-limit"
SEED_VARIABLE = "HARNESS_SEED"  # the run's seed when --hypothesis-seed is not given
WORKER_INPUT = "harness"  # the key of the run-wide values in xdist's workerinput


@dataclasses.dataclass
class Run:
    """One process's view of the run."""
    report_dir: Path
    example_timeout: float
    context: dict = dataclasses.field(default_factory=dict)  # what every record carries: versions, seed, run id
    worker: str | None = None  # this xdist worker's id; None in the controller and without xdist
    controller: bool = False  # the xdist controller, whose workers drive SGLang
    coverage: Any = None  # an SGLangCoverage with --sglang-coverage
    reproductions: dict[str, str] = dataclasses.field(default_factory=dict)  # nodeid -> its @reproduce_failure
    settings: Any = None  # the MonkeyPatch holding an ablation's settings (harness.evidence.settings)


RUN = pytest.StashKey[Run]()


def pytest_addoption(parser):
    from harness.profiles import PROFILES

    group = parser.getgroup("harness", "SGLang graph-capture / torch.compile harness")
    group.addoption(DEVICE, choices=DEVICES, default="cpu",
                    help="where capture runs: cpu (virtual device, default), cuda, npu")
    group.addoption(PERSONALITY, choices=PERSONALITIES, default="cuda",
                    help="which platform SGLang believes it runs on (virtual device): cuda (default) or npu")
    group.addoption(PROFILE, choices=PROFILES, default="gate",
                    help="gate: derandomised, small (pre-merge); nightly: random, 10x examples; "
                         "repro: replay stored failures only")
    group.addoption(REPORT_DIR, default="reports/out",
                    help="where examples.jsonl, failures.jsonl, junit.xml and summary.md go (default reports/out)")
    group.addoption(EXAMPLE_DB, default=None,
                    help="Hypothesis example database: a directory shareable between CI workers, or "
                         "redis://HOST:PORT/DB shared between machines (default REPORT_DIR/hypothesis-db)")
    group.addoption(SGLANG_COVERAGE, action="store_true",
                    help="measure which statements of SGLang's targeted code the run executed (xdist workers too)")
    group.addoption(EXAMPLE_TIMEOUT, type=float, default=600.0,
                    help="seconds one example may run before it is recorded as a hang and its process ended "
                         "(under -n, xdist replaces the worker and the run goes on; 0: no limit; default 600)")
    group.addoption(REPLAY_BLOB, default=None,
                    help="replay exactly one example: the b'...' text of a failure's @reproduce_failure")
    group.addoption(TORCH_TRACE, default=None, metavar="DIR",
                    help="after the run, re-run each failing example under TORCH_TRACE into DIR and render it with "
                         "tlparse (the failure's evidence links the trace and its index.html)")
    group.addoption(ABLATE, action="store_true",
                    help="after the run, re-run each failing example with compile off, the graphs re-run and each "
                         "compile backend, and name the smallest setting that still fails")
    group.addoption(EVIDENCE_LIMIT, type=int, default=3,
                    help="how many failing tests --torch-trace and --ablate gather evidence for (default 3)")


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config):
    """What the command line alone decides: the versions, the database and profile, the JUnit XML path (pytest
    writes it from the controller only)."""
    from harness import profiles
    from harness.database import open_database
    from harness.errors import HarnessError
    from harness.versions import versions

    report_dir = Path(config.getoption(REPORT_DIR)).resolve()
    try:
        versions()
        database = open_database(config.getoption(EXAMPLE_DB) or str(report_dir / "hypothesis-db"))
    except HarnessError as error:
        raise pytest.UsageError(str(error)) from None
    profiles.activate(config.getoption(PROFILE), database)
    if not getattr(config.option, "xmlpath", None):
        config.option.xmlpath = str(report_dir / "junit.xml")
    config.stash[RUN] = run = Run(report_dir, config.getoption(EXAMPLE_TIMEOUT))
    run.settings = _ablation_settings(config)


def _ablation_settings(config):
    """An ablation re-run's settings, from the environment (harness.evidence.settings); a --torch-trace folder that
    cannot be written refused before anything runs."""
    from harness.errors import HarnessError
    from harness.evidence import settings
    from harness.evidence.trace import writable

    patch = pytest.MonkeyPatch()
    try:
        if config.getoption(TORCH_TRACE):
            writable(Path(config.getoption(TORCH_TRACE)))
        applied = settings.apply(patch)
    except HarnessError as error:
        raise pytest.UsageError(str(error)) from None
    config.add_cleanup(patch.undo)
    return applied


@pytest.hookimpl(tryfirst=True)
def pytest_sessionstart(session):
    """Before collection imports SGLang (and before xdist starts workers): this process's role, its accelerator,
    the device layer's preparation, the seed and run id, the record sink and coverage."""
    from harness import record
    from harness.compat import prepare_torchvision
    from harness.devices import prepare as prepare_device
    from harness.devices.gc_policy import freeze_heap
    from harness.repro import RECORD_FORMAT
    from harness.versions import versions

    config = session.config
    run = config.stash[RUN]
    run.worker, run.controller = _xdist_role(session)
    device = config.getoption(DEVICE)
    _pin_worker_to_its_device(device, run.worker)
    prepare_torchvision()  # before anything imports SGLang (transformers imports torchvision)
    sgl_kernel = prepare_device(device)  # likewise
    collections = freeze_heap(device)  # SGLang's capture-time collections scan only what is made from here on
    inherited = config.workerinput.get(WORKER_INPUT, {}) if run.worker else {}
    run.context = {"record_format": RECORD_FORMAT, "run_id": inherited.get("run_id") or _fresh_run_id(),
                   "device": device, "personality": config.getoption(PERSONALITY),
                   "profile": config.getoption(PROFILE), "seed": _seed(config, inherited.get("seed")),
                   **versions(), "sgl_kernel": sgl_kernel, "stream_order": stream_order_state(device),
                   "gc": collections, **({"ablation": run.settings} if run.settings else {})}
    record.configure(run.report_dir, run.context, run.example_timeout, run.worker)
    if config.getoption(SGLANG_COVERAGE):
        from harness.sglang_coverage import SGLangCoverage

        run.coverage = SGLangCoverage(run.context["sglang_path"], run.report_dir)
        if not run.controller:  # the processes that drive SGLang measure it
            run.coverage.start()
        if not run.worker:
            config.pluginmanager.register(ItemDurations(run.coverage.durations), "harness-item-durations")


def stream_order_state(device: str) -> str:
    """Whether the virtual device's stream-order check runs, for every record and the summary."""
    from harness.devices import stream_order

    if device != "cpu":
        return "not run (real hardware)"
    return "on" if stream_order.enabled() else f"off ({stream_order.off_reason()})"


def _xdist_role(session) -> tuple[str | None, bool]:
    """(this worker's id or None, whether this is the controller), as pytest-xdist says; (None, False) without it."""
    if not session.config.pluginmanager.has_plugin("xdist"):
        return None, False
    import xdist

    worker = xdist.get_xdist_worker_id(session) if xdist.is_xdist_worker(session) else None
    return worker, xdist.is_xdist_controller(session)


def _fresh_run_id() -> str:
    import uuid

    return uuid.uuid4().hex[:12]


def _seed(config, inherited: int | None) -> int:
    """Every run forces a seed, so every failure record can name it: --hypothesis-seed, else (in a worker) the
    controller's, else HARNESS_SEED, else gate 0 (the same examples on every run) or nightly a fresh one."""
    import os
    import random

    from hypothesis import core

    seed = config.getoption("hypothesis_seed", None)
    if seed is None:
        seed = inherited if inherited is not None else os.environ.get(SEED_VARIABLE)
    if seed is None:
        seed = random.SystemRandom().randrange(2**32) if config.getoption(PROFILE) == "nightly" else 0
    config.option.hypothesis_seed = int(seed)
    # What Hypothesis's own plugin does with --hypothesis-seed, which it skips unless a Hypothesis option was
    # typed on the command line: without this, the gate's seed 0 would not be forced at all.
    core.global_force_seed = int(seed)
    return int(seed)


_VISIBLE = {"cuda": "CUDA_VISIBLE_DEVICES", "npu": "ASCEND_RT_VISIBLE_DEVICES"}


def _pin_worker_to_its_device(device: str, worker: str | None) -> None:
    """Under xdist on hardware, worker gwN uses accelerator N (modulo those visible), so one worker per GPU or
    NPU never shares one: by narrowing the visible list when one is set (before the runtime initialises),
    else by selecting the current device."""
    import os

    variable = _VISIBLE.get(device)
    if worker is None or not worker.startswith("gw") or variable is None:
        return
    index = int(worker[2:])
    if os.environ.get(variable):
        choices = os.environ[variable].split(",")
        os.environ[variable] = choices[index % len(choices)]
        return
    import torch

    module = getattr(torch, device, None)
    if module is not None and module.is_available() and module.device_count():
        module.set_device(index % module.device_count())


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node):
    """xdist controller, for each worker it starts: the run's seed and id, so every process records the same."""
    context = node.config.stash[RUN].context
    node.workerinput[WORKER_INPUT] = {"seed": context["seed"], "run_id": context["run_id"]}


def pytest_sessionfinish(session):
    """Every measuring process saves its coverage data; the controlling one (after its workers) combines it."""
    from harness import record

    run = session.config.stash.get(RUN, None)
    if run is None or run.coverage is None:
        return
    if not run.controller:
        run.coverage.stop()
    if run.worker:
        return
    for row in run.coverage.results():
        record.write_to(run.report_dir / "coverage.jsonl", {**row, "run_id": run.context["run_id"]})
    run.coverage.write_line_tests(run.context["run_id"])


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """--sglang-coverage, in a measuring process: what each test item (setup, call, teardown) executes of SGLang's
    targeted code is recorded under its node id (coverage.py's dynamic contexts), for `mutate`'s line map."""
    run = item.config.stash.get(RUN, None)
    measuring = run is not None and run.coverage is not None and not run.controller
    if measuring:
        run.coverage.switch(item.nodeid)
    try:
        return (yield)
    finally:
        if measuring:
            run.coverage.switch("")


class ItemDurations:
    """--sglang-coverage, in the process that writes the line map (the controller, or the only process): each
    item's seconds over its phases, so `mutate` runs the fastest item reaching a line first."""

    def __init__(self, durations: dict[str, float]):
        self.durations = durations

    def pytest_runtest_logreport(self, report) -> None:
        self.durations[report.nodeid] = self.durations.get(report.nodeid, 0.0) + report.duration


def pytest_report_header(config):
    ctx = config.stash[RUN].context
    return (f"harness: sglang {ctx['sglang']} ({ctx['sglang_path']}), torch {ctx['torch']}, "
            f"hypothesis {ctx['hypothesis']}; device={ctx['device']} personality={ctx['personality']} "
            f"profile={ctx['profile']} seed={ctx['seed']}; reports in {config.stash[RUN].report_dir}")


def pytest_collection_modifyitems(config, items):
    """--replay-blob: Hypothesis's `@reproduce_failure` on every Hypothesis test collected (one, by its node id);
    a state machine's `runTest` is a bound method, so the decorator goes on its machine class, where Hypothesis
    looks for it."""
    blob = config.getoption(REPLAY_BLOB)
    if not blob:
        return
    import hypothesis

    for item in items:
        function = getattr(item, "obj", None)
        if getattr(function, "is_hypothesis_test", False):
            target = getattr(function, "_hypothesis_state_machine_class", function)
            hypothesis.reproduce_failure(hypothesis.__version__, blob.encode())(target)


@pytest.fixture(scope="session")
def device_name(pytestconfig) -> str:
    return pytestconfig.getoption(DEVICE)


@pytest.fixture(scope="session")
def personality(pytestconfig) -> str:
    return pytestconfig.getoption(PERSONALITY)


def replay_command(run: Run, nodeid: str, blob: str | None, personality: str | None = None) -> str:
    """`personality`: the one the test ran under where its suite fixes it (default: the run's)."""
    ctx = run.context
    words = ["python", "-m", "pytest", nodeid, DEVICE, ctx["device"], PERSONALITY, personality or ctx["personality"],
             PROFILE, ctx["profile"], REPORT_DIR, str(run.report_dir), "--hypothesis-seed", str(ctx["seed"])]
    if blob:
        words += [REPLAY_BLOB, blob]
    return " ".join(shlex.quote(w) for w in words)


def _blob(decorator: str) -> str:
    """The b'...' text of `@reproduce_failure('VERSION', b'BLOB')`, as Hypothesis writes the decorator."""
    import ast

    call = ast.parse(decorator.removeprefix("@"), mode="eval").body
    return ast.literal_eval(call.args[1]).decode()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    """Watch the item's Hypothesis test cases through Hypothesis's observability callbacks: the first minimal
    failing example carries the `@reproduce_failure` decorator that replays it (the one Hypothesis prints)."""
    from hypothesis.internal import observability

    reproductions = item.config.stash[RUN].reproductions
    reproductions.pop(item.nodeid, None)

    def observe(observation) -> None:
        if observation.type == "test_case" and observation.status == "failed" \
                and observation.how_generated == "minimal failing example":
            reproductions.setdefault(item.nodeid, observation.metadata.reproduction_decorator)

    with pytest.MonkeyPatch.context() as patch:
        if not observability.observability_enabled():  # only this callback wants them: no line coverage
            patch.setattr(observability, "OBSERVABILITY_COLLECT_COVERAGE", False)
        with observability.with_observability_callback(observe):
            return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    if report.when == "call" and report.failed:
        _record_failure(item, call, report)
    return report


def _record_failure(item, call, report) -> None:
    """A failed test's record in failures.jsonl (its final example's oracle, diagnosis and drawn values, and the
    command that replays it), in its JUnit properties and in its report."""
    from harness import record

    run = item.config.stash[RUN]
    failed = record.record_of(call.excinfo.value) if call.excinfo else {}
    decorator = run.reproductions.pop(item.nodeid, None)
    blob = _blob(decorator) if decorator else item.config.getoption(REPLAY_BLOB)
    text = report.longreprtext
    personality = item.funcargs.get("personality", run.context["personality"])  # a suite may fix its own
    failure = {
        "test": item.nodeid, "replay": replay_command(run, item.nodeid, blob, personality),
        "reproduce_failure": decorator, "oracle": failed.get("oracle", "crash"),
        "diagnosis": failed.get("diagnosis", (text.strip().splitlines() or [""])[-1]),
        "drawn": failed.get("drawn"), "details": failed.get("details"), **run.context, "personality": personality,
    }
    properties = {"oracle": failure["oracle"], "drawn": json.dumps(failure["drawn"]), "replay": failure["replay"],
                  "seed": failure["seed"], "sglang": failure["sglang"], "torch": failure["torch"]}
    item.user_properties += [(key, str(value)) for key, value in properties.items()]  # xdist sends them as text
    report.sections.append(("harness: replay this failure", failure["replay"]))
    record.write_to(run.report_dir / "failures.jsonl", failure)


@pytest.hookimpl(optionalhook=True)
def pytest_handlecrashitem(crashitem, report, sched):
    """xdist controller: the worker running `crashitem` died (segfault, abort, the hang watchdog)."""
    node = report.node  # the worker, which xdist attaches to the report
    record_crash(node.config.stash[RUN], crashitem, node.workerinput["workerid"], report)


def record_crash(run: Run, nodeid: str, worker: str, report) -> None:
    """Record the example `worker` left in flight as a failure with its drawn values (for a hang, every
    thread's stack), in examples.jsonl, failures.jsonl and the test's report, so nothing is lost."""
    from harness import record

    inflight = record.inflight_path(run.report_dir, worker)
    example = json.loads(inflight.read_text()) if inflight.exists() else {}
    hang = record.hang_path(run.report_dir, worker)
    hung = hang.exists() and hang.stat().st_size > 0
    stacks = hang.read_text()[-6000:] if hung else ""
    oracle = "hang" if hung else "crash"
    diagnosis = (f"the example ran past {EXAMPLE_TIMEOUT}={run.example_timeout:g} s; every thread's stack is in "
                 "details" if hung else f"the worker process died while running this example ({report.longrepr})")
    drawn = example.get("drawn")
    if example:  # a test that died outside a drawn example (a self-test, a fixture) has a failure, no example
        row = {**example, "test": nodeid, "verdict": "error", "oracle": oracle, "diagnosis": diagnosis,
               "details": {"stacks": stacks}, "seconds": time.time() - example.get("started", time.time()),
               **run.context}
        row.pop("started", None)
        record.write_to(run.report_dir / "examples.jsonl", row)
    failure = {"test": nodeid, "replay": replay_command(run, nodeid, None, (drawn or {}).get("personality")),
               "oracle": oracle,
               "diagnosis": diagnosis, "drawn": drawn, "details": {"stacks": stacks}, **run.context}
    record.write_to(run.report_dir / "failures.jsonl", failure)
    report.sections.append(("harness: the example in flight", json.dumps(drawn)))
    inflight.unlink(missing_ok=True)
    hang.unlink(missing_ok=True)


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    run = config.stash.get(RUN, None)
    if run is None or run.worker or not run.context:
        return
    from reports.html import render
    from reports.summary import summarise

    _gather_evidence(terminalreporter, config, run)
    text = summarise(run.report_dir, run.context["run_id"])
    if text:
        terminalreporter.write_sep("=", "harness summary")
        terminalreporter.write_line(text)
        terminalreporter.write_line(f"report: {render(run.report_dir, run.context['run_id'])}")


def _gather_evidence(terminalreporter, config, run: Run) -> None:
    """--torch-trace / --ablate: evidence for the run's first failing tests, in evidence.jsonl and printed."""
    trace_dir, ablate, limit = config.getoption(TORCH_TRACE), config.getoption(ABLATE), config.getoption(EVIDENCE_LIMIT)
    if not (trace_dir or ablate):
        return
    from harness.evidence.gather import gather

    terminalreporter.write_sep("=", "harness evidence")
    for row in gather(run.report_dir, run.context["run_id"], Path(trace_dir) if trace_dir else None, ablate, limit):
        terminalreporter.write_line(f"{row['test']}:")
        for line in row["lines"]:
            terminalreporter.write_line(f"    {line}")
