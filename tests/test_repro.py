"""`python -m harness repro`: bad input gets a clear answer and exit 2; a pasted log is classified, the
failure is found by search on a mutant, and the standalone script it writes fails the same way."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from harness import __main__ as cli
from harness.mutants import REPO_ROOT, scratch_sglang
from harness import known_findings
from harness.repro import RECORD_FORMAT, SIGNATURES, classify
from tests.test_compile_kwargs_mutants import MUTANTS


def answer(capsys, *argv) -> tuple[int, str]:
    code = cli.main(["repro", *argv])
    captured = capsys.readouterr()
    return code, captured.out + captured.err


@pytest.mark.parametrize("content, message", [
    (None, "no such file"),
    (b"", "is empty"),
    (b"\x7fELF\x00\x01binary", "is binary"),
    (b"\xff\xfe not utf-8 \xff", "is not UTF-8 text"),
    (b"Segmentation fault (core dumped)\n", "no known signature in this log"),
])
def test_bad_input_is_refused_with_a_reason(content, message, tmp_path, capsys):
    path = tmp_path / "report.log"
    if content is not None:
        path.write_bytes(content)
    code, output = answer(capsys, str(path))
    assert code == 2 and message in output, output
    if "signature" in message:
        assert all(signature.name in output for signature in SIGNATURES)  # lists what it knows


def test_an_enormous_file_is_refused(tmp_path, capsys):
    path = tmp_path / "huge.log"
    with open(path, "wb") as stream:
        stream.truncate(21 * 1024 * 1024)
    code, output = answer(capsys, str(path))
    assert code == 2 and "the limit is 20 MiB" in output


def test_a_record_from_another_harness_version_is_refused(tmp_path, capsys):
    path = tmp_path / "failures.jsonl"
    path.write_text(json.dumps({"test": "suites/x.py::t", "replay": "python -m pytest ...", "record_format": 0}))
    code, output = answer(capsys, str(path))
    assert code == 2 and f"this harness reads format {RECORD_FORMAT}" in output and "python -m pytest" in output


@pytest.mark.parametrize("log, suite, conditions", [
    ("AssertionError: PCG capture stream is not set, please check if runtime recompilation happened\n"
     "forward_mode=ForwardMode.MIXED", "prefill_pcg", {"forward_mode": ["MIXED"]}),
    ("torch._dynamo.exc.RecompileError: Recompiling function forward in decode_cuda_graph_runner.py",
     "decode_capture", {}),
    ("RuntimeError: Either mode or options can be specified", "compile_kwargs", {"platform": ["oot"]}),
    ("Capture cuda graph failed on Ascend NPU with torchair", "decode_capture", {"personality": ["npu"]}),
    # CUDA's capture errors, inside SGLang's wrappers: the wrapper names the capture path
    ("Exception: Capture cuda graph failed: CUDA error: operation not permitted when stream is capturing",
     "decode_capture", {}),
    ("RuntimeError: Piecewise CUDA Graph failed with error: Cannot call CUDAGeneratorImpl::current_seed during CUDA "
     "graph capture. If you need this call to be captured, please file an issue.", "prefill_pcg", {}),
    ("Capture cuda graph failed: AttributeError: 'NoneType' object has no attribute 'seq_lens'",
     "decode_capture", {}),
    ("Piecewise CUDA Graph failed with error: TypeError: unsupported operand type(s), num_tokens=8",
     "prefill_pcg", {"num_tokens": [8]}),
])
def test_signatures_pick_the_suite_and_the_conditions(log, suite, conditions):
    _, found_suite, found = classify(log)
    assert found_suite == suite
    assert conditions.items() <= found.items()


def test_a_pasted_log_is_reproduced_by_search_and_replayed_standalone(tmp_path):
    log = tmp_path / "user.log"
    log.write_text("RuntimeError: Either mode or options can be specified, but both can't be specified at the "
                   "same time.\n")
    root = scratch_sglang(MUTANTS["mode_with_options"][0])
    env = dict(os.environ, PYTHONPATH=f"{root}{os.pathsep}{REPO_ROOT}")
    done = subprocess.run([sys.executable, "-m", "harness", "repro", str(log), "--budget", "240", "--out",
                           str(tmp_path / "out")], cwd=REPO_ROOT, env=env, capture_output=True, text=True)
    regressions = [line.split(": ", 1)[1] for line in done.stdout.splitlines() if "regression to pin" in line]
    for path in regressions:  # a pin of a mutant's failure does not belong in the repository
        os.remove(path)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "signature compile-kwargs-rejected" in done.stdout
    assert "[kwargs-validity] mode and options both reach torch.compile" in done.stdout
    assert "fails as reported" in done.stdout


@pytest.mark.parametrize("log, signature", [
    ("Capture cuda graph failed: CUDA error: operation not permitted when stream is capturing",
     "cuda-capture-refused"),
    ("Cannot copy between CPU and CUDA tensors during CUDA graph capture unless the CPU tensor is pinned",
     "cuda-capture-refused"),
    ("CUDA graphs must be captured on a non-default stream.", "cuda-capture-refused"),
    ("Piecewise CUDA Graph failed with error: AttributeError: x", "capture-crash"),
])
def test_the_capture_family_has_its_signatures(log, signature):
    assert classify(log)[0].name == signature


def test_known_findings_are_the_strict_xfails_and_the_pinned_regressions():
    prefill = {k.test.split("::")[-1] for k in known_findings.known_tests("prefill_pcg")}
    assert {"test_findings_global_forward_mode_none_recompiles", "test_findings_capture_size_one_never_replays",
            "test_findings_speculative_modes_recompile"} <= prefill
    assert [k.test for k in known_findings.known_tests("decode_capture")] == [
        "suites/regressions/test_decode_patch_model_override.py"]


def test_a_known_finding_is_named_without_a_search(tmp_path, capsys):
    log = tmp_path / "user.log"
    log.write_text("WARNING cuda_piecewise_backend.py: PCG capture stream is not set. This can be a Dynamo runtime "
                   "recompilation or an optional VLM branch pre-warmed outside CUDA graph capture\n")
    code, output = answer(capsys, str(log), "--out", str(tmp_path / "out"))
    assert code == 0, output
    assert "a KNOWN FINDING of the installed SGLang" in output and "no search" in output
    assert "searching suite" not in output
    assert "test_findings_" in output and "[no-recompile]" in output
