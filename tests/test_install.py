"""The harness as a wheel inside another project's pytest run (SGLang's test tree, docs/ci.md): the wheel builds
offline; in a fresh virtualenv, outside this checkout, its entry point leaves pytest as it is until asked
(`--sglang-harness`), the plugin loads through the entry point, `-p` and a conftest's `pytest_plugins` at once
without being registered twice, and a trivial test writes the harness's reports; the console script runs
`targets`, and says in one line that the gate needs a checkout.

The virtualenv has no pip and downloads nothing: a .pth file puts this environment's site-packages (torch, SGLang,
pytest, pip) after its own, where the wheel goes."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from harness import __main__ as cli

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("harness", "strategies", "suites")  # reports/ also holds runs' output: its modules alone are copied
TINY_TEST = '''import harness
from harness import record


def test_tiny():
    assert harness.__file__.startswith({venv!r}), harness.__file__  # the wheel's harness, not the checkout's
    with record.example("installed", n=1):
        assert 1 + 1 == 2
'''


def _run(command: list, cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # nothing may reach the checkout
    return subprocess.run([str(c) for c in command], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout)


def _wheel(tmp: Path) -> Path:
    """Built from a copy of the sources, so setuptools' build/ and egg-info never land in the checkout; with this
    environment's setuptools (torch depends on it; no build isolation), so nothing is downloaded."""
    source = tmp / "source"
    for name in PACKAGES:
        shutil.copytree(ROOT / name, source / name, ignore=shutil.ignore_patterns("__pycache__", ".hypothesis"))
    (source / "reports").mkdir()
    for module in (ROOT / "reports").glob("*.py"):
        shutil.copy(module, source / "reports")
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source)
    done = _run([sys.executable, "-m", "pip", "wheel", source, "--no-deps", "--no-build-isolation", "--no-index",
                 "-q", "-w", tmp / "dist"], tmp)
    assert done.returncode == 0, done.stdout + done.stderr
    (wheel,) = (tmp / "dist").glob("sglang_capture_harness-*.whl")
    return wheel


@pytest.fixture(scope="module")
def venv(tmp_path_factory) -> Path:
    """A fresh virtualenv with the wheel installed (its own site-packages first, then this environment's)."""
    tmp = tmp_path_factory.mktemp("install")
    wheel = _wheel(tmp)
    venv = tmp / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", venv], check=True, timeout=120)
    own = Path(_run([venv / "bin" / "python", "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                    tmp).stdout.strip())
    ours = dict.fromkeys([sysconfig.get_path("purelib"), sysconfig.get_path("platlib")])
    # addsitedir, not a bare path: this environment's own .pth files (e.g. an editable SGLang) apply too
    (own / "harness-env.pth").write_text("".join(f"import site; site.addsitedir({p!r})\n" for p in ours))
    done = _run([venv / "bin" / "python", "-m", "pip", "install", "--no-deps", "--no-index", "-q", wheel], tmp)
    assert done.returncode == 0, done.stdout + done.stderr
    return venv


@pytest.mark.slow
@pytest.mark.subprocess
def test_the_wheels_plugin_loads_in_a_bare_pytest_run(venv, tmp_path):
    python = venv / "bin" / "python"
    (tmp_path / "pytest.ini").write_text("[pytest]\n")  # the rootdir: no ini or conftest above is read
    inert = _run([python, "-m", "pytest", "--help"], tmp_path)  # installed, not asked: nothing of the harness
    assert inert.returncode == 0 and "--sglang-harness" in inert.stdout, inert.stdout + inert.stderr
    assert "--device" not in inert.stdout and "--profile" not in inert.stdout, inert.stdout
    shown = _run([python, "-m", "pytest", "--sglang-harness", "--help"], tmp_path)  # the entry point, asked
    assert shown.returncode == 0, shown.stdout + shown.stderr
    assert "--device={cpu,cuda,npu}" in shown.stdout and "--profile={gate,nightly,repro}" in shown.stdout

    (tmp_path / "conftest.py").write_text('pytest_plugins = ["harness.pytest_plugin"]\n')
    (tmp_path / "test_tiny.py").write_text(TINY_TEST.format(venv=str(venv)))
    reports = tmp_path / "reports"
    done = _run([python, "-m", "pytest", "--sglang-harness", "-p", "harness.pytest_plugin", "--device", "cpu",
                 "--report-dir", reports, "-q", "test_tiny.py"], tmp_path)
    assert done.returncode == 0 and "1 passed" in done.stdout, done.stdout[-3000:] + done.stderr[-3000:]
    assert "harness summary" in done.stdout
    (example,) = [json.loads(line) for line in (reports / "examples.jsonl").read_text().splitlines()]
    assert example["suite"] == "installed" and example["verdict"] == "pass", example
    assert 'name="test_tiny"' in (reports / "junit.xml").read_text()
    assert "installed" in (reports / "summary.md").read_text() and (reports / "report.html").stat().st_size


@pytest.mark.slow
@pytest.mark.subprocess
def test_the_console_script_runs_and_sends_checkout_commands_to_a_checkout(venv, tmp_path):
    script = venv / "bin" / "sglang-harness"
    shown = _run([script, "targets"], tmp_path)
    assert shown.returncode == 0, shown.stdout + shown.stderr
    assert "decode_capture" in shown.stdout and "SGLang " in shown.stdout, shown.stdout

    refused = _run([script, "gate", tmp_path / "not-a-checkout"], tmp_path)
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert refused.stderr.startswith("error: `gate` runs from a checkout of the harness")
    assert len(refused.stderr.strip().splitlines()) == 1 and not refused.stdout, refused.stderr


def test_the_workflow_in_docs_ci_md_is_the_workflow_file():
    """SGLang's maintainers copy one or the other: they must not drift apart."""
    page = (ROOT / "docs" / "ci.md").read_text()
    shown = page.split("```yaml\n", 1)[1].split("```", 1)[0]
    workflow = (ROOT / "docs" / "sglang-gate-workflow.yml").read_text()
    assert shown == "".join(line for line in workflow.splitlines(keepends=True) if not line.startswith("#"))


@pytest.mark.parametrize("argv", [["campaign"], ["selftest"], ["repro", "log.txt"], ["oracles", "--write-docs"]])
def test_commands_that_need_the_checkout_say_so_when_installed(argv, monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(cli, "REPO_ROOT", tmp_path)  # where an installed harness finds no checkout
    assert cli.main(argv) == 2
    error = capsys.readouterr().err
    assert error.startswith(f"error: `{argv[0]}` runs from a checkout of the harness") and error.count("\n") == 1
