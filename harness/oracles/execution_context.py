"""Oracle `execution-context`: every forward SGLang makes of a model's layers while it builds a server (warm-up,
graph capture) runs with autograd off.

SGLang's model classes decorate their outer `forward` with `@torch.no_grad()`, and where a runner calls an inner
module directly (the breakable prefill graph captures `layer_model.forward`, skipping that decorator) it applies the
decorator itself (`PrefillCudaGraphRunner._run_forward`). Capture happens when the `ModelRunner` is built, outside
the scheduler's `@torch.no_grad()` event loop, so nothing else turns autograd off there. A forward with grad on
builds autograd state the graphs never use (memory held per captured size), and a compiled MoE kernel that writes
`out=` fails Dynamo ("out= doesn't support autograd"); with SGLang's parameters requiring no grad the outputs are
the same, so no output comparison can see it. The oracle records, through PyTorch's global module hook
(`torch.nn.modules.module.register_module_forward_pre_hook`), the grad mode at each forward of a decoder layer
(a module whose class name ends in `DecoderLayer`, SGLang's naming) while the harness builds a target, and fails on
the first made with grad on, naming the layer and how many such forwards there were.
"""
from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

from harness.oracles import OracleFailure

ORACLE = "execution-context"
# Model classes whose own forward breaks the rule on the installed SGLang (a strict-xfail finding in the real-model
# suite, which sets HOLD_FINDINGS); elsewhere their servers are not held to it, so the rest stays checked
FINDINGS = {"Qwen2VLForConditionalGeneration": "SGLang's Qwen2-VL forward has no @torch.no_grad() (Qwen2.5-VL's "
                                               "and Qwen3-VL's have it)"}
HOLD_FINDINGS = False


class GradModeLog:
    """What `watching` saw: per decoder-layer forward, (layer class, grad enabled, inference mode)."""

    def __init__(self, phase: str) -> None:
        self.phase = phase
        self.forwards: list[tuple[str, bool, bool]] = []

    def check(self, model=None) -> None:
        """`model`: the served model, whose class may be a known finding (`FINDINGS`)."""
        if type(model).__name__ in FINDINGS and not HOLD_FINDINGS:
            return
        with_grad = [name for name, grad, _ in self.forwards if grad]
        if with_grad:
            raise OracleFailure(ORACLE, f"during {self.phase}, {len(with_grad)} of {len(self.forwards)} decoder-layer "
                                f"forward(s) ran with autograd on (first: {with_grad[0]}); SGLang runs every "
                                "forward of a server under torch.no_grad (its model classes' forward, the breakable "
                                "runner's _run_forward)", layers=sorted(set(with_grad)), forwards=len(self.forwards))


@contextlib.contextmanager
def watching(phase: str) -> Iterator[GradModeLog]:
    """Record the grad mode of every decoder-layer forward inside the block (`phase` names it in a failure);
    call `check()` on what it yields once the block is done."""
    log = GradModeLog(phase)

    def record(module, _args) -> None:
        if torch.compiler.is_compiling():  # Dynamo tracing the forward: the compiled code's run is recorded
            return
        name = type(module).__name__
        if name.endswith("DecoderLayer"):
            log.forwards.append((name, torch.is_grad_enabled(), torch.is_inference_mode_enabled()))

    handle = torch.nn.modules.module.register_module_forward_pre_hook(record)
    try:
        yield log
    finally:
        handle.remove()
