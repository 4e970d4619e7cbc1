"""The graph-break oracle: a Dynamo graph break inside the piecewise compile (SGLang compiles the prefill body with
fullgraph=True) is the `graph-break` verdict naming Dynamo's reason and the user-code site; clean SGLang passes.

In process: the real `PrefillCudaGraphRunner` and `install_torch_compiled` on the virtual device, with the tiny
prefill model's layer monkeypatched to do what Dynamo cannot trace under fullgraph."""
from __future__ import annotations

import inspect

import pytest
import torch

from harness.devices import get_device
from harness.oracles import OracleFailure
from harness.oracles.graph_break import ORACLE, check
from harness.targets import prefill
from harness.targets.prefill.base import Batch, PrefillCase, Request
from harness.targets.prefill.session import PrefillSession
from harness.models import prefill_model

CASE = PrefillCase(backend="tc_piecewise", capture_tokens=(4, 8), compiler="eager")
ORIGINAL_FORWARD = prefill_model.PrefillLayer.forward


def user_graph_break(self, h, forward_batch):
    torch._dynamo.graph_break()  # the site the verdict must name
    return ORIGINAL_FORWARD(self, h, forward_batch)


def data_dependent_branch(self, h, forward_batch):
    if h.sum() > 0:  # the site the verdict must name: a branch on a tensor's value
        h = h + 0.0
    return ORIGINAL_FORWARD(self, h, forward_batch)


def _line_of(function, text: str) -> int:
    lines, first = inspect.getsourcelines(function)
    return first + next(i for i, line in enumerate(lines) if text in line)


@pytest.fixture()
def session_device():
    device = get_device("cpu")
    if not device.available:
        pytest.skip(device.skip_reason)
    prefill.load()
    PrefillSession.use_device("cpu")
    PrefillSession.close_current()
    yield
    PrefillSession.close_current()


@pytest.mark.parametrize("body, reason, marker", [
    (user_graph_break, "torch._dynamo.graph_break()", "graph_break()"),
    (data_dependent_branch, "Data-dependent branching", "h.sum() > 0"),
], ids=["graph_break-call", "data-dependent-branch"])
def test_a_graph_break_in_the_piecewise_compile_is_the_verdict(body, reason, marker, session_device, monkeypatch):
    torch._dynamo.reset()
    monkeypatch.setattr(prefill_model.PrefillLayer, "forward", body)
    with pytest.raises(OracleFailure) as raised:
        PrefillSession.get(CASE)
    failure = raised.value
    assert failure.oracle == ORACLE, failure
    assert reason in failure.details["reason"] and reason in failure.diagnosis
    site = f"{__file__}:{_line_of(body, marker)} in {body.__name__}"
    assert failure.details["site"] == site and site in failure.diagnosis, failure
    assert "tc_piecewise compile pass" in failure.diagnosis


def test_clean_sglang_compiles_the_body_whole_and_replays(session_device):
    torch._dynamo.reset()
    session = PrefillSession.get(CASE)
    session.check_capture()
    batch = Batch((Request(1, (3, 1, 4)),), _extend(), _extend())
    outcome = session.step(batch)
    assert outcome.path == "graph"


def test_a_wrapped_graph_break_is_found_and_other_errors_pass():
    """SGLang's RuntimeError wrap around a UserError (not an Unsupported subclass in torch 2.14) still yields the
    verdict, its reason named with the UserError's type; an OOM is no graph break."""
    from torch._dynamo.exc import UserError, UserErrorType

    try:
        try:
            raise UserError(UserErrorType.DYNAMIC_CONTROL_FLOW, "Dynamic control flow is not supported")
        except UserError as inner:
            raise RuntimeError("Capture prefill CUDA graph failed: ...") from inner
    except RuntimeError as wrapped:
        with pytest.raises(OracleFailure) as raised:
            check(wrapped, where="the tc_piecewise compile pass")
    assert raised.value.details["reason"] == "DYNAMIC_CONTROL_FLOW: Dynamic control flow is not supported"
    check(RuntimeError("CUDA out of memory"), where="the tc_piecewise compile pass")  # not a graph break: quiet


def _extend():
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    return ForwardMode.EXTEND
