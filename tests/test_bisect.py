"""`python -m harness bisect` on a small synthetic git history, made here from a link copy of the installed SGLang
(the scratch copy `harness.mutants` makes): clean, an unrelated commit, a commit whose sglang does not import,
its fix, known bug 1's by-value import (the mutant the decode self-tests use), one more unrelated commit. The
static by-value-import check (seconds a run) must name the mutant's commit, skipping the unimportable one; bad
input gets a clear message and a non-zero exit; the checkout's status and branch are the same after every run."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from harness.mutants import REPO_ROOT, scratch_sglang
from tests.mutant_tables import BUG1, STATIC

pytestmark = pytest.mark.subprocess  # every test here runs a suite in another process


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], capture_output=True, text=True, check=True).stdout


def _commit(repo: Path, subject: str) -> str:
    _git(repo, "add", "-A")
    _git(repo, "-c", "user.name=harness", "-c", "user.email=harness@example.com", "commit", "-q", "-m", subject)
    return _git(repo, "rev-parse", "HEAD").strip()


@pytest.fixture(scope="module")
def history(tmp_path_factory) -> tuple[Path, dict[str, str]]:
    repo = tmp_path_factory.mktemp("sglang-history")
    _git(repo, "init", "-q", "-b", "main")
    package = repo / "python" / "sglang"
    shutil.copytree(scratch_sglang([]) / "sglang", package, symlinks=True)  # links to the installed files
    init = package / "__init__.py"
    commits = {"clean": _commit(repo, "clean sglang")}
    (repo / "NOTES.md").write_text("notes\n")
    commits["notes"] = _commit(repo, "docs: notes")
    original_init = init.resolve()
    init.unlink()
    init.write_text("raise ImportError('broken on purpose')\n")
    commits["unimportable"] = _commit(repo, "break the package import")
    init.unlink()
    init.symlink_to(original_init)
    commits["fixed"] = _commit(repo, "fix the package import")
    runner = package / BUG1[0][0]
    text = runner.read_text()
    for _, old, new in BUG1:
        assert old in text, f"bug 1's mutant does not apply to the installed SGLang: {old!r}"
        text = text.replace(old, new)
    runner.unlink()
    runner.write_text(text)
    commits["bug1"] = _commit(repo, "decode runner imports patch_model by value")
    (repo / "NOTES.md").write_text("more notes\n")
    commits["after"] = _commit(repo, "docs: more notes")
    (repo / "NOTES.md").write_text("uncommitted edit\n")  # the user's work in progress must survive
    return repo, commits


def _state(repo: Path) -> tuple[str, str, str]:
    return _git(repo, "status", "--porcelain"), _git(repo, "branch", "--show-current"), _git(repo, "rev-parse", "HEAD")


def _bisect(repo: Path, good: str, bad: str, report_dir: Path) -> subprocess.CompletedProcess:
    before = _state(repo) if (repo / ".git").exists() else None
    done = subprocess.run([sys.executable, "-m", "harness", "bisect", "--tree", str(repo), "--good", good, "--bad", bad,
                           "--test", STATIC, "--report-dir", str(report_dir)], cwd=REPO_ROOT, capture_output=True,
                          text=True, timeout=1200)
    if before is not None:
        assert _state(repo) == before, "bisect changed the user's checkout (status, branch or HEAD)"
    return done


@pytest.mark.extended  # the selftest's bisect is the repro-script one below: the same history, the same commit
def test_bisect_names_the_commit_that_introduced_the_mutant(history, tmp_path):
    repo, commits = history
    done = _bisect(repo, commits["clean"], commits["after"], tmp_path)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert f"first bad commit: {commits['bug1'][:10]}" in done.stdout, done.stdout[-3000:]
    assert "decode runner imports patch_model by value" in done.stdout
    steps = {row["hash"]: row for row in map(json.loads, (tmp_path / "bisect.jsonl").read_text().splitlines())}
    # the ends, then: the middle (unimportable: skipped), its neighbour, then halving down to the mutant
    expected = {"clean": "good", "after": "bad", "unimportable": "skip", "notes": "good", "fixed": "good",
                "bug1": "bad"}
    assert {name: steps[commits[name]]["verdict"] for name in expected} == expected, steps
    assert "does not import" in steps[commits["unimportable"]]["why"]
    assert "rebinding-by-value-import" in steps[commits["bug1"]]["why"]


# "bad passes" runs the test on the bad commit as "good fails" does on the good one: the extended tier's
@pytest.mark.parametrize("case", ["not a checkout", "unknown revision", "good fails",
                                  pytest.param("bad passes", marks=pytest.mark.extended)])
def test_bisect_bad_input_is_a_clear_message_and_leaves_the_checkout_alone(case, history, tmp_path):
    repo, commits = history
    good, bad, tree, message = {
        "not a checkout": (commits["clean"], commits["after"], tmp_path, "is not a git checkout"),
        "unknown revision": ("no-such-rev", commits["after"], repo, "revision 'no-such-rev' does not exist"),
        "good fails": (commits["bug1"], commits["after"], repo, "the good revision"),
        "bad passes": (commits["clean"], commits["notes"], repo, "the bad revision"),
    }[case]
    done = _bisect(tree, good, bad, tmp_path / "report")
    assert done.returncode == 2, done.stdout[-2000:] + done.stderr[-2000:]
    assert message in done.stderr, done.stderr[-2000:]
    assert "Traceback" not in done.stderr


# A script of the shape `python -m harness repro` writes (exit 1 and "reproduced: ..." when the failure shows),
# here around the static by-value-import oracle, so each step costs one scan.
REPRO_SCRIPT = '''import sys
sys.path.insert(0, {root!r})
from harness.oracles.rebinding import assert_no_by_value_imports_of_rebound_names

try:
    assert_no_by_value_imports_of_rebound_names()
except AssertionError as failure:
    print(f"reproduced: {{failure}}")
    sys.exit(1)
print("did not reproduce: every oracle passed")
'''


def test_bisect_with_a_repro_script_names_the_same_commit(history, tmp_path):
    repo, commits = history
    script = tmp_path / "repro_bug1.py"
    script.write_text(REPRO_SCRIPT.format(root=str(REPO_ROOT)))
    before = _state(repo)
    done = subprocess.run([sys.executable, "-m", "harness", "bisect", "--tree", str(repo), "--good", commits["fixed"],
                           "--bad", commits["after"], "--repro", str(script), "--report-dir", str(tmp_path / "r")],
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=1200)
    assert _state(repo) == before
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert f"first bad commit: {commits['bug1'][:10]}" in done.stdout, done.stdout[-3000:]
    assert "reproduced:" in done.stdout
