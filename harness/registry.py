"""The suites the harness runs, in one place: the command line, `repro`, SGLang coverage and the HTML report all
read this list.

Each suite names the `suite` values its examples record in examples.jsonl (with how the report draws each one's
explored space), its pytest files (the first holds `replay_case`, which repro scripts call), the SGLang code it
targets (for coverage, `path/in/sglang[::function]`), and its target adapter by module name under
`harness.targets`, whose `load()` returns the installed layout or raises `PathMissing` with the reason.

The decode file's static rebinding scan records `rebinding_static`; it drives no target, so it belongs to no suite.
"""
from __future__ import annotations

import dataclasses
import importlib
from typing import Any
from collections.abc import Mapping


@dataclasses.dataclass(frozen=True)
class Picture:
    """The report's grid of one recorded suite: drawn value `x` (columns) by drawn value `y` (rows); with `note`,
    each example lands on every (y, x) pair it noted under that name instead (the decode suite's replayed
    batches)."""
    x: str
    y: str
    note: str | None = None


@dataclasses.dataclass(frozen=True)
class Suite:
    name: str
    paths: tuple[str, ...]
    target: str
    records: Mapping[str, Picture | None]  # None: the grid of the first two scalar drawn values
    coverage: tuple[str, ...]
    personality_coverage: Mapping[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)

    @property
    def module(self) -> str:
        """The suite file as a module (where `replay_case` lives)."""
        return self.paths[0].removesuffix(".py").replace("/", ".")

    def load(self) -> Any:
        """The installed layout of this suite's target; raises PathMissing saying what the release lacks."""
        return importlib.import_module(f"harness.targets.{self.target}").load()


SUITES: tuple[Suite, ...] = (
    Suite(
        name="compile_kwargs",
        paths=("suites/test_compile_kwargs.py",),
        target="compile_kwargs",
        records={"compile_kwargs": Picture("platform", "backend")},
        coverage=("multimodal_gen/runtime/utils/torch_compile.py::build_torch_compile_kwargs",
                  "multimodal_gen/runtime/utils/torch_compile.py::resolve_torch_compile_kwargs"),
    ),
    Suite(
        name="decode_capture",
        paths=("suites/test_decode_capture.py", "suites/regressions/test_decode_patch_model_override.py",
               "suites/test_decode_npu.py", "suites/test_decode_switches.py"),
        target="decode",
        records={"decode_capture": Picture("batch size", "forward mode", note="replayed"),
                 "decode_capture_inductor": None, "decode_capture_regression": None,
                 "decode_target_verify": Picture("batch size", "forward mode", note="replayed"),
                 "decode_planned": Picture("batch size", "forward mode", note="replayed"),
                 "decode_padding_disabled": Picture("batch size", "forward mode", note="replayed"),
                 "decode_ragged_verify": Picture("batch size", "forward mode", note="replayed"),
                 "decode_draft_verify": Picture("batch size", "forward mode", note="replayed"),
                 "decode_dllm": Picture("batch size", "forward mode", note="replayed"),
                 "decode_mrope": Picture("batch size", "forward mode", note="replayed"),
                 "decode_overlap": Picture("batch size", "forward mode", note="replayed"),
                 "decode_ragged_refusal": None, "decode_ragged_layout": None, "decode_draft_refusal": None,
                 "decode_dllm_refusal": None, "decode_verify_width": None,
                 "decode_findings": None,
                 "decode_npu": Picture("batch size", "forward mode", note="replayed"), "decode_npu_contract": None,
                 "decode_npu_draft": Picture("batch size", "forward mode", note="replayed"),
                 "decode_switches": Picture("batch size", "forward mode", note="replayed")},
        coverage=("srt/model_executor/runner/decode_cuda_graph_runner.py",
                  "srt/model_executor/runner/base_cuda_graph_runner.py",
                  "srt/model_executor/runner_backend/full_cuda_graph_backend.py",
                  "srt/compilation/torch_compile_decoration.py",
                  "srt/speculative/ragged_verify.py",
                  # DeepSeek-V4.1's candidate graph variants and early verify metadata (`decode/dsv41.py`)
                  "srt/layers/attention/graph_variants.py",
                  "srt/model_executor/runner/early_verify_metadata.py"),
        # Reached only under the NPU personality (suites/test_decode_npu.py in every run, or --personality npu):
        # SGLang's own NPU runner and backend on the virtual device.
        personality_coverage={"npu": ("srt/hardware_backend/npu/graph_runner/npu_graph_runner.py",
                                      "srt/hardware_backend/npu/graph_runner/npu_cudagraph_backend.py",
                                      "srt/hardware_backend/npu/graph_runner/eagle_draft_npu_graph_runner.py",
                                      "srt/hardware_backend/npu/graph_runner/eagle_draft_extend_npu_graph_runner.py")},
    ),
    Suite(
        name="prefill_pcg",
        paths=("suites/test_prefill_pcg.py",),
        target="prefill",
        records={"prefill_pcg": Picture("num_tokens", "forward_mode"),
                 "prefill_pcg_stateful": Picture("num_tokens", "forward_mode"),
                 "prefill_pcg_findings": None, "prefill_pcg_replay": None},
        coverage=("srt/model_executor/runner/prefill_cuda_graph_runner.py",
                  "srt/model_executor/runner_backend/tc_piecewise_cuda_graph_backend.py",
                  "srt/compilation/backend.py",
                  "srt/compilation/compile.py",
                  "srt/compilation/cuda_piecewise_backend.py",
                  "srt/compilation/compiler_interface.py"),
    ),
    Suite(
        name="real_models",
        paths=("suites/test_real_models.py", "suites/test_server_lifetime.py", "suites/test_custom_ops.py"),
        target="decode.real_model",
        records={"real_models": Picture("batch size", "forward mode", note="replayed"),
                 "real_models_scheduled": Picture("batch size", "forward mode", note="replayed"),
                 "real_models_verify": Picture("batch size", "forward mode", note="replayed"),
                 "real_models_prefill": Picture("batch size", "forward mode", note="replayed"),
                 "real_models_deterministic": Picture("batch size", "forward mode", note="replayed"),
                 "real_models_draft": Picture("batch size", "forward mode", note="replayed"),
                 "real_models_lora": Picture("batch size", "forward mode", note="replayed"),
                 "real_models_served": Picture("batch size", "forward mode", note="replayed"),
                 "real_models_lora_served": Picture("batch size", "forward mode", note="replayed"),
                 "real_models_draft_prefill": Picture("batch size", "forward mode", note="replayed"),
                 "real_models_hybrid": Picture("batch size", "forward mode", note="replayed"),
                 "real_models_encoder": None,
                 "real_models_reference": None,
                 "real_models_refusal": None, "real_models_findings": None, "real_models_custom_ops": None},
        coverage=("srt/models/llama.py", "srt/models/qwen2_moe.py", "srt/models/deepseek_v2.py",
                  "srt/models/qwen2_vl.py", "srt/models/gemma2.py", "srt/layers/attention/triton_backend.py",
                  "srt/speculative/eagle_draft_cuda_graph_runner.py",
                  "srt/speculative/eagle_draft_extend_cuda_graph_runner.py", "srt/lora/lora_manager.py",
                  "srt/lora/mem_pool.py", "srt/lora/layers.py", "srt/lora/lora_overlap_loader.py",
                  "srt/lora/backend/triton_backend.py",
                  "srt/lora/backend/chunked_backend.py", "srt/lora/backend/torch_backend.py",
                  "srt/multimodal/vit_cuda_graph_runner.py", "srt/model_executor/runner/eager_runner.py",
                  "srt/model_executor/cuda_graph_buffer_registry.py",
                  # the hybrid family: its model, backend wrapper and linear-attention backend, its pools
                  "srt/models/qwen3_5_text.py", "srt/layers/attention/hybrid_linear_attn_backend.py",
                  "srt/layers/attention/linear/gdn_backend.py", "srt/mem_cache/memory_pool.py",
                  # custom ops under opcheck: the registration helper every op goes through
                  "srt/utils/custom_op.py"),
    ),
    Suite(
        name="parallel_worlds",
        paths=("suites/test_parallel_worlds.py",),
        target="worlds",
        records={"parallel_worlds": Picture("world_label", "max_running_requests")},
        coverage=("srt/model_executor/runner/decode_cuda_graph_runner.py", "srt/layers/dp_attention.py",
                  "srt/managers/scheduler_components/dp_attn.py", "srt/models/qwen3.py",
                  "srt/distributed/bootstrap.py", "srt/model_executor/runner/eager_runner.py",
                  "srt/model_executor/runner/prefill_cuda_graph_runner.py"),
    ),
)


def get(name: str) -> Suite:
    for suite in SUITES:
        if suite.name == name:
            return suite
    raise KeyError(f"no suite {name!r}; the harness has {', '.join(s.name for s in SUITES)}")


def suite_of(record: dict) -> Suite | None:
    """The suite a record (an examples.jsonl or failures.jsonl line) belongs to: by its test's file, else by
    the `suite` it recorded."""
    test = record.get("test", "")
    for suite in SUITES:
        if any(test.startswith(path) for path in suite.paths) or record.get("suite") in suite.records:
            return suite
    return None


def picture(recorded: str) -> Picture | None:
    """How the report draws the examples recorded as `recorded` (None: the first two scalar drawn values)."""
    return next((s.records[recorded] for s in SUITES if s.records.get(recorded)), None)


def coverage_rows() -> dict[str, tuple[Suite, str | None, tuple[str, ...]]]:
    """Each row coverage.jsonl holds: its name -> (suite, the personality it needs or None, targeted code)."""
    rows = {}
    for suite in SUITES:
        rows[suite.name] = (suite, None, suite.coverage)
        for personality, targets in suite.personality_coverage.items():
            rows[f"{suite.name}_{personality}"] = (suite, personality, targets)
    return rows

