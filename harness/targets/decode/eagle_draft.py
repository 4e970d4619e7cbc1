"""The EAGLE draft worker's graphs on a real draft model: SGLang's `EAGLEDraftCudaGraphRunner` capturing SGLang's
`EagleDraftWorker.draft_forward` (every draft step of a tree of `topk` branches in one graph) and
`EAGLEDraftExtendCudaGraphRunner` capturing the draft extend after a verify (the model over each request's verify
window, logits of the last accepted token), over SGLang's `LlamaForCausalLMEagle` (tiny config, dummy weights; or
the EAGLE3 head, or a STANDALONE draft: a vanilla `LlamaForCausalLM` reading no hidden state, its worker SGLang's
`StandaloneDraftWorker`),
SGLang's `TritonMultiStepDraftBackend` (one `TritonAttnBackend` per step) and the extend's `TritonAttnBackend`
(kernels run by Triton's CPU interpreter) and SGLang's real pools.

What is SGLang's own: the worker's methods (`_rebuild_topk1_chain_buffers`, `_init_dsa_index_share_state`,
`init_attention_backend` with its `DraftBackendFactory`, `draft_forward`), the runner (constructor, capture, `execute`
with its padding), the multi-step backend and its metadata kernels (`generate_draft_decode_kv_indices`), the model,
the pools. Doubles: the worker's and the draft runner's constructors (their attributes are set, as the decode
target's runner double is), and the draft runner's `forward`, which hands the batch to the model as
`ModelRunner._forward_raw`'s eager decode does (no decode graph of its own: a draft worker captures none).

A draft batch is what SGLang's `prepare_for_draft` hands over for a chain or tree draft at page size 1: per request
its committed prefix (`seq_len` tokens in the cache), then `topk * num_steps` slots of its `req_to_token` row past
the prefix (branch-major) as `out_cache_loc`, positions `seq_len` once per branch, the target's top-k (`topk_p`,
`topk_index`) and last hidden state in an `EagleDraftInput`.

A draft-extend batch is what `prepare_for_draft_extend` and `ForwardBatch.init_new` hand over after a verify: per
request its prefix before the verify window, the window's `num_draft_tokens` tokens (slots past the prefix, where
the verify wrote), the target's hidden state per token, how many tokens it accepted (`select_index`: the last one).

Under the virtual device's npu personality (`personality="npu"`) the runners are SGLang's NPU subclasses
(`EAGLEDraftNpuGraphRunner`, `EAGLEDraftExtendNpuGraphRunner`, what the worker picks on an NPU), replaying through
the platform's `NPUCudaGraphBackend`; each replay is also held to the host-side lengths it rebinds its graph with
(`npu-graph-update`).

Checks (`check_draft_replay`): the replay's draft tree (parents, selected indices, tokens) equals eager
`draft_forward` of the same worker on a fresh `TritonMultiStepDraftBackend` over the same cache, and the KV each
leaves in the draft slots agrees; the per-step KV rails the graph reads (`kv_indptr`, `cuda_graph_kv_indices` of the
backend) are the batch's arithmetic: step i of branch k of a request reads its prefix then its branch's first i + 1
draft slots (`draft_rails`), a padded branch only the padding slot; eager itself is held to the same arithmetic.
Rails are checked before the kernels follow them (an interpreted kernel following a stale index reads wild memory).
`check_extend_replay`: the extend's selected logits and hidden states against the worker's eager extend (within
`same`'s tolerance: the graph runs the LM head on the selected rows only), the KV its window writes, its rails
(each request extends by the whole window over its prefix).
"""
from __future__ import annotations

import contextlib
import dataclasses
from typing import Any

import torch

from harness.errors import HarnessError, PathMissing
from harness.models.real import DRAFT_FAMILIES, build_family, draft_family, missing_family, sliding_window_size
from harness.oracles import OracleFailure, batch_consistency, graph_key
from harness.oracles.draft_token_map import check_tokens_mapped
from harness.oracles.npu_graph_update import expected_draft_updates, expected_extend_updates
from harness.targets.decode.base import DecodeCase
from harness.targets.decode.real_model import RealModelTarget, kernels

RUNNER_MODULE = "sglang.srt.speculative.eagle_draft_cuda_graph_runner"
EXTEND_RUNNER_MODULE = "sglang.srt.speculative.eagle_draft_extend_cuda_graph_runner"
WORKER_MODULE = "sglang.srt.speculative.eagle_worker_v2"
STANDALONE_WORKER_MODULE = "sglang.srt.speculative.standalone_worker_v2"  # STANDALONE's draft worker
DRAFT_FAMILY = "eagle"  # the EAGLE worker's draft head; EAGLE3's is `draft_family("EAGLE3")`
NPU_RUNNERS = "sglang.srt.hardware_backend.npu.graph_runner"
# the runner classes `EagleDraftWorker._capture_cuda_graphs` looks up by the target worker's device
# (`Device2DraftCudaGraphRunner`, `Device2ExtendCudaGraphRunner`), by personality: (module, class) for each graph
RUNNER_CLASSES = {
    "cuda": ((RUNNER_MODULE, "EAGLEDraftCudaGraphRunner"), (EXTEND_RUNNER_MODULE, "EAGLEDraftExtendCudaGraphRunner")),
    "npu": ((f"{NPU_RUNNERS}.eagle_draft_npu_graph_runner", "EAGLEDraftNpuGraphRunner"),
            (f"{NPU_RUNNERS}.eagle_draft_extend_npu_graph_runner", "EAGLEDraftExtendNpuGraphRunner")),
}


# what this target calls, by module and class: the 0.5.2x draft worker's layout (its own methods build and run it)
NEEDED = {
    WORKER_MODULE: ("EagleDraftWorker", ("init_attention_backend", "draft_forward", "_rebuild_topk1_chain_buffers",
                                         "_init_dsa_index_share_state")),
    RUNNER_MODULE: ("EAGLEDraftCudaGraphRunner", ("execute", "_replay_graph")),
    EXTEND_RUNNER_MODULE: ("EAGLEDraftExtendCudaGraphRunner", ("execute", "_replay_graph")),
}


def draft_missing(personality: str = "cuda") -> str | None:
    """Why the installed SGLang cannot run this target under `personality` (naming the release and what it lacks),
    or None."""
    import importlib

    from harness.versions import module_exists, sglang_version

    needed = dict(NEEDED)
    if personality != "cuda":
        needed.update({module: (name, ("execute", "_replay_graph")) for module, name in RUNNER_CLASSES[personality]})
    for module, (name, methods) in needed.items():
        if not module_exists(module):
            return f"SGLang {sglang_version()} has no {module}: no EAGLE draft graphs of the layout this target drives"
        owner = getattr(importlib.import_module(module), name, None)
        lacking = [method for method in methods if not hasattr(owner, method)] if owner is not None else [name]
        if lacking:
            return f"SGLang {sglang_version()}: {module}.{name} lacks {', '.join(lacking)}: this target drives the " \
                   "0.5.2x EAGLE draft worker's layout"
    return missing_family(DRAFT_FAMILIES[DRAFT_FAMILY])


def worker_missing(algorithm: str) -> str | None:
    """Why the installed SGLang has no draft worker of its own for `algorithm` (STANDALONE's keeps its own LM head),
    or None."""
    from harness.versions import module_exists, sglang_version

    if algorithm == "STANDALONE" and not module_exists(STANDALONE_WORKER_MODULE):
        return (f"SGLang {sglang_version()} has no {STANDALONE_WORKER_MODULE}: no STANDALONE draft worker of the "
                "layout this target drives")
    return None


def draft_window_missing() -> str | None:
    """Why the installed SGLang serves no draft window (`--speculative-draft-window-size` / `-sink-size` clipping
    the multi-step draft's rails, `spec_utils.resolve_draft_decode_window`), or None."""
    import importlib

    from harness.versions import module_exists, sglang_version

    module = "sglang.srt.speculative.spec_utils"
    if not module_exists(module) or not hasattr(importlib.import_module(module), "resolve_draft_decode_window"):
        return (f"SGLang {sglang_version()} has no {module}.resolve_draft_decode_window: its multi-step draft plans "
                "no draft window, so --speculative-draft-window-size / -sink-size are not driven on this release")
    return None


def hot_token_map(draft_vocab: int, vocab: int, seed: int) -> torch.Tensor:
    """An EAGLE3 head's draft-to-target token map as its checkpoint's `d2t` loads it (`hot_token_id`: each draft
    token's target id, ascending), `draft_vocab` of the target's `vocab` ids drawn from `seed`."""
    chosen = torch.randperm(vocab, generator=torch.Generator().manual_seed(seed))[:draft_vocab]
    return chosen.sort().values


def _fresh_input_buffer_pool() -> None:
    """Each draft target starts as a new server does: SGLang's process-wide input-buffer pool empty. The pool keys
    buffers by name and size only, and the first registrant's tensor (with its values) is canonical: an earlier
    example's draft-extend runner of another verify width left `extend_seq_lens` holding its width, which the
    next capture's deterministic extend read, gathering write slots past its own `out_cache_loc` (wild reads; a
    segfault under the interpreter; a nightly draw crashed this way). Within one server the pool is filled at
    startup, before any replay writes it: the extend runner's capture then reads the draft decode runner's
    `extend_seq_lens` (ones), capture-time values only, which every replay refreshes."""
    from harness.versions import module_exists

    if module_exists("sglang.srt.model_executor.input_buffers"):
        import sglang.srt.model_executor.input_buffers as input_buffers

        pool = getattr(input_buffers, "_forward_input_buffer_pool", None)
        if pool is not None:
            pool.clear()


@contextlib.contextmanager
def _no_compile(what: str):
    """A replay compiles nothing (`no-recompile`, with the guard that failed). Only the replays are watched: the
    eager references call SGLang's `torch.compile`d `_select_top_k_tokens_later` on unpadded batches, which a
    server sends through the graph (Dynamo specialises a batch of one, so eager recompiles there)."""
    from harness.oracles.recompile import RecompileWatcher

    with RecompileWatcher(f"EAGLE draft worker, {what}") as watcher:
        watcher.arm()
        yield
        watcher.check(f"{what} compiled a frame")


@contextlib.contextmanager
def _checked_replay(runner, before_graph, what: str):
    """While the block runs `runner.execute`: `before_graph()` runs after the runner's metadata prep, right before
    its graph replays (its `_replay_graph`), the Triton kernels by the interpreter, and the replay compiles nothing.
    The runner's own `_replay_graph` is back after."""
    replay_graph = runner._replay_graph

    def checked(shape_key, forward_batch):
        if before_graph is not None:
            before_graph()
        return replay_graph(shape_key, forward_batch)

    runner._replay_graph = checked
    try:
        with kernels(), _no_compile(what):
            yield
    finally:
        del runner._replay_graph  # the class's method again


@dataclasses.dataclass
class DraftBatch:
    """One draft-decode batch as `prepare_for_draft` leaves it: per request its committed prefix length, pool row,
    the target's top-k tokens and probabilities, and the seed of its cached prefix and hidden state."""

    seq_lens: list[int]
    pool_rows: list[int]
    topk_index: list[list[int]]
    topk_p: list[list[float]]
    seed: int
    # under rejection sampling: each request's top_k (1: greedy, as SamplingParams rewrites temperature 0) and
    # temperature; None: the batch carries no sampling info (the worker reads none without rejection sampling)
    top_ks: list[int] | None = None
    temperatures: list[float] | None = None

    @property
    def batch_size(self) -> int:
        return len(self.seq_lens)

    @property
    def all_greedy(self) -> bool:
        return self.top_ks is not None and all(k <= 1 for k in self.top_ks)


@dataclasses.dataclass
class DraftExtendBatch:
    """One draft-extend batch as `prepare_for_draft_extend` leaves it after a verify: per request its prefix before
    the verify window, pool row, the window's tokens (`num_draft_tokens` of them: the accepted ones, then what the
    verify padded the window with) and how many it accepted (the bonus token included), and the seed of its cached
    prefix and of the target hidden states the window carries."""

    prefixes: list[int]
    pool_rows: list[int]
    tokens: list[list[int]]
    accepted: list[int]
    seed: int

    @property
    def batch_size(self) -> int:
        return len(self.prefixes)


class EagleDraftTarget(RealModelTarget):
    """See the module docstring. `case.spec`: the EAGLE settings (num_steps > 1: a single step captures nothing);
    `split_tile`: under `--enable-deterministic-inference` with that KV split tile (None: off)."""

    def __init__(self, case: DecodeCase, *, hooks: Any = None, split_tile: int | None = None,
                 personality: str = "cuda") -> None:
        """`personality`: the device SGLang's worker believes it runs on, which picks its runner classes
        (`RUNNER_CLASSES`; "npu": the NPU runners, under the virtual device's npu personality, whose platform hands
        the runners SGLang's `NPUCudaGraphBackend`)."""
        served = sorted(family.algorithm for family in DRAFT_FAMILIES.values())
        if case.spec is None or case.spec.algorithm not in served or case.spec.num_steps < 2:
            raise HarnessError(f"an EAGLE draft target needs one of {served} with two or more draft steps, not "
                               f"{case.spec}")
        if personality not in RUNNER_CLASSES:
            raise HarnessError(f"no EAGLE draft runners for personality {personality!r}: one of {list(RUNNER_CLASSES)}")
        reason = draft_missing(personality) or missing_family(DRAFT_FAMILIES[draft_family(case.spec.algorithm)]) or \
            (draft_window_missing() if case.spec.draft_window else None) or worker_missing(case.spec.algorithm)
        if reason:
            raise PathMissing(reason)
        _fresh_input_buffer_pool()
        with torch.no_grad():  # as `Scheduler.init_all_cuda_graphs` captures: Dynamo guards on the grad mode
            super().__init__(case, family="dense", hooks=hooks, split_tile=split_tile, personality=personality)

    def server_flags(self, case: DecodeCase) -> dict[str, Any]:
        # --page-size 1 said explicitly: the multi-step backend reads the published one (ServerArgs leaves it None
        # until a model's own handling runs), where the Triton backend reads the runner's
        return {**super().server_flags(case), "attention_backend": "triton", "page_size": 1}

    def build_parts(self, case: DecodeCase, device: str) -> tuple:
        from sglang.srt.layers.attention.triton_backend import TritonAttnBackend, TritonMultiStepDraftBackend

        parts = super().build_parts(case, device)  # the target's model and pools: the draft shares its cache shape
        self.draft = build_family(DRAFT_FAMILIES[draft_family(case.spec.algorithm)])
        if case.spec.algorithm == "EAGLE3":  # its own vocabulary, mapped onto the target's (`load_weights`' d2t)
            config = self.draft.model.config
            self.draft.model.hot_token_id = hot_token_map(config.draft_vocab_size, config.vocab_size, seed=1)
        self.draft_runner = self._draft_runner_double(case, device)
        self.eager_draft_backend = lambda: TritonMultiStepDraftBackend(self.draft_runner, case.spec.topk,
                                                                        case.spec.num_steps)
        # as DraftBackendFactory builds the draft extend's backend
        self.eager_extend_backend = lambda: TritonAttnBackend(self.draft_runner, skip_prefill=False)
        return parts

    def _draft_runner_double(self, case: DecodeCase, device: str):
        from sglang.srt.model_executor.model_runner import ModelRunnerOutput

        runner = self._runner_double(case, device)
        runner.model, runner.model_config = self.draft.model, self.draft.model_config
        runner.sliding_window_size = sliding_window_size(self.draft)  # ModelRunner's, for the draft's own model
        runner.is_draft_worker = True
        runner.draft_attention_backend = None  # --speculative-draft-attention-backend unset: the configured one
        model = self.draft.model

        def forward(forward_batch, *args, **kwargs):
            # ModelRunner._forward_raw's eager path: the batch to the model, in the forward context the caller opened
            # (draft_forward's, with the step's backend) or else one with the runner's own backend (the draft
            # extend's), whose metadata the worker planned
            from sglang.srt.model_executor.forward_context import has_forward_context

            from harness.targets.sglang_plumbing import forward_context

            context = contextlib.nullcontext() if has_forward_context() else \
                forward_context(runner.attn_backend, forward_batch)
            with context:
                logits = model.forward(forward_batch.input_ids, forward_batch.positions, forward_batch)
            return ModelRunnerOutput(logits_output=logits, can_run_graph=False)

        runner.forward = forward
        return runner

    def _runner_class(self):
        """SGLang's draft runner, built as `EagleDraftWorker._capture_cuda_graphs` builds it, over a worker whose
        attributes are set and whose own methods build its attention backends."""
        import importlib

        draft_cls, extend_cls = (getattr(importlib.import_module(module), name)
                                 for module, name in RUNNER_CLASSES[self.personality])

        def construct(model_runner, **kwargs):
            self.worker = self._worker()
            runner = draft_cls(self.worker)
            # then the draft extend's, as `_capture_cuda_graphs` captures it next, over the worker's extend backend
            self.extend_runner = extend_cls(self.worker)
            return runner

        return construct

    def _worker(self):
        from sglang.srt.speculative.eagle_worker_v2 import EagleDraftWorker
        from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

        spec = self.case.spec
        worker_class = _worker_class(spec.algorithm)
        worker = worker_class.__new__(worker_class)
        super(EagleDraftWorker, worker).__init__()  # what its own __init__ first runs: the base's bookkeeping
        worker.server_args, worker.device, worker.gpu_id = self.server_args, self.device, 0
        worker.topk, worker.speculative_num_steps = spec.topk, spec.num_steps
        worker.speculative_num_draft_tokens = spec.num_draft_tokens
        worker.speculative_algorithm = SpeculativeAlgorithm.from_string(spec.algorithm)
        worker._rebuild_topk1_chain_buffers()
        worker.draft_runner = self.draft_runner
        worker._init_dsa_index_share_state()
        # `init_token_map` then `init_lm_head`'s EAGLE3 branch: the head's own map (its embedding and LM head are the
        # draft's here, not shared with the target's)
        worker.hot_token_id = getattr(self.draft.model, "hot_token_id", None)
        worker.init_attention_backend()
        return worker

    # -- batches -----------------------------------------------------------------------------------------------
    @property
    def reads_hidden_states(self) -> bool:
        """Whether the draft reads the target's hidden states, by SGLang's own answer
        (`get_draft_recurrent_hidden_state_spec`): a STANDALONE draft, a model of its own, reads none, so its
        batches carry none and capture none (`CaptureHiddenMode.NULL`, as the worker and its runners ask)."""
        from sglang.srt.speculative.eagle_utils import get_draft_recurrent_hidden_state_spec

        return get_draft_recurrent_hidden_state_spec(self.draft_runner)[0] is not None

    @property
    def target_hidden_width(self) -> int:
        """How wide the target's hidden states a draft extend reads are: SGLang's own answer
        (`get_draft_input_from_target_hidden_dim`: EAGLE3, three target layers side by side)."""
        from sglang.srt.speculative.eagle_utils import get_draft_input_from_target_hidden_dim

        return get_draft_input_from_target_hidden_dim(self.draft_runner)

    @property
    def draft_slots(self) -> int:
        return self.case.spec.topk * self.case.spec.num_steps

    def stage_draft(self, batch: DraftBatch) -> list[int]:
        """The cache and rows as `prepare_for_draft` finds them: each request's row maps its prefix and, past it,
        `topk * num_steps` fresh slots (the draft's); returns `out_cache_loc` (those slots, request-major)."""
        self.pools.stage([n + self.draft_slots for n in batch.seq_lens], batch.pool_rows, batch.seed)
        return [slot for slots in self.pools.staged_slots for slot in slots[-self.draft_slots:]]

    def draft_forward_batch(self, batch: DraftBatch, out_cache_loc: list[int]):
        """The ForwardBatch `prepare_for_draft` builds (page size 1): positions `seq_len` once per branch."""
        from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode, ForwardBatch, ForwardMode
        from sglang.srt.speculative.eagle_info import EagleDraftInput

        device, topk = self.device, self.case.spec.topk
        seq_lens = torch.tensor(batch.seq_lens, dtype=torch.int64, device=device)
        generator = torch.Generator().manual_seed(batch.seed + 1)
        hidden = torch.randn((batch.batch_size, self.draft.model_config.hidden_size), generator=generator)
        mode = CaptureHiddenMode.LAST if self.reads_hidden_states else CaptureHiddenMode.NULL
        spec_info = EagleDraftInput(
            topk_p=torch.tensor(batch.topk_p, dtype=torch.float32, device=device),
            topk_index=torch.tensor(batch.topk_index, dtype=torch.int64, device=device),
            hidden_states=hidden.to(device) if self.reads_hidden_states else None, capture_hidden_mode=mode)
        spec_info.num_tokens_per_req = spec_info.num_tokens_for_logprob_per_req = topk
        positions = seq_lens.repeat_interleave(topk, dim=0)
        spec_info.positions = positions
        fb = ForwardBatch(
            forward_mode=ForwardMode.DECODE, batch_size=batch.batch_size, input_ids=None,
            req_pool_indices=torch.tensor(batch.pool_rows, dtype=torch.int64, device=device),
            seq_lens=seq_lens, seq_lens_cpu=seq_lens.cpu(), seq_lens_sum=sum(batch.seq_lens),
            out_cache_loc=torch.tensor(out_cache_loc, dtype=torch.int64, device=device), positions=positions,
            return_logprob=False, spec_algorithm=self.draft_runner.spec_algorithm, spec_info=spec_info,
            capture_hidden_mode=mode)
        fb.req_to_token_pool, fb.token_to_kv_pool = self.pools.req_to_token_pool, self.pools.token_to_kv_pool
        if self.case.spec.rejection_sampling:
            self._sampling(fb, batch, generator)
        return fb

    def _sampling(self, fb, batch: DraftBatch, generator) -> None:
        """The batch's sampling info (`SamplingBatchInfo`, as the scheduler builds it) and, for a batch that samples,
        the proposal distribution the previous step handed on (`EagleDraftInput.draft_probs`, one row a request)."""
        from sglang.srt.sampling.sampling_batch_info import SamplingBatchInfo

        if batch.top_ks is None or batch.temperatures is None:
            raise HarnessError("a draft batch under rejection sampling needs each request's top_k and temperature")
        device, bs, vocab = self.device, batch.batch_size, self.draft.model_config.vocab_size
        fb.sampling_info = SamplingBatchInfo(
            temperatures=torch.tensor(batch.temperatures, dtype=torch.float32, device=device).view(-1, 1),
            top_ps=torch.ones(bs, device=device), top_ks=torch.tensor(batch.top_ks, dtype=torch.int32, device=device),
            min_ps=torch.zeros(bs, device=device), is_all_greedy=batch.all_greedy,
            is_any_greedy=any(k <= 1 for k in batch.top_ks), need_top_p_sampling=False,
            need_top_k_sampling=not batch.all_greedy, need_min_p_sampling=False, vocab_size=vocab)
        if not batch.all_greedy:
            fb.spec_info.draft_probs = torch.softmax(torch.randn((bs, vocab), generator=generator), dim=-1).to(device)

    def replay_draft(self, fb, before_graph=None):
        """SGLang's `execute` on the batch; `before_graph()` runs after the runner's metadata prep, before the graph
        replays (a check of what the graph is about to read: an interpreted kernel following a stale index would
        read or write wild memory, where a GPU faults)."""
        if not self._can_run_graph(fb):
            raise RuntimeError(f"the draft runner refuses batch size {fb.batch_size} (captured {self.capture_bs})")
        with _checked_replay(self.runner, before_graph, "a draft decode replay"):
            return self.runner.execute(fb)

    def eager_draft(self, fb, before_forward=None):
        """`draft_forward` on the batch, no graph: the worker's eager path (`EagleDraftWorker.draft`), its multi-step
        backend a fresh one planned by `init_forward_metadata`; `before_forward(backend)` runs between the plan and
        the forward (a check of the rails the kernels are about to follow)."""
        backend = self.eager_draft_backend()
        saved = self.worker.draft_attn_backend
        self.worker.draft_attn_backend = backend
        try:
            with kernels(), torch.no_grad():
                backend.init_forward_metadata(fb)
                fb.mark_forward_metadata_ready()
                if before_forward is not None:
                    before_forward(backend)
                return self.worker.draft_forward(fb)
        finally:
            self.worker.draft_attn_backend = saved


    def stage_extend(self, batch: DraftExtendBatch) -> list[int]:
        """Each request's row maps its prefix and its verify window (`num_draft_tokens` slots, where the verify wrote
        and the draft extend writes again); returns the windows' slots, request-major."""
        width = self.case.spec.num_draft_tokens
        self.pools.stage([n + width for n in batch.prefixes], batch.pool_rows, batch.seed)
        return [slot for slots in self.pools.staged_slots for slot in slots[-width:]]

    def extend_forward_batch(self, batch: DraftExtendBatch, out_cache_loc: list[int]):
        """The DRAFT_EXTEND_V2 ForwardBatch `prepare_for_draft_extend` and `ForwardBatch.init_new` build after a
        verify: the whole window extends each request (seq_lens past it), the target's hidden states one a token."""
        from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode, ForwardBatch, ForwardMode
        from sglang.srt.speculative.eagle_info import EagleDraftExtendInput

        device, width, bs = self.device, self.case.spec.num_draft_tokens, batch.batch_size
        seq_lens = [n + width for n in batch.prefixes]
        generator = torch.Generator().manual_seed(batch.seed + 1)
        hidden = torch.randn((bs * width, self.target_hidden_width), generator=generator).to(device) \
            if self.reads_hidden_states else None
        accepted = torch.tensor(batch.accepted, dtype=torch.int32, device=device)
        spec_info = EagleDraftExtendInput(hidden_states=hidden, num_correct_drafts=accepted - 1,
                                          num_accept_tokens=accepted, num_tokens_per_req=width,
                                          num_tokens_for_logprob_per_req=width)
        as_tensor = lambda values, dtype=torch.int64: torch.tensor(values, dtype=dtype, device=device)  # noqa: E731
        fb = ForwardBatch(
            forward_mode=ForwardMode.DRAFT_EXTEND_V2, batch_size=bs,
            input_ids=as_tensor([t for tokens in batch.tokens for t in tokens]),
            req_pool_indices=as_tensor(batch.pool_rows), seq_lens=as_tensor(seq_lens),
            seq_lens_cpu=torch.tensor(seq_lens, dtype=torch.int64), seq_lens_sum=sum(seq_lens),
            out_cache_loc=as_tensor(out_cache_loc),
            positions=as_tensor([n + i for n in batch.prefixes for i in range(width)]),
            extend_num_tokens=bs * width, extend_seq_lens=as_tensor([width] * bs, torch.int32),
            extend_prefix_lens=as_tensor(batch.prefixes, torch.int32),
            extend_start_loc=as_tensor([width * r for r in range(bs)], torch.int32),
            extend_seq_lens_cpu=[width] * bs, extend_prefix_lens_cpu=list(batch.prefixes),
            return_logprob=False, spec_algorithm=self.draft_runner.spec_algorithm, spec_info=spec_info,
            capture_hidden_mode=CaptureHiddenMode.FULL if self.reads_hidden_states else CaptureHiddenMode.NULL)
        fb.req_to_token_pool, fb.token_to_kv_pool = self.pools.req_to_token_pool, self.pools.token_to_kv_pool
        return fb

    def select_index(self, batch: DraftExtendBatch) -> torch.Tensor:
        """Each request's last accepted token in the flattened window (what `_draft_extend_for_decode` samples)."""
        width = self.case.spec.num_draft_tokens
        return torch.tensor([r * width + a - 1 for r, a in enumerate(batch.accepted)], dtype=torch.int64,
                            device=self.device)

    def replay_extend(self, fb, select_index, before_graph=None):
        """SGLang's draft-extend `execute`; `before_graph()` between its metadata prep and the graph (as above)."""
        runner = self.extend_runner
        if not runner.can_run_graph(fb):
            raise RuntimeError(f"the draft extend runner refuses batch size {fb.batch_size} "
                               f"(captured {list(runner.capture_bs)})")
        with _checked_replay(runner, before_graph, "a draft extend replay"):
            return runner.execute(fb, select_index)

    def eager_extend(self, fb, select_index, before_forward=None):
        """The worker's eager draft extend: the extend backend plans the batch (`prepare_for_draft_extend`), the
        draft runner's forward runs it, the selected rows are kept (`_draft_extend_for_decode`)."""
        backend = self.eager_extend_backend()
        saved = self.draft_runner.attn_backend
        self.draft_runner.attn_backend = backend
        try:
            with kernels(), torch.no_grad():
                backend.init_forward_metadata(fb)
                fb.mark_forward_metadata_ready()
                if before_forward is not None:
                    before_forward(backend)
                output = self.draft_runner.forward(fb).logits_output
        finally:
            self.draft_runner.attn_backend = saved
        return output.next_token_logits[select_index], _rows_of(output.hidden_states, select_index)


# -- the check --------------------------------------------------------------------------------------------------
def check_draft_replay(target: EagleDraftTarget, batch: DraftBatch, where: str) -> None:
    """One draft batch staged, replayed, then run eagerly on the cache the replay saw (see the module docstring)."""
    from harness.counter import counter
    from harness.oracles.graph_replay import check_graph_forward, replay_delta

    pools = target.pools
    out_cache_loc = target.stage_draft(batch)
    before = pools.snapshot()
    mark, keys = counter.mark(), graph_key.replay_counts(target.runner)
    fb = target.draft_forward_batch(batch, out_cache_loc)
    rejection_sampling = target.case.spec.rejection_sampling
    samples = rejection_sampling and not batch.all_greedy  # the proposal is drawn: the same RNG stream for both
    raw = batch_consistency.raw_fields(fb)
    with _updates_checked(target.runner, lambda padded: expected_draft_updates(
            batch.seq_lens, padded, target.case.spec.num_steps), batch.batch_size, f"{where}, draft decode"):
        with _seeded(batch.seed, samples):
            output = target.replay_draft(fb, before_graph=lambda: check_graph_rails(target, batch, where))
    batch_consistency.check_restored(raw, fb, where)
    replayed = [None if t is None else t.clone() for t in output]
    check_graph_forward(replay_delta(counter.since(mark)), 1, context=where)
    if keys:  # where the runner's backend keeps its graphs by key (`graph_key.replay_counts`)
        graph_key.check_replayed_key(keys, graph_key.replay_counts(target.runner), requests=batch.batch_size,
                                     capture_bs=target.capture_bs, where=where,
                                     variant=graph_key.expected_sampling_variant(batch.all_greedy, rejection_sampling))
    if target.split_tile is not None:  # the splits every draft step's decode kernels read, one per branch
        from harness.oracles.batch_invariance import check_split_counts

        topk = target.case.spec.topk
        splits = target.worker.draft_attn_backend.cuda_graph_num_kv_splits[:batch.batch_size * topk].tolist()
        check_split_counts(splits, [n for n in batch.seq_lens for _ in range(topk)], target.split_tile, where)
    after_replay = pools.snapshot()
    pools.restore(before)
    with _seeded(batch.seed, samples):
        eager = target.eager_draft(target.draft_forward_batch(batch, out_cache_loc),
                                   before_forward=lambda backend: check_eager_rails(target, batch, backend, where))
    after_eager = pools.snapshot()
    names = ("parent_list", "top_scores_index", "draft_tokens", "draft_probs")
    for tree, what in ((replayed, "the replayed draft tree"), (eager, "eager's draft tree")):
        check_tokens_mapped(tree[names.index("draft_tokens")], target.worker.hot_token_id, batch.batch_size,
                            what=what, where=where)
    exact = batch.batch_size in target.capture_bs
    if samples and not exact:
        # a padded graph draws the proposal for its padded rows too, so after the first draw the replay's random
        # stream runs ahead of eager's (on a GPU as here): what precedes that draw is held, the distribution handed
        # in and the first step's, within float tolerance (the padded rows' GEMM sums in another order)
        first = {"draft_probs": lambda probs: probs[:, :2]}
        replayed, eager = ({name: first[name](t) for name, t in zip(names, out) if name in first}
                           for out in (replayed, eager))
        _check_against_eager(target, replayed, eager, after_replay, after_replay, exact_output=False,
                             exact_cache=False, what="first draft step's proposal", where=where,
                             slots=f"draft slots {out_cache_loc}")
        return
    _check_against_eager(target, dict(zip(names, replayed)), dict(zip(names, eager)), after_replay, after_eager,
                         exact_output=True, exact_cache=exact, what="draft tree",
                         where=where, slots=f"draft slots {out_cache_loc}")


@contextlib.contextmanager
def _seeded(seed: int, samples: bool):
    """Torch's RNG forked and seeded with `seed` for a draft that samples its proposal (rejection sampling), so the
    replay (the virtual device runs the captured ops again) and eager draw the same tokens; else nothing."""
    if not samples:
        yield
        return
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        yield


@contextlib.contextmanager
def _updates_checked(runner, expected, requests: int, where: str):
    """Around one replay by `runner`: where it keeps its graphs in SGLang's `NPUCudaGraphBackend` (an NPU runner),
    the host-side lengths the replay rebound its graph with (`npu-graph-update`) against `expected(padded size)`;
    elsewhere nothing."""
    from harness.oracles.npu_graph_update import check_update_devices, check_updates, runner_updates, updates_since

    before = runner_updates(runner) if replays_through_npu_backend(runner) else None
    yield
    if before is not None:
        padded = min(s for s in runner.capture_bs if s >= requests)
        check_update_devices(runner, f"{where} replay of {requests} request(s)")
        check_updates(updates_since(before, runner_updates(runner)), expected(padded), f"{where} replay of "
                      f"{requests} request(s) padded to {padded}", requests, runner=type(runner).__name__)


def _worker_class(algorithm: str):
    """The draft worker class SGLang builds for `algorithm`: STANDALONE's keeps its own embedding and LM head."""
    import importlib

    if algorithm == "STANDALONE":
        return importlib.import_module(STANDALONE_WORKER_MODULE).StandaloneDraftWorker
    return importlib.import_module(WORKER_MODULE).EagleDraftWorker


def _rows_of(hidden, index=None):
    """Hidden states kept for a comparison (their `index` rows, or all): None where the draft captures none."""
    if hidden is None:
        return None
    return hidden[index] if index is not None else hidden.clone()


def replays_through_npu_backend(runner) -> bool:
    """Whether `runner` replays through SGLang's NPU graph backend (the class its platform handed it)."""
    return type(getattr(runner, "backend", None)).__name__ == "NPUCudaGraphBackend"


def _check_against_eager(target: EagleDraftTarget, replayed: dict, eager: dict, after_replay, after_eager, *,
                         exact_output: bool, exact_cache: bool, what: str, where: str, slots: str) -> None:
    """A replay's outputs against eager's (`eager-equality`), then the KV caches each left (SGLang's padding slot
    aside); the pools are left as the replay left them."""
    from harness.oracles.eager import assert_matches_eager
    from harness.targets.decode.real_model import _cache_difference

    pools = target.pools
    cache = _cache_difference(pools, after_replay, after_eager, exact_cache)
    try:
        assert_matches_eager(replayed, eager, exact=exact_output)
    except OracleFailure as failure:
        raise OracleFailure(failure.oracle, f"{where}: the replayed {what} differs from eager's: "
                            f"{failure.diagnosis}{'; the KV cache after the replay: ' + cache if cache else ''}",
                            **failure.details, capture_bs=target.capture_bs) from None
    if cache:
        raise OracleFailure("eager-equality", f"{where}: the replayed {what} equals eager's but the KV cache it "
                            f"leaves does not: {cache} ({slots})", capture_bs=target.capture_bs)
    pools.restore(after_replay)


def _rows(target: EagleDraftTarget, batch: DraftBatch) -> list[list[int]]:
    table = target.pools.req_to_token_pool.req_to_token
    return [table[row, :n + target.draft_slots].tolist() for row, n in zip(batch.pool_rows, batch.seq_lens)]


def draft_windows(spec) -> tuple[int, int, int]:
    """What `--speculative-draft-window-size` / `-sink-size` make of the draft's reads: (window, sink) every draft
    layer's rail is clipped to, and the window of a window layer's own rail (0s: none). An EAGLE head has no window
    of its own, so the multi-step backend clips its rails (SGLang's `resolve_draft_decode_window`); EAGLE3's head
    takes the flag as its layers' sliding window, so the rails stay whole and a window rail is planned beside."""
    if not spec.draft_window:
        return 0, 0, 0
    if spec.algorithm == "EAGLE3":
        return 0, 0, spec.draft_window
    return spec.draft_window, spec.draft_sink or 0, 0


def _step_rails(target: EagleDraftTarget, batch: DraftBatch, step: int) -> tuple[list, list | None]:
    """Step `step`'s expected segments, per branch, of the full rail and of the window rail (None: no window
    layer)."""
    from harness.oracles.draft_rails import expected_segments, window_segments

    spec = target.case.spec
    clip, sink, layer_window = draft_windows(spec)
    rows = _rows(target, batch)
    segments = expected_segments(batch.seq_lens, rows, spec.topk, spec.num_steps, step, clip, sink)
    return segments, window_segments(segments, layer_window) if layer_window else None


def check_graph_rails(target: EagleDraftTarget, batch: DraftBatch, where: str) -> None:
    """The rails the graph is about to read: the multi-step backend's static `kv_indptr` and `cuda_graph_kv_indices`
    (and, for a window layer, `window_kv_indptr` and `cuda_graph_window_kv_indices`), written by the runner's
    out-of-graph metadata for the padded batch (checked before the graph replays)."""
    from harness.oracles.draft_rails import check_rails

    spec, backend = target.case.spec, target.worker.draft_attn_backend
    padded = min(s for s in target.capture_bs if s >= batch.batch_size)
    pad, rows, where = (padded - batch.batch_size) * spec.topk, padded * spec.topk + 1, f"{where}, padded to {padded}"
    for step in range(spec.num_steps - 1):
        segments, windows = _step_rails(target, batch, step)
        check_rails(backend.kv_indptr[step, :rows], backend.cuda_graph_kv_indices[step], segments, pad,
                    topk=spec.topk, step=step, what="graph's", where=where)
        if windows is not None:
            _window_rail_planned(backend.window_kv_indptr, spec, "the multi-step backend", where)
            check_rails(backend.window_kv_indptr[step, :rows], backend.cuda_graph_window_kv_indices[step], windows,
                        pad, topk=spec.topk, step=step, what="graph's window", where=where)


def check_eager_rails(target: EagleDraftTarget, batch: DraftBatch, backend, where: str) -> None:
    """The rails eager's per-step backends planned (`forward_metadata`), held to the same arithmetic before the
    draft forward follows them."""
    from harness.oracles.draft_rails import check_rails

    spec = target.case.spec
    for step in range(spec.num_steps - 1):
        metadata = backend.attn_backends[step].forward_metadata
        segments, windows = _step_rails(target, batch, step)
        check_rails(metadata.kv_indptr, metadata.kv_indices, segments, 0, topk=spec.topk, step=step,
                    what="eager backend's", where=where)
        if windows is not None:
            _window_rail_planned(metadata.window_kv_indices, spec, f"eager step {step}'s backend", where)
            check_rails(metadata.window_kv_indptr, metadata.window_kv_indices, windows, 0, topk=spec.topk,
                        step=step, what="eager backend's window", where=where)


def _window_rail_planned(rail, spec, whose: str, where: str) -> None:
    """A draft whose layers attend a window must have a window rail planned for them."""
    if rail is None:
        from harness.oracles.draft_rails import ORACLE

        raise OracleFailure(ORACLE, f"{where}: the {spec.algorithm} draft's layers attend a window of "
                            f"{spec.draft_window} (--speculative-draft-window-size), but {whose} plans no window "
                            "rail for them: they read the whole prefix", window=spec.draft_window)


def check_extend_replay(target: EagleDraftTarget, batch: DraftExtendBatch, where: str) -> None:
    """One draft-extend batch staged, replayed through the extend runner, then run eagerly on the cache the replay
    saw: the selected rows' logits and hidden states (what the next draft reads) against eager's, the KV the window
    writes against eager's, the rails against the batch's arithmetic."""
    from harness.counter import counter
    from harness.oracles.graph_replay import check_graph_forward, replay_delta

    pools, width = target.pools, target.case.spec.num_draft_tokens
    out_cache_loc = target.stage_extend(batch)
    before = pools.snapshot()
    select = target.select_index(batch)
    mark = counter.mark()
    window = [n + width for n in batch.prefixes]
    fb = target.extend_forward_batch(batch, out_cache_loc)
    raw = batch_consistency.raw_fields(fb)
    with _updates_checked(target.extend_runner, lambda padded: expected_extend_updates(window, padded),
                          batch.batch_size, f"{where}, draft extend"):
        output = target.replay_extend(fb, select, before_graph=lambda: check_extend_graph_rails(target, batch, where))
    batch_consistency.check_restored(raw, fb, where)
    replayed = {"next_token_logits": output.next_token_logits.clone(), "hidden_states": _rows_of(output.hidden_states)}
    check_graph_forward(replay_delta(counter.since(mark)), 1, context=where)
    after_replay = pools.snapshot()
    pools.restore(before)
    logits, hidden = target.eager_extend(
        target.extend_forward_batch(batch, out_cache_loc), select,
        before_forward=lambda backend: check_extend_eager_rails(target, batch, backend, where))
    after_eager = pools.snapshot()
    # the graph runs the LM head on the selected rows only, eager on the whole window: float32 rounding, `same`'s
    # tolerance; a padded batch's GEMMs have more rows too
    eager = {"next_token_logits": logits, "hidden_states": hidden}
    if not target.reads_hidden_states:
        # a STANDALONE draft reads no hidden state: the extend graph still captures the draft's own (SGLang's runner
        # captures LAST whatever the algorithm) where eager captures none (NULL), and nothing reads either
        replayed.pop("hidden_states"), eager.pop("hidden_states")
    _check_against_eager(target, replayed, eager, after_replay, after_eager, exact_output=False, exact_cache=False,
                         what="draft extend", where=where, slots=f"window slots {out_cache_loc}, {width} a request")


def _prefix_rows(target: EagleDraftTarget, batch: DraftExtendBatch) -> list[list[int]]:
    table = target.pools.req_to_token_pool.req_to_token
    return [table[row, :n].tolist() for row, n in zip(batch.pool_rows, batch.prefixes)]


def check_extend_graph_rails(target: EagleDraftTarget, batch: DraftExtendBatch, where: str) -> None:
    """The rails the draft-extend graph is about to read: its backend's static `qo_indptr`, `kv_indptr` and
    `cuda_graph_kv_indices`, as the runner's metadata prep left them for the padded batch."""
    from harness.oracles.draft_rails import check_extend_rails

    backend = target.extend_runner.draft_extend_attn_backend
    padded = min(s for s in target.extend_runner.capture_bs if s >= batch.batch_size)
    check_extend_rails(backend.qo_indptr, backend.kv_indptr, backend.cuda_graph_kv_indices,
                       _prefix_rows(target, batch), target.case.spec.num_draft_tokens, padded - batch.batch_size,
                       what="graph's", where=f"{where}, padded to {padded}")


def check_extend_eager_rails(target: EagleDraftTarget, batch: DraftExtendBatch, backend, where: str) -> None:
    from harness.oracles.draft_rails import check_extend_rails

    metadata = backend.forward_metadata
    check_extend_rails(metadata.qo_indptr, metadata.kv_indptr, metadata.kv_indices, _prefix_rows(target, batch),
                       target.case.spec.num_draft_tokens, 0, what="eager backend's", where=where)
