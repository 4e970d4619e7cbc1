"""The prefill runner driving a real SGLang model class on SGLang's Triton attention backend and real pools.

`RealModelPrefillTarget` is the 0.5.14+ prefill target (`v0_5_14.Target`: published config, SGLang's `ModelRunner`
with its constructor skipped, `PrefillCudaGraphRunner` capturing every token count) with its doubles replaced: the
model is SGLang's own class for a family (`harness.models.real.build`), the attention backend SGLang's
`TritonAttnBackend` (kernels by Triton's CPU interpreter) over SGLang's `ReqToTokenPool` and KV pools, and the
runner carries the real `ModelConfig`, the pools, the allocator, the KV index translator and the model's
`RadixAttention` layers. Batches come from SGLang's own batch code (`decode/scheduled.Scheduler.extend_batch`:
`ScheduleBatch.prepare_for_extend`, `ForwardBatch.init_new`).

Backends on the virtual device (`backend_refusal`, decided from the release and the backend before a run):
- breakable: runs; the graph breaks around each attention layer (`RadixAttention._eager_attention`).
- full: SGLang's `TritonAttnBackend` plans no full-graph prefill metadata; SGLang refuses at capture with
  "Invalid forward mode ... for CUDA Graph replay".
- tc_piecewise: SGLang 0.5.2x's config removed it and its `RadixAttention` no longer routes attention through the
  piecewise split op, so Dynamo meets the Triton kernels SGLang wraps in `torch.compiler.disable`.

`check_prefill(target, prompts)`: one extend batch of new requests; a batch the case says a graph holds (its
tokens within the largest captured count, padded at most twice: `admission.padding_refusal`) must be offered a
graph and its replay must equal eager on the same cache (bit-exact on a captured count; `same`'s tolerance on a
padded one, or where the family's captured prefill takes other kernels: `Family.captured_prefill_path`, MLA), eager
SGLang's torch-native attention (an MHA family), and the KV cache each leaves must agree; any other batch must be
refused.
"""
from __future__ import annotations

from types import SimpleNamespace

import torch

from harness.errors import PathMissing
from harness.models.real import DRAFT_FAMILIES, FAMILIES, draft_algorithm, missing, sliding_window_size
from harness.models.real.pools import Pools
from harness.oracles import OracleFailure, batch_consistency, logits_buffer, state_at_rest
from harness.oracles.eager import assert_matches_eager
from harness.targets.decode.real_model import KV_TOKENS, _cache_difference, eager_matches_reference, kernels, \
    real_model
from harness.targets.prefill import v0_5_14
from harness.targets.prefill.admission import padding_refusal
from harness.targets.prefill.base import KvCache, PrefillCase
from harness.targets.sglang_plumbing import ensure_tp_group, forward_context, load, tp_group

SHARED_OUTPUT_MODULE = "sglang.srt.model_executor.graph_shared_output"
BACKEND_REFUSALS = {
    "full": "SGLang's TritonAttnBackend plans no full-graph prefill metadata (its capture raises \"Invalid forward "
            "mode ... for CUDA Graph replay\")",
    "tc_piecewise": "SGLang 0.5.2x removed tc_piecewise: its RadixAttention no longer splits attention out of the "
                    "compiled graph, so Dynamo meets SGLang's torch.compiler.disable'd Triton kernels",
}


def load_layout():
    """The prefill layout this target drives (0.5.14+), or PathMissing naming what the release lacks."""
    from harness.targets.prefill import load as prefill_layout
    from harness.versions import sglang_version

    layout = prefill_layout()
    if layout is not v0_5_14.LAYOUT:
        raise PathMissing(f"SGLang {sglang_version()}: the real-model prefill target drives the 0.5.14+ prefill "
                          f"runner; this release has the {layout.name} layout")
    return layout


def backend_refusal(backend: str) -> str | None:
    """Why SGLang's path for `backend` cannot serve a real model here (None: it can)."""
    if backend in BACKEND_REFUSALS:
        return BACKEND_REFUSALS[backend]
    from sglang.srt.layers.radix_attention import RadixAttention

    from harness.versions import sglang_version

    if backend == "breakable" and not hasattr(RadixAttention, "_eager_attention"):
        return (f"SGLang {sglang_version()}: RadixAttention has no `_eager_attention` (0.5.2x): a breakable graph "
                "routes its attention through the `sglang::unified_attention_with_output` op, which registers no "
                "CPU kernel")
    return None


class RealModelPrefillTarget(v0_5_14.Target):
    """See the module docstring. `family`: a key of `harness.models.real.FAMILIES` whose capture the device allows."""

    def __init__(self, case: PrefillCase, family: str, device: str = "cpu", *, weights: str = "dummy",
                 tied: bool | None = None, capture: bool = True, lora=None) -> None:
        """`weights`: "dummy" (the family's model, SGLang's dummy loader) or "transformers" (loaded from the
        checkpoint transformers saved: `transformers_reference`, `tied` its `tie_word_embeddings` variant);
        `capture=False`: the pools, the runner double and the backends only, no prefill runner (eager runs);
        `lora`: a LoRA server's `decode.real_lora.Serving` (its model and manager; the runner captures LoRA)."""
        layout = load_layout()
        reason = missing(family) or (capture and (backend_refusal(case.backend) or
                                                  layout.backend_gap(case.backend, device))) or \
            (lora is not None and (lora.missing() or (capture and lora.prefill_graph_missing())))
        if reason:
            raise PathMissing(reason)
        self.family, self._weights, self._tied, self._capture, self.lora = family, weights, tied, capture, lora
        super().__init__(case, layout, device)

    def scope(self):
        """What SGLang's code here needs from the device: Triton's CPU interpreter for the attention kernels (a
        LoRA server's: its `Serving.scope`, the LoRA kernels and pinned host memory too)."""
        return self.lora.scope() if self.lora is not None else kernels()

    def _build(self, case: PrefillCase, device: str) -> None:
        from sglang.srt.layers.attention.torch_native_backend import TorchNativeAttnBackend
        from sglang.srt.layers.attention.triton_backend import TritonAttnBackend
        from sglang.srt.layers.radix_attention import RadixAttention

        self.server_args = v0_5_14.publish_config(case, device, **self._lora_config(case))
        ensure_tp_group()
        if self.lora is not None:
            self.real = self.lora.model()
        elif self._weights == "transformers":
            from harness.models.real import transformers_reference

            self.real = transformers_reference.sglang_model(self.family, self._tied)
        else:
            self.real = real_model(self.family)
        self.model = self.real.model
        self.pools = pools = Pools(self.real.model_config, case.max_requests, KV_TOKENS, device)
        self.kv = KvCache(case.max_requests, case.max_context, device=device)  # what make_model_runner sizes from
        runner = v0_5_14.make_model_runner(self.model, SimpleNamespace(req_to_token_pool=pools.req_to_token_pool),
                                           self.kv, self.server_args, case)
        layers = [m for m in self.model.modules() if isinstance(m, RadixAttention)]
        pools.bind(runner)
        if self.family in DRAFT_FAMILIES:  # an EAGLE / EAGLE3 draft worker's runner (`prefill/draft.py`)
            object.__setattr__(runner, "spec_algorithm", draft_algorithm(self.family))
            object.__setattr__(runner, "is_draft_worker", True)
        for name, value in dict(
                model_config=self.real.model_config, page_size=1, sliding_window_size=sliding_window_size(self.real),
                prefill_attention_backend_str="triton", attention_layers=layers,
                mha_companion_layers=[None] * len(layers), moe_layers=[None] * len(layers),
                moe_fusions=[None] * len(layers),
                layer_info=SimpleNamespace(start_layer=0, end_layer=len(layers))).items():
            object.__setattr__(runner, name, value)
        self.attn_backend = TritonAttnBackend(runner)
        object.__setattr__(runner, "attn_backend", self.attn_backend)
        object.__setattr__(runner, "decode_attn_backend", self.attn_backend)
        self.eager_attn_backend = TritonAttnBackend(runner)
        self.reference_attn_backend = TorchNativeAttnBackend(runner)
        self.model_runner = runner
        if self.lora is not None:  # SGLang's ModelRunner.init_lora_manager, before the runner captures
            with self.scope():
                self.lora.manager(runner)
        if not self._capture:
            return
        if v0_5_14.module_exists(SHARED_OUTPUT_MODULE):  # SGLang's own shared logits buffer (the decode graphs'
            # rows, here the largest captured count: a prefill's logits rows never exceed its tokens)
            shared = load(SHARED_OUTPUT_MODULE, "GraphSharedOutput")
            object.__setattr__(runner, "graph_shared_output",
                               shared(device=torch.device(device), max_rows=max(case.capture_tokens)))
        if v0_5_14.module_exists(v0_5_14.EAGER_RUNNER_MODULE):
            runner.eager_runner = load(v0_5_14.EAGER_RUNNER_MODULE, "EagerRunner")(runner)
        with v0_5_14._tc_piecewise_resolution(case), self.scope(), state_at_rest.watching(
                self.model, f"the prefill runner's {case.backend} capture of {list(case.capture_tokens)}",
                tp_group=tp_group()):
            self.runner = load(v0_5_14.RUNNER_MODULE, "PrefillCudaGraphRunner")(runner)
        runner.prefill_cuda_graph_runner = self.runner
        # SGLang's caller (cuda_graph_setup) then reads free memory with empty_cache=True, and cudaFree synchronises
        # the device: the capture stream's eager breaks (which read the KV pool) are ordered before the first batch
        # writes it (a first chunk's prefill, before any replay)
        torch.get_device_module(device).synchronize()

    def _lora_config(self, case: PrefillCase) -> dict:
        """A LoRA server's flags and SGLang's check of them (`real_lora.validated`), the decode phase's `max_bs`
        set as SGLang's config resolution sets it when the decode graphs are off (the LoRA manager reads it)."""
        if self.lora is None:
            return {}
        from harness.targets.decode.real_lora import validated

        def validate(args):
            decode = args.cuda_graph_config.decode
            if decode.max_bs is None:
                decode.max_bs = case.max_requests
            return validated(args)

        return {"flags": self.lora.flags(), "validate": validate}

    def serve_eager(self, fb, where: str):
        """A forward the scheduler runs eager (`decode.scheduled.Scheduler.admit`'s prefill): the model on the eager
        backend, apart from the runner's."""
        return self.run_eager(fb, self.eager_attn_backend)

    def run_eager(self, fb, backend, forward=None):
        """The model's forward (or `forward`: another model's) on `fb`, no graph, on `backend`."""
        with self.scope():
            backend.init_forward_metadata(fb)
            with torch.no_grad(), forward_context(backend, fb):
                return (forward or self.model.forward)(fb.input_ids, fb.positions, fb)

    def replay(self, fb):
        """The prefill runner's `execute` on `fb`; the raw batch must come back (`batch_consistency`)."""
        raw = batch_consistency.raw_fields(fb)
        with self.scope():
            output = self.runner.execute(fb)
        batch_consistency.check_restored(raw, fb, f"the prefill runner's replay of {fb.batch_size} request(s)")
        return output


def check_prefill(target: RealModelPrefillTarget, prompts, index: int, chunks=None, logprob_starts=None,
                  running=None, adapters=None) -> str:
    """See the module docstring; returns "replayed" or "refused" (a batch no captured count holds). `chunks`: per
    prompt, the tokens an earlier chunk prefilled (SGLang's chunked prefill; the batch extends the rest).
    `logprob_starts`: per prompt, where its input logprobs start (None: none asked); a replay returning them must
    equal eager's, and the shared logits buffer it asks for must hold its logits rows (`oracles.logits_buffer`).
    `running`: prompts already prefilled and decoding when the batch arrives: the batch is then SGLang's mixed
    chunked prefill (`Scheduler.mixed_batch`: MIXED, each running request a one-token extend after the prompts),
    and each running request's logits must be what its plain decode step gives it (`batch-invariance`).
    `adapters`: on a LoRA server, per prompt its adapter's name (None: none; running requests use none); each
    request's logits must then be its adapter's merged model's (`lora-reference`)."""
    from harness.targets.decode.scheduled import Alone, Scheduler, chunking_missing, mixing_missing

    unsupported = (chunking_missing() if chunks and any(chunks) else None) or (mixing_missing() if running else None)
    if unsupported:
        raise PathMissing(unsupported)
    scheduler = Scheduler(target, target.pools, target.model_runner)
    alone = None
    if running:
        alone = Alone(target)  # each running request on pools of its own: its plain decode step, the reference
        alone.admit(scheduler.admit(running))
    if adapters is not None:  # the prompts' requests, made next (the running ones were admitted on none)
        from harness.targets.decode.real_lora import lora_id

        scheduler.lora_ids = [lora_id(target.model_runner.lora_manager, name) for name in adapters]
    batch = (scheduler.mixed_batch if running else scheduler.extend_batch)(prompts, chunks, logprob_starts)
    fb = scheduler.forward_batch(batch)
    where = _describe(target, fb, prompts, index, chunks, logprob_starts, running, adapters)
    if not _admitted(target, fb, where):
        return "refused"
    starts = list(logprob_starts or [None] * len(prompts))
    got, asked = _replay_against_eager(target, fb, lambda: scheduler.forward_batch(batch), where,
                                       logprobs=any(start is not None for start in starts))
    prefix = list(chunks or [0] * len(prompts))
    extends = [len(p) - c for p, c in zip(prompts, prefix)]
    if running:  # each running request: a one-token extend on its cached prefix, asking no logprobs
        tails = fb.seq_lens.tolist()[len(prompts):]
        extends, prefix, starts = extends + [1] * len(tails), prefix + [n - 1 for n in tails], \
            starts + [None] * len(tails)
    rows, arithmetic = logits_buffer.expected_rows(extends, prefix, starts)
    logits_buffer.check(asked, rows, arithmetic, where=where)
    if alone is not None:
        check_mixed_decodes(target, fb, got[len(prompts):], alone, scheduler.running.reqs, where)
    if adapters is not None:
        _check_against_merged(target, scheduler, batch, got, list(adapters) + [None] * len(running or ()), where)
    return "replayed"


def _check_against_merged(target, scheduler, batch, got, adapters, where: str) -> None:
    """Each request's replayed logits against its adapter's merged model (`real_lora.hold_to_merged`), run eagerly
    on the batch over the cache the replay left (the batch's own K/V written again by the merged model)."""
    from harness.models.real.lora import merged_model
    from harness.targets.decode.real_lora import hold_to_merged

    after = target.pools.snapshot()

    def merged(adapter):
        target.pools.restore(after)
        return target.run_eager(scheduler.forward_batch(batch), target.eager_attn_backend,
                                forward=merged_model(target.family, adapter, target.lora.base()).model.forward
                                ).next_token_logits

    hold_to_merged(got, adapters, merged, serving=target.lora, where=where)
    target.pools.restore(after)


def check_input_embeds(target: RealModelPrefillTarget, prompts, index: int) -> None:
    """An extend batch whose requests carry their prompts as `input_embeds` (each token's row of the model's own
    input embedding, as an API user sends precomputed embeddings; the token ids beside them SGLang's scheduler's
    fake ones, all 1): SGLang's batch code stacks them into `ForwardBatch.input_embeds`; the prefill runner must
    refuse it (`admission`: a graph's static inputs are token ids; SGLang's `can_replay_locally` rule), and
    SGLang's eager runner (`EagerRunner.execute`, which hands the embeddings to the model) must give each request
    the logits the same prompt as token ids gets (`eager-equality`, float32 tolerance). Two findings on 0.5.23
    (the suite's strict xfails): `ModelRunner._extend_forward_kwargs` casts the embeddings to bfloat16 whatever
    the model's dtype (a float32 Llama fails in its first projection), and Qwen2-VL's embedding routine overwrites
    them with the fake ids' embeddings."""
    from harness.targets.decode.scheduled import Scheduler

    embedding = target.model.get_input_embeddings()
    scheduler = Scheduler(target, target.pools, target.model_runner)
    scheduler.embed = lambda ids: embedding(torch.tensor(ids)).tolist()
    fb = scheduler.forward_batch(scheduler.extend_batch(prompts))
    where = (f"prefill {index} ({len(prompts)} request(s), {[len(p) for p in prompts]} tokens as input_embeds, "
             f"captured token counts {list(target.case.capture_tokens)})")
    if fb.input_embeds is None:
        raise OracleFailure("eager-equality", f"{where}: SGLang's batch code dropped the requests' input_embeds "
                            "(ForwardBatch.input_embeds is None)")
    if target.runner.can_run_graph(fb):
        raise OracleFailure("admission", f"{where}: the runner offers a graph to a batch carrying input_embeds, "
                            "which its static token-id inputs cannot carry")
    before = target.pools.snapshot()
    with target.scope(), torch.no_grad(), forward_context(target.attn_backend, fb):  # as ModelRunner.forward sets
        got = target.model_runner.eager_runner.execute(fb).next_token_logits
    target.pools.restore(before)
    plain = Scheduler(target, target.pools, target.model_runner)
    tokens = target.run_eager(plain.forward_batch(plain.extend_batch(prompts)), target.eager_attn_backend)
    try:
        assert_matches_eager(got, tokens.next_token_logits, exact=False)
    except OracleFailure as failure:
        raise OracleFailure(failure.oracle, f"{where}: SGLang's eager runner on the embeddings differs from the "
                            f"model on the same prompts as token ids: {failure.diagnosis}", **failure.details) from None


def _describe(target, fb, prompts, index, chunks, logprob_starts, running, adapters=None) -> str:
    """The batch as a failure names it."""
    prefixes = f", cached prefixes {list(chunks)}" if chunks and any(chunks) else ""
    if logprob_starts and any(start is not None for start in logprob_starts):
        prefixes += f", logprobs from {list(logprob_starts)}"
    if adapters is not None:
        prefixes += f", adapters {list(adapters)} on LoRA backend {target.lora.backend}"
    if running:
        prefixes += f", mixed with {len(running)} running request(s) decoding"
    return (f"prefill {index} ({len(prompts)} request(s), {[len(p) for p in prompts]} tokens{prefixes}, pool rows "
            f"{fb.req_pool_indices.tolist()}, {fb.forward_mode.name}, captured token counts "
            f"{list(target.case.capture_tokens)})")


def _admitted(target, fb, where: str) -> bool:
    """Whether the case says a graph holds the batch (its tokens within the largest captured count, padded at most
    twice), which the runner's offer must match (`admission`)."""
    tokens, captured = int(fb.input_ids.shape[0]), tuple(target.case.capture_tokens)
    offered = bool(target.runner.can_run_graph(fb))
    refusal = (f"its {tokens} tokens exceed the largest captured count {max(captured)}" if tokens > max(captured)
               else padding_refusal(captured, tokens))
    if refusal and offered:
        raise OracleFailure("admission", f"{where}: the runner offers a graph though {refusal}")
    if not refusal and not offered:
        raise OracleFailure("admission", f"{where}: the runner refuses {tokens} tokens though the captured count "
                            f"{min(c for c in captured if c >= tokens)} holds them")
    return not refusal


def _replay_against_eager(target, fb, fresh_batch, where: str, logprobs: bool) -> tuple[torch.Tensor, list[int]]:
    """Replay `fb`, then eager on the cache the replay saw (`fresh_batch()`: the batch built again), eager against
    SGLang's torch-native attention (an MHA family), replay against eager and the KV caches they leave, the input
    logprobs when asked; the pools are left as the replay left them. Returns the replay's logits and the rows of
    the shared logits buffers it asked for."""
    pools = target.pools
    # the harness reads the whole cache, as a host read of device memory: after a device synchronisation (the
    # breakable capture's eager breaks wrote the pool on the capture stream, and nothing later orders them)
    device_module = torch.get_device_module(target.device)
    device_module.synchronize()
    before = pools.snapshot()
    with logits_buffer.observing(target.runner) as asked:
        replayed = target.replay(fb)
    got = replayed.next_token_logits.clone()
    device_module.synchronize()
    after_replay = pools.snapshot()
    pools.restore(before)
    eager_output = target.run_eager(fresh_batch(), target.eager_attn_backend)
    eager = eager_output.next_token_logits
    after_eager = pools.snapshot()
    if not pools.mla:  # an MLA model's extend takes its MHA path, which the torch-native backend cannot run
        pools.restore(before)
        reference = target.run_eager(fresh_batch(), target.reference_attn_backend)
        eager_matches_reference(eager, reference.next_token_logits, where)
    tokens = int(fb.input_ids.shape[0])
    exact = tokens in target.case.capture_tokens and target.real.family.captured_prefill_path is None
    cache = _cache_difference(pools, after_replay, after_eager, exact)
    try:
        assert_matches_eager(got, eager, exact=exact)
    except OracleFailure as failure:
        raise OracleFailure(failure.oracle, f"{where}: replay differs from eager: {failure.diagnosis}"
                            f"{'; the KV cache after the replay: ' + cache if cache else ''}",
                            **failure.details) from None
    if cache:
        raise OracleFailure("eager-equality", f"{where}: the replay's logits equal eager's but the KV cache it "
                            f"leaves does not: {cache}")
    if logprobs:
        try:
            assert_matches_eager(replayed.input_token_logprobs, eager_output.input_token_logprobs, exact=exact)
        except OracleFailure as failure:
            raise OracleFailure(failure.oracle, f"{where}: the replay's input logprobs differ from eager's: "
                                f"{failure.diagnosis}", **failure.details) from None
    pools.restore(after_replay)
    return got, asked


def check_mixed_decodes(target, fb, mixed: torch.Tensor, alone, reqs, where: str) -> None:
    """Each running request of a mixed batch gets what its decode step alone gives it (`scheduled.Alone`: its prompt
    prefilled and its chosen token decoded on pools of its own, SGLang's torch-native attention; float32
    tolerance): its row's logits, and the K/V its token leaves in its slot (the cache as the replay left it; the
    next step reads it). Mixing a prefill in must change neither."""
    from harness.oracles.batch_invariance import ORACLE

    tails = len(reqs)
    rows, lens = fb.req_pool_indices.tolist()[-tails:], fb.seq_lens.tolist()[-tails:]
    table = target.pools.req_to_token_pool.req_to_token
    for position, (logits, req, row, seq_len) in enumerate(zip(mixed, reqs, rows, lens)):
        history = list(req.origin_input_ids) + list(req.output_ids)
        who = f"{where}: running request {position} (rid {req.rid}, history {history})"
        try:
            # the row runs SGLang's extend kernel, which reads a window layer's HF window (its decode kernel one
            # key fewer: test_findings_triton_decode_window_one_key_short)
            assert_matches_eager(logits, alone.step(req, decode_window=False), exact=False)
        except OracleFailure as failure:
            raise OracleFailure(ORACLE, f"{who} gets other logits in the mixed batch than decoding alone: "
                                f"{failure.diagnosis}", **failure.details) from None
        scheduler, _ = alone.requests[req.rid]
        own_row = int(scheduler.running.req_pool_indices[0])
        own_slot = int(scheduler.pools.req_to_token_pool.req_to_token[own_row, seq_len - 1])
        slot = int(table[row, seq_len - 1])
        for (name, buffer), (_, own) in zip(target.pools.buffers(), scheduler.pools.buffers()):
            if not torch.allclose(buffer[slot], own[own_slot], rtol=1e-4, atol=1e-5):
                raise OracleFailure(ORACLE, f"{who}: the K/V its decode token leaves in its slot {slot} (`{name}`) "
                                    "differ from what decoding alone leaves there: the next step reads another "
                                    "token's K/V as this one's", slot=slot, buffer=name)


def prefill_families() -> list[str]:
    """The families whose capture the device allows (Qwen2-MoE's host-synchronising experts refuse any capture)."""
    return sorted(name for name, family in FAMILIES.items() if family.capture_refusal is None)


def check_against_transformers(target: RealModelPrefillTarget, prompts, chunks, decode_steps: int) -> int:
    """SGLang's eager forward of `target`'s model (loaded from transformers' checkpoint: `weights="transformers"`)
    against transformers' (`oracles.transformers_reference`): an extend batch of `prompts` through SGLang's batch
    code (`chunks`: tokens an earlier chunk prefilled), on the Triton backend; then `decode_steps` greedy decode
    steps of the batch, each request's logits against transformers' for its history so far. A window family decodes
    on SGLang's torch-native backend, which reads the model's window as transformers does (the Triton decode reads
    one key fewer: `test_findings_triton_decode_window_one_key_short`). Returns the comparisons made."""
    from harness.models.real import transformers_reference
    from harness.oracles.transformers_reference import check
    from harness.targets.decode.scheduled import Scheduler

    family, compared = target.family, 0
    scheduler = Scheduler(target, target.pools, target.model_runner)
    scheduler.running = batch = scheduler.extend_batch(prompts, chunks)
    logits = target.run_eager(scheduler.forward_batch(batch), target.eager_attn_backend).next_token_logits
    decode_backend = target.reference_attn_backend if target.model_runner.sliding_window_size else \
        target.eager_attn_backend
    for step in range(decode_steps + 1):
        where = "the prefill" if step == 0 else f"decode step {step}"
        for index, req in enumerate(batch.reqs):
            history = scheduler.history(req)
            check(logits[index], transformers_reference.logits(family, history, target._tied), history=history,
                  where=f"{where}, request {index} (cached prefix {(chunks or [0] * len(prompts))[index]})")
            compared += 1
        if step == decode_steps:
            return compared
        scheduler.advance(batch, logits.argmax(-1))
        logits = target.run_eager(scheduler.prepare_decode().built(), decode_backend).next_token_logits
    return compared
