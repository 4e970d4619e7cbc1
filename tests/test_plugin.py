"""The plugin and the command line: bad input gets a clear message, records survive a killed run, and a
failure's replay command really replays it."""
from __future__ import annotations

import importlib.util
import json
import shlex

import pytest

from harness import __main__ as cli
from harness.errors import HarnessError
from harness.mutants import run_pytest
from harness.versions import require_sglang
from reports.summary import load
from tests.mutant_runs import failure_records, run_suite_on_mutant
from tests.test_compile_kwargs_mutants import MUTANTS, SUITE


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


def test_the_replay_command_of_a_failure_replays_it(tmp_path):
    edits, oracle, diagnosis = MUTANTS["oot_hooks_ignored"]
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


def test_a_failure_found_on_one_machine_replays_on_another_through_redis(redis_url, tmp_path):
    """Two runs with separate report directories share only the Redis database: the second, in the repro
    profile (stored failures only), fails the same way."""
    edits, oracle, _ = MUTANTS["oot_hooks_ignored"]
    found, _ = run_suite_on_mutant(SUITE, "oot_hooks_ignored", edits, tmp_path / "a",
                                   extra=("--example-db", redis_url))
    again, output = run_suite_on_mutant(SUITE, "oot_hooks_ignored", edits, tmp_path / "b",
                                        extra=("--example-db", redis_url, "--profile", "repro"))
    assert found == 1 and again == 1, output[-2000:]
    replayed = failure_records(tmp_path / "b")[0]
    assert replayed["oracle"] == oracle and replayed["profile"] == "repro"


def test_the_same_seed_and_profile_give_the_same_examples_and_verdicts(tmp_path):
    runs = []
    for name, extra in (("first", ()), ("again-under-xdist", ("-n", "1"))):
        code, output = run_pytest([SUITE, "--report-dir", str(tmp_path / name), *extra])
        assert code == 0, output[-2000:]
        rows = load(tmp_path / name, "examples")
        runs.append([(row["drawn"], row["verdict"]) for row in rows])
    assert len(runs[0]) >= 40 and runs[0] == runs[1]


def test_a_failure_under_xdist_is_reported_with_its_properties(tmp_path):
    """Under xdist the worker ships the failure (and its JUnit properties) to the controller: all plain text."""
    edits, oracle, _ = MUTANTS["oot_hooks_ignored"]
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
