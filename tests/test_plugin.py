"""The plugin and the command line: bad input gets a clear message, records survive a killed run, and a
failure's replay command really replays it."""
from __future__ import annotations

import importlib.util
import json
import os
import re
import shlex
import time
import types
from pathlib import Path

import pytest

from harness import __main__ as cli, pytest_plugin, record, registry
from harness.errors import HarnessError, PathMissing
from harness.mutants import run_pytest
from harness.versions import require_sglang
from reports.summary import load
from tests.mutant_runs import failure_records, run_suite_on_mutant
from tests.mutant_tables import KWARGS_MUTANTS as MUTANTS, KWARGS_SUITE as SUITE

DRAWN_SUITE = "suites/test_decode_capture.py::test_ragged_layouts_are_the_requests_arithmetic"


@pytest.mark.subprocess
@pytest.mark.parametrize("option, value, choices", [("--device", "tpu", "'cpu', 'cuda', 'npu'"),
                                                    ("--profile", "fast", "'gate', 'nightly', 'repro'"),
                                                    ("--personality", "tpu", "'cuda', 'npu'")])
def test_unknown_option_values_are_refused_with_the_choices(option, value, choices, tmp_path):
    code, output = run_pytest([SUITE, option, value, "--report-dir", str(tmp_path)])
    assert code == 4, output
    assert f"argument {option}: invalid choice: '{value}' (choose from {choices})" in output


def test_missing_sglang_says_how_to_install_it(monkeypatch, capsys):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "sglang" else real(name, *a))
    with pytest.raises(HarnessError, match="SGLang is not installed in .*pip install --no-deps"):
        require_sglang()
    from harness import versions
    versions.versions.cache_clear()
    try:
        assert cli.main(["targets"]) == 2
    finally:
        versions.versions.cache_clear()
    assert "SGLang is not installed" in capsys.readouterr().err


@pytest.mark.subprocess
def test_a_release_without_the_path_skips_with_the_reason(tmp_path):
    renamed = [("multimodal_gen/runtime/utils/torch_compile.py", "def build_torch_compile_kwargs(",
                "def _renamed_build_torch_compile_kwargs(")]
    code, output = run_suite_on_mutant(SUITE, "path_missing", renamed, tmp_path, extra=("-rs",))
    assert code == 0 and "1 skipped" in output, output[-2000:]
    assert "has no build_torch_compile_kwargs (added in 0.5.19)" in output


def test_records_of_a_killed_run_are_kept_up_to_the_torn_line(tmp_path):
    good = {"suite": "s", "verdict": "pass", "run_id": "r"}
    (tmp_path / "examples.jsonl").write_text(json.dumps(good) + "\n" + '{"suite": "s", "verd')
    assert load(tmp_path, "examples", "r") == [good]


@pytest.mark.subprocess
def test_the_replay_command_of_a_failure_replays_it(tmp_path):
    mutant = MUTANTS["oot_hooks_ignored"]
    edits, oracle, (diagnosis,) = mutant.edits, mutant.oracle, mutant.texts
    first, _ = run_suite_on_mutant(SUITE, "oot_hooks_ignored", edits, tmp_path / "first")
    failure = failure_records(tmp_path / "first")[0]
    assert first == 1 and {"seed", "sglang", "torch", "drawn", "replay"} <= failure.keys()
    words = shlex.split(failure["replay"])
    assert words[:3] == ["python", "-m", "pytest"]
    replay_dir = tmp_path / "replay"
    words[words.index("--report-dir") + 1] = str(replay_dir)
    again, output = run_suite_on_mutant(SUITE, "oot_hooks_ignored", edits, replay_dir, extra=tuple(words[4:]))
    replayed = failure_records(replay_dir)[0]
    assert again == 1 and replayed["oracle"] == oracle and diagnosis in replayed["diagnosis"], output[-2000:]


@pytest.mark.subprocess
def test_a_redis_database_that_does_not_answer_is_a_usage_error(tmp_path):
    code, output = run_pytest([SUITE, "--example-db", "redis://127.0.0.1:1/0", "--report-dir", str(tmp_path)])
    assert code == 4 and "does not answer" in output and "redis://127.0.0.1:1/0" in output, output[-2000:]


@pytest.fixture
def redis_url(tmp_path):
    import shutil
    import socket
    import subprocess
    import time

    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed (.ci/run installs it from Debian's packages)")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = subprocess.Popen(["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                               "--dir", str(tmp_path)], stdout=subprocess.DEVNULL)
    try:
        for _ in range(50):
            with socket.socket() as client:
                if client.connect_ex(("127.0.0.1", port)) == 0:
                    break
            time.sleep(0.1)
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        server.terminate()
        server.wait(timeout=10)


@pytest.mark.subprocess
def test_a_failure_found_on_one_machine_replays_on_another_through_redis(redis_url, tmp_path):
    """Two runs with separate report directories share only the Redis database: the second, in the repro
    profile (stored failures only), fails the same way."""
    edits, oracle = MUTANTS["oot_hooks_ignored"].edits, MUTANTS["oot_hooks_ignored"].oracle
    found, _ = run_suite_on_mutant(SUITE, "oot_hooks_ignored", edits, tmp_path / "a",
                                   extra=("--example-db", redis_url))
    again, output = run_suite_on_mutant(SUITE, "oot_hooks_ignored", edits, tmp_path / "b",
                                        extra=("--example-db", redis_url, "--profile", "repro"))
    assert found == 1 and again == 1, output[-2000:]
    replayed = failure_records(tmp_path / "b")[0]
    assert replayed["oracle"] == oracle and replayed["profile"] == "repro"


@pytest.mark.subprocess
def test_the_same_seed_and_profile_give_the_same_examples_and_verdicts(tmp_path, monkeypatch):
    """Also under a CI variable, where Hypothesis would otherwise switch to its derandomised "ci" profile. The
    ragged layouts' test: five strategies drawn per example, milliseconds to judge each (no compile, no capture)."""
    monkeypatch.delenv("CI", raising=False)
    runs = []
    for name, extra, env in (("first", (), {}), ("again-under-xdist", ("-n", "1"), {}),
                             ("again-under-ci", (), {"CI": "true"})):
        code, output = run_pytest([DRAWN_SUITE, "--report-dir", str(tmp_path / name), *extra], env=env)
        assert code == 0, output[-2000:]
        rows = load(tmp_path / name, "examples")
        runs.append([(row["drawn"], row["verdict"]) for row in rows])
    assert len(runs[0]) >= 30 and runs[0] == runs[1] == runs[2]


@pytest.mark.subprocess
def test_a_failure_under_xdist_is_reported_with_its_properties(tmp_path):
    """Under xdist the worker ships the failure (and its JUnit properties) to the controller: all plain text."""
    edits, oracle = MUTANTS["oot_hooks_ignored"].edits, MUTANTS["oot_hooks_ignored"].oracle
    code, output = run_suite_on_mutant(SUITE, "oot_hooks_ignored", edits, tmp_path, extra=("-n", "1"))
    assert code in (1, 2) and "INTERNALERROR" not in output, output[-3000:]  # 2: xdist stopped on -x
    failure = failure_records(tmp_path)[0]
    assert failure["oracle"] == oracle
    junit = (tmp_path / "junit.xml").read_text()
    assert 'name="oracle" value="hook-contract"' in junit and 'name="replay"' in junit, junit[-2000:]


@pytest.mark.parametrize("shape", ["missing", "empty folder", "a file", "python/ without sglang"])
def test_gate_refuses_a_path_that_is_not_a_source_tree(shape, tmp_path, capsys):
    tree = tmp_path / "checkout"
    if shape == "empty folder":
        tree.mkdir()
    elif shape == "a file":
        tree.write_text("not a tree")
    elif shape == "python/ without sglang":
        (tree / "python").mkdir(parents=True)
        (tree / "python" / "pyproject.toml").write_text("[project]\nname = 'sglang'\n")
    assert cli.main(["gate", str(tree), "--report-dir", str(tmp_path / "report")]) == 2
    error = capsys.readouterr().err
    assert f"{tree} is not an SGLang source tree" in error and "Traceback" not in error, error
    assert not (tmp_path / "report").exists()


FAILING = "tests/targets_that_fail.py"


@pytest.mark.subprocess
def test_a_replay_blob_replays_exactly_that_example_through_reproduce_failure(tmp_path):
    """The blob comes from Hypothesis's observability callbacks (the minimal failing example's decorator); the
    replay applies `@reproduce_failure` with it, so exactly that one example runs, and fails the same way."""
    code, output = run_pytest([FAILING, "--report-dir", str(tmp_path / "found")])
    failure = failure_records(tmp_path / "found")[0]
    assert code == 1 and failure["drawn"] == {"n": 10}, output[-2000:]
    assert re.fullmatch(r"@reproduce_failure\('[\d.]+', b'[\w+/=]+'\)", failure["reproduce_failure"])
    words = shlex.split(failure["replay"])
    blob = words[words.index("--replay-blob") + 1]
    assert f"b'{blob}'" in failure["reproduce_failure"]
    words[words.index("--report-dir") + 1] = str(tmp_path / "replay")
    again, output = run_pytest(words[3:])
    replayed = load(tmp_path / "replay", "examples")
    assert again == 1 and [(row["drawn"], row["verdict"]) for row in replayed] == [({"n": 10}, "fail")], output
    assert shlex.split(failure_records(tmp_path / "replay")[0]["replay"])[-2:] == ["--replay-blob", blob]


@pytest.mark.subprocess
def test_a_state_machines_replay_blob_replays_its_program(tmp_path):
    """A state machine's `runTest` is a bound method: the blob must reach its machine class, else the replay
    dies on an AttributeError (as the LoRA server machine's did) instead of playing the failing program."""
    code, output = run_pytest(["tests/machine_that_fails.py", "--report-dir", str(tmp_path / "found")])
    failure = failure_records(tmp_path / "found")[0]
    assert code == 1 and "--replay-blob" in failure["replay"], output[-2000:]
    words = shlex.split(failure["replay"])
    words[words.index("--report-dir") + 1] = str(tmp_path / "replay")
    again, output = run_pytest(words[3:])
    replayed = failure_records(tmp_path / "replay")
    assert again == 1 and "AttributeError" not in output and "DidNotReproduce" not in output, output[-3000:]
    assert replayed[0]["diagnosis"] == failure["diagnosis"], (replayed, failure)


@pytest.mark.subprocess
def test_xdist_workers_record_the_controllers_seed_and_run_id(tmp_path):
    """Nightly draws a fresh seed in the controller; its worker gets it and the run id through workerinput (no
    environment variable carries them), so the worker's records carry both and the summary finds them."""
    code, output = run_pytest([FAILING, "--profile", "nightly", "-n", "1",
                               "--report-dir", str(tmp_path)])
    seed = int(re.search(r"profile=nightly seed=(\d+)", output).group(1))
    failure = failure_records(tmp_path)[0]
    assert code == 1 and failure["seed"] == seed and failure["profile"] == "nightly", output[-2000:]
    assert {row["seed"] for row in load(tmp_path, "examples")} == {seed}
    assert "harness summary" in output and "1 failing test(s)" in output, output[-2000:]  # the controller's run id


def test_the_run_lives_in_the_config_stash(pytestconfig):
    run = pytestconfig.stash[pytest_plugin.RUN]
    assert run.report_dir == Path(pytestconfig.getoption("--report-dir")).resolve()
    assert run.context["seed"] == pytestconfig.getoption("hypothesis_seed")
    assert run.context["run_id"] and "HARNESS_RUN_ID" not in os.environ


def crashed_worker_report(tmp_path, worker: str, hang: str = "",
                          inflight: bool = True) -> tuple[pytest.TestReport, pytest_plugin.Run]:
    """What xdist's controller hands pytest_handlecrashitem when `worker` died, with the example it left in
    flight (and, for a hang, the watchdog's dump)."""
    run = pytest_plugin.Run(tmp_path, 5.0, context={"device": "cpu", "personality": "cuda", "profile": "gate",
                                                    "seed": 3, "run_id": "r"})
    if inflight:
        record.inflight_path(tmp_path, worker).write_text(json.dumps({"suite": "crashy", "drawn": {"n": 3},
                                                                      "started": time.time()}))
    if hang:
        record.hang_path(tmp_path, worker).write_text(hang)
    config = types.SimpleNamespace(stash=pytest.Stash())
    config.stash[pytest_plugin.RUN] = run
    report = pytest.TestReport("t.py::test_x", ("t.py", None, "t.py"), {}, "failed",
                               f"worker {worker!r} crashed while running 't.py::test_x'", "???")
    report.node = types.SimpleNamespace(config=config, workerinput={"workerid": worker})
    return report, run


@pytest.mark.parametrize("hang", ["", 'Thread 0x1 (most recent call first):\n  File "t.py", line 9 in test_x'])
def test_a_crashed_worker_is_recorded_through_pytest_handlecrashitem(hang, tmp_path):
    report, run = crashed_worker_report(tmp_path, "gw3", hang)
    pytest_plugin.pytest_handlecrashitem(crashitem="t.py::test_x", report=report, sched=None)
    failure, = failure_records(tmp_path)
    assert failure["oracle"] == ("hang" if hang else "crash") and failure["drawn"] == {"n": 3}
    assert failure["seed"] == 3 and failure["details"] == {"stacks": hang}
    assert ("--example-timeout=5 s" if hang else "crashed while running 't.py::test_x'") in failure["diagnosis"]
    example, = load(tmp_path, "examples")
    assert example["verdict"] == "error" and example["suite"] == "crashy" and "started" not in example
    assert ("harness: the example in flight", '{"n": 3}') in report.sections
    assert not record.inflight_path(tmp_path, "gw3").exists() and not record.hang_path(tmp_path, "gw3").exists()


def test_a_worker_dying_outside_an_example_is_a_failure_and_the_summary_still_renders(tmp_path):
    """A self-test (no drawn example in flight) whose worker segfaults: its failure is recorded, no example row
    without a suite is written, and the run's summary renders (it once raised KeyError: 'suite')."""
    from reports.summary import summarise

    report, run = crashed_worker_report(tmp_path, "gw0", inflight=False)
    pytest_plugin.pytest_handlecrashitem(crashitem="t.py::test_x", report=report, sched=None)
    failure, = failure_records(tmp_path)
    assert failure["oracle"] == "crash" and failure["drawn"] is None and not load(tmp_path, "examples")
    assert "t.py::test_x" in summarise(tmp_path, "r")


def test_the_targets_command_says_which_paths_the_release_has(monkeypatch, capsys):
    """Checked on compile_kwargs only, whose adapter has `load()` in this tree (decode and prefill go through
    the registry's shim until harness/targets/ is restructured)."""
    compile_kwargs = registry.get("compile_kwargs")
    monkeypatch.setattr(registry, "SUITES", (compile_kwargs,))
    assert cli.main(["targets"]) == 0
    assert re.search(r"^  compile_kwargs +available$", capsys.readouterr().out, re.M)

    def missing():
        raise PathMissing("has no build_torch_compile_kwargs (added in 0.5.19)")
    monkeypatch.setattr(registry, "SUITES", (types.SimpleNamespace(name="compile_kwargs", load=missing),))
    assert cli.main(["targets"]) == 0
    assert "compile_kwargs   missing: has no build_torch_compile_kwargs (added in 0.5.19)" in capsys.readouterr().out
