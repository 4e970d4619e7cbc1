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
from harness import repro as repro_module
from harness.errors import HarnessError
from harness.repro import RECORD_FORMAT, SIGNATURES, classify, launch_flags, read, strategy_names, without_launch
from tests.mutant_tables import KWARGS_MUTANTS as MUTANTS


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


@pytest.mark.subprocess
def test_a_pasted_log_is_reproduced_by_search_and_replayed_standalone(tmp_path):
    log = tmp_path / "user.log"
    log.write_text("RuntimeError: Either mode or options can be specified, but both can't be specified at the "
                   "same time.\n")
    root = scratch_sglang(MUTANTS["mode_with_options"].edits)
    env = dict(os.environ, PYTHONPATH=f"{root}{os.pathsep}{REPO_ROOT}")
    done = subprocess.run([sys.executable, "-m", "harness", "repro", str(log), "--budget", "240", "--out",
                           str(tmp_path / "out"), "--pin-dir", str(tmp_path / "pins")],
                          cwd=REPO_ROOT, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "signature compile-kwargs-rejected" in done.stdout
    assert "[kwargs-validity] mode and options both reach torch.compile" in done.stdout
    assert "fails as reported" in done.stdout


@pytest.mark.subprocess
@pytest.mark.extended  # a search end to end runs in every selftest (the pasted log's); this one in another runner
def test_a_draft_runner_fault_is_searched_where_the_draft_graphs_run(tmp_path):
    """A GPU report of an illegal memory access in the EAGLE draft runner's replay, on SGLang whose runner no
    longer zeroes the padded rows' KV slots: the search runs the draft test narrowed to the launch command's
    speculative shape and finds the replay writing the last batch's slots; the script it writes fails the same."""
    log = REPO_ROOT / "tests" / "repro_logs" / "draft_runner_illegal_memory_access.log"
    root = scratch_sglang([("srt/speculative/eagle_draft_cuda_graph_runner.py", "buffers.out_cache_loc.zero_()",
                            "pass")])
    env = dict(os.environ, PYTHONPATH=f"{root}{os.pathsep}{REPO_ROOT}")
    # the pin of a mutant's failure goes to tmp: in the repository a concurrent gate would collect it
    done = subprocess.run([sys.executable, "-m", "harness", "repro", str(log), "--budget", "600", "--out",
                           str(tmp_path / "out"), "--pin-dir", str(tmp_path / "pins")],
                          cwd=REPO_ROOT, env=env, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "signature draft-runner-fault" in done.stdout
    assert "searching suites/test_real_models.py -k 'eagle_draft_replays'" in done.stdout
    assert "[eager-equality]" in done.stdout and "KV slot" in done.stdout
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


@pytest.mark.slow
def test_a_known_finding_is_named_without_a_search(tmp_path, capsys):
    log = tmp_path / "user.log"
    log.write_text("WARNING cuda_piecewise_backend.py: PCG capture stream is not set. This can be a Dynamo runtime "
                   "recompilation or an optional VLM branch pre-warmed outside CUDA graph capture\n")
    code, output = answer(capsys, str(log), "--out", str(tmp_path / "out"))
    assert code == 0, output
    assert "a KNOWN FINDING of the installed SGLang" in output and "no search" in output
    assert "searching suite" not in output
    assert "test_findings_" in output and "[no-recompile]" in output


@pytest.mark.slow
def test_a_lora_adapter_log_is_named_as_its_known_finding_by_frame(tmp_path, capsys):
    """The scheduler's traceback of an adapter on k_proj without q_proj: its innermost LoRA frame
    (`get_target_module_name`) is the finding's own, so repro runs that finding and names it, no search."""
    log = REPO_ROOT / "tests" / "repro_logs" / "lora_k_proj_adapter_first_batch.log"
    code, output = answer(capsys, str(log), "--out", str(tmp_path / "out"))
    assert code == 0, output
    assert "a KNOWN FINDING" in output and "no search" in output
    assert "test_findings_adapter_without_q_proj_loads_then_fails_its_first_batch" in output


# -- pasted reports (tests/repro_logs/, modelled on public SGLang tracker reports): family, suite, conditions -----
LOGS = REPO_ROOT / "tests" / "repro_logs"
SQL = "/sgl-workspace/sglang/python/sglang/srt"
# file -> (signature, suite, conditions, evidence texts: {name: text its value must hold}, notes that must appear)
REPORTS = {
    "pcg_graph_break_logger.log": (
        "graph-break", "prefill_pcg", {"num_tokens": [4096]},
        {"reason": "Logger not supported for non-export cases", "site": f"{SQL}/models/qwen3_5.py:412 in forward"},
        ["--tp-size 8 -> tp_size=[8]: ignored, a world's size is its test's"]),
    "pcg_graph_break_non_tensor.log": (
        "graph-break", "prefill_pcg", {},
        {"reason": "Unsupported: torch.* op returned non-Tensor",
         "site": "/work/sglang/python/sglang/srt/layers/quantization/fp8_utils.py:180 in apply_fp8_linear"},
        ["--enable-piecewise-cuda-graph -> the piecewise prefill graphs"]),
    "prefill_user_error_moe.log": (
        "graph-break", "prefill_pcg", {},
        {"reason": "UserError: Dynamic control flow is not supported",
         "site": "/opt/sglang/python/sglang/srt/models/qwen2_moe.py:248 in forward"},
        ["architecture=['Qwen2MoeForCausalLM']: ignored", "chunked_prefill_size=[8192]: ignored"]),
    "pcg_dynamo_assert_vlm.log": (
        "graph-break", "prefill_pcg", {},
        {"reason": "AssertionError", "site": "torch/_dynamo/variables/tensor.py:1290 in call_method"},
        ["architecture=['Qwen3VLForConditionalGeneration']: ignored"]),
    "decode_dynamo_assert_dp.log": (
        "graph-break", "decode_capture", {"enable_torch_compile": [True], "torch_compile_max_bs": [16]},
        {"reason": "InternalTorchDynamoError: AssertionError", "site": "torch/_dynamo/variables/builtin.py:1011"},
        ["--enable-torch-compile -> enable_torch_compile=[True]: narrows the search"]),
    "decode_compile_graph_break_log.log": (
        "graph-break", "decode_capture",
        {"replay_bs": [8], "default_max_bs": [16], "enable_torch_compile": [True], "torch_compile_max_bs": [8]},
        {"reason": "Unsupported Tensor.item() call", "site": f"{SQL}/layers/moe/topk.py:512"},
        ["--torch-compile-max-bs 8 -> torch_compile_max_bs=[8]: narrows the search"]),
    "wrong_output_multi_lora_garbled.log": (
        "wrong-output", "decode_capture", {"lora": [True], "default_max_bs": [64]}, {},
        ["lora=[True]: narrows the search",
         "--cuda-graph-max-bs 64 -> default_max_bs=[64]"]),
    "wrong_output_length_drift_pcg.log": (
        "wrong-output", "prefill_pcg", {}, {},
        ["--speculative-algo NEXTN -> speculative_algorithm=['NEXTN']",
         "forward_mode=['TARGET_VERIFY']: ignored, the prefill runner refuses TARGET_VERIFY batches"]),
    "wrong_output_accuracy_pcg.log": ("wrong-output", "prefill_pcg", {}, {}, []),
    "wrong_output_accuracy_max_bs.log": ("wrong-output", "decode_capture", {"default_max_bs": [256]}, {},
                                         ["--tensor-parallel-size 4 -> tp_size=[4]: ignored"]),
    "wrong_output_nan_no_padding.log": (
        "wrong-output", "decode_capture", {}, {},
        ["--cuda-graph-bs 1 2 4 8 -> capture_bs=[[1, 2, 4, 8]]", "disable_padding=[True]: ignored"]),
    "wrong_output_mixed_chunk_pcg.log": (
        "wrong-output", "prefill_pcg", {"forward_mode": ["MIXED"]}, {},
        ["--enable-mixed-chunk -> forward_mode=['MIXED']: narrows the search"]),
    "wrong_output_padding_nolora.log": (
        "wrong-output", "decode_capture",
        {"default_max_bs": [160], "enable_torch_compile": [True], "torch_compile_max_bs": [32]}, {}, []),
    "capture_stream_not_set_mixed.log": (
        "capture-stream-not-set", "prefill_pcg", {"forward_mode": ["MIXED"], "num_tokens": [96]}, {},
        ["forward_mode=['MIXED']: ignored, the log itself names forward_mode=['MIXED']"]),
    "cuda_capture_refused_sync.log": (
        "cuda-capture-refused", "decode_capture", {"replay_bs": [32], "default_max_bs": [32]}, {},
        ["replay_bs=[32]: from the log; no strategy of suite decode_capture narrows by it"]),
    "decode_recompile_limit.log": ("dynamo-recompile", "decode_capture",
                                   {"enable_torch_compile": [True], "torch_compile_max_bs": [32]}, {}, []),
    "capture_crash_attribute.log": (
        "capture-crash", "decode_capture", {"default_max_bs": [8]}, {},
        ["--speculative-algorithm -> forward_mode=['TARGET_VERIFY']: ignored"]),
    "compile_kwargs_mode_options.log": (
        "compile-kwargs-rejected", "compile_kwargs",
        {"platform": ["oot"], "options": [{"epilogue_fusion": True, "max_autotune": False}], "backend": ["inductor"]},
        {}, []),
    "out_of_scope_nccl_timeout.log": (  # a collective that never completed: ranks that ran different ones
        "collective-mismatch", "parallel_worlds", {}, {}, ["--tp 4 -> tp_size=[4]: ignored, a world's size"]),
    "dp_attention_collective_mismatch.log": (
        "collective-mismatch", "parallel_worlds", {"dp_size": [2], "enable_dp_attention": [True]}, {},
        ["--enable-dp-attention -> enable_dp_attention=[True]: narrows the search",
         "--cuda-graph-max-bs 8 -> default_max_bs=[8]: ignored"]),
    # compile-time failures of model code (harness/repro_compile.py): narrowed to the frame, call, op or guard
    "untraceable_call_lock.log": (
        "untraceable-call", "decode_capture", {"default_max_bs": [8], "enable_torch_compile": [True]},
        {"call": "threading.Lock (context-manager)", "frame": f"{SQL}/eplb/expert_distribution.py:318 in "
         "on_select_experts", "model": "qwen2_moe", "architecture": "Qwen2MoeForCausalLM",
         "installed": "sglang/srt/eplb/expert_distribution.py:318"}, []),
    "untraceable_call_device_name.log": (
        "untraceable-call", "decode_capture", {"enable_torch_compile": [True], "torch_compile_max_bs": [4]},
        {"call": "torch.cuda.get_device_name (skipped)", "reason": "Attempted to call function marked as skipped",
         "frame": f"{SQL}/layers/attention/triton_backend.py:944 in forward_decode", "model": "gemma2"}, []),
    "missing_fake_impl_fp8_marlin.log": (
        "missing-fake-impl", "prefill_pcg", {},
        {"op": "sglang::apply_fp8_marlin_linear", "frame": f"{SQL}/layers/quantization/fp8.py:1314 in apply",
         "model": "qwen3", "installed": "fp8.py:1314 is `return torch.ops.sglang.apply_fp8_marlin_linear(`",
         "registered": "in sglang.srt.layers.quantization.marlin_utils_fp8"},
        ["--enable-piecewise-cuda-graph -> the piecewise prefill graphs"]),
    "missing_fake_impl_absent_op.log": (
        "missing-fake-impl", "prefill_pcg", {},
        {"op": "sglang::fused_gdn_gating_v2", "registered": "registers no op sglang::fused_gdn_gating_v2",
         "model": "qwen3_next"}, []),
    "fake_script_object_gptq_marlin.log": (
        "fake-script-object", "decode_capture", {"enable_torch_compile": [True], "torch_compile_max_bs": [8]},
        {"op": "sgl_kernel::gptq_marlin_gemm", "class": "__torch__.torch.classes.sgl_kernel.ScalarType",
         "argument": "b_q_type", "frame": "marlin_utils.py:490 in apply_gptq_marlin_linear", "model": "qwen2"}, []),
    "recompile_grad_mode_moe_topk.log": (
        "dynamo-recompile", "decode_capture",
        {"default_max_bs": [16], "enable_torch_compile": [True], "torch_compile_max_bs": [16]},
        {"guard": "GLOBAL_STATE changed: grad_mode", "guard kind": "global-state (grad_mode)",
         "function": "grouped_topk_gpu", "frame": f"{SQL}/layers/moe/topk.py:1383 in grouped_topk_gpu",
         "installed": "the file defines grouped_topk_gpu at line"}, []),
    "recompile_global_flag.log": (
        "dynamo-recompile", "prefill_pcg", {},
        {"guard": "___check_obj_id(G['_expert_recording_enabled'], 9784864)",
         "guard kind": "global (_expert_recording_enabled)", "function": "forward_normal", "model": "qwen3_moe"},
        []),
    # the EAGLE draft worker's runners: searched where the harness drives them, narrowed by the speculative shape
    "draft_runner_illegal_memory_access.log": (
        "draft-runner-fault", "real_models",
        {"speculative_algorithm": ["EAGLE"], "speculative_num_steps": [3], "speculative_eagle_topk": [4],
         "speculative_num_draft_tokens": [8], "speculative_draft_window_size": [None]}, {},
        ["searching suites/test_real_models.py -k 'eagle_draft_replays'",
         "--speculative-num-steps 3 -> speculative_num_steps=[3]: narrows the search", "--tp 2 -> tp_size=[2]: ignored",
         "no --speculative-draft-window-size (SGLang's default) -> speculative_draft_window_size=[None]: narrows"]),
    "npu_draft_extend_size_mismatch.log": (
        "draft-runner-fault", "real_models",
        {"personality": ["npu"], "default_max_bs": [24], "speculative_algorithm": ["EAGLE3"],
         "speculative_num_steps": [2], "speculative_eagle_topk": [1], "speculative_num_draft_tokens": [3],
         "speculative_draft_window_size": [None]}, {},
        ["searching suites/test_decode_npu.py -k 'eagle_draft_replays'"]),
    "draft_capture_host_sync.log": (
        "cuda-capture-refused", "real_models",
        {"speculative_algorithm": ["EAGLE"], "speculative_num_steps": [2], "speculative_eagle_topk": [2],
         "speculative_num_draft_tokens": [4], "speculative_draft_window_size": [None]}, {},
        ["searching suites/test_real_models.py -k 'eagle_draft_replays'"]),
    # a LoRA adapter's lifecycle: searched in the LoRA server's lifetime, narrowed by the pool's slots; the frame
    # decides whether the known finding (an adapter on k_proj without q_proj) may answer
    "lora_k_proj_adapter_first_batch.log": (
        "lora-adapter-lifecycle", "real_models", {"max_loras_per_batch": [4]},
        {"frame": "srt/lora/utils.py:369 in get_target_module_name", "module": "self_attn.k_proj.lora_A"},
        ["searching suites/test_server_lifetime.py -k 'LoRA'", "--max-loras-per-batch 4 -> max_loras_per_batch=[4]: "
         "narrows the search"]),
    "lora_pinned_adapters_no_slot.log": (
        "lora-adapter-lifecycle", "real_models", {},
        {"frame": "srt/lora/mem_pool.py:817 in get_available_buffer_slot"},
        ["searching suites/test_server_lifetime.py -k 'LoRA'"]),
    "recompile_scalar_arg.log": (
        "dynamo-recompile", "prefill_pcg", {},
        {"guard": "L['num_fused_shared_experts'] == 1", "guard kind": "local (num_fused_shared_experts)",
         "function": "biased_grouped_topk_impl", "architecture": "DeepseekV3ForCausalLM"}, []),
}


def test_every_fixture_is_in_the_table():
    assert sorted(p.name for p in LOGS.glob("*.log")) == sorted(REPORTS)


@pytest.mark.parametrize("name", sorted(REPORTS))
def test_pasted_reports_get_their_family_suite_and_conditions(name):
    signature, suite, conditions, evidence, notes = REPORTS[name]
    text = (LOGS / name).read_text()
    if signature is None:
        with pytest.raises(HarnessError, match="no known signature"):
            read(text)
        return
    reading = read(text)
    assert (reading.signature.name, reading.suite, reading.conditions) == (signature, suite, conditions)
    for key, want in evidence.items():
        assert want in reading.evidence[key], (key, reading.evidence)
    for want in notes:
        assert any(want in note for note in reading.notes), (want, reading.notes)


def test_the_launch_command_is_parsed_with_its_continuations_and_server_args():
    text = ("python3 -m sglang.launch_server \\\n  --model-path m --lora-paths a=/a b=/b \\\n  --cuda-graph-max-bs=48\n"
            "server_args=ServerArgs(model_path='m', enable_mixed_chunk=True, disable_cuda_graph=False, tp_size=2)\n")
    assert launch_flags(text) == {"--model-path": ["m"], "--lora-paths": ["a=/a", "b=/b"],
                                  "--cuda-graph-max-bs": ["48"], "--enable-mixed-chunk": [],
                                  "--tp-size": ["2"]}
    assert "lora" not in without_launch(text) and without_launch(text).strip() == ""


def test_conditions_narrow_only_by_what_the_strategies_read():
    assert {"forward_mode", "num_tokens"} <= strategy_names("prefill_pcg")
    assert {"platform", "backend", "options", "mode"} <= strategy_names("compile_kwargs")
    assert "personality" in strategy_names("decode_capture")  # passed to pytest as --personality by the search


@pytest.mark.subprocess
def test_the_search_passes_the_personality_to_pytest(monkeypatch, tmp_path):
    calls = []

    def command(args, **kwargs):
        calls.append((args, kwargs))
        return [sys.executable, "-c", "pass"], dict(os.environ)

    monkeypatch.setattr(repro_module, "pytest_command", command)
    assert repro_module.search("decode_capture", {"personality": ["npu"]}, 5, tmp_path) is None
    args, kwargs = calls[0]
    assert args[-2:] == ["--personality", "npu"]
    assert json.loads(kwargs["env"]["HARNESS_CONDITIONS"]) == {"personality": ["npu"]}


@pytest.mark.parametrize("log, expected", [
    # the launch command's flag names are not words about the failure: --chunked-prefill-size keeps decode
    ("the outputs are garbled\npython -m sglang.launch_server --model-path m --chunked-prefill-size 4096\n",
     ("wrong-output", "decode_capture")),
    ("answers are wrong at high concurrency\nsglang serve --model-path m --enable-piecewise-cuda-graph\n",
     ("wrong-output", "prefill_pcg")),
    # words about outputs beside a traceback are not this family: the traceback is the report
    ("Traceback (most recent call last):\n  File \"x.py\", line 1, in f\nConnectionError: reset\n"
     "the output was garbled",
     None),
])
def test_the_wrong_output_family_reads_words_only_without_a_traceback(log, expected):
    if expected is None:
        with pytest.raises(HarnessError, match="no known signature"):
            read(log)
    else:
        assert (read(log).signature.name, read(log).suite) == expected


def test_launch_command_narrows_worlds_by_expert_parallelism_and_prefill_graphs():
    from harness.repro import launch_conditions

    text = ("python -m sglang.launch_server --model-path m --tp 2 --dp 2 --enable-dp-attention --ep-size 2 "
            "--cuda-graph-backend-prefill=breakable\n")
    derived, notes = launch_conditions(text, "parallel_worlds", {})
    assert derived == {"dp_size": [2], "enable_dp_attention": [True], "ep_size": [2], "prefill_graphs": [True]}, notes
    derived, _ = launch_conditions(text.replace("=breakable", "=disabled"), "parallel_worlds", {})
    assert derived["prefill_graphs"] == [False]
