"""Expected errors are derived and audited: every `expected-error` verdict names the rule that predicted it from
the case before the run, a refusal no rule predicted fails, and a predicted refusal SGLang does not make fails;
the summary counts expected errors per rule and their share of each suite's examples. In-process: SGLang's real
`build_torch_compile_kwargs` and real prefill runner constructor, a rule or a construction check monkeypatched."""
from __future__ import annotations

import json

import pytest

from tests.prefill_sessions import cpu_prefill_layout

from harness import record
from harness.errors import HarnessError
from harness.models.small import ModuleSpec
from harness.oracles import OracleFailure
from harness.targets.prefill import Batch, PrefillCase, Request, admission

SMALL = ModuleSpec("mlp", 2, 8, "float32")


@pytest.fixture
def records(tmp_path, monkeypatch):
    """Records of the examples this test runs, in tmp_path/examples.jsonl (the run's own sink restored after)."""
    monkeypatch.setattr(record, "_sink", record.Sink(path=tmp_path / "examples.jsonl"))
    return lambda: record.read_records(tmp_path / "examples.jsonl")


# -- the audit itself ---------------------------------------------------------------------------------------
def test_predicted_refusal_is_expected_error_with_its_rule(records):
    with record.example("s", x=1) as ex:
        ex.audit_refusal(("some-rule", "the case says no"), refused="SGLang: no", oracle="admission", what="x")
    [row] = records()
    assert row["verdict"] == "expected-error" and row["expected_rule"] == "some-rule"
    assert row["diagnosis"].startswith("the case says no: SGLang refused it (SGLang: no")


def test_unpredicted_refusal_and_unmade_refusal_fail(records):
    with pytest.raises(OracleFailure) as raised, record.example("s", x=1) as ex:
        ex.audit_refusal(None, refused="SGLang: no", oracle="admission", what="a DECODE batch")
    assert raised.value.oracle == "admission"
    assert "SGLang refused a case the rules call valid: a DECODE batch: SGLang: no" in raised.value.diagnosis
    with pytest.raises(OracleFailure) as raised, record.example("s", x=2) as ex:
        ex.audit_refusal(("some-rule", "the case says no"), refused=None, oracle="compiles", what="the build")
    assert "the rules predict SGLang refuses the build (some-rule" in raised.value.diagnosis
    assert raised.value.details["expected_rule"] == "some-rule"
    assert [r["verdict"] for r in records()] == ["fail", "fail"]


def test_expected_error_needs_a_rule():
    with pytest.raises(TypeError):
        record.Example("s", {}).expected_error("no rule given")  # the keyword is required
    with pytest.raises(HarnessError, match="rule"):
        record.Example("s", {}).expected_error("empty rule", rule="")


# -- the rules, from the case alone -------------------------------------------------------------------------
def test_prefill_rules_from_the_case():
    grid = (4, 8, 16)
    names = {admission.expected_refusal(case).name for case in (
        PrefillCase(backend="full", capture_tokens=grid, max_context_size=80),
        PrefillCase(backend="full", capture_tokens=grid, max_context_size=32, fixed_context_metadata=False),
        PrefillCase(backend="tc_piecewise", capture_tokens=grid, body="unannotated"),
        PrefillCase(backend="tc_piecewise", capture_tokens=grid, enable_mixed_chunk=True),
        PrefillCase(backend="breakable", capture_tokens=grid, body="blocks"))}
    assert names == {f"construction-refused:{n}" for n in ("context-beyond-table", "no-fixed-metadata",
                                                            "unannotated-body", "mixed-chunk-on-tc-piecewise",
                                                            "layerless-body")}
    valid = PrefillCase(backend="breakable", capture_tokens=grid)
    assert admission.expected_refusal(valid) is None
    assert admission.refused_at_construction(PrefillCase(backend="full", capture_tokens=grid, max_context_size=80))
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    def batch(mode, hidden="NULL"):
        return Batch((Request(1, (3, 5)),), ForwardMode[mode], ForwardMode.EXTEND, capture_hidden_mode=hidden)
    assert admission.expected_refusal(valid, batch("PREBUILT")).name == "mode-without-forward:PREBUILT"
    assert admission.expected_refusal(valid, batch("SPLIT_PREFILL")).name.startswith("mode-needs-model-hook")
    assert all(admission.expected_refusal(valid, batch(m)) is None for m in ("EXTEND", "MIXED", "DECODE", "IDLE"))
    assert admission.execute_refusal(batch("EXTEND", "FULL")).name == "execute-hidden-mode-above-capture"
    assert admission.execute_refusal(batch("EXTEND")) is None


# -- in-process, through SGLang's real code -------------------------------------------------------------------
@pytest.fixture
def compile_suite():
    from harness.errors import PathMissing
    from harness.targets import compile_kwargs

    try:
        compile_kwargs.load()
    except PathMissing as missing:
        pytest.skip(str(missing))
    from suites import test_compile_kwargs as suite
    return suite


def test_compile_rule_predicting_a_refusal_that_does_not_come_fails(compile_suite, monkeypatch, records):
    """A rule calls the eager backend uncompilable; SGLang's real build hands it to torch.compile, which
    compiles it: the audit fails (oracle compiles), never an expected error."""
    from strategies.compile_kwargs import CompileCase

    monkeypatch.setattr(compile_suite, "platform_refusal",
                        lambda case: ("platform-unknown-backend", "a wrong rule: eager is registered"))
    case = CompileCase("oot", "eager", None, None, "build", True, SMALL)
    with pytest.raises(OracleFailure) as raised:
        compile_suite.check_case(case, compile_suite.target.load(), compile_suite.CompileOutcomes())
    assert raised.value.oracle == "compiles"
    assert "the rules predict SGLang refuses the platform's own compile settings (platform-unknown-backend" \
        in raised.value.diagnosis
    assert records()[-1]["verdict"] == "fail"


def test_compile_refusal_no_rule_predicted_fails(compile_suite, monkeypatch, records):
    """An unknown backend name with the rule switched off: torch.compile refuses it, and no rule said so."""
    from strategies.compile_kwargs import UNKNOWN_BACKEND, CompileCase

    case = CompileCase("oot", UNKNOWN_BACKEND, None, None, "build", True, SMALL)
    assert compile_suite.platform_refusal(case)[0] == "platform-unknown-backend"
    compile_suite.check_case(case, compile_suite.target.load(), compile_suite.CompileOutcomes())  # clean: expected
    assert records()[-1]["expected_rule"] == "platform-unknown-backend"
    monkeypatch.setattr(compile_suite, "platform_refusal", lambda case: None)
    with pytest.raises(OracleFailure) as raised:
        compile_suite.check_case(case, compile_suite.target.load(), compile_suite.CompileOutcomes())
    assert raised.value.oracle == "compiles"
    assert "SGLang refused a case the rules call valid: the platform's own compile settings" in raised.value.diagnosis
    assert "harness_no_such_backend" in raised.value.diagnosis


def test_platform_options_reach_torch_compile_only_with_a_module(compile_suite, records):
    """The platform's options are per module: with a module, a backend that takes no `options` is refused (the
    rule predicts it); without one SGLang asks for no options and compiles (a nightly false alarm of 2026-12-06:
    the rule ignored `pass_module`). Both against SGLang's real build."""
    from strategies.compile_kwargs import CompileCase, recording_backend

    options = {"epilogue_fusion": True, "max_autotune": False}
    with_module = CompileCase("oot", recording_backend, options, None, "build", True, SMALL)
    assert compile_suite.platform_refusal(with_module)[0] == "platform-backend-takes-no-options"
    compile_suite.check_case(with_module, compile_suite.target.load(), compile_suite.CompileOutcomes())
    assert records()[-1]["expected_rule"] == "platform-backend-takes-no-options"
    without = CompileCase("oot", recording_backend, options, None, "build", False, SMALL)
    assert compile_suite.platform_refusal(without) is None
    compile_suite.check_case(without, compile_suite.target.load(), compile_suite.CompileOutcomes())
    assert records()[-1]["verdict"] == "pass"


def test_prefill_construction_refusal_no_rule_predicted_fails(monkeypatch, records):
    """SGLang's real prefill runner constructor with its layer-model lookup made to refuse a valid breakable case
    (the default body owns `layers`): the construction audit fails, naming the refusal."""
    from harness.targets.prefill.session import PrefillSession

    cpu_prefill_layout("breakable")
    from suites import test_prefill_pcg as suite
    from sglang.srt.model_executor.runner import prefill_cuda_graph_runner as runner

    def refuse(model):
        raise RuntimeError("BreakableCudaGraphBackend could not resolve a layer model (harness mutant)")
    monkeypatch.setattr(runner, "_resolve_transformer_layer_model", refuse)
    case = PrefillCase(backend="breakable", capture_tokens=suite.GRID)
    assert admission.expected_refusal(case) is None
    try:
        with pytest.raises(OracleFailure) as raised:
            suite.test_refused_at_construction(case)
    finally:
        PrefillSession.close_current()
    assert raised.value.oracle == "admission"
    assert "SGLang refused a case the rules call valid: building the runner: " in raised.value.diagnosis
    assert "could not resolve a layer model" in raised.value.diagnosis
    assert records()[-1]["verdict"] == "fail"


# -- the summary ------------------------------------------------------------------------------------------------
def test_summary_counts_expected_errors_per_rule(tmp_path):
    from reports import html, summary

    rows = [{"suite": "prefill_pcg", "verdict": "pass"}] * 7 + [
        {"suite": "prefill_pcg", "verdict": "expected-error", "expected_rule": "mode-without-forward:PREBUILT"},
        {"suite": "prefill_pcg", "verdict": "expected-error", "expected_rule": "mode-without-forward:PREBUILT"},
        {"suite": "prefill_pcg", "verdict": "expected-error", "expected_rule": "construction-refused:layerless-body"},
        {"suite": "compile_kwargs", "verdict": "pass"},
        {"suite": "compile_kwargs", "verdict": "expected-error", "expected_rule": "platform-unknown-backend"}]
    with open(tmp_path / "examples.gw0.jsonl", "w") as out:
        for row in rows:
            out.write(json.dumps({**row, "run_id": "r1", "drawn": {}, "seconds": 0.1}) + "\n")
    text = summary.summarise(tmp_path, "r1")
    assert ("expected errors of prefill_pcg: 3 of 10 examples (30.0%): mode-without-forward:PREBUILT 2, "
            "construction-refused:layerless-body 1") in text
    assert "expected errors of compile_kwargs: 1 of 2 examples (50.0%): platform-unknown-backend 1" in text
    assert "mode-without-forward:PREBUILT 2" in (tmp_path / "summary.md").read_text()
    page = html.render(tmp_path, "r1").read_text()
    assert "Expected errors by rule" in page
    assert "<td class='l'>mode-without-forward:PREBUILT</td><td>2</td><td>20.0%</td>" in page
