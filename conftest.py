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
                    help="measure which statements of SGLang's targeted code the run executed (not under xdist)")
    group.addoption("--replay-blob", default=None,
                    help="replay exactly one example: the b'...' text of a failure's @reproduce_failure")


def _seed(config) -> int:
    """Every run forces a seed, so every failure record can name it: gate 0 (the same examples on every run),
    nightly a fresh one (shared with xdist workers through the environment)."""
    seed = config.getoption("hypothesis_seed", None)
    if seed is None:
        fresh = random.SystemRandom().randrange(2**32) if config.getoption("--profile") == "nightly" else 0
        seed = int(os.environ.setdefault("HARNESS_SEED", str(fresh)))
        config.option.hypothesis_seed = seed
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
    from harness.versions import versions

    _pin_worker_to_its_device(config.getoption("--device"))
    prepare_torchvision()  # before anything imports SGLang (transformers imports torchvision)
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
               "personality": config.getoption("--personality"), "profile": profile, "seed": seed, **found}
    record.configure(report_dir, context)
    config._harness = {"report_dir": report_dir, "context": context, "started": time.time(), "coverage": None}
    if config.getoption("--sglang-coverage") and not _under_xdist(config):
        from harness.sglang_coverage import SGLangCoverage

        config._harness["coverage"] = SGLangCoverage(found["sglang_path"])
    if not getattr(config.option, "xmlpath", None) and not os.environ.get("PYTEST_XDIST_WORKER"):
        config.option.xmlpath = str(report_dir / "junit.xml")


def _under_xdist(config) -> bool:
    return bool(os.environ.get("PYTEST_XDIST_WORKER") or getattr(config.option, "numprocesses", None))


def pytest_sessionfinish(session):
    harness = getattr(session.config, "_harness", None)
    if not harness or harness["coverage"] is None:
        return
    harness["coverage"].stop()
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
    item.user_properties += [("oracle", failure["oracle"]), ("drawn", json.dumps(failure["drawn"])),
                             ("replay", failure["replay"]), ("seed", str(failure["seed"])),
                             ("sglang", failure["sglang"]), ("torch", failure["torch"])]
    report.sections.append(("harness: replay this failure", failure["replay"]))
    with open(config._harness["report_dir"] / "failures.jsonl", "a", encoding="utf-8") as stream:
        stream.write(json.dumps(failure, default=repr) + "\n")


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
