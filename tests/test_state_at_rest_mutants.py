"""Mutants of SGLang for the `state-at-rest` oracle (`harness/oracles/state_at_rest.py`), in-process (MonkeyPatch,
undone after), on the dense family's decode runner captured with `--enable-torch-compile` (a fresh model) and on
the closed-form decode model shared across examples (a warm one):

- restore_stops_at_the_top: `_to_torch(reverse=True)` restores only the model's direct children, so every fused op
  deeper down (RMSNorm, SiluAndMul, the rotary embedding) stays in torch.compile mode after `patch_model` leaves;
- leave_keeps_compile_mode: `BaseFusedOp.leave_torch_compile` restores the dispatch but not `is_torch_compile`.

On a CPU an op's compile forward and its resolved forward are both `forward_native`, so eager after either mutant
equals eager before it: only the op's state shows it. Each must fail naming the module, the attribute and both
values; the same captures on clean SGLang pass. The oracle's rules on hand-made state beside them.
"""
from __future__ import annotations

import dataclasses

import pytest
import torch

from harness.devices import get_device
from harness.oracles import OracleFailure, state_at_rest
from harness.targets.decode.base import DecodeCase
from tests.mutant_runs import edited

COMPILED = DecodeCase(capture_bs=(1, 2), max_running_requests=4, enable_torch_compile=True,
                      compile_backend="aot_eager", torch_compile_max_bs=2)
DECORATION = "sglang.srt.compilation.torch_compile_decoration"


@pytest.fixture
def device(monkeypatch):
    """The virtual device, and model caches of this test's own: a mutant's capture leaves its model changed, and
    both the suites (`real_model._MODELS`, a model per family and process) and SGLang (`get_rope`'s `_ROPE_DICT`:
    one rotary embedding per configuration, shared by every model of the process) keep what it changed."""
    from sglang.srt.layers.rotary_embedding import factory

    from harness.targets.decode import real_model

    monkeypatch.setattr(real_model, "_MODELS", {})
    monkeypatch.setattr(factory, "_ROPE_DICT", {})
    device = get_device("cpu")
    device.reset()
    with device.install("cuda"):
        yield


def capture_dense(case: DecodeCase = COMPILED) -> None:
    from harness.targets.decode.base import fresh_dynamo_when_compiler_changes
    from harness.targets.decode.real_model import RealModelTarget

    fresh_dynamo_when_compiler_changes(case, "cuda")
    torch._dynamo.reset()
    RealModelTarget(case, family="dense")


def restore_stops_at_the_top(monkeypatch) -> None:
    import importlib

    module = importlib.import_module(DECORATION)
    recurse = "if isinstance(sub, torch.nn.Module):"
    monkeypatch.setattr(module, "_to_torch", edited(module._to_torch, recurse, recurse[:-1] + " and not reverse:"))


def leave_keeps_compile_mode(monkeypatch) -> None:
    from sglang.kernels.fused_op import BaseFusedOp

    monkeypatch.setattr(BaseFusedOp, "leave_torch_compile", edited(
        BaseFusedOp.leave_torch_compile, "self.is_torch_compile = False", "pass"))


@pytest.mark.slow
def test_clean_sglang_compiled_capture_leaves_state_at_rest(device):
    capture_dense()


@pytest.mark.slow
@pytest.mark.parametrize("model_state", ["fresh", "warm"])
@pytest.mark.parametrize("mutant", [restore_stops_at_the_top, leave_keeps_compile_mode])
def test_dispatch_left_in_compile_mode_fails_the_capture(device, monkeypatch, mutant, model_state):
    """Fresh: the mutant's capture is the model's first. Warm: a capture without torch.compile ran on the model
    first (its warm-up resolved the fused ops' dispatch), as a process's second example finds it."""
    if model_state == "warm":
        capture_dense(dataclasses.replace(COMPILED, enable_torch_compile=False))
    mutant(monkeypatch)
    with pytest.raises(OracleFailure) as failure:
        capture_dense()
    assert failure.value.oracle == "state-at-rest"
    assert "the decode runner's capture of [1, 2] with torch.compile left" in failure.value.diagnosis
    assert f"on a {model_state} model" in failure.value.diagnosis
    assert "model.model.layers.0.input_layernorm.is_torch_compile: False before, True after" \
        in failure.value.details["changed"]


# -- the rules, on hand-made state --------------------------------------------------------------------------------
class Op(torch.nn.Module):
    """A fused op's dispatch state as SGLang's BaseFusedOp keeps it."""

    def __init__(self) -> None:
        super().__init__()
        self.is_torch_compile = False
        self._forward_method = None

    def forward_native(self, x):
        return x

    def forward_other(self, x):
        return x

    def _resolve_forward_method(self):
        return self.forward_native


def model() -> torch.nn.Module:
    return torch.nn.Sequential(Op(), torch.nn.Sequential(Op()))


def test_a_lazy_dispatch_may_resolve_to_its_own_forward_only():
    net = model()
    with state_at_rest.watching(net, "a pass"):
        net[1][0]._forward_method = net[1][0].forward_native
    with pytest.raises(OracleFailure) as failure, state_at_rest.watching(net, "a pass"):
        net[0]._forward_method = net[0].forward_other
    assert "model.0._forward_method: None before, <bound Op.forward_other> after" in failure.value.diagnosis
    warm = model()
    warm[0]._forward_method = warm[0].forward_other
    warm[1][0]._forward_method = warm[1][0].forward_native
    with pytest.raises(OracleFailure) as failure, state_at_rest.watching(warm, "a pass"):
        warm[0]._forward_method = warm[0].forward_native
    assert "on a warm model" in failure.value.diagnosis


def test_a_forward_installed_by_sglang_is_kept_any_other_is_not():
    def install_torch_compiled(module):
        def trampoline(self, x):
            return x
        module.forward = trampoline.__get__(module)

    net = model()
    with state_at_rest.watching(net, "a pass"):
        install_torch_compiled(net[1])
    with pytest.raises(OracleFailure) as failure, state_at_rest.watching(net, "a pass"):
        net[0].forward = net[0].forward_other
    assert "model.0.forward: '<absent>' before, <bound Op.forward_other> after" in failure.value.diagnosis


def test_process_state_left_changed_is_named():
    with pytest.raises(OracleFailure) as failure, state_at_rest.watching(model(), "a pass"):
        torch.set_default_dtype(torch.float64)
    torch.set_default_dtype(torch.float32)
    assert "torch.get_default_dtype(): torch.float32 before, torch.float64 after" in failure.value.diagnosis
