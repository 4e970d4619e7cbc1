"""The dynamo-contract oracle (`harness/oracles/dynamo_evidence.py`) on SGLang's real compile glue, in process.

Prefill: the real `PrefillCudaGraphRunner` compiles the tiny body through `install_torch_compiled` on the virtual
device; the oracle reads the graph Dynamo handed SGLang's backend. Decode: the real `DecodeCudaGraphRunner`
compiles 9 sizes (one over Dynamo's default recompile limit) through `patch_model`. Each mutant is a text edit of
one function of the installed SGLang, compiled in SGLang's own module namespace and monkeypatched in (where a
module imported it by value, there too), undone after the test:
- mrope_axis_zero: `_runtime_dynamic_dim_for_argument` returns axis 0 for mRoPE positions (their constant axis);
- strict_marking: `_mark_dynamic_on_value` calls `mark_dynamic` for `maybe_mark_dynamic`;
- string_annotations_ignored: `_infer_dynamic_arg_dims_from_annotations` drops its string-annotation branch;
- limit_not_raised: `set_torch_compile_config` no longer raises Dynamo's recompile limits.
"""
from __future__ import annotations

import inspect
import sys
import textwrap

import pytest

from tests.prefill_sessions import cpu_prefill_layout
import torch

from harness.devices import get_device
from harness.errors import PathMissing
from harness.oracles import OracleFailure
from harness.oracles.dynamo_evidence import (
    ORACLE, BudgetWatcher, check_annotations_accepted, check_symbolic_axes, limit_hits,
)
from harness.oracles.patch_contract import expected_sizes
from harness.targets import decode
from harness.targets.prefill.base import PrefillCase, body_forward
from harness.targets.prefill.session import PrefillSession

pytestmark = pytest.mark.slow  # drives SGLang's compile or capture in this process: seconds a test

COMPILE = "sglang.srt.compilation.compile"
DECORATION = "sglang.srt.compilation.torch_compile_decoration"
TEXT = PrefillCase(backend="tc_piecewise", capture_tokens=(4, 8), compiler="eager")
MROPE = PrefillCase(backend="tc_piecewise", capture_tokens=(4, 8), compiler="eager", multimodal=True)
STRINGS = PrefillCase(backend="tc_piecewise", capture_tokens=(4, 8), compiler="eager", body="deepstack")


def mutate(monkeypatch, module_name: str, function: str, old: str, new: str) -> None:
    """Replace `old` by `new` (every occurrence) in the source of SGLang's `module_name.function` and bind the result
    wherever the original is bound in SGLang's modules; skip, naming the edit, where it does not apply."""
    module = sys.modules.get(module_name) or __import__(module_name, fromlist=["_"])
    original = getattr(module, function)
    source = textwrap.dedent(inspect.getsource(original))
    if old not in source:
        pytest.skip(f"mutant does not apply: {module_name}.{function} has no {old!r}")
    namespace: dict = {}
    exec(compile(source.replace(old, new), inspect.getsourcefile(module), "exec"), vars(module), namespace)
    for name, holder in list(sys.modules.items()):
        if name.startswith("sglang.") and getattr(holder, function, None) is original:
            monkeypatch.setattr(holder, function, namespace[function])


@pytest.fixture()
def prefill_sessions():
    cpu_prefill_layout()
    yield lambda case: PrefillSession.get(case)
    PrefillSession.close_current()


def contract(session: PrefillSession, *, one_trace: bool = True) -> dict:
    return check_symbolic_axes(session.compile_traces.traces, what=f"the {session.case.body} body",
                               sizes=session.expected_sizes, one_trace=one_trace)


def test_clean_sglang_marks_the_token_axes(prefill_sessions):
    """Text body: input_ids, positions [T] and forward_batch.out_cache_loc dynamic on axis 0, one trace; the
    mRoPE body: positions [3, T] on axis 1 (its second trace is the stride finding of the prefill suite)."""
    checked = contract(prefill_sessions(TEXT))
    assert checked["dynamic_axes"] == {"L['input_ids']": [0], "L['positions']": [0],
                                       "L['forward_batch'].out_cache_loc": [0]}, checked
    checked = contract(prefill_sessions(MROPE), one_trace=False)
    assert checked["dynamic_axes"]["L['positions']"] == [1], checked


def test_mrope_axis_zero_is_named(prefill_sessions, monkeypatch):
    mutate(monkeypatch, COMPILE, "_runtime_dynamic_dim_for_argument",
           "return -1 if name in _MROPE_TOKEN_AXIS_ARGUMENTS else 0", "return 0")
    with pytest.raises(OracleFailure) as raised:
        contract(prefill_sessions(MROPE), one_trace=False)
    failure = raised.value
    assert failure.oracle == ORACLE and failure.details["source"] == "L['positions']", failure
    assert failure.details["marked"] == [0] and failure.details["promised"] == [1], failure
    assert "`L['positions']` (sizes [3, 8] at the trace): SGLang marked axes [0] dynamic where SGLang promises " \
        "axes [1]" in failure.diagnosis, failure


def test_strict_marking_is_named(prefill_sessions, monkeypatch):
    mutate(monkeypatch, COMPILE, "_mark_dynamic_on_value", "torch._dynamo.maybe_mark_dynamic(",
           "torch._dynamo.mark_dynamic(")
    with pytest.raises(OracleFailure) as raised:
        contract(prefill_sessions(TEXT))
    failure = raised.value
    assert failure.oracle == ORACLE and failure.details["strict"] == [0], failure
    assert "strictly (torch._dynamo.mark_dynamic)" in failure.diagnosis and failure.details["source"] in (
        "L['input_ids']", "L['positions']", "L['forward_batch'].out_cache_loc"), failure


def test_string_annotations_are_served(prefill_sessions):
    checked = contract(prefill_sessions(STRINGS))
    assert checked["dynamic_axes"]["L['input_ids']"] == [0], checked


def test_string_annotations_ignored_is_a_refusal_verdict(prefill_sessions, monkeypatch):
    mutate(monkeypatch, COMPILE, "_infer_dynamic_arg_dims_from_annotations",
           'elif ann == "torch.Tensor" or ann == "Optional[torch.Tensor]":', "elif False:")
    with pytest.raises(ValueError) as refused:
        prefill_sessions(STRINGS)
    with pytest.raises(OracleFailure) as raised:
        check_annotations_accepted(body_forward(STRINGS), refused.value, what="the deepstack body")
    failure = raised.value
    assert failure.oracle == ORACLE and "input_ids" in failure.details["annotated"], failure
    assert "'torch.Tensor'" in failure.diagnosis and "must infer their dynamic dims" in failure.diagnosis, failure


def test_a_body_without_tensor_annotations_may_be_refused():
    def forward(self, input_ids, positions, forward_batch):
        return input_ids

    check_annotations_accepted(forward, ValueError("No dynamic dims inferred"), what="an unannotated body")


# -- decode: the recompile budget ----------------------------------------------------------------------------
NINE = decode.DecodeCase(capture_bs=tuple(range(1, 10)), max_running_requests=9, enable_torch_compile=True,
                         torch_compile_max_bs=9)


@pytest.fixture()
def decode_runs():
    try:
        layout = decode.load()
    except PathMissing as missing:
        pytest.skip(str(missing))
    device = get_device("cpu")
    if not device.available:
        pytest.skip(device.skip_reason)

    def run(case):
        device.reset()
        decode.fresh_dynamo_when_compiler_changes(case, "cuda")
        budget = BudgetWatcher()
        with device.capture_mode("rerun"):
            target = layout.make_target(case, personality="cuda", device=device.torch_device)
        budget.note_limits()
        return budget.check(expected_sizes(target.case)[1])

    with device.install("cuda"):
        yield run
    torch._dynamo.reset()  # a frame that hit a limit runs uncompiled for good: no later test may inherit it


def test_clean_sglang_compiles_nine_sizes_within_the_limit(decode_runs):
    checked = decode_runs(NINE)
    assert checked["compiled_sizes"] == 9 and checked["recompile_limit"] >= 9 and not checked["limit_hits"]


def test_limit_not_raised_is_named(decode_runs, monkeypatch):
    torch._dynamo.reset()
    monkeypatch.setattr(torch._dynamo.config, "recompile_limit", 8)  # Dynamo's defaults, restored after
    monkeypatch.setattr(torch._dynamo.config, "accumulated_recompile_limit", 256)
    mutate(monkeypatch, DECORATION, "set_torch_compile_config",
           "torch._dynamo.config.accumulated_cache_size_limit = 1024\n    if hasattr(torch._dynamo.config, "
           "\"cache_size_limit\"):\n        torch._dynamo.config.cache_size_limit = 1024\n", "")
    hits = limit_hits()
    with pytest.raises(OracleFailure) as raised:
        decode_runs(NINE)
    failure = raised.value
    assert failure.oracle == ORACLE and failure.details["limit"] == "recompile_limit", failure
    assert "torch._dynamo.config.recompile_limit in force is 8" in failure.diagnosis, failure
    assert limit_hits() > hits, "Dynamo did not hit the limit: the mutant's consequence was not reproduced"


def test_a_limit_hit_during_the_run_fails(monkeypatch):
    """The second evidence: a frame that hits the limit while the case's own sizes fit (sizes compiled before
    share the frame's cache), seen in Dynamo's counters."""
    torch._dynamo.reset()
    monkeypatch.setattr(torch._dynamo.config, "recompile_limit", 2)
    budget = BudgetWatcher()

    def forward(x):
        return x + 1

    for size in (1, 2, 3):
        torch.compile(forward, backend="eager", dynamic=False)(torch.ones(size))
    with pytest.raises(OracleFailure) as raised:
        budget.check([2, 3], what="a test frame")
    assert raised.value.details["hits"] == 1 and "hit a recompile limit" in raised.value.diagnosis
    torch._dynamo.reset()
