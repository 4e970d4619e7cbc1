"""Decode layout of SGLang 0.5.14 and later (and main trees from May 2026): `DecodeCudaGraphRunner` in
`srt/model_executor/runner/`, config through `CudaGraphConfig` published with `runtime_context` (or, on trees
without it, as the scheduler's global server args), `patch_model` in `compilation/torch_compile_decoration.py`."""
from __future__ import annotations

import contextlib
import inspect
from typing import Any
from unittest import mock

from harness.errors import PathMissing
from harness.targets.decode.base import DecodeCase, DecodeTarget, Layout
from harness.targets.decode.glue import GLUE_BACKEND_FOR_ROLE
from harness.targets.sglang_plumbing import (
    can_publish_config, forward_context, forward_context_takes_batch, load, publish_server_args,
)
from harness.versions import module_exists, sglang_version

RUNNER_MODULE = "sglang.srt.model_executor.runner.decode_cuda_graph_runner"
CONFIG_MODULE = "sglang.srt.model_executor.cuda_graph_config"


def speculative_args(case: DecodeCase) -> dict:
    """The server arguments of speculative decoding, as a user passes them."""
    if case.spec is None:
        return {}
    return dict(speculative_algorithm=case.spec.algorithm, speculative_draft_model_path="dummy",
                speculative_num_steps=case.spec.num_steps, speculative_eagle_topk=case.spec.topk,
                speculative_num_draft_tokens=case.spec.num_draft_tokens,
                **({"speculative_use_rejection_sampling": True} if case.spec.rejection_sampling else {}),
                **({"speculative_draft_window_size": case.spec.draft_window} if case.spec.draft_window else {}),
                **({"speculative_draft_sink_size": case.spec.draft_sink} if case.spec.draft_sink is not None else {}))


class Target(DecodeTarget):
    def server_args(self, case: DecodeCase, device: str) -> Any:
        from sglang.srt.model_executor.cuda_graph_config import CudaGraphConfig, PhaseConfig
        from sglang.srt.server_args import ServerArgs

        return ServerArgs(
            model_path="dummy", device=device,
            cuda_graph_config=CudaGraphConfig(decode=PhaseConfig(backend="full", bs=list(case.capture_bs)),
                                              **self.prefill_phase(case)),
            enable_torch_compile=case.enable_torch_compile, torch_compile_max_bs=case.torch_compile_max_bs,
            max_running_requests=case.max_running_requests, disable_cuda_graph_padding=case.disable_padding,
            enable_profile_cuda_graph=case.switches.profile is not None, **speculative_args(case),
            **({"moe_dense_tp_size": 1} if case.switches.dp_gather else {}), **case.switches.server_flags(),
            **self.server_flags(case))

    def server_flags(self, case: DecodeCase) -> dict[str, Any]:
        """Further server flags a target sets for its case (none here)."""
        return {}

    def prefill_phase(self, case: DecodeCase) -> dict[str, Any]:
        """The prefill phase's `PhaseConfig`, as `{"prefill": ...}`, where a target captures prefill graphs too
        (none here: the release's default, which off CUDA is disabled)."""
        return {}

    def attention_backend_for(self, case: DecodeCase):
        """With the metadata glue graph, a double whose prep the glue can capture (`glue.py`)."""
        switches = case.switches
        glue = switches.metadata_glue or (switches.dspark_verify_glue and not switches.glue_declined) or \
            switches.draft_glue
        if not glue:
            return self.attention_backend_class
        return GLUE_BACKEND_FOR_ROLE["draft" if switches.draft_glue else "target"]

    def publish_config(self, case: DecodeCase, device: str) -> Any:
        server_args = self.server_args(case, device)
        if not publish_server_args(server_args, self.world_rank):
            # Without runtime_context the runner decides on LoRA from `server_args.enable_lora`; set past the
            # parser, which would want adapter paths.
            server_args.enable_lora = bool(case.lora)
        return server_args

    def construction_patches(self):
        """Where SGLang's `resolve_decode_backend` picks the NPU graph backend by `model_runner.device == "npu"`
        alone (0.5.1x, main trees; 0.5.2x asks the platform, which the npu personality answers), the model-runner
        double reports device "npu" while that resolver runs, and only then."""
        runner_module = load(RUNNER_MODULE)
        original = getattr(runner_module, "resolve_decode_backend", None)
        if self.personality != "npu" or original is None or \
                "get_full_graph_backend_cls" in inspect.getsource(original):
            return contextlib.nullcontext()

        def resolve_decode_backend(cuda_graph_runner):
            with mock.patch.object(cuda_graph_runner.model_runner, "device", "npu"):
                return original(cuda_graph_runner)

        return mock.patch.object(runner_module, "resolve_decode_backend", resolve_decode_backend)

    def replay_context(self):
        """Up to 0.5.1x (whose `forward_context` takes no batch) `ModelRunner._forward_raw` wraps `execute` in a
        forward context with the runner's attention backend; from 0.5.2x the runner's `run_once` enters its own."""
        from sglang.srt.model_executor.forward_context import has_forward_context

        if forward_context_takes_batch() or has_forward_context():
            return contextlib.nullcontext()
        return forward_context(self.model_runner.attn_backend)

    def eager_context(self, fb):
        return forward_context(self.eager_attn_backend, fb)


LAYOUT = Layout(
    name="0.5.14+ (srt/model_executor/runner/...)",
    runner_module=RUNNER_MODULE,
    runner_class="DecodeCudaGraphRunner",
    decoration_module="sglang.srt.compilation.torch_compile_decoration",
    npu_runner_module="sglang.srt.hardware_backend.npu.graph_runner.npu_graph_runner",
    npu_runner_class="NPUGraphRunner",
    target_class=Target,
)


def detect() -> Layout | None:
    """This layout when the installed SGLang has it (PathMissing when it has it only in part), else None."""
    if not module_exists(RUNNER_MODULE):
        return None
    if not (module_exists(CONFIG_MODULE) and can_publish_config()):
        raise PathMissing(f"SGLang {sglang_version()} has the 0.5.14+ decode runner but neither "
                          "runtime_context.publish nor server_args.set_global_server_args_for_scheduler to publish "
                          "config through")
    return LAYOUT
