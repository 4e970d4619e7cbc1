"""The suites against real SGLang releases, each in its own environment (harness.releases: built by .ci/run).

- Prefill (known bug 2's release history): 0.5.9 passes MIXED through `replay_prepare` and must fail with bug 2's
  diagnosis, found by generated examples; 0.5.10, the first release with the MIXED -> EXTEND normalisation, and
  later ones must pass.
- Decode on the pre-0.5.14 layout (`harness.targets.decode.v0_5_9`): on 0.5.9 and 0.5.10 the suite must drive
  SGLang's `CudaGraphRunner` / `NPUGraphRunner` (examples run, not skipped) and every capture/replay example must
  pass; a mutant of 0.5.9's `replay` that returns the padded rows must fail the eager oracle.
- Gate (known bug 1's history on main): `python -m harness gate TREE` on main-branch trees (see BUG1_TREES).

Under CI (CI set) a missing environment or tree fails the case; elsewhere it skips, naming what is missing.
"""
from __future__ import annotations

import os
import subprocess
import tarfile
from pathlib import Path

import pytest

from harness.record import read_records
from harness.releases import (BUG2_ORACLES, REPO, SUITE, build_command, checked_releases, expected, release_env,
                              release_python, run_release, sglang_version)
from harness.targets.decode.v0_5_9 import NOTE as PRE14_NOTE
from tests.mutant_runs import failure_records, run_suite_on_mutant

pytestmark = pytest.mark.subprocess  # every test here runs a suite in another process

RELEASES = checked_releases()
HYPOTHESIS_TESTS = ("test_piecewise_capture_grid_and_replay", "test_piecewise_inductor_pieces",
                    "TestPrefillMachine")  # tests without a pinned explicit example
# Archives of main-branch trees (shared/sglang-trees/README.md), beside the project's checkout.
TREES = Path(os.environ.get("HARNESS_SGLANG_TREES") or REPO.parent / "shared" / "sglang-trees")


def _missing(reason: str) -> None:
    """A release check that cannot run: a failure under CI, which must run it; a skip elsewhere."""
    if os.environ.get("CI", "").lower() not in ("", "0", "false"):
        pytest.fail(f"{reason}; under CI (CI={os.environ['CI']}) this release check must run, not skip", pytrace=False)
    pytest.skip(f"{reason}; this release check did not run")


def _python(version: str) -> Path:
    python = release_python(version)
    if not python.exists():
        _missing(f"no SGLang {version} environment at {python.parent.parent} (build it: {build_command(version)})")
    found = sglang_version(python)
    if found != version:
        _missing(f"{python} holds SGLang {found}, not {version} (rebuild it: {build_command(version)})")
    return python


def _tree(commit: str, into: Path) -> Path:
    """Main-branch tree `commit`, unpacked from its archive into `into` (a temporary folder)."""
    archive = TREES / f"sglang-{commit}.tar.gz"
    if not archive.is_file():
        _missing(f"no archive of SGLang main at {commit}: {archive} (set HARNESS_SGLANG_TREES to the folder of "
                 "sglang-<commit>.tar.gz)")
    with tarfile.open(archive) as tar:
        tar.extractall(into, filter="data")
    return into / f"sglang-{commit}"


# the release with bug 2 and the newest checked one in every selftest; the releases between them in the extended tier
BUG2_DEFAULT = (RELEASES[0], RELEASES[-1]) if RELEASES else ()


@pytest.mark.parametrize("version", [version if version in BUG2_DEFAULT
                                     else pytest.param(version, marks=pytest.mark.extended) for version in RELEASES])
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
# `git archive <commit> python` of a repository carrying main's history (Oasis-Git/sglang), in TREES;
# they pin torch 2.11.0, as 0.5.14 does, so they run in the 0.5.14 environment.
# The prefill suite found a second, unrelated bug on main at 70c71ba1: with torch 2.11 (main since 2026-05-02,
# PR #21247) Inductor reads `shape_env.var_to_hint_override`, which SGLang's AlwaysHitShapeEnv lacked until
# 4ed698a4 (2026-06-15, PR #27343), so the piecewise graph with Inductor pieces cannot compile. 70c71ba1 must fail
# with that crash (none of bug 1's diagnoses). A third real bug of 70c71ba1, found by the NPU suite's
# `npu-graph-update` oracle: its NPUGraphRunner.execute rebinds the KV lengths of the v2 architectures (MiMoV2)
# under the v1 name `actual_seq_lengths_kv` (fixed by 4ed698a4, which calls `_get_update_attr_name()`).
# A fourth, found by the same oracle once the NPU suite ran on NPU 1: every tree here updates each NPU graph from a
# fresh thread that never sets its device, so the update runs on NPU 0 whatever NPU captured the graph (SGLang
# fixed it in dfaf75b1, PR #30112, 2026-07-24, "bugfix for extra device memory on Ascend"). So 4ed698a4 must fail
# with that diagnosis alone, and 4ed698a4 with #30112's two lines applied must pass.
BUG1_DIAGNOSES = ("[hook-contract] during capture `patch_model_npu` ran 0 time(s)",
                  "torch_compile_decoration.patch_model is rebound at")
UNBOUND_UPDATE = "the update worker is not bound to its runner's device"
BUG1_TREES = {"2495c02c": "bug 1", "70c71ba1": "AlwaysHitShapeEnv", "4ed698a4": "unbound update",
              "4ed698a4+30112": "pass"}
NPU_DECODE_TESTS = ("test_npu_replay_matches_eager_and_updates_graph", "test_npu_padded_batch_updates_graph")


def _apply_30112(tree: Path) -> None:
    """SGLang's fix dfaf75b1 (PR #30112): the graph-update thread binds the device its backend was built on."""
    backend = tree / "python/sglang/srt/hardware_backend/npu/graph_runner/npu_cudagraph_backend.py"
    text = backend.read_text()
    module, update = "        self._device_module = cuda_graph_runner.device_module\n", "        def _update():\n"
    assert text.count(module) == 1 and text.count(update) == 1, f"{backend} no longer has the lines #30112 patched"
    backend.write_text(text.replace(module, module + "        self._device_id = self._device_module.current_device()\n")
                       .replace(update, update + "            self._device_module.set_device(self._device_id)\n"))


def _unbound_update(failure: dict) -> bool:
    return failure["oracle"] == "npu-graph-update" and UNBOUND_UPDATE in failure["diagnosis"]


# the bug in every selftest; the two trees after it (each a later finding) and the fixed tree in the extended tier
BUG1_EXTENDED = ("70c71ba1", "4ed698a4", "4ed698a4+30112")


@pytest.mark.parametrize("tree_name", [pytest.param(name, marks=pytest.mark.extended) if name in BUG1_EXTENDED
                                       else name for name in sorted(BUG1_TREES)])
def test_gate_matches_bug1_history(tree_name, tmp_path):
    python = _python("0.5.14")
    commit, _, fix = tree_name.partition("+")
    tree = _tree(commit, tmp_path)
    if fix:
        _apply_30112(tree)
    run = subprocess.run([str(python), "-m", "harness", "gate", str(tree), "--personality", "npu",
                          "--report-dir", str(tmp_path)], cwd=REPO, env=release_env(), capture_output=True,
                         text=True, timeout=1800)
    failures = failure_records(tmp_path)
    expect = BUG1_TREES[tree_name]
    if expect == "pass":
        assert run.returncode == 0, run.stdout[-4000:]
        return
    assert run.returncode == 1, run.stdout[-4000:]
    if expect == "bug 1":
        assert all(d in run.stdout for d in BUG1_DIAGNOSES), run.stdout[-4000:]
        return
    assert not any(d in run.stdout for d in BUG1_DIAGNOSES), run.stdout[-4000:]
    npu = [f for f in failures if f["test"].split("::")[-1].split("[")[0] in NPU_DECODE_TESTS]
    assert npu and all(_unbound_update(f) or "'actual_seq_kvlen'" in f["diagnosis"] for f in npu), npu
    rest = {f["test"].split("::")[-1]: f for f in failures if f not in npu}
    if expect == "unbound update":
        assert not rest and all(_unbound_update(f) for f in npu), failures
        return
    # the Inductor-pieces tests (the drawn one and the cache-and-compile-sizes one) meet the same finding
    assert "test_piecewise_inductor_pieces" in rest and set(rest) <= {
        "test_piecewise_inductor_pieces", "test_piecewise_inductor_cache_and_compile_sizes"}, failures
    assert "has no attribute 'var_to_hint_override'" in rest["test_piecewise_inductor_pieces"]["diagnosis"]


DECODE_SUITE = "suites/test_decode_capture.py"
DECODE_REGRESSIONS = "suites/regressions/test_decode_patch_model_override.py"  # explicit cases, both personalities
DECODE_PRE14_RELEASES = ("0.5.9", "0.5.10")
DECODE_DYNAMIC = f"{DECODE_SUITE}::test_replay_matches_eager_and_patch_model_contract"
STATIC_TEST = f"{DECODE_SUITE}::test_no_module_imports_a_rebound_name_by_value"


# every selftest drives each pre-0.5.14 release under one personality and each personality on one release
PRE14_DEFAULT = (("0.5.9", "cuda"), ("0.5.10", "npu"))


@pytest.mark.parametrize(("version", "personality"), [
    pytest.param(version, personality, marks=() if (version, personality) in PRE14_DEFAULT else pytest.mark.extended,
                 id=f"{version}-{personality}")
    for version in DECODE_PRE14_RELEASES for personality in ("cuda", "npu")])
def test_decode_suite_drives_the_pre14_runner(version, personality, tmp_path):
    python = _python(version)
    result = run_release(python, suite=DECODE_SUITE, extra=("--personality", personality, DECODE_REGRESSIONS),
                         report_dir=tmp_path, timeout=1200)
    records = read_records(tmp_path / "examples.jsonl")
    suites = {"decode_capture", "decode_capture_inductor", "decode_capture_regression"}
    captured = [r for r in records if r["suite"] in suites]
    # Both capture tests (generated examples) and the pinned regressions ran through the pre-0.5.14 adapter (the
    # layout note says so), none skipped, and every one passed every oracle.
    assert {r["suite"] for r in captured} == suites, result
    assert all(r["verdict"] == "pass" for r in captured), result
    assert all(r["notes"].get("layout") == PRE14_NOTE for r in captured), captured[0]["notes"]
    # Speculative decoding and pre-planned batches came with 0.5.14: skipped, naming the release and the name
    # (the NPU findings test too, or as not its personality).
    skipped = [r for r in records if r["verdict"] == "skip"]
    speculative = [r for r in skipped if r["suite"] != "decode_findings"]
    assert {r["suite"] for r in speculative} == {"decode_target_verify", "decode_planned", "decode_ragged_verify",
                                                 "decode_ragged_refusal", "decode_ragged_layout", "decode_draft_verify",
                                                 "decode_draft_refusal", "decode_dllm", "decode_dllm_refusal",
                                                 "decode_mrope", "decode_overlap", "decode_verify_width"}, skipped
    assert all(f"SGLang {version}" in r["diagnosis"] and "has no" in r["diagnosis"] for r in speculative), skipped
    assert f"{len(skipped)} skipped" in result["counts"], result
    # The only failures these releases may show are the static scan's (by-value imports of rebound names outside
    # the decode runner, e.g. torch.cuda.Stream, which the NPU modules rebind); never patch_model (bug 1 came later).
    failures = failure_records(tmp_path)
    for failure in failures:
        assert failure["test"] == STATIC_TEST and failure["oracle"] == "rebinding-by-value-import", failure
        assert "patch_model" not in failure["diagnosis"], failure
    assert result["exit"] == (1 if failures else 0), result


PRE14_PADDED_ROWS = [
    ("srt/model_executor/cuda_graph_runner.py",
     "next_token_logits = output.next_token_logits[: self.raw_num_token]",
     "next_token_logits = output.next_token_logits[: self.bs * self.num_tokens_per_bs]"),
]


def test_decode_mutant_on_pre14_layout_fails_the_eager_oracle(tmp_path):
    python = _python("0.5.9")
    code, output = run_suite_on_mutant(DECODE_DYNAMIC, "pre14_replay_returns_padded_rows", PRE14_PADDED_ROWS,
                                       tmp_path, python=python, timeout=900)
    assert code == 1, f"the padded-rows mutant of 0.5.9 was not detected (exit {code}):\n{output[-3000:]}"
    failures = failure_records(tmp_path)
    assert failures, output[-3000:]
    assert failures[0]["oracle"] == "eager-equality", failures[0]
    assert "shape or dtype differs from eager" in failures[0]["diagnosis"], failures[0]
