"""Evidence for a failing example (`--torch-trace`, `--ablate`, harness/evidence): a trace written and rendered by
tlparse for a mutant whose failure compiles (known bug 2: MIXED batches recompile the piecewise graphs); an
ablation of a known mutant (the decode replay slicing padded rows) naming the smallest setting that still fails;
an unwritable trace folder refused in one line. The settings an ablation imposes, and its conclusions, in process."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from harness.errors import HarnessError
from harness.evidence import settings
from harness.evidence.ablate import conclusion
from harness.evidence.rerun import Outcome
from harness.mutants import REPO_ROOT, scratch_sglang
from tests.mutant_tables import BUG2_MIXED_NOT_NORMALISED

PADDED_ROWS = [("srt/model_executor/runner/decode_cuda_graph_runner.py",
                "output.next_token_logits[: self.raw_num_token]",
                "output.next_token_logits[: self.bs * self.captured_req_width]")]


def _pytest(test: str, edits, *options: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(scratch_sglang(edits)), str(REPO_ROOT)]))
    return subprocess.run([sys.executable, "-m", "pytest", test, "-q", "-p", "no:cacheprovider", *options],
                          cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=1500)


def _evidence(report_dir) -> list[dict]:
    return [json.loads(line) for line in (report_dir / "evidence.jsonl").read_text().splitlines()]


@pytest.mark.subprocess
def test_a_failing_compile_is_traced_and_rendered(tmp_path):
    done = _pytest("suites/test_prefill_pcg.py::test_piecewise_forward_modes", BUG2_MIXED_NOT_NORMALISED,
                   "--report-dir", str(tmp_path / "r"), "--torch-trace", str(tmp_path / "trace"))
    assert done.returncode == 1, done.stdout[-3000:]
    (row,) = _evidence(tmp_path / "r")
    assert row["oracle"] == "no-recompile" and row["trace_logs"] >= 1, row
    assert row["trace_index"] and list((tmp_path / "trace").glob("*/tlparse/index.html")), row
    assert "tlparse index" in (tmp_path / "r" / "report.html").read_text()


@pytest.mark.subprocess
@pytest.mark.extended  # each ablation setting re-runs the failing example: 164 s under CI's load
def test_an_ablation_names_the_smallest_setting_that_still_fails(tmp_path):
    done = _pytest("suites/test_decode_capture.py::test_replay_matches_eager_and_patch_model_contract", PADDED_ROWS,
                   "--report-dir", str(tmp_path), "--ablate")
    assert done.returncode == 1, done.stdout[-3000:]
    (row,) = _evidence(tmp_path)
    assert [a["setting"] for a in row["ablation"]][0] == "compile off, graphs re-run"
    assert all(a["oracle"] == "eager-equality" for a in row["ablation"]), row["ablation"]
    assert "even with compile off and the graphs re-run" in row["ablation_says"]
    assert "ablation:" in done.stdout


@pytest.mark.subprocess
def test_an_unwritable_trace_folder_is_refused(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    done = subprocess.run([sys.executable, "-m", "pytest", "suites/test_compile_kwargs.py", "-q", "--torch-trace",
                           str(blocker / "t"), "--report-dir", str(tmp_path / "r")], cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode != 0 and "cannot be written" in done.stderr, done.stderr[-2000:]


def test_a_backend_setting_rewrites_every_compile(monkeypatch):
    import torch

    seen = {}
    monkeypatch.setattr(torch, "compile", lambda model=None, **kwargs: seen.update(kwargs) or model)
    monkeypatch.setenv(settings.BACKEND, "aot_eager")
    patch = pytest.MonkeyPatch()
    try:
        assert settings.apply(patch) == {"backend": "aot_eager"}
        torch.compile(len, backend="inductor", mode="max-autotune", options={"x": 1}, dynamic=False)
    finally:
        patch.undo()
    assert seen == {"backend": "aot_eager", "dynamic": False}  # mode and options are Inductor's only


def test_an_unknown_ablation_setting_is_refused(monkeypatch):
    monkeypatch.setenv(settings.ABLATE, "graphs-off")
    with pytest.raises(HarnessError, match="unknown setting"):
        settings.requested()


def test_conclusions_follow_the_outcomes():
    failure = {"oracle": "no-recompile"}
    fail, ok = Outcome("fail", "no-recompile"), Outcome("pass")
    names = ["compile off, graphs re-run", "compile off", "graphs re-run", "backend eager", "backend aot_eager",
             "backend inductor"]
    assert "frozen graph is needed" in conclusion(failure, list(zip(names, [ok, fail, ok, ok, ok, ok])))
    assert "Dynamo is needed" in conclusion(failure, list(zip(names, [ok, ok, fail, fail, fail, fail])))
    assert "compiler_bisector" in conclusion(failure, list(zip(names, [ok, ok, ok, ok, ok, fail])))
    assert "needs the run's own settings" in conclusion(failure, list(zip(names, [ok] * 6)))


@pytest.mark.subprocess
def test_a_repro_script_renders_its_trace(tmp_path):
    log = REPO_ROOT / "tests" / "repro_logs" / "recompile_grad_mode_moe_topk.log"
    written = subprocess.run([sys.executable, "-m", "harness", "repro", str(log), "--out", str(tmp_path)],
                             cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
    assert written.returncode == 0, written.stdout[-3000:]
    (script,) = sorted(tmp_path.glob("repro_*.py"))
    done = subprocess.run([sys.executable, str(script), "--torch-trace", str(tmp_path / "trace")], cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 1, done.stdout[-3000:] + done.stderr[-3000:]  # reproduced, and traced
    assert (tmp_path / "trace" / "tlparse" / "index.html").exists(), done.stdout[-2000:]
    assert "trace: " in done.stdout and "index.html" in done.stdout
