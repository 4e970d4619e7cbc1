"""`python -m harness repro` on compile-time failures of model code (harness/repro_compile.py): a pasted log is
classified into its family and narrowed to its frame, call, op or guard; a known finding answers it only when it
declares the same guard, frame or op; and the standalone script repro writes re-creates the failure on this CPU
(or says what this machine lacks to run it)."""
from __future__ import annotations

import subprocess
import sys

import pytest

from harness import __main__ as cli
from harness import known_findings
from harness import repro as repro_module
from harness.mutants import REPO_ROOT
from harness.repro import read
from harness.repro_compile import guard_kind, op_named
from harness.versions import sglang_version

LOGS = REPO_ROOT / "tests" / "repro_logs"


def answer(capsys, *argv) -> tuple[int, str]:
    code = cli.main(["repro", *argv])
    captured = capsys.readouterr()
    return code, captured.out + captured.err


# -- reading: the same failure in the words of other torch releases --------------------------------------------
@pytest.mark.parametrize("guard, kind, subject, value", [
    ("GLOBAL_STATE changed: grad_mode ", "global-state", "grad_mode", None),
    ("___check_obj_id(G['flag'], 140234)", "global", "flag", None),  # torch <= 2.13 for a bool global
    ("G['flag'] == True                       # if flag:  # m.py:3 in f", "global", "flag", True),  # torch 2.14
    ("G['cfg'].enabled == False", "global", "cfg.enabled", False),
    ("L['n'] == 3", "local", "n", 3),
    ("n == 3                                  # return x * n  # m.py:4 in f", "local", "n", 3),  # torch 2.14
    ("L['self'].training == True", "local", "self.training", True),
    ("tensor 'L['x']' size mismatch at index 0. expected 4, actual 8", "tensor-size", "x", ("4", "8")),
    ("tensor 'x' dtype mismatch. expected Float, actual Half", "tensor-dtype", "x", ("Float", "Half")),
    ("___check_type_id(L['self']._forward_method, 7629)", "other", None, None),
    ("2 <= L['positions'].size()[0]", "other", None, None),
])
def test_a_guard_has_one_kind_in_every_release_spelling(guard, kind, subject, value):
    found = guard_kind(guard)
    assert found.kind == kind
    if subject is not None:
        assert (found.subject, found.value) == (subject, value)


@pytest.mark.parametrize("log, family, op", [
    ("NotImplementedError: There was no fake impl registered for <OpOverload(op='sglang.fused_rope', "
     "overload='default')>", "missing-fake-impl", ("sglang", "fused_rope")),
    ("RuntimeError: There was no fake impl registered for <CustomOpDef(sglang::moe_sum)>. This is necessary for "
     "torch.compile/export/fx tracing to work.", "missing-fake-impl", ("sglang", "moe_sum")),
    ("torch._subclasses.fake_tensor.UnsupportedOperatorException: sglang.outplace_all_reduce.default",
     "missing-fake-impl", ("sglang", "outplace_all_reduce")),
    ("torch._dynamo.exc.Unsupported: Operator does not support running with fake tensors\n  Developer debug "
     "context: unsupported operator: sgl_kernel.fp8_scaled_mm.default", "missing-fake-impl",
     ("sgl_kernel", "fp8_scaled_mm")),
    ("RuntimeError: sgl_kernel::awq_marlin_gemm() Expected a value of type '__torch__.torch.classes.sgl_kernel."
     "ScalarType' for argument 'b_q_type' but instead found type 'FakeScriptObject'.", "fake-script-object",
     ("sgl_kernel", "awq_marlin_gemm")),
])
def test_op_failures_name_their_family_and_op(log, family, op):
    assert read(log).signature.name == family
    assert op_named(log) == op


@pytest.mark.parametrize("log, call", [
    ("torch._dynamo.exc.Unsupported: 'skip function get_device_name in file /usr/lib/python3/dist-packages/torch/"
     "cuda/__init__.py'", "torch.cuda.get_device_name (skipped)"),
    ("torch._dynamo.exc.Unsupported: Graph break: call_function UserDefinedObjectVariable(_lru_cache_wrapper) "
     "skip function is_sm90_supported in file /sgl-workspace/sglang/python/sglang/srt/utils/common.py",
     "sglang.srt.utils.common.is_sm90_supported (lru_cache)"),
    ("torch._dynamo.exc.Unsupported: call_function in skip_files: threading.Lock (Dynamo cannot trace it)",
     "threading.Lock (context-manager)"),
])
def test_untraceable_calls_name_the_call(log, call):
    reading = read(log)
    assert reading.signature.name == "untraceable-call"
    assert reading.evidence["call"] == call


# -- known findings answer only for their own guard, frame or op ------------------------------------------------
GRAD_MODE = {"guard": "GLOBAL_STATE changed: grad_mode",
             "frame": "/sgl-workspace/sglang/python/sglang/srt/layers/moe/topk.py:1383 in grouped_topk_gpu"}


def test_every_finding_repro_may_name_declares_what_it_is_about():
    for suite in ("prefill_pcg", "decode_capture", "compile_kwargs"):
        for finding in known_findings.known_tests(suite):
            assert finding.about is not None, f"{finding.test} declares no FINDINGS_ABOUT / ABOUT entry"


def test_a_finding_about_another_guard_is_told_apart():
    known = known_findings.known_tests("prefill_pcg")
    eligible, notes = known_findings.answering(known, GRAD_MODE)
    assert eligible == []
    assert "not the known finding test_findings_global_forward_mode_none_recompiles: its guard is " \
           "/\\bglobal_forward_mode\\b/" in notes
    own = {"guard": "___check_obj_id(L['forward_batch'].global_forward_mode, 94305)"}
    assert [k.test.split("::")[-1] for k in known_findings.answering(known, own)[0]] == [
        "test_findings_global_forward_mode_none_recompiles"]
    assert known_findings.answering(known, {})[0] == known  # a log naming no guard: oracle and conditions decide


def test_a_recompile_log_with_another_guard_gets_no_known_finding(monkeypatch, tmp_path, capsys):
    """Every known finding fails with a recompile oracle here (the worst case): before the findings declared their
    guards, the first of them answered this grad_mode log with confidence."""
    def every_finding_fails(suite, timeout=300, known=None):
        known = known_findings.known_tests(suite) if known is None else known
        return known, [{"test": k.test, "oracle": "no-recompile", "drawn": {}, "diagnosis": "recompiled",
                        "replay": f"pytest {k.test}", "sglang": "0.5.23"} for k in known]

    planned = []
    monkeypatch.setattr(known_findings, "run_known", every_finding_fails)
    monkeypatch.setattr(repro_module, "run_plan", lambda plan, *args: planned.append(plan) or 0)
    log = tmp_path / "user.log"  # the fixture's recompile lines (without its words about decode: searched in prefill)
    lines = (LOGS / "recompile_grad_mode_moe_topk.log").read_text().splitlines()
    log.write_text("\n".join(line for line in lines if "__recompiles" in line) + "\n")
    code, output = answer(capsys, str(log), "--out", str(tmp_path / "out"))
    assert code == 0 and "KNOWN FINDING" not in output, output
    assert "not the known finding test_findings_global_forward_mode_none_recompiles: its guard is" in output
    assert [p.name for p in planned] == ["recompile_grouped_topk_gpu_global_state"]
    no_guard = tmp_path / "no_guard.log"  # the same stand-in findings do answer a log that names no guard
    no_guard.write_text("torch._dynamo.exc.RecompileError: Recompiling function forward in piecewise backend\n")
    code, output = answer(capsys, str(no_guard), "--out", str(tmp_path / "out"))
    assert "a KNOWN FINDING of the installed SGLang" in output, output


# -- the scripts, run: the failure re-created on this CPU -----------------------------------------------------------
def run_repro(name: str, tmp_path) -> tuple[subprocess.CompletedProcess, list]:
    done = subprocess.run([sys.executable, "-m", "harness", "repro", str(LOGS / name), "--out", str(tmp_path)],
                          cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)
    return done, sorted(tmp_path.glob("repro_*.py"))


def run_script(script) -> subprocess.CompletedProcess:
    """The written script on its own, in a fresh process, as a user (or bisect --repro) runs it."""
    return subprocess.run([sys.executable, str(script)], cwd=REPO_ROOT, capture_output=True, text=True, timeout=300)


@pytest.mark.slow
@pytest.mark.subprocess
def test_a_missing_fake_impl_log_is_reproduced_by_its_script(tmp_path):
    done, scripts = run_repro("missing_fake_impl_fp8_marlin.log", tmp_path)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "signature missing-fake-impl" in done.stdout and "op: sglang::apply_fp8_marlin_linear" in done.stdout
    assert "KNOWN FINDING" not in done.stdout and "searching suite" not in done.stdout
    assert "(fails as reported)" in done.stdout
    rerun = run_script(scripts[0])
    assert rerun.returncode == 1, rerun.stdout[-3000:] + rerun.stderr[-3000:]
    assert "reproduced: compiling a call of harness_repro::apply_fp8_marlin_linear fails for want of a fake " \
           "impl" in rerun.stdout
    assert "sglang::apply_fp8_marlin_linear has a fake impl in this SGLang" in rerun.stdout  # said, not hidden


@pytest.mark.slow
@pytest.mark.subprocess
def test_a_grad_mode_recompile_log_is_reproduced_on_sglangs_own_helper(tmp_path):
    done, scripts = run_repro("recompile_grad_mode_moe_topk.log", tmp_path)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "guard kind: global-state (grad_mode)" in done.stdout and "KNOWN FINDING" not in done.stdout
    assert "from sglang.srt.layers.moe.topk import grouped_topk_gpu" in scripts[0].read_text()
    rerun = run_script(scripts[0])
    assert rerun.returncode == 1, rerun.stdout[-3000:] + rerun.stderr[-3000:]
    assert "recompiled grouped_topk_gpu on the guard 'GLOBAL_STATE changed: grad_mode'" in rerun.stdout


@pytest.mark.slow
@pytest.mark.subprocess
@pytest.mark.parametrize("name, outcome, said", [
    ("recompile_global_flag.log", "fails as reported", "on the guard \"G['_expert_recording_enabled']"),
    ("recompile_scalar_arg.log", "fails as reported", "on the guard 'num_fused_shared_experts == 1'"),
    ("untraceable_call_lock.log", "fails as reported", "cannot trace threading.Lock (fullgraph): Unsupported"),
    ("untraceable_call_device_name.log", "cannot run on this machine",
     "Dynamo ran torch.cuda.get_device_name to trace it, and it needs a GPU"),
    ("fake_script_object_gptq_marlin.log", "cannot run on this machine",
     "no op sgl_kernel::gptq_marlin_gemm is registered; no torchbind class "
     "__torch__.torch.classes.sgl_kernel.ScalarType"),
    ("missing_fake_impl_absent_op.log", "DID NOT fail on this machine",
     f"SGLang {sglang_version()} registers no op sglang::fused_gdn_gating_v2"),
])
def test_each_compile_family_script_reproduces_or_says_why_not(name, outcome, said, tmp_path):
    done, scripts = run_repro(name, tmp_path)
    assert f"({outcome})" in done.stdout and said in done.stdout, done.stdout[-3000:] + done.stderr[-3000:]
    assert done.returncode == (0 if outcome == "fails as reported" else 1)
    assert len(scripts) == 1 and "KNOWN FINDING" not in done.stdout
