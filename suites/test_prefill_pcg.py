"""SGLang's prefill graph runner (`PrefillCudaGraphRunner`): capture once, then replay batches of every size and
forward mode through SGLang's own dispatch, and check that the graph really replayed (known bug 2, SGLang PR
#20441: a MIXED batch after an EXTEND capture recompiled at serve time and its pieces ran outside the capture).

Two parts: the torch.compile piecewise path (`TcPiecewiseCudaGraphBackend` -> `install_torch_compiled` ->
`SGLangBackend` -> `CUDAPiecewiseBackend`, on the virtual device or a GPU), and the live 0.5.23 backends (breakable,
full) through the same runner. Oracles after every forward: no Dynamo recompilation (with the failing guard), no
"capture stream is not set" in any form, the graph path replayed every captured piece (a silent eager fallback
fails), output equal to eager (bit-equal for the eager piece compiler) and to the model's by-hand numbers,
SGLang's process-wide graph state back at rest.
"""
from __future__ import annotations

import traceback

import pytest
from hypothesis import HealthCheck, assume, example as explicit, given, settings, strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from harness.devices import get_device
from harness.errors import PathMissing
from harness.oracles.capture_failure import check_capture_failure_message
from harness.oracles import OracleFailure
from harness.oracles import dynamo_evidence
from harness.oracles.process_state import check_at_rest
from harness.profiles import suite_settings
from harness.record import example
from harness.targets import prefill
from harness.targets.prefill import Batch, PrefillCase, Request, admission
from harness.targets.prefill.base import body_forward
from harness.targets.prefill.session import GRAPH_MODES, PrefillSession, one_trace_gap
from harness.versions import sglang_version
from strategies import prefill as draw

GRID = (4, 8, 16)
# Modes only a speculative draft worker or a dLLM scheduler produces; the runner does not refuse them.
# (DRAFT_EXTEND: main trees of mid-2026, whose ForwardMode still has it beside DRAFT_EXTEND_V2.)
SPECULATIVE_OR_DLLM = ("DRAFT_EXTEND", "DRAFT_EXTEND_V2", "DLLM_EXTEND")
# The modes the runner refuses and the modes this configuration never hands it differ by release: the adapter's
# layout says which (`prefill.load().refused_modes` / `.unproduced_modes`).
REFUSED = ("TARGET_VERIFY", "DECODE", "IDLE", "SPLIT_PREFILL", "PREBUILT")
# Gate: no shrinking (shrink_in_gate=False). A failing example closes its session (its Dynamo cache is spoiled),
# so each shrink step would capture again (~2 s); nightly shrinks.
TC_CASE = PrefillCase(backend="tc_piecewise", capture_tokens=GRID, compiler="eager")


@pytest.fixture(scope="module", autouse=True)
def prefill_path(device_name):
    """The prefill path on the run's device: the virtual device, or a real GPU (real CUDA graphs, counted by
    wrapping torch.cuda.CUDAGraph); a real NPU is not ported (its graphs are not counted)."""
    if device_name not in ("cpu", "cuda"):
        pytest.skip(f"the prefill suite runs on --device cpu or cuda; --device {device_name}'s graphs are not "
                    "counted by harness.counter, so the graph-replay oracle has no evidence there")
    device = get_device(device_name)
    if not device.available:
        pytest.skip(device.skip_reason)
    try:
        layout = prefill.load()
    except PathMissing as missing:
        pytest.skip(str(missing))
    PrefillSession.use_device(device_name)
    yield layout
    PrefillSession.close_current()


def _mode(name):
    return draw._mode(name)


def _layout():
    return prefill.load()


def refusal(error: BaseException) -> str | None:
    """Why `error` is SGLang's own answer to a mode it does not run (None: a crash to report)."""
    text = f"{type(error).__name__}: {str(error)[:300]}"
    if "SimpleNamespace" in text:
        return None  # a gap in the harness's model-runner double, not SGLang's answer
    if isinstance(error, AttributeError) and "PrefillForCausalLM" in text:
        return f"SGLang routes this mode to a model hook the harness model does not have ({text})"
    frames = traceback.extract_tb(error.__traceback__)
    if frames and "/sglang/" in frames[-1].filename:
        return f"SGLang's own error ({text})"
    return None


def run_example(ex, session: PrefillSession, batch: Batch, *, reuse_history: bool = False,
                one_trace: bool = True):
    """One forward and its oracles; SGLang's own refusal of a mode it has no graph for is expected behaviour.
    `one_trace=False`: the compile pass may trace more than once (a known finding, kept in its own test)."""
    if session.case.backend == "tc_piecewise":
        ex.note("tc_piecewise", session.layout.note)
        if session.one_trace_gap:
            ex.note("one_trace", session.one_trace_gap)
        check_dynamo_contract(ex, session)
    session.check_capture(one_trace=one_trace)
    rule = admission.expected_refusal(session.case, batch)  # from the case, before SGLang sees the batch
    outcome = session.step(batch, ex, reuse_history=reuse_history)
    mode = batch.forward_mode.name
    if outcome.path == "sglang-error":
        reason = refusal(outcome.error)
        if mode in GRAPH_MODES or reason is None:
            raise outcome.error
    ex.audit_refusal(rule, refused=f"forward_mode={mode}: {reason}" if outcome.path == "sglang-error" else None,
                     oracle="admission", what=f"a {mode} batch", forward_mode=mode, path=outcome.path)
    if outcome.path == "eager" and mode not in GRAPH_MODES:
        ex.note("refused", f"forward_mode={mode}: the runner has no graph for it; SGLang's eager runner ran it")
    return outcome


def check_dynamo_contract(ex, session: PrefillSession) -> None:
    """The compiled body's first trace has symbols on the axes SGLang promises dynamic (the ForwardBatch fields
    from 0.5.19, where SGLang marks them), none marked strictly. Its trace count is recorded; one trace for every
    size stays `check_capture`'s clause (no-recompile), so the findings keep their verdicts."""
    checked = dynamo_evidence.check_symbolic_axes(
        session.compile_traces.traces, what=f"the {session.case.body} body", sizes=session.expected_sizes,
        one_trace=False, forward_batch_fields=not session.one_trace_gap)
    ex.note("dynamo_contract", checked)


def compiled_session(case: PrefillCase) -> PrefillSession:
    """`PrefillSession.get(case)`; SGLang refusing to compile a body whose forward annotates tensor arguments
    (objects or strings) is the dynamo-contract verdict, not an expected error."""
    try:
        return PrefillSession.get(case)
    except ValueError as error:
        dynamo_evidence.check_annotations_accepted(body_forward(case), error, what=f"the {case.body} body")
        raise


# -- the torch.compile piecewise path --------------------------------------------------------------------------
@suite_settings(gate_examples=90, shrink_in_gate=False)  # paying for the captures of the body/wrapper variants
@given(data=st.data())
# Pinned: known bug 2's trigger, a mixed batch (a decoding request beside a prefill chunk) in MIXED mode.
@explicit(data=None)
def test_piecewise_forward_modes(data):
    """Graph-bound batches: EXTEND/MIXED in forward_mode and global_forward_mode independently, every size on,
    between and beyond the grid. The modes the runner refuses are explicit examples
    (test_refused_forward_mode_takes_sglang_path), so the drawn budget goes where the graphs replay."""
    if data is None:
        batch = Batch((Request(1, (3, 5, 7)), Request(2, (4,), prefix=2, history=(1, 2))),
                      _mode("MIXED"), _mode("MIXED"))
    else:
        batch = data.draw(draw.graph_bound_batches(GRID), label="batch")
    with example("prefill_pcg", capture_tokens=GRID, compiler="eager", backend="tc_piecewise",
                 **draw.describe(batch)) as ex:
        run_example(ex, PrefillSession.get(TC_CASE), batch)


@suite_settings(gate_examples=6, shrink_in_gate=False)  # each example compiles and captures its own grid (~1 s)
@given(case=draw.cases("tc_piecewise"), data=st.data())
def test_piecewise_capture_grid_and_replay(case, data):
    """Any capture grid; replays on, between and beyond it; MIXED/EXTEND in either field; chunked/mixed batches."""
    batch = data.draw(draw.graph_bound_batches(case.capture_tokens), label="batch")
    with example("prefill_pcg", capture_tokens=case.capture_tokens, compiler=case.compiler,
                 backend=case.backend, **draw.describe(batch)) as ex:
        run_example(ex, PrefillSession.get(case), batch)


def refused_batch(mode: str) -> Batch:
    """A small batch in `mode`: none for IDLE, a prefill beside a decoding request for the extend family, one
    decoding request otherwise."""
    local = _mode(mode)
    if mode == "IDLE":
        return Batch((), local, _mode("EXTEND"))
    if local.is_extend():
        return Batch((Request(1, (3, 5)), Request(2, (4,), prefix=2, history=(1, 2))), local, _mode("EXTEND"))
    return Batch((Request(1, (4,), prefix=2, history=(1, 2)),), local, _mode("EXTEND"))


@pytest.mark.parametrize("mode", REFUSED)
@pytest.mark.parametrize("backend", prefill.BACKENDS)  # varies slowest: one backend's examples share a capture
def test_refused_forward_mode_takes_sglang_path(mode, backend):
    """Bad input: a mode the runner has no graph for ends in SGLang's eager runner or SGLang's own error, on every
    backend (explicit examples: drawing them spent a third of the gate on SGLang saying no)."""
    layout = _layout()
    if mode not in layout.refused_modes:
        pytest.skip(f"SGLang {sglang_version()} ({layout.name}): the runner does not refuse {mode}; this "
                    f"configuration never hands it one (layout.unproduced_modes)")
    gap = layout.backend_gap(backend, PrefillSession.device)
    if gap:
        pytest.skip(gap)
    case = TC_CASE if backend == "tc_piecewise" else PrefillCase(backend=backend, capture_tokens=GRID)
    batch = refused_batch(mode)
    with example("prefill_pcg", capture_tokens=GRID, compiler=case.compiler, backend=backend,
                 **draw.describe(batch)) as ex:
        outcome = run_example(ex, PrefillSession.get(case), batch)
        assert outcome.path in ("eager", "sglang-error"), f"{mode} replayed the prefill graph"


@suite_settings(gate_examples=2, shrink_in_gate=False)
@given(data=st.data())
def test_piecewise_inductor_pieces(data):
    """The pieces compiled by inductor (one capture per run: ~25 s cold, <2 s warm on this machine)."""
    case = PrefillCase(backend="tc_piecewise", capture_tokens=(4, 8), compiler="inductor")
    batch = data.draw(draw.graph_bound_batches(case.capture_tokens), label="batch")
    with example("prefill_pcg", capture_tokens=case.capture_tokens, compiler=case.compiler,
                 backend=case.backend, **draw.describe(batch)) as ex:
        run_example(ex, PrefillSession.get(case), batch)


@suite_settings(gate_examples=1, shrink_in_gate=False)  # two sessions, 6 to 12 Inductor compiles (kernels cached)
@given(data=st.data())
def test_piecewise_inductor_cache_and_compile_sizes(data):
    """SGLang's InductorAdaptor for real: a first session compiles the pieces (and, drawn, a specialised compile per
    size) into a fresh SGLang cache folder, a second loads each back from SGLang's cache file; both replay the batch
    (`harness/targets/prefill/inductor.py`: adaptor compiles, post-grad pass, cache handles, loaded == fresh)."""
    from harness.targets.prefill.inductor import run_and_check

    case = PrefillCase(backend="tc_piecewise", capture_tokens=(4, 8), compiler="inductor")
    sizes = data.draw(draw.compile_sizes(case.capture_tokens, none=False), label="compile_sizes")
    batch = data.draw(draw.graph_bound_batches(case.capture_tokens), label="batch")
    with example("prefill_pcg", capture_tokens=case.capture_tokens, compiler=case.compiler, backend=case.backend,
                 compile_sizes=sizes, **draw.describe(batch)) as ex:
        ex.note("tc_piecewise", _layout().note)
        run_and_check(case, sizes, batch, ex)


@suite_settings(gate_examples=4, shrink_in_gate=False)
@given(data=st.data())
def test_pipeline_stage_body(data):
    """A body ported from vLLM: its hidden states arrive as SGLang's IntermediateTensors (annotated
    Optional[IntermediateTensors]), so SGLang must mark their token dimension dynamic from that annotation: one
    trace serves every token count, and the numbers are the annotated body's (the residual is the embedding)."""
    case = PrefillCase(backend="tc_piecewise", capture_tokens=GRID, body="pipeline")
    batch = data.draw(draw.graph_bound_batches(GRID), label="batch")
    with example("prefill_pcg", capture_tokens=GRID, backend=case.backend, body=case.body,
                 **draw.describe(batch)) as ex:
        run_example(ex, PrefillSession.get(case), batch)


@suite_settings(gate_examples=2, shrink_in_gate=False)
@given(data=st.data())
def test_string_annotated_body(data):
    """A body whose forward spells its annotations as strings ('torch.Tensor', as files with `from __future__
    import annotations` do; the deepstack body): SGLang must infer the same dynamic dimensions from them and serve
    it (a refusal is a failure); text batches only (its deepstack warm-up is test_findings_deepstack_warmup_skipped)."""
    case = PrefillCase(backend="tc_piecewise", capture_tokens=GRID, body="deepstack")
    batch = data.draw(draw.graph_bound_batches(GRID), label="batch")
    with example("prefill_pcg", capture_tokens=GRID, backend=case.backend, body=case.body,
                 **draw.describe(batch)) as ex:
        run_example(ex, compiled_session(case), batch)


@pytest.mark.parametrize("backend", prefill.BACKENDS)
@suite_settings(gate_examples=10, shrink_in_gate=False)
@given(data=st.data())
def test_multimodal_inputs(backend, data):
    """A VLM on each backend: mRoPE positions ([3, T]), embeddings handed to the language model (the input_embeds
    slot), per-request shifts that change between replays; image requests, hidden-state modes and logprobs the
    graphs cannot serve must fall back to eager (admission), the rest replay with this batch's own values."""
    layout = _layout()
    gap = layout.backend_gap(backend, PrefillSession.device) or layout.multimodal_gap()
    if gap:
        pytest.skip(gap)
    case = PrefillCase(backend=backend, capture_tokens=GRID, multimodal=True)
    batch = data.draw(draw.model_input_batches(GRID), label="batch")
    with example("prefill_pcg", capture_tokens=GRID, backend=backend, multimodal=True,
                 **draw.describe(batch)) as ex:
        # the mRoPE slot's strides retrace the compile pass on clean 0.5.23: test_findings_mrope_slot_retraces
        run_example(ex, PrefillSession.get(case), batch, one_trace=False)


@suite_settings(gate_examples=10, shrink_in_gate=False)
@given(data=st.data())
def test_full_chunked_prefix(data):
    """The full backend with chunked-prefix capture: one graph per size and prefix-chunk variant; batches whose
    requests arrive with cached prefixes (chunks, decoding requests) replay the variant covering their longest
    prefix, reading it through the chunk KV indices SGLang's own kernel writes (Triton's CPU interpreter on the
    virtual device), refreshed for every replay."""
    layout = _layout()
    gap = layout.backend_gap("full", PrefillSession.device) or layout.chunked_prefix_gap()
    if gap:
        pytest.skip(gap)
    case = PrefillCase(backend="full", capture_tokens=GRID, prefix_chunk_tokens=64)
    batch = data.draw(draw.graph_bound_batches(GRID, beyond=False), label="batch")
    with example("prefill_pcg", capture_tokens=GRID, backend="full", prefix_chunk_tokens=64,
                 **draw.describe(batch)) as ex:
        run_example(ex, PrefillSession.get(case), batch)


@pytest.mark.parametrize("source", ["chunked_prefill_size", "max_bs"])
@suite_settings(gate_examples=2, shrink_in_gate=False)
@given(data=st.data())
def test_prefix_chunk_capacity_sources(source, data):
    """Chunked-prefix capture with full_prefill_prefix_chunk_tokens unset: SGLang takes the chunk capacity from
    the scheduler's chunked_prefill_size, or, with no chunk budget, from the prefill phase's max_bs; the harness
    publishes 64 there, so the capture must hold the same variants (1, 2, 4) as the configured 64."""
    layout = _layout()
    gap = layout.backend_gap("full", PrefillSession.device) or layout.chunked_prefix_gap()
    if gap:
        pytest.skip(gap)
    case = PrefillCase(backend="full", capture_tokens=GRID, prefix_chunk_tokens=64, prefix_chunk_source=source)
    batch = data.draw(draw.graph_bound_batches(GRID, beyond=False), label="batch")
    with example("prefill_pcg", capture_tokens=GRID, backend="full", prefix_chunk_tokens=64,
                 prefix_chunk_source=source, **draw.describe(batch)) as ex:
        run_example(ex, PrefillSession.get(case), batch)


@pytest.mark.parametrize("backend", ["breakable", "full"])
@suite_settings(gate_examples=2, shrink_in_gate=False)
@given(data=st.data())
def test_embedding_model_pooled_output(backend, data):
    """An embedding (sequence-classification) model through the graphs: the replay hands back SGLang's
    EmbeddingPoolerOutput, one pooled row per request, equal to eager and to the closed form (`reference_logits`:
    the score head on each request's last token)."""
    layout = _layout()
    gap = layout.backend_gap(backend, PrefillSession.device) or layout.feature_gap(prefill.POOLED_OUTPUT)
    if gap:
        pytest.skip(gap)
    case = PrefillCase(backend=backend, capture_tokens=GRID, pooled=True)
    batch = data.draw(draw.graph_bound_batches(GRID, beyond=False), label="batch")
    with example("prefill_pcg", capture_tokens=GRID, backend=backend, pooled=True, **draw.describe(batch)) as ex:
        run_example(ex, PrefillSession.get(case), batch)


# Context limits: the full graphs planned at a fixed extent (max_context_size), the breakable graphs under the
# attention backend's own cap (prefill_cuda_graph_default_max_seq_len).
# (the full case with mixed chunks on, which SGLang allows for its padded backends)
CONTEXT_LIMIT_CASES = {"full-fixed-32": PrefillCase(backend="full", capture_tokens=GRID, max_context_size=32,
                                                    enable_mixed_chunk=True),
                       "breakable-cap-24": PrefillCase(backend="breakable", capture_tokens=GRID,
                                                       backend_max_seq_len=24)}


@pytest.mark.parametrize("name", sorted(CONTEXT_LIMIT_CASES))
@suite_settings(gate_examples=8, shrink_in_gate=False)
@given(data=st.data())
def test_context_limits(name, data):
    """Graphs with a context limit: a batch whose longest context (cached prefix + new tokens) is beyond it must
    run eager (admission), the rest replay; the attention reads the KV through metadata of the batch's own extent
    (`max_seq_len_override`), so a replay past the fixed extent drops cached tokens and shows in the numbers."""
    case = CONTEXT_LIMIT_CASES[name]
    layout = _layout()
    gap = layout.backend_gap(case.backend, PrefillSession.device) or layout.feature_gap(prefill.CONTEXT_LIMITS)
    if gap:
        pytest.skip(gap)
    batch = data.draw(draw.batches_near_context(GRID, case.context_limit()), label="batch")
    with example("prefill_pcg", capture_tokens=GRID, backend=case.backend, max_context_size=case.max_context_size,
                 backend_max_seq_len=case.backend_max_seq_len, **draw.describe(batch)) as ex:
        run_example(ex, PrefillSession.get(case), batch)


@pytest.mark.parametrize("backend", ["breakable", "full"])
@suite_settings(gate_examples=6, shrink_in_gate=False)
@given(data=st.data())
def test_attention_backend_refusal_honoured(backend, data):
    """Admission owned by the attention backend: where it defines `can_run_prefill_cuda_graph` (as SGLang's dLLM
    and DeepSeek V4 backends do), the runner honours its refusal. The double refuses a batch where a request
    extends by more than a drawn limit (dLLM's query limit); such a batch must run eager (admission), the rest
    replay equal to eager."""
    layout = _layout()
    gap = layout.backend_gap(backend, PrefillSession.device) or layout.feature_gap(prefill.BACKEND_ADMISSION)
    if gap:
        pytest.skip(gap)
    limit = data.draw(st.sampled_from([3, 6]), label="backend_max_extend")
    case = PrefillCase(backend=backend, capture_tokens=GRID, backend_max_extend=limit)
    batch = data.draw(draw.graph_bound_batches(GRID, beyond=False), label="batch")
    with example("prefill_pcg", capture_tokens=GRID, backend=backend, backend_max_extend=limit,
                 **draw.describe(batch)) as ex:
        run_example(ex, PrefillSession.get(case), batch)


def test_context_limit_ignored_by_tc_piecewise():
    """tc_piecewise drops max_context_size (SGLang warns: its metadata has no fixed extent), so a batch longer
    than it still replays the graphs (the session's admission oracle: a servable batch that ran eager fails)."""
    layout = _layout()
    if layout.feature_gap(prefill.CONTEXT_LIMITS):
        pytest.skip(layout.feature_gap(prefill.CONTEXT_LIMITS))
    case = PrefillCase(backend="tc_piecewise", capture_tokens=GRID, max_context_size=8)
    batch = Batch((Request(1, (3, 5, 7, 9), prefix=20, history=tuple(range(10)) * 2),), _mode("EXTEND"),
                  _mode("EXTEND"))
    with example("prefill_pcg", capture_tokens=GRID, backend=case.backend, max_context_size=8,
                 **draw.describe(batch)) as ex:
        run_example(ex, PrefillSession.get(case), batch)


@pytest.mark.parametrize("case", [
    PrefillCase(backend="full", capture_tokens=GRID, max_context_size=80),
    PrefillCase(backend="full", capture_tokens=GRID, max_context_size=32, fixed_context_metadata=False),
    PrefillCase(backend="tc_piecewise", capture_tokens=GRID, body="unannotated"),
    PrefillCase(backend="tc_piecewise", capture_tokens=GRID, enable_mixed_chunk=True),
    PrefillCase(backend="breakable", capture_tokens=GRID, body="blocks"),
], ids=["beyond-table", "no-fixed-metadata", "unannotated-body", "mixed-chunk-on-tc-piecewise", "layerless-body"])
def test_refused_at_construction(case):
    """Bad configuration: a context limit the request table or the attention backend cannot honour, or a body
    whose dynamic dimensions SGLang cannot infer or whose decoder layers it cannot find, is refused when the runner
    is built (ValueError; the AssertionError the mixed-chunk check raises; for a body without `layers` the
    RuntimeError naming the backend and the body), never served wrongly later."""
    layout = _layout()
    gap = layout.feature_gap(prefill.CONTEXT_LIMITS) if case.max_context_size is not None else None
    gap = gap or (layout.feature_gap(prefill.MIXED_CHUNK_CHECK) if case.enable_mixed_chunk else None)
    gap = gap or (layout.backend_gap(case.backend, PrefillSession.device) if case.body == "blocks" else None)
    if gap:
        pytest.skip(gap)
    rule = admission.expected_refusal(case)  # from the case, before SGLang builds anything
    with example("prefill_pcg", capture_tokens=GRID, backend=case.backend, max_context_size=case.max_context_size,
                 fixed_context_metadata=case.fixed_context_metadata, body=case.body,
                 enable_mixed_chunk=case.enable_mixed_chunk) as ex:
        try:
            PrefillSession.get(case)
        except (ValueError, AssertionError, RuntimeError) as error:
            if case.body == "blocks" and "without layers" not in str(error):
                raise OracleFailure("admission", f"SGLang refused a body without `layers` without saying so: "
                                    f"{str(error)[:300]}", **_context_details(case)) from error
            ex.audit_refusal(rule, refused=str(error), oracle="admission", what="building the runner",
                             **_context_details(case))
            return
        PrefillSession.close_current()
        if rule is not None:
            raise OracleFailure("admission", f"SGLang built the runner although {rule.reason}",
                                expected_rule=rule.name, **_context_details(case))


def _context_details(case: PrefillCase) -> dict:
    return dict(max_context_size=case.max_context_size, table_columns=case.max_context,
                fixed_context_metadata=case.fixed_context_metadata, body=case.body)


@pytest.mark.parametrize("mode", ["LAST", "FULL"])
def test_execute_refuses_hidden_mode_above_capture(mode):
    """A caller that skips can_run_graph: `execute` itself refuses a batch asking for more hidden states than the
    capture keeps (a NULL capture: no speculative decoding, a generation model), naming the capture's mode."""
    layout = _layout()
    gap = layout.backend_gap("full", PrefillSession.device) or layout.feature_gap(prefill.EXECUTE_HIDDEN_GUARD)
    if gap:
        pytest.skip(gap)
    session = PrefillSession.get(PrefillCase(backend="full", capture_tokens=GRID))
    batch = Batch((Request(1, (3, 5)),), _mode("EXTEND"), _mode("EXTEND"), capture_hidden_mode=mode)
    rule = admission.execute_refusal(batch)
    with example("prefill_pcg", capture_tokens=GRID, backend="full", **draw.describe(batch)) as ex:
        try:
            session.target.execute(batch)
        except RuntimeError as error:
            if "capture mode (NULL)" not in str(error):
                raise OracleFailure("admission", f"execute refused a {mode} batch without naming the capture's "
                                    f"mode NULL: {error}", capture_hidden_mode=mode) from error
            ex.audit_refusal(rule, refused=f"execute: {error}", oracle="admission",
                             what=f"execute of a capture_hidden_mode={mode} batch", capture_hidden_mode=mode)
            return
        finally:
            PrefillSession.close_current()  # a replay past the guard would leave its static state spoiled
        raise OracleFailure("admission", f"execute replayed a capture_hidden_mode={mode} batch on the NULL "
                            "capture, which keeps no hidden states", capture_hidden_mode=mode)


def test_compile_pass_failure_names_backend_and_way_out():
    """A tc_piecewise compile pass that fails (an OOM inside it) surfaces as SGLang's capture-failure message:
    the cause, the backend, and the way out a tc_piecewise user has (the breakable backend)."""
    layout = _layout()
    if layout.feature_gap(prefill.CAPTURE_FAILURE_MESSAGE):
        pytest.skip(layout.feature_gap(prefill.CAPTURE_FAILURE_MESSAGE))
    case = PrefillCase(backend="tc_piecewise", capture_tokens=GRID, max_requests=7)  # a case of its own
    cause = "CUDA out of memory (injected into the compile pass by the harness)"
    with example("prefill_pcg", capture_tokens=GRID, backend=case.backend, injected=cause):
        with layout.target_class.compile_pass_failing(cause):
            with pytest.raises(RuntimeError) as raised:
                PrefillSession.get(case)
        PrefillSession.close_current()
        check_capture_failure_message(str(raised.value), cause=cause, backend=case.backend)


def replay_case(drawn: dict) -> None:
    """One recorded example (the `drawn` dict `harness.record.example` wrote), without Hypothesis or pytest: what
    repro scripts and pinned regressions call. Raises the oracle's failure (an AssertionError) when it fails."""
    prefill.load()  # before SGLang is imported (older releases need the device layer's stand-ins)
    case = PrefillCase(backend=drawn.get("backend") or "tc_piecewise",
                       capture_tokens=tuple(drawn.get("capture_tokens") or GRID),
                       compiler=drawn.get("compiler") or "eager", multimodal=bool(drawn.get("multimodal")),
                       prefix_chunk_tokens=drawn.get("prefix_chunk_tokens"))
    batch = draw.batch_from_drawn(drawn)
    try:
        with example("prefill_pcg_replay", **drawn) as ex:
            run_example(ex, PrefillSession.get(case), batch)
    finally:
        PrefillSession.close_current()


# -- the live 0.5.23 prefill backends ------------------------------------------------------------------------
@pytest.mark.parametrize("backend", ["breakable", "full"])
@suite_settings(gate_examples=4, shrink_in_gate=False)  # each example captures its own grid (~1 s)
@given(data=st.data())
def test_live_backends(backend, data):
    """breakable and full, chosen through the config as a server would; no torch.compile, so global_forward_mode
    is drawn from every mode and None (forward_mode EXTEND/MIXED: the refused ones are explicit examples)."""
    gap = _layout().backend_gap(backend, PrefillSession.device)
    if gap:
        pytest.skip(gap)
    grid = data.draw(draw.capture_grids(max_size=3), label="capture_tokens")
    case = PrefillCase(backend=backend, capture_tokens=grid)
    local = data.draw(draw.graph_modes(), label="forward_mode")
    num_tokens = data.draw(draw.replay_num_tokens(grid), label="num_tokens")
    batch = data.draw(draw.batches(num_tokens, local, data.draw(draw.global_forward_modes())), label="batch")
    with example("prefill_pcg", capture_tokens=grid, backend=backend, **draw.describe(batch)) as ex:
        run_example(ex, PrefillSession.get(case), batch)


@suite_settings(gate_examples=4, shrink_in_gate=False)
@given(data=st.data())
# Pinned: three requests (9 tokens, bucket 16) against metadata that carries two: eager, though the graph fits.
@explicit(data=None)
def test_breakable_captured_attn_metadata(data):
    """breakable with an attention backend that opts into SGLang's captured-metadata contract: each bucket's
    metadata is built at capture and refreshed in place from the live batch at replay; the attention reads that
    bucket's tables, so a replay computing with the capture's (or another batch's) metadata shows in the numbers.
    The backend may bound the requests one replay of that metadata carries (drawn, or none): a batch of more
    requests must run eager (admission), and the double's refresh refuses it as a real backend's tables overflow."""
    gap = _layout().backend_gap("breakable", PrefillSession.device)
    if gap:
        pytest.skip(gap)
    if data is None:
        cap, batch = 2, Batch(tuple(Request(row, (row, 3, 5)) for row in (1, 2, 3)), _mode("EXTEND"), _mode("EXTEND"))
    else:
        cap = data.draw(st.sampled_from((None, 1, 2, 3)), label="captured_metadata_max_requests")
        batch = data.draw(draw.graph_bound_batches(GRID), label="batch")
    case = PrefillCase(backend="breakable", capture_tokens=GRID, captured_attn_metadata=True,
                       captured_metadata_max_requests=cap)
    with example("prefill_pcg", capture_tokens=GRID, backend="breakable", captured_attn_metadata=True,
                 captured_metadata_max_requests=cap, **draw.describe(batch)) as ex:
        run_example(ex, PrefillSession.get(case), batch)


@suite_settings(gate_examples=2, shrink_in_gate=False)
@given(data=st.data())
# Pinned: more requests (4, mixed adapters) than the LoRA backend's static rows: eager, while the graphs could serve it.
@explicit(data=None)
def test_breakable_lora(data):
    """breakable on a LoRA server, each request on a drawn adapter: the runner sizes the manager's static prefill
    batch info at construction, prepares it for every capture bucket and resets the routing cache before each
    captured run; a batch the LoRA backend's static rows hold replays with its own adapters' scales (equal to eager
    and the closed form), one of more requests runs eager (admission)."""
    layout = _layout()
    gap = layout.backend_gap("breakable", PrefillSession.device) or layout.feature_gap(prefill.LORA_CAPTURE)
    if gap:
        pytest.skip(gap)
    case = PrefillCase(backend="breakable", capture_tokens=GRID, lora=True)
    if data is None:
        batch = Batch(tuple(Request(row, (row, 3), adapter=adapter) for row, adapter in
                            ((1, "sql"), (2, None), (3, "chat"), (4, "sql"))), _mode("EXTEND"), _mode("EXTEND"))
    else:
        batch = data.draw(draw.lora_batches(GRID), label="batch")
    with example("prefill_pcg", capture_tokens=GRID, backend="breakable", lora=True, **draw.describe(batch)) as ex:
        run_example(ex, PrefillSession.get(case), batch)


def test_token_embedding_overrides_run_eager():
    """A batch carrying token-embedding overrides (replace_embeds at replace_positions, value-neutral here) runs
    eager: the captured graphs never read them (explicit batch; the LoRA case's capture)."""
    layout = _layout()
    gap = layout.backend_gap("breakable", PrefillSession.device) or layout.feature_gap(prefill.LORA_CAPTURE)
    if gap:
        pytest.skip(gap)
    case = PrefillCase(backend="breakable", capture_tokens=GRID, lora=True)
    batch = Batch((Request(1, (3, 5), adapter="sql"),), _mode("EXTEND"), _mode("EXTEND"), replace_embeds=True)
    with example("prefill_pcg", capture_tokens=GRID, backend="breakable", lora=True, **draw.describe(batch)) as ex:
        run_example(ex, PrefillSession.get(case), batch)  # its admission oracle: the batch must run eager


@pytest.mark.parametrize("backend", ["breakable", "full"])
@suite_settings(gate_examples=2, shrink_in_gate=False)
@given(data=st.data())
def test_vlm_wrapper_layer_model(backend, data):
    """The causal LM behind a VLM-style `language_model` wrapper: breakable/full capture the body SGLang finds by
    walking language_model -> .model to the module owning `layers`; the numbers are the unwrapped model's."""
    gap = _layout().backend_gap(backend, PrefillSession.device)
    if gap:
        pytest.skip(gap)
    case = PrefillCase(backend=backend, capture_tokens=GRID, wrapped=True)
    batch = data.draw(draw.graph_bound_batches(GRID), label="batch")
    with example("prefill_pcg", capture_tokens=GRID, backend=backend, wrapped=True, **draw.describe(batch)) as ex:
        run_example(ex, PrefillSession.get(case), batch)


MHA_BATCHES = {"fresh": Batch((Request(1, (3, 5)), Request(2, (4, 6, 1))), _mode("EXTEND"), _mode("EXTEND")),
               "fresh-and-chunk": Batch((Request(1, (3, 5)), Request(2, (4, 6), prefix=2, history=(1, 2))),
                                        _mode("EXTEND"), _mode("EXTEND")),
               "decoding": Batch((Request(1, (7,), prefix=3, history=(1, 2, 3)),), _mode("MIXED"), _mode("MIXED"))}


@pytest.mark.parametrize("name", sorted(MHA_BATCHES))
def test_breakable_mha_companion_prefix(name):
    """breakable with MHA companion layers (an MLA model's) off CUDA: a batch with any cached prefix must run
    eager (the companion's prefix path is uncapturable), a fresh one replays (explicit batches, one capture)."""
    if PrefillSession.device != "cpu":
        pytest.skip("on CUDA the runner captures the MHA companion's prefix path; the rule is the off-CUDA one")
    gap = _layout().backend_gap("breakable", PrefillSession.device)
    if gap:
        pytest.skip(gap)
    case = PrefillCase(backend="breakable", capture_tokens=GRID, mha_companion=True)
    batch = MHA_BATCHES[name]
    with example("prefill_pcg", capture_tokens=GRID, backend="breakable", mha_companion=True,
                 **draw.describe(batch)) as ex:
        outcome = run_example(ex, PrefillSession.get(case), batch)
        expected = "eager" if admission.must_run_eager(case, batch) else "graph"
        if outcome.path != expected:
            raise OracleFailure("admission", f"the {name} batch ran {outcome.path} on breakable with MHA companion "
                                f"layers, expected {expected}", batch=name)


# -- findings on clean SGLang, kept visible -------------------------------------------------------------------
# What each finding is about (harness/known_findings.py): the guard its recompile shows. `repro` names a finding for
# a pasted log only when the log's guard is this one (a log naming another guard goes on to its own reproduction).
FINDINGS_ABOUT = {
    "test_findings_unresolved_fused_ops_retrace_at_capture": {"guard": r"\._forward_method\b"},
    "test_findings_global_forward_mode_none_recompiles": {"guard": r"\bglobal_forward_mode\b"},
    "test_findings_capture_size_one_never_replays": {
        "guard": r"\b2 <= \S+\.size\(\)\[0\]|size mismatch at index 0\. expected 1\b"},
    "test_findings_mrope_slot_retraces": {"guard": r"stride\(\)\[0\] == \S+\.size\(\)\[1\]"},
    "test_findings_deepstack_warmup_skipped": {"guard": r"\binput_deepstack_embeds\b"},
    "test_findings_speculative_modes_recompile": {"guard": r"\bforward_mode\b"},  # not global_forward_mode
}


def run_finding(case: PrefillCase, batch: Batch) -> None:
    with example("prefill_pcg_findings", capture_tokens=case.capture_tokens, backend=case.backend,
                 **draw.describe(batch)) as ex:
        run_example(ex, PrefillSession.get(case), batch)


@pytest.mark.xfail(strict=True, reason=(
    "finding: a fused op's dispatch is resolved lazily (BaseFusedOp._forward_method None until its first call, "
    "0.5.19+); on a server nothing runs it before the tc_piecewise compile pass, so leave_torch_compile restores "
    "None, Dynamo's guard on that attribute's type fails at the first capture, and with Inductor pieces the body "
    "is traced and compiled again inside the capture, its fused ops out of compile mode (capture-context fires on "
    "that second trace, no-recompile on its count)"))
def test_findings_unresolved_fused_ops_retrace_at_capture():
    from harness.models.fused_ops import silu_and_mul

    if getattr(silu_and_mul(resolve=False), "_forward_method", None) is not None:  # MultiPlatformOp: resolved at init
        pytest.skip(f"SGLang {sglang_version()} resolves a fused op's dispatch at construction: nothing to leave "
                    "unresolved")
    case = PrefillCase(backend="tc_piecewise", capture_tokens=(4, 8), compiler="inductor", body="lazy_fused")
    run_finding(case, Batch((Request(1, (3, 5)),), _mode("EXTEND"), _mode("EXTEND")))


@pytest.mark.xfail(strict=True, reason=(
    "finding: the capture batch carries global_forward_mode=EXTEND but load_batch passes the live value through; "
    "without DP attention/TBO the scheduler leaves it None, so a model that reads the batch-wide mode inside the "
    "compiled region recompiles at every piecewise replay (SGLang's own models read it only under TBO)"))
def test_findings_global_forward_mode_none_recompiles():
    run_finding(TC_CASE, Batch((Request(1, (3, 5)),), _mode("EXTEND"), None))


@pytest.mark.xfail(strict=True, reason=(
    "finding: Dynamo specialises a size-1 token dimension, so with 1 in the capture grid the 1-token pieces are "
    "compiled separately during the compile pass and never captured: a 1-token prefill takes the graph path and "
    "replays no graph (the graph-replay oracle fires)"))
def test_findings_capture_size_one_never_replays():
    case = PrefillCase(backend="tc_piecewise", capture_tokens=(1, 4), compiler="eager")
    run_finding(case, Batch((Request(1, (3,)),), _mode("EXTEND"), _mode("EXTEND")))


@pytest.mark.xfail(strict=True, reason=(
    "finding: the mRoPE slot is a view buf[:, :T] of a [3, max_tokens] buffer; at the largest bucket (traced first) "
    "it is contiguous, so Dynamo guards positions.stride()[0] == positions.size()[1] and every smaller bucket traces "
    "the forward again (one more full compile per VLM under tc_piecewise, an Inductor compile with inductor pieces)"))
def test_findings_mrope_slot_retraces():
    layout = _layout()
    if layout.multimodal_gap():
        pytest.skip(layout.multimodal_gap())
    case = PrefillCase(backend="tc_piecewise", capture_tokens=GRID, multimodal=True)
    run_finding(case, Batch((Request(1, (3, 5)),), _mode("EXTEND"), _mode("EXTEND")))


@pytest.mark.xfail(strict=True, reason=(
    "finding: run_dummy_multimodal_deepstack_forward checks inspect.signature(language_model.forward) for "
    "input_deepstack_embeds, but install_torch_compiled has already replaced that forward by its "
    "trampoline(*args, **kwargs): the Qwen3-VL deepstack warm-up never runs, so the first request carrying "
    "deepstack embeddings compiles the body at serve time"))
def test_findings_deepstack_warmup_skipped():
    """A body taking deepstack embeddings, its model declaring num_deepstack_embeddings = 1: the compile pass
    traces every token count once (text dummies), then the deepstack warm-up traces the tensor branch: 2 traces."""
    gap = _layout().feature_gap(prefill.DEEPSTACK_WARMUP) or one_trace_gap()  # no warm-up, or no one-trace baseline
    if gap:
        pytest.skip(gap)
    case = PrefillCase(backend="tc_piecewise", capture_tokens=GRID, body="deepstack")
    batch = Batch((Request(1, (3, 5)),), _mode("EXTEND"), _mode("EXTEND"))
    with example("prefill_pcg_findings", capture_tokens=GRID, backend=case.backend, body=case.body,
                 **draw.describe(batch)) as ex:
        session = PrefillSession.get(case)
        traces = session.recompiles.warmup_compiles
        if traces != 2:
            raise OracleFailure("no-recompile", f"the compile pass traced the deepstack body {traces} time(s), "
                                "expected 2 (all token counts, then the input_deepstack_embeds branch the deepstack "
                                "warm-up must trace before serving)", traces=traces)
        run_example(ex, session, batch, one_trace=False)


@pytest.mark.parametrize("mode", SPECULATIVE_OR_DLLM)
@pytest.mark.xfail(strict=True, reason=(
    "finding: can_run_graph accepts DRAFT_EXTEND(_V2) / DLLM_EXTEND batches (dispatch uses "
    "is_extend(include_draft_extend_v2=True)) and load_batch passes them through unnormalised, so the EXTEND "
    "piecewise capture recompiles for them; only a draft worker / dLLM scheduler produces them"))
def test_findings_speculative_modes_recompile(mode):
    if mode not in {m.name for m in draw.all_modes()}:
        pytest.skip(f"SGLang {sglang_version()} has no ForwardMode.{mode}")
    run_finding(TC_CASE, Batch((Request(1, (3, 5)),), _mode(mode), _mode("EXTEND")))


# -- stateful: capture once, then interleave -----------------------------------------------------------------
class PrefillMachine(RuleBasedStateMachine):
    """Capture once (tc_piecewise, eager pieces), then interleave graph replays of every size and mode, chunked
    continuations of earlier requests, eager fallbacks (too many tokens, refused modes), and check every oracle
    after every step, so state one step leaves behind (a stream or mode flag left set, a recompile an earlier step
    triggered, KV or static buffers an earlier step left stale) fails the step that shows it.
    LoRA switches: the harness model has no LoRA layers (`PrefillForCausalLM.supports_lora` is False), so the
    machine has no LoRA rule."""

    def __init__(self):
        super().__init__()
        self.session = None
        self.sequences: dict[int, tuple[int, ...]] = {}  # row -> tokens cached so far (for continuations)
        self.steps = 0

    @initialize()
    def capture(self):
        self.session = PrefillSession.get(TC_CASE)
        self.session.check_capture()

    def _run(self, batch: Batch, label: str, *, reuse_history: bool = False):
        self.steps += 1
        with example("prefill_pcg_stateful", step=self.steps, rule=label, capture_tokens=GRID,
                     **draw.describe(batch)) as ex:
            ex.note("kv_from_earlier_step", reuse_history)
            outcome = run_example(ex, self.session, batch, reuse_history=reuse_history)
        for request in batch.requests:  # every forward that ran wrote its rows' KV, whatever its mode
            if outcome.path == "sglang-error":
                self.sequences.pop(request.row, None)
            else:
                self.sequences[request.row] = request.history + request.tokens
        return outcome

    @rule(data=st.data())
    def replay(self, data):
        """A graph-bound batch: any size, EXTEND/MIXED in each field."""
        self._run(data.draw(draw.graph_bound_batches(GRID)), "replay")

    @precondition(lambda self: bool(self.sequences))
    @rule(data=st.data())
    def continue_request(self, data):
        """The next chunk of a request an earlier step computed (its KV comes from that step), or its next
        decode token inside a MIXED batch."""
        row = data.draw(st.sampled_from(sorted(self.sequences)))
        history = self.sequences[row]
        room = draw.MAX_CONTEXT - len(history)
        assume(room >= 1)
        count = data.draw(st.integers(1, min(room, GRID[-1])))
        tokens = tuple(data.draw(st.lists(draw.TOKEN_IDS, min_size=count, max_size=count)))
        mode = _mode("MIXED") if count == 1 else data.draw(st.sampled_from(GRAPH_MODES).map(_mode))
        batch_wide = data.draw(st.sampled_from(GRAPH_MODES).map(_mode))
        # The previous step's KV is what this one reads: no history replay for it (prefix from the cache).
        self._run(Batch((Request(row, tokens, prefix=len(history), history=history),), mode, batch_wide),
                  "continue", reuse_history=True)

    @rule(data=st.data())
    def eager_fallback(self, data):
        """A batch the runner refuses: more tokens than the largest capture, or a mode it has no graph for."""
        refused = tuple(m for m in ("DECODE", "TARGET_VERIFY") if m in self.session.layout.refused_modes)
        kind = data.draw(st.sampled_from(("too-many-tokens",) + refused))
        if kind == "too-many-tokens":
            num_tokens = data.draw(st.integers(GRID[-1] + 1, 2 * GRID[-1]))
            batch = data.draw(draw.batches(num_tokens, _mode("EXTEND"), _mode("EXTEND"), decoding=False))
        else:
            batch = data.draw(draw.batches(1, _mode(kind), _mode("EXTEND")))
        outcome = self._run(batch, f"eager-fallback:{kind}")
        assert outcome.path in ("eager", "sglang-error")

    @invariant()
    def at_rest(self):
        """Between steps SGLang's process-wide graph state is at rest (checked after capture too)."""
        if self.session is not None and not self.session.closed:
            try:
                check_at_rest(self.session.probes, context=f"after step {self.steps}")
            except OracleFailure:  # recorded only when it fires: it is a check, not an example
                with example("prefill_pcg_stateful", step=self.steps, rule="invariant:at-rest", capture_tokens=GRID):
                    raise


TestPrefillMachine = PrefillMachine.TestCase
TestPrefillMachine.settings = settings(suite_settings(gate_examples=7, shrink_in_gate=False), stateful_step_count=15,
                                       suppress_health_check=list(HealthCheck))
