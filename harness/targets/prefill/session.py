"""One prefill-runner target on the run's device, with every oracle of the prefill suite attached.

    session = PrefillSession.get(case)          # cached: one live target per process (see below)
    outcome = session.step(batch, ex)           # SGLang's dispatch for one forward, then all oracles

A session enters its device (the virtual device in the case's capture mode, or a real GPU whose CUDA graphs the
counter counts), a `RecompileWatcher` and a `CaptureStreamWatcher`, and builds the target (SGLang compiles and
captures). The recompile watcher is armed once capture is done; the capture-stream watcher watches capture too (a
capture session that never set the stream shows there first).

Only one target lives per process: `install_torch_compiled` removes the model class's forward code from Dynamo's
cache each time it compiles a new instance, so an older target's compiled forward would recompile. Asking for
another case closes the current session first. Compiled pieces are therefore cached per capture grid within a
run: examples that share a case share its target.
"""
from __future__ import annotations

import contextlib
import dataclasses

import torch

from harness.counter import counter
from harness.devices import get_device
from harness.models.prefill_model import NUM_LAYERS, initial_hidden, reference_logits
from harness.models import capture_queries
from harness.oracles import OracleFailure, capture_context
from harness.oracles.capture_stream import CaptureStreamWatcher
from harness.oracles.eager import assert_matches_eager
from harness.oracles.dynamo_evidence import TraceRecorder
from harness.oracles.graph_break import check as check_graph_break, graph_breaks_as_verdict
from harness.oracles.graph_replay import ORACLE as GRAPH_REPLAY, check_eager_forward, check_graph_forward, replay_delta
from harness.oracles.prefill_padding import check_padded_rows
from harness.oracles.process_state import check_at_rest
from harness.oracles.recompile import ORACLE as RECOMPILE, RecompileWatcher
from harness.targets import prefill
from harness.targets.prefill.admission import must_run_eager
from harness.targets.prefill.base import Batch, PrefillCase, Request
from harness.targets.sglang_plumbing import load
from harness.versions import sglang_version

# Modes whose graph replay must equal an EXTEND capture (the runner normalises MIXED to EXTEND).
GRAPH_MODES = ("EXTEND", "MIXED")
ADMISSION = "admission"


def expected_capture(case: PrefillCase) -> tuple[list[int], int, int]:
    """(token counts the runner must capture, graphs one forward replays, graphs per token count), from the case.

    Sizes: the configured grid, each once (`sorted(set(capture_tokens))`: (4, 8, 16) -> [4, 8, 16]).
    Graphs per forward: the model has NUM_LAYERS attention split ops; tc_piecewise and breakable cut the body
    there, so NUM_LAYERS + 1 pieces each capture one graph (2 layers: 3 graphs); full captures the body whole (1).
    Graphs per size: those of one forward, times 1 + the chunked-prefix variants when the case captures chunked
    prefixes (`prefix_variants`; each variant is a full graph of its own).
    Example: tc_piecewise over (4, 8, 16): 3 sizes x 3 pieces = 9 graphs at capture, 3 replays per graph forward.
    """
    per_forward = 1 if case.backend == "full" else NUM_LAYERS + 1
    variants = len(prefix_variants(case)) if case.backend == "full" and case.prefix_chunk_tokens is not None else 0
    return sorted(set(case.capture_tokens)), per_forward, per_forward * (1 + variants)


def prefix_variants(case: PrefillCase) -> tuple[int, ...]:
    """Chunk counts a chunked-prefix full capture records: the geometric set 1, 2, 4, 8, 16, keeping n only while
    n // 2 chunks cannot already cover the longest addressable prefix (`max_context`). A chunk holds
    prefix_chunk_tokens // full_prefill_max_req tokens per request. Example: 64 tokens over 4 slots -> 16 per
    request; a 64-token context needs 4 chunks -> variants (1, 2, 4)."""
    per_request = max(min(case.prefix_chunk_tokens, case.max_context * case.full_prefill_max_req)
                      // case.full_prefill_max_req, 1)
    needed = -(-case.max_context // per_request)
    return tuple(n for n in (1, 2, 4, 8, 16) if n // 2 < needed)


def one_trace_gap() -> str | None:
    """Why the installed SGLang does not promise one compile-pass trace for every token count (None: it does).
    From 0.5.19 `install_torch_compiled` marks the ForwardBatch's tensors dynamic too; before, a model reading
    them in the compiled region traces once per captured token count (all during the compile pass)."""
    if hasattr(load("sglang.srt.compilation.compile"), "_mark_dynamic_forward_batch"):
        return None
    return (f"one trace per token count not checked: SGLang {sglang_version()} has no "
            "compile._mark_dynamic_forward_batch (its ForwardBatch tensors stay static)")


@dataclasses.dataclass
class Outcome:
    path: str  # "graph" | "eager" | "sglang-error"
    logits: torch.Tensor | None = None
    error: BaseException | None = None
    replay: dict | None = None


class PrefillSession:
    _current: PrefillSession | None = None
    device = "cpu"  # where sessions run: the suite's --device, set through use_device

    @classmethod
    def use_device(cls, name: str) -> None:
        if name != cls.device:
            cls.close_current()
            cls.device = name

    @classmethod
    def get(cls, case: PrefillCase) -> PrefillSession:
        current = cls._current
        if current is not None and current.case == case and not current.closed:
            return current
        if current is not None:
            current.close()
        cls._current = cls(case)
        return cls._current

    @classmethod
    def close_current(cls) -> None:
        if cls._current is not None:
            cls._current.close()
            cls._current = None

    def __init__(self, case: PrefillCase):
        self.case = case
        self.closed = False
        self.layout = prefill.load()
        self._stack = contextlib.ExitStack()
        try:
            device = get_device(self.device)
            self._stack.enter_context(device.install("cuda"))
            self._stack.enter_context(device.capture_mode(case.device_capture_mode))
            opened = counter.mark()
            self.recompiles = self._stack.enter_context(RecompileWatcher("the prefill model's forward"))
            self.streams = self._stack.enter_context(CaptureStreamWatcher("prefill capture and replay"))
            self.answers = self._stack.enter_context(capture_queries.recording())
            # the graphs Dynamo hands the compile backend (dynamo-contract: the axes SGLang marks dynamic)
            self.compile_traces = self._stack.enter_context(TraceRecorder())
            with self.streams.watching_warnings(), graph_breaks_as_verdict(f"the {case.backend} compile pass"):
                self.target = self.layout.make_target(case, device.torch_device)
            self.compile_traces.stop()
            self._stack.callback(self.target.close)
            capture_queries.serving()
            # SGLang's caller (cuda_graph_setup) then reads free memory with empty_cache=True, and cudaFree
            # synchronises the device: the capture stream's eager tail is ordered before the first replay.
            torch.get_device_module(device.torch_device).synchronize()
            self.capture_sizes = list(self.target.runner.capture_num_tokens)
            self.expected_sizes, self.graphs_per_forward, self.graphs_per_size = expected_capture(case)
            self.captured = counter.since(opened)["num_graphs_captured"]
            self.warmup_guards = list(self.recompiles.guard_failures)  # why the compile pass traced again, if it did
            self.one_trace_gap = one_trace_gap()
            self.recompiles.arm()
            self.probes = self.target.state_probes()
        except BaseException:
            self._stack.close()
            self.closed = True
            raise

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self._stack.close()

    # -- oracles that do not depend on a forward ------------------------------------------------------------
    def check_capture(self, *, one_trace: bool = True) -> None:
        """After construction: no capture-stream problem, one Dynamo trace for every token count (tc_piecewise:
        SGLang marks the token and request dimensions dynamic for exactly that), and the token counts and graphs
        the case implies."""
        self.streams.check("capture")
        self.check_capture_context("capture")
        capture_context.check_fused_ops_traced(self.compile_traces.fused_modes, promised=self.case.compiler != "eager",
                                               what=f"prefill {self.case.backend} compile pass")
        traces = self.recompiles.warmup_compiles
        if one_trace and not self.one_trace_gap and self.case.backend == "tc_piecewise" and traces != 1:
            guard = " ".join(self.warmup_guards[-1].split()) if self.warmup_guards else "(no guard failure logged)"
            raise OracleFailure(RECOMPILE, f"the compile pass traced the model's forward {traces} times over token "
                                f"counts {self.expected_sizes}; one trace must serve them all (a dimension SGLang "
                                f"left static or specialised); last failing guard: {guard}",
                                traces=traces, guards=self.warmup_guards[-3:])
        sizes, per_size = self.expected_sizes, self.graphs_per_size
        if sorted(self.capture_sizes) != sizes:
            raise OracleFailure(GRAPH_REPLAY, f"the runner captured token counts {sorted(self.capture_sizes)}, "
                                f"the case configures {sizes} (sorted(set(capture_tokens)))",
                                capture_sizes=self.capture_sizes, expected_sizes=sizes)
        if self.captured != len(sizes) * per_size:
            raise OracleFailure(GRAPH_REPLAY, f"the capture recorded {self.captured} graph(s), expected "
                                f"{len(sizes) * per_size} ({len(sizes)} token counts x {per_size} graph(s) each for "
                                f"the {self.case.backend} backend)", capture_sizes=self.capture_sizes,
                                captured=self.captured)

    # -- one forward -------------------------------------------------------------------------------------------
    def prefill_history(self, batch: Batch) -> None:
        """Earlier iterations, for requests that arrive with a cached prefix: run their history eagerly once
        (the model writes its own KV for those tokens, as the chunk before did)."""
        from sglang.srt.model_executor.forward_batch_info import ForwardMode

        earlier = tuple(Request(r.row, r.history, mrope_delta=r.mrope_delta, adapter=r.adapter)
                        for r in batch.requests if r.prefix)
        if earlier:
            self.target.eager(Batch(earlier, ForwardMode.EXTEND, ForwardMode.EXTEND))

    def step(self, batch: Batch, ex=None, *, check_eager: bool = True, reuse_history: bool = False) -> Outcome:
        """SGLang's dispatch for `batch`, then: no recompile, no capture-stream sighting, a batch the graphs cannot
        serve took the eager path (admission), the graph path replayed its graphs (or the eager path none), output
        equal to eager and to the by-hand numbers, state at rest.

        `reuse_history`: the requests' prefixes are already in the KV cache (an earlier step computed them).
        A failing oracle closes the session: its watchers and compiled state are spoiled for later examples."""
        try:
            if not reuse_history:
                self.prefill_history(batch)
            return self._step(batch, ex, check_eager)
        except BaseException:
            self.close()
            if PrefillSession._current is self:
                PrefillSession._current = None
            raise

    def _step(self, batch: Batch, ex, check_eager: bool) -> Outcome:
        expected = self.target.eager(batch) if check_eager and batch.requests else None
        mark = counter.mark()
        mode = batch.forward_mode.name
        try:
            with self.streams.watching_warnings():
                logits, graph_path, _ = self.target.forward(batch)
        except Exception as error:  # noqa: BLE001 - classified below
            check_graph_break(error, where=f"a {mode} forward (fullgraph compiled body)")
            self._check_watchers(batch)
            refused = must_run_eager(self.case, batch) if mode in GRAPH_MODES else None
            if refused:
                raise OracleFailure(ADMISSION, f"SGLang raised {type(error).__name__}: {str(error)[:200]} for a "
                                    f"{mode} batch its admission must send to eager: {refused}",
                                    **self._batch_details(batch)) from error
            return Outcome("sglang-error", error=error, replay=replay_delta(counter.since(mark)))
        delta = replay_delta(counter.since(mark))
        outcome = Outcome("graph" if graph_path else "eager", logits=logits, replay=delta)
        if ex is not None:
            ex.note("path", outcome.path)
            ex.note("graph_replays", delta["replays"])
        context = (f"forward_mode={mode}, global_forward_mode="
                   f"{getattr(batch.global_forward_mode, 'name', None)}, tokens={batch.num_tokens}")
        self._check_watchers(batch)
        refused = must_run_eager(self.case, batch) if graph_path or mode in GRAPH_MODES else None
        if graph_path and refused:
            raise OracleFailure(ADMISSION, f"the {mode} batch replayed the prefill graphs, but {refused}: "
                                "can_run_graph must send it to eager", **self._batch_details(batch))
        if not graph_path and mode in GRAPH_MODES and batch.requests and refused is None:
            longest = max(r.prefix + len(r.tokens) for r in batch.requests)
            raise OracleFailure(ADMISSION, f"the {mode} batch ran eager, but the graphs serve it ({batch.num_tokens} "
                                f"tokens within the capture {list(self.case.capture_tokens)}, longest context "
                                f"{longest}, no reason of the case's or the batch's to refuse it): can_run_graph "
                                "sent a servable batch to eager", **self._batch_details(batch))
        if graph_path:
            check_graph_forward(delta, self.graphs_per_forward, context=context)
            variants = prefix_variants(self.case) if self.case.prefix_chunk_tokens is not None else ()
            padded = check_padded_rows(self.target.runner, batch, self.case, sizes=self.expected_sizes,
                                       prefix_variants=variants)  # padded rows hold what SGLang promises
            if ex is not None:
                ex.note("padded_rows", padded)
        else:
            check_eager_forward(delta, context=context)
        if expected is not None and logits is not None:
            exact = self.case.backend != "tc_piecewise" or self.case.compiler == "eager"
            assert_matches_eager(logits, expected, exact=exact)
            if batch.forward_mode.is_extend() or batch.forward_mode.is_decode():
                mrope = self.case.multimodal
                rows = [initial_hidden(r.history + r.tokens, r.embeds, r.mrope_delta if mrope else None, r.adapter)
                        for r in batch.requests]
                by_hand = torch.tensor(reference_logits(rows), dtype=logits.dtype)
                assert_matches_eager(expected, by_hand)
        return outcome

    @staticmethod
    def _batch_details(batch: Batch) -> dict:
        return dict(num_tokens=batch.num_tokens, requests=len(batch.requests),
                    input_embeds=any(r.embeds is not None for r in batch.requests),
                    capture_hidden_mode=batch.capture_hidden_mode, return_logprob=batch.return_logprob)

    def check_capture_context(self, context: str) -> dict:
        """What the layers were told about the capture since the last check (`oracles.capture_context`)."""
        promised = capture_context.promised("prefill", self.case.backend, lora=bool(self.case.lora))
        what = f"prefill {self.case.backend} backend, {context}"
        counts = capture_context.check(self.answers, capture_mode_promised=promised, what=what)
        capture_context.check_fused_ops_at_rest(self.compile_traces.fused_ops(), what=what)
        self.answers.clear()
        return counts

    def _check_watchers(self, batch: Batch) -> None:
        context = (f"forward_mode={batch.forward_mode.name}, global_forward_mode="
                   f"{getattr(batch.global_forward_mode, 'name', None)}, tokens={batch.num_tokens}")
        self.streams.check(context)
        self.check_capture_context(context)
        self.recompiles.check(context)
        check_at_rest(self.probes, context=context)
