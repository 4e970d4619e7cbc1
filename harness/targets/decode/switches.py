"""The decode runner's switches a user sets beside the capture config, one drawn value of a case:
`--enable-profile-cuda-graph` (with `SGLANG_GRAPH_BATCH_CAPTURE`: one trace per captured shape), the metadata
glue graph (`SGLANG_ENABLE_METADATA_GLUE_GRAPH`, with `SGLANG_OPT_SKIP_GLUED_REPLAY_VIEW`), the replay log
(`SGLANG_LOG_DECODE_GRAPH_KEY`), a DSPARK target verify runner's metadata glue and pre-planned input skip
(`SGLANG_OPT_DSV41_TARGET_VERIFY_METADATA_GLUE`, `SGLANG_OPT_DSV41_DSPARK_SKIP_PREFILLED_INPUTS`), the model's
architecture (the NPU runner picks its seq-len update by it), `--moe-dense-tp-size 1` (the gathered DP-attention
buffers, on one rank), a model reading mRoPE positions (a VLM's decode: `ForwardBatch.mrope_positions`, staged
through the runner's buffer registry) and the overlap plan stream (`SGLANG_ENABLE_OVERLAP_PLAN_STREAM`, under which
the NPU runner re-copies a pre-planned batch's mRoPE positions), PD-multiplexing (`--enable-pdmux`: a graph set
and a decode backend per SM group, `pdmux.py`), DeepSeek-V4.1's candidate graph variants and its early target
verify metadata (`SGLANG_OPT_DSV41_TARGET_METADATA_EARLY`, `dsv41.py`).
`environment()` sets them for one example; `missing()` names what the installed release lacks."""
from __future__ import annotations

import contextlib
import dataclasses
import inspect
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from typing import Any

from unittest import mock

PROFILE_MODES = (None, "single", "per_shape")  # per_shape: SGLANG_GRAPH_BATCH_CAPTURE
DEFAULT_ARCHITECTURE = "HarnessDecodeModel"


@dataclasses.dataclass(frozen=True)
class RunnerSwitches:
    profile: str | None = None  # PROFILE_MODES
    metadata_glue: bool = False
    skip_glued_view: bool = False  # with metadata_glue
    log_graph_key: bool = False
    architecture: str = DEFAULT_ARCHITECTURE
    dp_gather: bool = False  # --moe-dense-tp-size 1: the runner's gathered DP buffers (require_attn_tp_gather)
    dspark_verify_glue: bool = False  # a DSPARK target verify runner's own metadata glue switch
    glue_declined: bool = False  # with dspark_verify_glue: the attention backend declares no host-free verify prep
    skip_prefilled: bool = False  # a DSPARK target verify runner skips re-copying pre-planned input_ids / positions
    draft_glue: bool = False  # a draft runner's metadata glue (no switch: on where its backend declares it)
    mrope: bool = False  # the model reads mRoPE positions ([3, tokens]); the batches carry them
    overlap_plan_stream: bool = False  # SGLANG_ENABLE_OVERLAP_PLAN_STREAM
    pdmux_groups: int = 0  # --enable-pdmux --sm-group-num N: N stream groups, a decode graph set and backend each
    # DeepSeek-V4.1's candidate-indexer graph variants (`dsv41.py`): the text config's candidate span in tokens
    # (0: off), and its target verify metadata staged early beside the draft (SGLANG_OPT_DSV41_TARGET_METADATA_EARLY)
    dsv41_span: int = 0
    early_verify: bool = False

    def server_flags(self) -> dict[str, Any]:
        """The server arguments these switches set (pdmux with what SGLang's validation requires beside it)."""
        if not self.pdmux_groups:
            return {}
        return dict(enable_pdmux=True, sm_group_num=self.pdmux_groups, chunked_prefill_size=-1,
                    disable_overlap_schedule=True)

    def environment_variables(self) -> dict[str, str]:
        """The SGLang environment variables these switches set (each to "1")."""
        names = [("SGLANG_GRAPH_BATCH_CAPTURE", self.profile == "per_shape"),
                 ("SGLANG_ENABLE_METADATA_GLUE_GRAPH", self.metadata_glue),
                 ("SGLANG_OPT_SKIP_GLUED_REPLAY_VIEW", self.metadata_glue and self.skip_glued_view),
                 ("SGLANG_LOG_DECODE_GRAPH_KEY", self.log_graph_key),
                 ("SGLANG_OPT_DSV41_TARGET_VERIFY_METADATA_GLUE", self.dspark_verify_glue),
                 ("SGLANG_OPT_DSV41_DSPARK_SKIP_PREFILLED_INPUTS", self.skip_prefilled),
                 ("SGLANG_ENABLE_OVERLAP_PLAN_STREAM", self.overlap_plan_stream),
                 ("SGLANG_OPT_DSV41_TARGET_METADATA_EARLY", self.early_verify)]
        return {name: "1" for name, on in names if on}

    def missing(self, runner_module: str) -> str | None:
        """Why the installed release cannot run these switches (naming the release and the missing name), or None."""
        from harness.targets.sglang_plumbing import load
        from harness.versions import module_exists, sglang_version

        if self == RunnerSwitches():
            return None
        if self.pdmux_groups:
            from harness.targets.decode.pdmux import missing as pdmux_missing

            reason = pdmux_missing()
            if reason:
                return reason
        if not module_exists(runner_module) or not runner_module.endswith("decode_cuda_graph_runner"):
            return (f"SGLang {sglang_version()} has no sglang.srt.model_executor.runner.decode_cuda_graph_runner: "
                    "its runner switches are not driven")
        from sglang.srt.environ import envs

        for name in self.environment_variables():
            if not hasattr(envs, name):
                return f"SGLang {sglang_version()} has no environment switch {name} (sglang.srt.environ.envs)"
        if self.dsv41_span:
            from harness.targets.decode.dsv41 import missing as dsv41_missing

            reason = dsv41_missing()
            if reason:
                return reason
        if self.dp_gather:  # the scheduler's MLP-sync verdict the batch carries (0.5.14 has none)
            from sglang.srt.model_executor.forward_batch_info import ForwardBatch

            if "can_run_decode_cuda_graph" not in getattr(ForwardBatch, "__dataclass_fields__", {}):
                return f"SGLang {sglang_version()} has no ForwardBatch.can_run_decode_cuda_graph: no DP fields driven"
        if self.mrope and "mrope_positions" not in inspect.getsource(load(runner_module)):
            return f"SGLang {sglang_version()}: {runner_module} has no mrope_positions staging"
        if self.draft_glue and not hasattr(load(runner_module, "DecodeCudaGraphRunner"), "_glues_draft_metadata"):
            return f"SGLang {sglang_version()} has no DecodeCudaGraphRunner._glues_draft_metadata: no draft glue"
        # the metadata-glue oracle counts the glue's replays (0.5.19's glue keeps no count)
        if self.metadata_glue or self.dspark_verify_glue or self.draft_glue:
            from sglang.srt.model_executor.runner.metadata_glue_graph import MetadataGlueGraph

            if "self.replays" not in inspect.getsource(MetadataGlueGraph.__init__):
                return f"SGLang {sglang_version()} has no MetadataGlueGraph.replays: its glued replays are not counted"
        return None

    @contextlib.contextmanager
    def environment(self) -> Iterator[str | None]:
        """The switches' environment for the block; yields the profiler directory (`SGLANG_TORCH_PROFILER_DIR`,
        fresh and removed after) when profiling, else None. Variables the switches leave off are unset."""
        off = {name: None for name in RunnerSwitches(profile="per_shape", metadata_glue=True, skip_glued_view=True,
                                                     log_graph_key=True, dspark_verify_glue=True,
                                                     skip_prefilled=True, overlap_plan_stream=True,
                                                     early_verify=True).environment_variables()}
        values = {**off, **self.environment_variables(), "SGLANG_ENABLE_CUDA_GRAPH_CAPTURE_TRACE": None}
        folder = tempfile.mkdtemp(prefix="harness-profile-") if self.profile else None
        if folder:
            values["SGLANG_TORCH_PROFILER_DIR"] = folder
        try:
            with mock.patch.dict(os.environ, {k: v for k, v in values.items() if v is not None}), \
                    self._stream_groups(), self._device_capability():
                for name in [k for k, v in values.items() if v is None]:
                    os.environ.pop(name, None)
                yield folder
        finally:
            if folder:
                shutil.rmtree(folder, ignore_errors=True)

    def _device_capability(self) -> contextlib.AbstractContextManager:
        """With DeepSeek-V4.1's variants, the device facts SGLang asks before it builds them, answered as a Blackwell
        GPU would (`dsv41.on_blackwell`)."""
        if not self.dsv41_span:
            return contextlib.nullcontext()
        from harness.targets.decode.dsv41 import on_blackwell

        return on_blackwell()

    def _stream_groups(self) -> contextlib.AbstractContextManager:
        """Under pdmux, SGLang's stream groups (`pdmux.groups`), made before the runner reads them."""
        if not self.pdmux_groups:
            return contextlib.nullcontext()
        from harness.targets.decode.pdmux import groups

        return groups(self.pdmux_groups)


def elastic_drop() -> Callable[[Any], None] | str:
    """SGLang's elastic-EP graph reset as a function of a target (the runner's backend cleaned up, the shared
    graph pool released), or why the installed SGLang has none."""
    from harness.versions import module_exists, sglang_version

    module = "sglang.srt.model_executor.model_runner_components.cuda_graph_setup"
    if not module_exists(module):
        return f"SGLang {sglang_version()} has no {module}: no elastic EP graph reset"
    import importlib

    drop = getattr(importlib.import_module(module), "drop_elastic_cuda_graph_state", None)
    if drop is None:
        return f"SGLang {sglang_version()} has no {module}.drop_elastic_cuda_graph_state"
    return lambda target: drop(decode_runner=target.runner, eager_runner=None)
