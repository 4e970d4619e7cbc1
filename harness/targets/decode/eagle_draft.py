"""The EAGLE draft worker's multi-step decode graphs on a real draft model: SGLang's `EAGLEDraftCudaGraphRunner`
capturing SGLang's `EagleDraftWorker.draft_forward` (every draft step of a tree of `topk` branches in one graph) over
SGLang's `LlamaForCausalLMEagle` (tiny config, dummy weights), SGLang's `TritonMultiStepDraftBackend` (one
`TritonAttnBackend` per step, its kernels run by Triton's CPU interpreter) and SGLang's real pools.

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

Checks (`check_draft_replay`): the replay's draft tree (parents, selected indices, tokens) equals eager
`draft_forward` of the same worker on a fresh `TritonMultiStepDraftBackend` over the same cache, and the KV each
leaves in the draft slots agrees; the per-step KV rails the graph read (`kv_indptr`, `cuda_graph_kv_indices` of the
backend) are the batch's arithmetic: step i of branch k of a request reads its prefix then its branch's first i + 1
draft slots (`draft_rails`), padded rows the fill value's; eager itself is held to the same arithmetic.
"""
from __future__ import annotations

import dataclasses
from typing import Any

import torch

from harness.errors import HarnessError, PathMissing
from harness.models.real import DRAFT_FAMILIES, build_family, missing_family
from harness.oracles import OracleFailure
from harness.targets.decode.base import DecodeCase
from harness.targets.decode.real_model import RealModelTarget, kernels

RUNNER_MODULE = "sglang.srt.speculative.eagle_draft_cuda_graph_runner"
WORKER_MODULE = "sglang.srt.speculative.eagle_worker_v2"
DRAFT_FAMILY = "eagle"


def draft_missing() -> str | None:
    """Why the installed SGLang cannot run this target (naming the release and what it lacks), or None."""
    from harness.versions import module_exists, sglang_version

    for module in (RUNNER_MODULE, WORKER_MODULE):
        if not module_exists(module):
            return f"SGLang {sglang_version()} has no {module}: no EAGLE draft decode graphs of this layout"
    return missing_family(DRAFT_FAMILIES[DRAFT_FAMILY])


@dataclasses.dataclass
class DraftBatch:
    """One draft-decode batch as `prepare_for_draft` leaves it: per request its committed prefix length, pool row,
    the target's top-k tokens and probabilities, and the seed of its cached prefix and hidden state."""

    seq_lens: list[int]
    pool_rows: list[int]
    topk_index: list[list[int]]
    topk_p: list[list[float]]
    seed: int

    @property
    def batch_size(self) -> int:
        return len(self.seq_lens)


class EagleDraftTarget(RealModelTarget):
    """See the module docstring. `case.spec`: the EAGLE settings (num_steps > 1: a single step captures nothing)."""

    def __init__(self, case: DecodeCase, *, hooks: Any = None) -> None:
        if case.spec is None or case.spec.algorithm != "EAGLE" or case.spec.num_steps < 2:
            raise HarnessError(f"an EAGLE draft target needs EAGLE with two or more draft steps, not {case.spec}")
        reason = draft_missing()
        if reason:
            raise PathMissing(reason)
        with torch.no_grad():  # as `Scheduler.init_all_cuda_graphs` captures: Dynamo guards on the grad mode
            super().__init__(case, family="dense", hooks=hooks)

    def server_flags(self, case: DecodeCase) -> dict[str, Any]:
        # --page-size 1 said explicitly: the multi-step backend reads the published one (ServerArgs leaves it None
        # until a model's own handling runs), where the Triton backend reads the runner's
        return {**super().server_flags(case), "attention_backend": "triton", "page_size": 1}

    def build_parts(self, case: DecodeCase, device: str) -> tuple:
        from sglang.srt.layers.attention.triton_backend import TritonMultiStepDraftBackend

        parts = super().build_parts(case, device)  # the target's model and pools: the draft shares its cache shape
        self.draft = build_family(DRAFT_FAMILIES[DRAFT_FAMILY])
        self.draft_runner = self._draft_runner_double(case, device)
        self.eager_draft_backend = lambda: TritonMultiStepDraftBackend(self.draft_runner, case.spec.topk,
                                                                        case.spec.num_steps)
        return parts

    def _draft_runner_double(self, case: DecodeCase, device: str):
        from sglang.srt.model_executor.model_runner import ModelRunnerOutput

        runner = self._runner_double(case, device)
        runner.model, runner.model_config = self.draft.model, self.draft.model_config
        runner.is_draft_worker = True
        runner.draft_attention_backend = None  # --speculative-draft-attention-backend unset: the configured one
        model = self.draft.model

        def forward(forward_batch, *args, **kwargs):
            # ModelRunner._forward_raw's eager decode: the batch to the model, in the forward context draft_forward
            # entered with the step's backend (whose metadata the worker planned)
            return ModelRunnerOutput(logits_output=model.forward(forward_batch.input_ids, forward_batch.positions,
                                                                 forward_batch), can_run_graph=False)

        runner.forward = forward
        return runner

    def _runner_class(self):
        """SGLang's draft runner, built as `EagleDraftWorker._capture_cuda_graphs` builds it, over a worker whose
        attributes are set and whose own methods build its attention backends."""
        from sglang.srt.speculative.eagle_draft_cuda_graph_runner import EAGLEDraftCudaGraphRunner

        def construct(model_runner, **kwargs):
            self.worker = self._worker()
            return EAGLEDraftCudaGraphRunner(self.worker)

        return construct

    def _worker(self):
        from sglang.srt.speculative.eagle_worker_v2 import EagleDraftWorker
        from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

        spec = self.case.spec
        worker = EagleDraftWorker.__new__(EagleDraftWorker)
        type(worker).__mro__[1].__init__(worker)  # EagleDraftWorkerBase: its graph bookkeeping
        worker.server_args, worker.device, worker.gpu_id = self.server_args, self.device, 0
        worker.topk, worker.speculative_num_steps = spec.topk, spec.num_steps
        worker.speculative_num_draft_tokens = spec.num_draft_tokens
        worker.speculative_algorithm = SpeculativeAlgorithm.from_string(spec.algorithm)
        worker._rebuild_topk1_chain_buffers()
        worker.draft_runner = self.draft_runner
        worker._init_dsa_index_share_state()
        worker.hot_token_id = None
        worker.init_attention_backend()
        return worker

    # -- batches -----------------------------------------------------------------------------------------------
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
        spec_info = EagleDraftInput(
            topk_p=torch.tensor(batch.topk_p, dtype=torch.float32, device=device),
            topk_index=torch.tensor(batch.topk_index, dtype=torch.int64, device=device),
            hidden_states=hidden.to(device), capture_hidden_mode=CaptureHiddenMode.LAST)
        spec_info.num_tokens_per_req = spec_info.num_tokens_for_logprob_per_req = topk
        positions = seq_lens.repeat_interleave(topk, dim=0)
        spec_info.positions = positions
        fb = ForwardBatch(
            forward_mode=ForwardMode.DECODE, batch_size=batch.batch_size, input_ids=None,
            req_pool_indices=torch.tensor(batch.pool_rows, dtype=torch.int64, device=device),
            seq_lens=seq_lens, seq_lens_cpu=seq_lens.cpu(), seq_lens_sum=sum(batch.seq_lens),
            out_cache_loc=torch.tensor(out_cache_loc, dtype=torch.int64, device=device), positions=positions,
            return_logprob=False, spec_algorithm=self.draft_runner.spec_algorithm, spec_info=spec_info,
            capture_hidden_mode=CaptureHiddenMode.LAST)
        fb.req_to_token_pool, fb.token_to_kv_pool = self.pools.req_to_token_pool, self.pools.token_to_kv_pool
        return fb

    def replay_draft(self, fb, before_graph=None):
        """SGLang's `execute` on the batch; `before_graph()` runs after the runner's metadata prep, before the graph
        replays (a check of what the graph is about to read: an interpreted kernel following a stale index would
        read or write wild memory, where a GPU faults)."""
        if not self._can_run_graph(fb):
            raise RuntimeError(f"the draft runner refuses batch size {fb.batch_size} (captured {self.capture_bs})")
        replay_graph = self.runner._replay_graph

        def checked(shape_key, forward_batch):
            if before_graph is not None:
                before_graph()
            return replay_graph(shape_key, forward_batch)

        self.runner._replay_graph = checked
        try:
            with kernels():
                return self.runner.execute(fb)
        finally:
            del self.runner._replay_graph  # the class's method again

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


# -- the check --------------------------------------------------------------------------------------------------
def check_draft_replay(target: EagleDraftTarget, batch: DraftBatch, where: str) -> None:
    """One draft batch staged, replayed, then run eagerly on the cache the replay saw (see the module docstring)."""
    from harness.counter import counter
    from harness.oracles.eager import assert_matches_eager
    from harness.oracles.graph_replay import check_graph_forward, replay_delta
    from harness.targets.decode.real_model import _cache_difference

    pools = target.pools
    out_cache_loc = target.stage_draft(batch)
    before = pools.snapshot()
    mark = counter.mark()
    fb = target.draft_forward_batch(batch, out_cache_loc)
    output = target.replay_draft(fb, before_graph=lambda: check_graph_rails(target, batch, where))
    replayed = [None if t is None else t.clone() for t in output]
    check_graph_forward(replay_delta(counter.since(mark)), 1, context=where)
    after_replay = pools.snapshot()
    pools.restore(before)
    eager = target.eager_draft(target.draft_forward_batch(batch, out_cache_loc),
                               before_forward=lambda backend: check_eager_rails(target, batch, backend, where))
    after_eager = pools.snapshot()
    names = ("parent_list", "top_scores_index", "draft_tokens", "draft_probs")
    exact = batch.batch_size in target.capture_bs
    try:
        assert_matches_eager(dict(zip(names, replayed)), dict(zip(names, eager)), exact=True)
    except OracleFailure as failure:
        cache = _cache_difference(pools, after_replay, after_eager, exact)
        raise OracleFailure(failure.oracle, f"{where}: the replayed draft tree differs from eager draft_forward's: "
                            f"{failure.diagnosis}{'; the KV cache after the replay: ' + cache if cache else ''}",
                            **failure.details, capture_bs=target.capture_bs) from None
    cache = _cache_difference(pools, after_replay, after_eager, exact)
    if cache:
        raise OracleFailure("eager-equality", f"{where}: the replayed draft tree equals eager's but the KV cache the "
                            f"draft steps leave does not: {cache} (draft slots {out_cache_loc})",
                            capture_bs=target.capture_bs)
    pools.restore(after_replay)


def _rows(target: EagleDraftTarget, batch: DraftBatch) -> list[list[int]]:
    table = target.pools.req_to_token_pool.req_to_token
    return [table[row, :n + target.draft_slots].tolist() for row, n in zip(batch.pool_rows, batch.seq_lens)]


def check_graph_rails(target: EagleDraftTarget, batch: DraftBatch, where: str) -> None:
    """The rails the graph is about to read: the multi-step backend's static `kv_indptr` and `cuda_graph_kv_indices`,
    written by the runner's out-of-graph metadata for the padded batch (checked before the graph replays)."""
    from harness.oracles.draft_rails import check_rails, expected_segments

    spec, backend = target.case.spec, target.worker.draft_attn_backend
    padded = min(s for s in target.capture_bs if s >= batch.batch_size)
    rows = _rows(target, batch)
    for step in range(spec.num_steps - 1):
        segments = expected_segments(batch.seq_lens, rows, spec.topk, spec.num_steps, step)
        check_rails(backend.kv_indptr[step, :padded * spec.topk + 1], backend.cuda_graph_kv_indices[step], segments,
                    (padded - batch.batch_size) * spec.topk, topk=spec.topk, step=step, what="graph's",
                    where=f"{where}, padded to {padded}")


def check_eager_rails(target: EagleDraftTarget, batch: DraftBatch, backend, where: str) -> None:
    """The rails eager's per-step backends planned (`forward_metadata`), held to the same arithmetic before the
    draft forward follows them."""
    from harness.oracles.draft_rails import check_rails, expected_segments

    spec = target.case.spec
    rows = _rows(target, batch)
    for step in range(spec.num_steps - 1):
        metadata = backend.attn_backends[step].forward_metadata
        segments = expected_segments(batch.seq_lens, rows, spec.topk, spec.num_steps, step)
        check_rails(metadata.kv_indptr, metadata.kv_indices, segments, 0, topk=spec.topk, step=step,
                    what="eager backend's", where=where)
