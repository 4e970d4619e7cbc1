"""The prefill suite against real SGLang releases, each in its own environment under .venvs/ (known bug 2's
release history: 0.5.9 passes MIXED through `replay_prepare` and must fail with bug 2's diagnosis, found by
generated examples; 0.5.10, the first release with the MIXED -> EXTEND normalisation, and later ones must pass).

Those environments are built by hand on a development machine (see requirements/sglang-<version>.txt); CI does not
have them, so each case skips, naming the missing environment. A skip here proves nothing: run
`python bench/bench_releases.py` where the environments exist.
"""
from __future__ import annotations

import pytest

from bench.bench_releases import BUG2_ORACLES, REPO, expected, run_release, sglang_version

SUITE = "suites/test_prefill_pcg.py"
RELEASES = ("0.5.9", "0.5.10", "0.5.14")
HYPOTHESIS_TESTS = ("test_piecewise_capture_grid_and_replay", "test_piecewise_inductor_pieces",
                    "TestPrefillMachine")  # tests without a pinned explicit example


def _python(version: str):
    python = REPO / ".venvs" / f"sglang-{version}" / "bin" / "python"
    if not python.exists():
        pytest.skip(f"no SGLang {version} environment at {python.parent.parent} (built by hand, not in CI); "
                    "this release check did not run")
    found = sglang_version(python)
    if found != version:
        pytest.skip(f"{python} holds SGLang {found}, not {version}")
    return python


@pytest.mark.parametrize("version", RELEASES)
def test_prefill_suite_matches_bug2_history(version, tmp_path):
    python = _python(version)
    result = run_release(python, suite=SUITE, report_dir=tmp_path, timeout=1800)
    if expected(version) == "pass":
        assert result["exit"] == 0, result
        return
    assert result["exit"] == 1, result
    bug2 = [f for f in result["failures"] if f["oracle"] in BUG2_ORACLES]
    assert bug2, result
    # Found by generation, not only by the pinned explicit example: a test without one fails with bug 2's
    # diagnosis on a batch whose forward_mode or global_forward_mode is MIXED.
    generated = [f for f in bug2 if any(name in (f["test"] or "") for name in HYPOTHESIS_TESTS)
                 and "MIXED" in (f["drawn"]["forward_mode"], f["drawn"].get("global_forward_mode"))]
    assert generated, result["failures"]
    for failure in generated:
        assert "forward_mode=MIXED" in failure["diagnosis"] or "MIXED" in failure["diagnosis"], failure


# Known bug 1 lived on SGLang's main branch between 2495c02c (PR #23906) and 70c71ba1 (PR #27774). Trees from
# `git archive <commit> python` of a repository carrying main's history (Oasis-Git/sglang), outside the project;
# those trees pin torch 2.11, so they run in the 0.5.14 environment (torch 2.13, the nearest here).
BUG1_TREES = {"2495c02c": "fail", "70c71ba1": "pass"}


@pytest.mark.parametrize("commit", sorted(BUG1_TREES))
def test_gate_matches_bug1_history(commit, tmp_path):
    import os
    import subprocess
    from pathlib import Path

    tree = Path(os.environ.get("HARNESS_SGLANG_TREES", "/tmp")) / f"sglang-{commit}"
    if not (tree / "python" / "sglang").is_dir():
        pytest.skip(f"no SGLang tree at {tree} (set HARNESS_SGLANG_TREES; built by hand, not in CI)")
    python = _python("0.5.14")
    run = subprocess.run([str(python), "-m", "harness", "gate", str(tree), "--personality", "npu",
                          "--report-dir", str(tmp_path)], cwd=REPO, capture_output=True, text=True, timeout=1800)
    if BUG1_TREES[commit] == "pass":
        assert run.returncode == 0, run.stdout[-4000:]
        return
    assert run.returncode == 1, run.stdout[-4000:]
    assert "[hook-contract] during capture `patch_model_npu` ran 0 time(s)" in run.stdout
    assert "torch_compile_decoration.patch_model is rebound at" in run.stdout
