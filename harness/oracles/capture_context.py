"""Capture context as model code sees it: every capture answers "capturing", every eager or replayed step "not".

Layers take capture-only branches on SGLang's `get_is_capture_mode()` and on the device module's
`is_current_stream_capturing()` (`harness.models.capture_queries` logs what the tiny models were told). The
expectation comes from the case and the device, not from SGLang's flags:

- while the device has a graph capture open (its own stream-capture answer), SGLang's capture mode must be on
  where the path promises it: the decode runner captures inside `model_capture_mode()` (CUDA and NPU runners);
  the prefill runner's breakable backend through `is_in_breakable_cuda_graph()`; its full backend only for a LoRA
  server ("record LoRA kernels"); tc_piecewise and full without LoRA promise nothing;
- while the harness serves (its eager references and replays, after the target was built), both answers must be
  "not capturing": a flag left on after capture sends an eager forward down a capture-only branch.

The same holds for the compile mode SGLang tells its fused ops (`BaseFusedOp.is_torch_compile`, which picks the
forward Dynamo traces and which real layers branch on: `fp8_activation` reads it). The evidence is the state of the
compiled module's fused ops at each frame Dynamo converts (`dynamo_evidence.TraceRecorder`), and their state once
the target is built:

- decode's `patch_model` compiles with every fused op in torch.compile mode (`_to_torch`), whatever the backend;
  the NPU platform's override (`patch_model_npu`) does not switch them: npugraph_ex traces the ops' own NPU
  dispatch (`forward_npu`), so it promises nothing (`fused_compile_promised`);
- tc_piecewise with a compiler other than "eager" (Inductor pieces) does too (`_toggle_fused_ops` before the
  compile pass); with "eager" it promises nothing;
- while the harness serves, every fused op is out of it again (the pass's `finally` turns it back).
"""
from __future__ import annotations

from collections.abc import Sequence

from harness.models.capture_queries import Answer
from harness.oracles import OracleFailure

ORACLE = "capture-context"


def promised(runner: str, backend: str = "", lora: bool = False) -> bool:
    """Whether SGLang promises its capture mode on during the device's captures of this path (see above)."""
    if runner == "decode":
        return True
    return backend == "breakable" or (backend == "full" and lora)


def check(log: Sequence[Answer], *, capture_mode_promised: bool, what: str) -> dict:
    """Raise on the first answer that contradicts the phase; return counts for the record. An answer of None (a
    release without the query) is not judged."""
    captured = [a for a in log if a.stream_capturing]
    for answer in captured:
        if capture_mode_promised and answer.capture_mode is False:
            raise OracleFailure(
                ORACLE, f"{what}: SGLang's get_is_capture_mode() answered False at {answer.site} while the device "
                        "was capturing a graph (a layer would take its eager branch inside the graph)",
                query="get_is_capture_mode", site=answer.site, phase=answer.phase)
    for answer in log:
        if answer.phase == "serving" and not answer.stream_capturing and answer.capture_mode is True:
            raise OracleFailure(
                ORACLE, f"{what}: SGLang's get_is_capture_mode() answered True at {answer.site} while the harness "
                        "ran an eager or replayed step (capture mode left on after capture)",
                query="get_is_capture_mode", site=answer.site, phase=answer.phase)
    return {"asked": len(log), "during_device_capture": len(captured),
            "query": "absent" if any(a.capture_mode is None for a in log) else "get_is_capture_mode",
            "capture_mode_promised": capture_mode_promised}


def fused_compile_promised(personality: str) -> bool:
    """Whether decode's patch_model promises fused ops in compile mode while it compiles (see above)."""
    return personality != "npu"


def check_fused_ops_traced(modes: Sequence[dict[str, bool]], *, promised: bool, what: str) -> dict:
    """Where promised, every fused op was in torch.compile mode at each Dynamo trace (`modes`: one {op name:
    is_torch_compile} per trace, `dynamo_evidence.TraceRecorder.fused_modes`). Returns counts for the record."""
    if promised:
        for index, traced in enumerate(modes):
            off = sorted(name for name, on in traced.items() if not on)
            if off:
                raise OracleFailure(
                    ORACLE, f"{what}: Dynamo traced fused op(s) {off} out of torch.compile mode (trace {index + 1} "
                            f"of {len(modes)}): SGLang must switch every fused op of the compiled module to its "
                            "compile-safe forward before it compiles the module", fused_off=off, trace=index)
    return {"traces": len(modes), "fused_ops": sorted({name for traced in modes for name in traced}),
            "compile_mode_promised": promised}


def check_fused_ops_at_rest(ops: dict, *, what: str) -> None:
    """While the harness serves, none of `ops` (fused ops by name) is still in torch.compile mode."""
    left = sorted(name for name, op in ops.items() if op.is_torch_compile)
    if left:
        raise OracleFailure(
            ORACLE, f"{what}: fused op(s) {left} still in torch.compile mode while the harness serves (SGLang "
                    "must turn them back after its compile pass: an eager forward then runs the compile-safe "
                    "forward, and layers branching on is_torch_compile take their compile branch)", fused_on=left)
