"""Oracle `capture-profile`: `--enable-profile-cuda-graph` profiles the capture and leaves what the case implies.

- CUDA runner, `SGLANG_GRAPH_BATCH_CAPTURE`: one chrome trace per captured graph, named
  `{runner}_bs_{bs}[_{lora variant}]_rank0.json.gz` in `$SGLANG_TORCH_PROFILER_DIR/graph_capture_profile`, for
  bs in the capture sizes (`patch_contract.expected_sizes`) x the LoRA variants ("lora", "nolora" with
  `record_nolora_graph`, else none): e.g. sizes [2, 6] without variants give `..._bs_2_rank0.json.gz` and
  `..._bs_6_rank0.json.gz`. A draft worker's base runner prefixes its name with `Draft` (it captures the target's
  shapes, so the names would collide), where the release names runners for traces (`_profile_runner_name`).
  Without it (one unscheduled pass): no trace file (the combined trace's switch is off).
- CUDA runner, either way: allocator memory history switched on before the first capture, the snapshot dumped
  while it was on, then switched off (`harness.devices.memory_history` logs the calls); off at the end.
- NPU runner (its own profile context, `torch_npu.profiler` on torch's profiler): one trace file of the whole
  capture in that folder, and the allocator history never touched.
"""
from __future__ import annotations

import os

from harness.devices import memory_history
from harness.oracles import OracleFailure
from harness.oracles.patch_contract import expected_sizes

ORACLE = "capture-profile"
TRACE_FOLDER = "graph_capture_profile"


def expected_trace_names(case, runner_name: str) -> set[str]:
    variants = ("lora", "nolora") if case.record_nolora_graph else (None,)
    return {f"{runner_name}_bs_{bs}{'_' + v if v else ''}_rank0.json.gz"
            for bs in expected_sizes(case)[0] for v in variants}


def expected_runner_name(target) -> str:
    """The runner's name in its trace files, from the class the harness built and whether it built a draft
    worker (`targets.decode.draft.DraftWorker`)."""
    runner_class = type(target.runner)
    name = runner_class.__name__
    drafts_renamed = hasattr(runner_class, "_profile_runner_name")  # the release's marker
    if target.is_draft_worker and drafts_renamed and name == "DecodeCudaGraphRunner":
        return f"Draft{name}"
    return name


def check_capture_profile(target, profile_dir: str) -> None:
    case, folder = target.case, os.path.join(profile_dir, TRACE_FOLDER)
    written = set(os.listdir(folder)) if os.path.isdir(folder) else set()
    calls = [(c.name, c.argument, c.recording) for c in memory_history.LOG]
    if target.personality == "npu":
        traces = [name for name in written if name.endswith(".pt.trace.json")]
        if len(traces) != 1 or calls:
            raise OracleFailure(ORACLE, f"the NPU runner's capture profile: expected one trace of the whole capture "
                                f"in {folder} and no allocator history calls, found files {sorted(written)} and "
                                f"calls {calls}", files=sorted(written), memory_history=calls)
        return
    expected = expected_trace_names(case, expected_runner_name(target)) if case.switches.profile == "per_shape" \
        else set()
    if written != expected:
        raise OracleFailure(ORACLE, f"capture traces ({case.switches.profile}): expected {sorted(expected)}, found "
                            f"{sorted(written)}; missing {sorted(expected - written)}, unexpected "
                            f"{sorted(written - expected)}", expected=sorted(expected), found=sorted(written))
    problems = []
    if not calls or calls[0][0] != "record" or not calls[0][2]:
        problems.append("history was not switched on first")
    if not any(name == "dump" and on for name, _, on in calls):
        problems.append("no snapshot was dumped while history was on")
    if memory_history.recording() or not calls or calls[-1] != ("record", None, False):
        problems.append("history was left on after capture (the last call must be _record_memory_history("
                        "enabled=None))")
    if problems:
        raise OracleFailure(ORACLE, "allocator memory history around the profiled capture: " + "; ".join(problems)
                            + f" (calls: {calls})", memory_history=calls)
