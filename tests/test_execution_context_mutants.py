"""Mutants of SGLang for the `execution-context` oracle (`harness/oracles/execution_context.py`), in-process: a
method recompiled without its `@torch.no_grad()` by `edited`, set with pytest's MonkeyPatch (undone after).

- llama_forward_with_grad: `LlamaForCausalLM.forward` loses its decorator, so the decode runner's capture of a dense
  server runs every decoder layer with autograd on (the outputs are the same: SGLang's parameters require no grad).
- breakable_forward_with_grad: `PrefillCudaGraphRunner._run_forward` loses its decorator, so the breakable prefill
  capture, which calls the inner `layer_model.forward` and so skips the model class's decorator, runs with grad on.

Each must fail naming the phase and the layer; the same captures on clean SGLang pass.
"""
from __future__ import annotations

import pytest

from harness.devices import get_device
from harness.oracles import OracleFailure, execution_context
from harness.targets.decode.base import DecodeCase
from harness.targets.prefill.base import PrefillCase
from tests.mutant_runs import edited

pytestmark = pytest.mark.slow  # builds a real model and captures its graphs in this process


@pytest.fixture
def device():
    with get_device("cpu").install("cuda"):
        yield


def capture(kind: str) -> None:
    """Build a dense server's decode or breakable prefill runner under the oracle, then check it."""
    from harness.targets.decode.real_model import RealModelTarget
    from harness.targets.prefill.real_model import RealModelPrefillTarget

    with execution_context.watching(f"the dense family's {kind} capture") as grad:
        if kind == "decode":
            target = RealModelTarget(DecodeCase(capture_bs=(1, 2), max_running_requests=4), family="dense")
        else:
            target = RealModelPrefillTarget(PrefillCase(backend="breakable", capture_tokens=(8,)), "dense")
    assert grad.forwards, "no decoder-layer forward was recorded during the capture"
    grad.check(target.model)


def without_no_grad(monkeypatch, owner, name: str) -> None:
    decorated = getattr(owner, name)  # the no_grad wrapper: recompile what it wraps, in its own module
    monkeypatch.setattr(owner, name, edited(decorated.__wrapped__, "@torch.no_grad()\n", ""))


@pytest.mark.parametrize("kind", ["decode", "prefill"])
def test_clean_sglang_captures_without_grad(device, kind):
    capture(kind)


def test_llama_forward_with_grad_fails_the_decode_capture(device, monkeypatch):
    from sglang.srt.models.llama import LlamaForCausalLM

    without_no_grad(monkeypatch, LlamaForCausalLM, "forward")
    with pytest.raises(OracleFailure) as failure:
        capture("decode")
    assert failure.value.oracle == "execution-context"
    assert "during the dense family's decode capture" in failure.value.diagnosis
    assert "ran with autograd on (first: LlamaDecoderLayer)" in failure.value.diagnosis


def test_breakable_forward_with_grad_fails_the_prefill_capture(device, monkeypatch):
    from sglang.srt.model_executor.runner.prefill_cuda_graph_runner import PrefillCudaGraphRunner

    without_no_grad(monkeypatch, PrefillCudaGraphRunner, "_run_forward")
    with pytest.raises(OracleFailure) as failure:
        capture("prefill")
    assert "during the dense family's prefill capture" in failure.value.diagnosis
    assert "ran with autograd on (first: LlamaDecoderLayer)" in failure.value.diagnosis
