"""The harness's pytest plugin: device, personality and profile options, Hypothesis profiles and example
database, per-example JSONL records, failure records with a replay command, JUnit XML, a summary per suite."""
from __future__ import annotations

import json
import os
import random
import re
import shlex
import time
import uuid
from pathlib import Path

import pytest

from harness import profiles, record
from harness.errors import HarnessError

DEVICES = ("cpu", "cuda", "npu")
PERSONALITIES = ("cuda", "npu")
BLOB = re.compile(r"@reproduce_failure\('([^']+)', b'([^']+)'\)")


def pytest_addoption(parser):
    group = parser.getgroup("harness", "SGLang graph-capture / torch.compile harness")
    group.addoption("--device", choices=DEVICES, default="cpu",
                    help="where capture runs: cpu (virtual device, default), cuda, npu")
    group.addoption("--personality", choices=PERSONALITIES, default="cuda",
                    help="which platform SGLang believes it runs on (virtual device): cuda (default) or npu")
    group.addoption("--profile", choices=profiles.PROFILES, default="gate",
                    help="gate: derandomised, small (pre-merge); nightly: random, 10x examples; "
                         "repro: replay stored failures only")
    group.addoption("--report-dir", default="reports/out",
                    help="where examples.jsonl, failures.jsonl, junit.xml and summary.md go (default reports/out)")
    group.addoption("--example-db", default=None,
                    help="Hypothesis example database: a directory shareable between CI workers, or "
                         "redis://HOST:PORT/DB shared between machines (default REPORT_DIR/hypothesis-db)")
    group.addoption("--sglang-coverage", action="store_true",
                    help="measure which statements of SGLang's targeted code the run executed (xdist workers too)")
    group.addoption("--example-timeout", type=float, default=600.0,
                    help="seconds one example may run before it is recorded as a hang and its process ended "
                         "(under -n, xdist replaces the worker and the run goes on; 0: no limit; default 600)")
    group.addoption("--replay-blob", default=None,
                    help="replay exactly one example: the b'...' text of a failure's @reproduce_failure")


def _seed(config) -> int:
    """Every run forces a seed, so every failure record can name it: gate 0 (the same examples on every run),
    nightly a fresh one (shared with xdist workers through the environment)."""
    from hypothesis import core

    seed = config.getoption("hypothesis_seed", None)
    if seed is None:
        fresh = random.SystemRandom().randrange(2**32) if config.getoption("--profile") == "nightly" else 0
        seed = int(os.environ.setdefault("HARNESS_SEED", str(fresh)))
        config.option.hypothesis_seed = seed
    # What Hypothesis's own plugin does with --hypothesis-seed, which it skips unless a Hypothesis option was
    # typed on the command line: without this, the gate's seed 0 would not be forced at all.
    core.global_force_seed = int(seed)
    return int(seed)


_VISIBLE = {"cuda": "CUDA_VISIBLE_DEVICES", "npu": "ASCEND_RT_VISIBLE_DEVICES"}


def _pin_worker_to_its_device(device: str) -> None:
    """Under xdist on hardware, worker gwN uses accelerator N (modulo those visible), so one worker per GPU or
    NPU never shares one: by narrowing the visible list when one is set (before the runtime initialises),
    else by selecting the current device."""
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    variable = _VISIBLE.get(device)
    if not worker.startswith("gw") or variable is None:
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


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config):
    from harness.compat import prepare_torchvision
    from harness.database import open_database
    from harness.devices import prepare as prepare_device
    from harness.versions import versions

    _pin_worker_to_its_device(config.getoption("--device"))
    prepare_torchvision()  # before anything imports SGLang (transformers imports torchvision)
    sgl_kernel = prepare_device(config.getoption("--device"))  # likewise
    try:
        found = versions()
    except HarnessError as error:
        raise pytest.UsageError(str(error)) from None
    report_dir = Path(config.getoption("--report-dir")).resolve()
    try:
        database = open_database(config.getoption("--example-db") or str(report_dir / "hypothesis-db"))
    except HarnessError as error:
        raise pytest.UsageError(str(error)) from None
    profile = config.getoption("--profile")
    profiles.activate(profile, database)
    seed = _seed(config)
    run_id = os.environ.setdefault("HARNESS_RUN_ID", uuid.uuid4().hex[:12])
    from harness.repro import RECORD_FORMAT

    context = {"record_format": RECORD_FORMAT, "run_id": run_id, "device": config.getoption("--device"),
               "personality": config.getoption("--personality"), "profile": profile, "seed": seed, **found,
               "sgl_kernel": sgl_kernel}
    record.configure(report_dir, context, config.getoption("--example-timeout"))
    config._harness = {"report_dir": report_dir, "context": context, "started": time.time(), "coverage": None}
    if config.getoption("--sglang-coverage"):
        from harness.sglang_coverage import SGLangCoverage

        config._harness["coverage"] = SGLangCoverage(found["sglang_path"], report_dir)
        if not _is_xdist_controller(config):  # the processes that drive SGLang measure it
            config._harness["coverage"].start()
    if not getattr(config.option, "xmlpath", None) and not os.environ.get("PYTEST_XDIST_WORKER"):
        config.option.xmlpath = str(report_dir / "junit.xml")


def _is_xdist_controller(config) -> bool:
    return bool(getattr(config.option, "numprocesses", None)) and not os.environ.get("PYTEST_XDIST_WORKER")


def pytest_sessionfinish(session):
    """Every measuring process saves its coverage data; the controlling one (after its workers) combines it."""
    harness = getattr(session.config, "_harness", None)
    if not harness or harness["coverage"] is None:
        return
    if not _is_xdist_controller(session.config):
        harness["coverage"].stop()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        return
    for row in harness["coverage"].results():
        record.write_to(harness["report_dir"] / "coverage.jsonl", {**row, "run_id": harness["context"]["run_id"]})


def pytest_report_header(config):
    ctx = config._harness["context"]
    return (f"harness: sglang {ctx['sglang']} ({ctx['sglang_path']}), torch {ctx['torch']}, "
            f"hypothesis {ctx['hypothesis']}; device={ctx['device']} personality={ctx['personality']} "
            f"profile={ctx['profile']} seed={ctx['seed']}; reports in {config._harness['report_dir']}")


def pytest_collection_modifyitems(config, items):
    blob = config.getoption("--replay-blob")
    if not blob:
        return
    import hypothesis

    for item in items:
        function = getattr(item, "obj", None)
        if getattr(function, "is_hypothesis_test", False):
            function._hypothesis_internal_use_reproduce_failure = (hypothesis.__version__, blob.encode())


@pytest.fixture(scope="session")
def device_name(pytestconfig) -> str:
    return pytestconfig.getoption("--device")


@pytest.fixture(scope="session")
def personality(pytestconfig) -> str:
    return pytestconfig.getoption("--personality")


@pytest.fixture(scope="session")
def harness_profile(pytestconfig) -> str:
    return pytestconfig.getoption("--profile")


def replay_command(config, nodeid: str, blob: str | None) -> str:
    ctx = config._harness["context"]
    words = ["python", "-m", "pytest", nodeid, "--device", ctx["device"], "--personality", ctx["personality"],
             "--profile", ctx["profile"], "--report-dir", str(config._harness["report_dir"])]
    words += ["--hypothesis-seed", str(ctx["seed"])]
    if blob:
        words += ["--replay-blob", blob]
    return " ".join(shlex.quote(w) for w in words)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.when != "call" or not report.failed:
        return
    config = item.config
    text = report.longreprtext
    found = BLOB.search(text)
    failed = record.last_failure(item.nodeid)
    failure = {
        "test": item.nodeid, "replay": replay_command(config, item.nodeid, found.group(2) if found else None),
        "reproduce_failure": found.group(0) if found else None,
        "oracle": failed.get("oracle", "crash"), "diagnosis": failed.get("diagnosis", (text.strip().splitlines() or [""])[-1]),
        "drawn": failed.get("drawn"), "details": failed.get("details"),
        **config._harness["context"],
    }
    properties = {"oracle": failure["oracle"], "drawn": json.dumps(failure["drawn"]), "replay": failure["replay"],
                  "seed": failure["seed"], "sglang": failure["sglang"], "torch": failure["torch"]}
    item.user_properties += [(key, str(value)) for key, value in properties.items()]  # xdist sends them as text
    report.sections.append(("harness: replay this failure", failure["replay"]))
    with open(config._harness["report_dir"] / "failures.jsonl", "a", encoding="utf-8") as stream:
        stream.write(json.dumps(failure, default=repr) + "\n")


def pytest_runtest_logreport(report):
    """On the xdist controller: a worker that died (segfault, abort, the hang watchdog) left its example in
    flight; record it as a failure with its drawn values, so nothing is lost, while xdist goes on."""
    worker = getattr(getattr(report, "node", None), "gateway", None)
    if worker is None or report.when != "???" or "crashed while running" not in str(report.longrepr):
        return
    config = report.node.config
    report_dir = config._harness["report_dir"]
    inflight = record.inflight_path(report_dir, worker.id)
    example = json.loads(inflight.read_text()) if inflight.exists() else {}
    hang = record.hang_path(report_dir, worker.id)
    hung = hang.exists() and hang.stat().st_size > 0
    stacks = hang.read_text()[-6000:] if hung else ""
    oracle = "hang" if hung else "crash"
    diagnosis = (f"the example ran past --example-timeout={config.getoption('--example-timeout'):g} s; every "
                 "thread's stack is in details" if hung else
                 f"the worker process died while running this example ({report.longrepr})")
    drawn = example.get("drawn")
    row = {**example, "test": report.nodeid, "verdict": "error", "oracle": oracle, "diagnosis": diagnosis,
           "details": {"stacks": stacks}, "seconds": time.time() - example.get("started", time.time()),
           **config._harness["context"]}
    row.pop("started", None)
    record.write_to(report_dir / "examples.jsonl", row)
    failure = {"test": report.nodeid, "replay": replay_command(config, report.nodeid, None), "oracle": oracle,
               "diagnosis": diagnosis, "drawn": drawn, "details": {"stacks": stacks}, **config._harness["context"]}
    record.write_to(report_dir / "failures.jsonl", failure)
    report.sections.append(("harness: the example in flight", json.dumps(drawn)))
    inflight.unlink(missing_ok=True)
    hang.unlink(missing_ok=True)


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    if os.environ.get("PYTEST_XDIST_WORKER") or not hasattr(config, "_harness"):
        return
    from reports.html import render
    from reports.summary import summarise

    report_dir, run_id = config._harness["report_dir"], config._harness["context"]["run_id"]
    text = summarise(report_dir, run_id)
    if text:
        terminalreporter.write_sep("=", "harness summary")
        terminalreporter.write_line(text)
        page = render(report_dir, run_id)
        terminalreporter.write_line(f"report: {page}")
