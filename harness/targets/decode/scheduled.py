"""Decode batches as SGLang's scheduler builds them, for the real-model target.

SGLang's own batch code runs on the CPU the way its `benchmark/one_batch.py` drives it: `Req`s of drawn prompts,
`ScheduleBatch.init_new` over the target's real pools and SGLang's `RadixCache` disabled (`--disable-radix-cache`),
`prepare_for_extend`, `ForwardBatch.init_new` and the prefill forward (eager, the Triton backend's extend kernels,
checked against SGLang's torch-native attention); then per decode step `prepare_for_decode` and `ForwardBatch.init_new`
again. Finished requests leave through SGLang's `release_kv_cache` and `filter_batch`; new ones are prefilled and
joined through `merge_batch` (continuous batching, as the scheduler's `get_next_batch_to_run` does). So the decode
runner sees the CPU fields, their types and values as production hands them (per-request lists of `lora_ids` and
`mm_inputs` holding None, `orig_seq_lens`, the KV location plan, the sampling info, an mRoPE model's positions from
`ForwardBatch._compute_mrope_positions`), and pool rows and KV slots reused after a request left.

`run_program(target, program)` plays a drawn program (`Admit`, `Decode`, `Finish` steps); each decode step is
judged by `real_model.check_replay` like a staged batch, and each of its requests is held to what it gets decoded
alone (`Alone`, the `batch-invariance` oracle). Whether a step may replay is derived from the case: the running
batch must fit the largest captured size (padding on), else the runner must refuse it and eager serves it.
"""
from __future__ import annotations

import contextlib
import dataclasses
from array import array
from types import SimpleNamespace
from collections.abc import Callable
from typing import Any

import torch

from harness.models.real import triton_decode_windows
from harness.oracles import OracleFailure
from harness.targets.decode.base import DecodeBatch
from harness.targets.decode.real_model import check_replay, eager_matches_reference, kernels

MAX_NEW_TOKENS = 64  # per request: more than any program decodes, so SGLang finishes none on its own


# what this module calls of SGLang's batch code, as (module, attribute): a release without one gets a skip naming it
SGLANG_BATCH_API = (("sglang.srt.managers.schedule_batch", "ScheduleBatch"),
                    ("sglang.srt.managers.schedule_batch", "FINISH_LENGTH"),
                    ("sglang.srt.mem_cache.cache_init_params", "CacheInitParams"),
                    ("sglang.srt.mem_cache.radix_cache", "RadixCache"),
                    ("sglang.srt.mem_cache.common", "release_kv_cache"))


def missing() -> str | None:
    """Why the installed SGLang's batch code cannot be driven this way (the first module or name it lacks), or
    None."""
    import importlib

    from harness.versions import module_exists, sglang_version

    for module, name in SGLANG_BATCH_API:
        if not module_exists(module) or not hasattr(importlib.import_module(module), name):
            return f"SGLang {sglang_version()} has no {module}.{name}: scheduler-built batches are not driven"
    return None


@dataclasses.dataclass
class ScheduledBatch(DecodeBatch):
    """The view of a scheduler-built decode batch the checks read (rows, ids, slots); `built` returns a fresh
    `ForwardBatch.init_new` of SGLang's `ScheduleBatch`, which is what the replay and eager run on."""

    built: Callable[[], Any] | None = None


@dataclasses.dataclass(frozen=True)
class Admit:
    """New requests: their prompts (token ids), prefilled in one extend batch and merged into the running one."""

    prompts: tuple[tuple[int, ...], ...]


@dataclasses.dataclass(frozen=True)
class Mix:
    """New prompts prefilled in one batch with the running requests' next decode step (`--enable-mixed-chunk`:
    SGLang's MIXED batch); the new requests join the running ones."""

    prompts: tuple[tuple[int, ...], ...]


@dataclasses.dataclass(frozen=True)
class Decode:
    """One decode step of every running request."""


@dataclasses.dataclass(frozen=True)
class Finish:
    """The running requests at these positions finish: their KV and pool rows go back, the batch is filtered."""

    positions: tuple[int, ...]


def _release_without_insert() -> dict:
    """`release_kv_cache`'s switch for "free, do not keep in the tree": `checkpoint=False` in 0.5.2x, `is_insert=False`
    before."""
    import inspect

    from sglang.srt.mem_cache.common import release_kv_cache

    return {"checkpoint": False} if "checkpoint" in inspect.signature(release_kv_cache).parameters else \
        {"is_insert": False}


def _admit(req, end: int | None = None) -> None:
    """What SGLang's `PrefillAdder` records when it admits a prompt: the extent to prefill, from the matched prefix
    to the prompt's end (`end`: a chunk's end instead, as `add_chunked_req` truncates); 0.5.2x as `extend_end`,
    earlier releases through `set_extend_range`."""
    prefix = req.prefix_len if hasattr(req, "prefix_len") else len(req.prefix_indices)
    end = len(req.full_untruncated_fill_ids) if end is None else end
    if hasattr(req, "set_extend_range"):
        req.set_extend_range(prefix, end)
    else:
        req.extend_end = end


def chunking_missing() -> str | None:
    """Why the installed release's chunked prefill is not driven here (naming what it lacks), or None."""
    from harness.versions import sglang_version

    import sglang.srt.mem_cache.common as common

    if not hasattr(common, "checkpoint_kv_cache"):
        return f"SGLang {sglang_version()} has no sglang.srt.mem_cache.common.checkpoint_kv_cache: no chunk handover"
    return None


def mixing_missing() -> str | None:
    """Why the installed release's mixed chunked prefill is not driven here (naming what it lacks), or None."""
    from harness.versions import sglang_version

    import sglang.srt.managers.overlap_utils as overlap_utils
    from sglang.srt.managers.schedule_batch import ScheduleBatch

    if not hasattr(ScheduleBatch, "mix_with_running"):
        return f"SGLang {sglang_version()} has no ScheduleBatch.mix_with_running: no mixed chunked prefill"
    if not hasattr(overlap_utils, "resolve_forward_inputs"):
        return f"SGLang {sglang_version()} has no overlap_utils.resolve_forward_inputs: a mixed batch's input ids " \
               "are resolved another way there"
    return None


class Scheduler:
    """The part of SGLang's scheduler a decode runner's input depends on, over the target's pools (module
    docstring). `running`: SGLang's running `ScheduleBatch`, None before the first admission."""

    def __init__(self, target, pools=None, model_runner=None) -> None:
        """Over the target's pools and model runner, or (the batch-invariance reference) over others."""
        from sglang.srt.mem_cache.cache_init_params import CacheInitParams
        from sglang.srt.mem_cache.radix_cache import RadixCache

        self.target = target
        self.pools = pools = pools or target.pools
        self.model_runner = model_runner or target.model_runner
        pools.allocator.clear()
        pools.req_to_token_pool.clear()
        with torch.no_grad():
            pools.req_to_token_pool.req_to_token.zero_()
        self.tree_cache = RadixCache(CacheInitParams(
            disable=True, req_to_token_pool=pools.req_to_token_pool, token_to_kv_pool_allocator=pools.allocator,
            page_size=1))
        self.running = None
        self.next_rid = 0
        self.lora_ids: list = []  # the adapters of the requests made next, in order (a LoRA server's)
        self.embed = None  # token ids -> embedding rows: the requests made next carry them as `input_embeds`

    # -- SGLang's batch code -------------------------------------------------------------------------------------
    def _requests(self, prompts, logprob_starts=None) -> list:
        """`logprob_starts`: per prompt, where its input logprobs start (None: it asks none). A request's LoRA
        adapter (by id) is `self.lora_ids`' next entry, where a LoRA server set them (None: no adapter); with
        `self.embed` set, it carries its prompt as `input_embeds` (what an API user sends in place of token ids)."""
        from sglang.srt.managers.schedule_batch import Req
        from sglang.srt.sampling.sampling_params import SamplingParams

        reqs = []
        for prompt, start in zip(prompts, logprob_starts or [None] * len(prompts)):
            lora = {"lora_id": self.lora_ids.pop(0)} if self.lora_ids else {}
            embeds = {}
            if self.embed is not None:  # the scheduler's fake ids beside the embeddings (`handle_generate_request`)
                embeds, prompt = {"input_embeds": self.embed(list(prompt))}, [1] * len(prompt)
            req = Req(rid=str(self.next_rid), origin_input_text="", origin_input_ids=array("q", prompt),
                      sampling_params=SamplingParams(temperature=0, max_new_tokens=MAX_NEW_TOKENS),
                      return_logprob=start is not None, **lora, **embeds)
            req.logprob_start_len = -1 if start is None else start  # as the tokenizer sets it; the match reads it
            req.init_next_round_input(self.tree_cache)  # the scheduler's admission: fill ids, prefix match
            _admit(req)
            self.next_rid += 1
            reqs.append(req)
        return reqs

    def forward_batch(self, batch) -> Any:
        from sglang.srt.model_executor.forward_batch_info import ForwardBatch

        # up to 0.5.1x an extend batch's positions come from a Triton kernel; a LoRA server's batch info is staged
        # in pinned memory, its LoRA kernels interpreted (the target's scope)
        with self.target.scope():
            return ForwardBatch.init_new(batch, self.model_runner, return_hidden_states_before_norm=False)

    def extend_batch(self, prompts, chunks=None, logprob_starts=None) -> Any:
        """SGLang's extend batch of new requests for `prompts`, prepared (slots and pool rows allocated). `chunks`:
        per prompt, how many of its tokens an earlier chunk of SGLang's chunked prefill has already prefilled (0:
        none); those chunks run first (`_prefill_chunks`), and the batch returned extends each prompt's rest on
        its cached prefix. `logprob_starts`: per prompt, where its input logprobs start (None: none asked)."""
        return self._prepared(self._chunked_requests(prompts, chunks, logprob_starts))

    def _chunked_requests(self, prompts, chunks=None, logprob_starts=None) -> list:
        """The requests of `prompts`, each past the chunk an earlier prefill took (`chunks`), ready to admit."""
        reqs = self._requests(prompts, logprob_starts)
        if chunks and any(chunks):
            self._prefill_chunks([(req, chunk) for req, chunk in zip(reqs, chunks) if chunk])
        return reqs

    def _prefill_chunks(self, chunked) -> None:
        """The scheduler's chunked prefill up to the last chunk: each request admitted up to its chunk's end
        (`add_chunked_req`), the chunks prefilled eager as one extend batch (their K/V into the pools), then each
        request handed over as the scheduler does between chunks (`checkpoint_kv_cache`: its prefix now the chunk,
        `init_next_round_input`) and admitted for the rest."""
        from sglang.srt.mem_cache.common import checkpoint_kv_cache

        for req, chunk in chunked:
            _admit(req, end=chunk)
        batch = self._prepared([req for req, _ in chunked])
        self.target.run_eager(self.forward_batch(batch), self.target.eager_attn_backend)
        for req, _ in chunked:
            checkpoint_kv_cache(req, self.tree_cache)
            req.init_next_round_input()
            _admit(req)

    def mixed_batch(self, prompts, chunks=None, logprob_starts=None) -> Any:
        """SGLang's mixed chunked prefill (`--enable-mixed-chunk`): the extend batch of `prompts` (as `extend_batch`)
        mixed with the running batch's next decode step, as `Scheduler.get_new_batch_prefill` mixes them
        (`prepare_for_decode` on the running batch, then `mix_with_running`: forward mode MIXED, each running
        request a one-token extend on its cached prefix), its input ids resolved as the model worker resolves
        them (`overlap_utils.resolve_forward_inputs`: the prompts' tokens, then each running request's last sampled
        token, read from the future map by pool row)."""
        from sglang.srt.managers.overlap_utils import resolve_forward_inputs
        from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

        batch = self._prepared(self._chunked_requests(prompts, chunks, logprob_starts), resolve_input_ids=False)
        running = self.running
        with kernels():
            running.prepare_for_decode()
        batch.mix_with_running(running)
        batch.decoding_reqs = running.reqs
        # the future map's one buffer the resolve reads: each pool row's last sampled token
        sampled = torch.full((self.pools.requests + 1,), -1, dtype=torch.int64, device=self.target.device)
        for row, req in zip(running.req_pool_indices.tolist(), running.reqs):
            sampled[row] = req.output_ids[-1]
        resolve_forward_inputs(batch, SimpleNamespace(output_tokens_buf=sampled, spec_algo=SpeculativeAlgorithm.NONE))
        return batch

    def _prepared(self, reqs, resolve_input_ids: bool = True) -> Any:
        from sglang.srt.managers.schedule_batch import ScheduleBatch
        from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

        pools = self.pools
        batch = ScheduleBatch.init_new(
            reqs=reqs, req_to_token_pool=pools.req_to_token_pool,
            token_to_kv_pool_allocator=pools.allocator, tree_cache=self.tree_cache,
            model_config=self.model_runner.model_config, enable_overlap=False,
            spec_algorithm=SpeculativeAlgorithm.NONE)
        with kernels():  # up to 0.5.1x the allocation writes req_to_token with a Triton kernel
            batch.prepare_for_extend()
        if resolve_input_ids and batch.input_ids is None and getattr(batch, "prefill_input_ids_cpu", None) is not None:
            batch.input_ids = batch.prefill_input_ids_cpu.to(batch.device)  # what the model worker does
            batch.prefill_input_ids_cpu = None
        return batch

    def admit(self, prompts) -> list:
        """Prefill `prompts` as one extend batch (eager on the Triton backend, held to the torch-native one) and
        merge it into the running batch, its next input ids the greedy choice of the prefill's logits; returns the
        new requests."""
        target, pools = self.target, self.pools
        batch = self.extend_batch(prompts)
        where = f"the prefill of {[len(p) for p in prompts]}-token prompts"
        reference = None
        if not pools.mla:  # an MLA model's extend takes its MHA path, which the torch-native backend cannot run
            before = pools.snapshot()  # over the latent pool: its prefill is held by the decode steps alone
            reference = target.run_eager(self.forward_batch(batch), target.reference_attn_backend).next_token_logits
            pools.restore(before)
        logits = target.serve_eager(self.forward_batch(batch), where).next_token_logits
        if reference is not None:
            eager_matches_reference(logits, reference, where)
        self.advance(batch, logits.argmax(-1))
        reqs = list(batch.reqs)
        if self.running is None:
            self.running = batch
        else:
            self.running.merge_batch(batch)
        return reqs

    @staticmethod
    def history(req) -> list[int]:
        """A request's tokens so far: its prompt, then the tokens chosen for it (the last one the input of the
        next decode step)."""
        return list(req.origin_input_ids) + list(req.output_ids)

    def advance(self, batch, next_ids: torch.Tensor) -> None:
        """What the scheduler does with a forward's greedy tokens: each request's output grows by its token, and
        the token is the batch's next input (the non-overlap path)."""
        for req, token in zip(batch.reqs, next_ids.tolist()):
            req.output_ids.append(token)
        batch.output_ids = next_ids
        batch.input_ids = next_ids.to(torch.int64)

    def finish(self, positions) -> list:
        """The requests at `positions` finish (SGLang's `release_kv_cache`, then `filter_batch`); returns them."""
        from sglang.srt.managers.schedule_batch import FINISH_LENGTH
        from sglang.srt.mem_cache.common import release_kv_cache

        reqs = [self.running.reqs[position] for position in positions]
        for req in reqs:
            req.finished_reason = FINISH_LENGTH(length=len(req.output_ids))
            release_kv_cache(req, self.tree_cache, **_release_without_insert())
        self.running.filter_batch()
        return reqs

    def prepare_decode(self) -> ScheduledBatch:
        """`prepare_for_decode` on the running batch, and the view the checks read."""
        batch = self.running
        with kernels():
            batch.prepare_for_decode()
        fb = self.forward_batch(batch)
        rows, lens = fb.req_pool_indices.tolist(), fb.seq_lens.tolist()
        req_to_token = self.pools.req_to_token_pool.req_to_token
        self.pools.staged_slots = [req_to_token[row, :n].tolist() for row, n in zip(rows, lens)]
        mrope = None if fb.mrope_positions is None else fb.mrope_positions.tolist()
        return ScheduledBatch(input_ids=fb.input_ids.tolist(), positions=fb.positions.tolist(), seq_lens=lens,
                              req_pool_indices=rows, out_cache_loc=fb.out_cache_loc.tolist(),
                              mrope_positions=mrope, built=lambda: self.forward_batch(batch))


class Alone:
    """Each running request replayed alone, in lockstep with the batch (`harness.oracles.batch_invariance`): on
    pools of its own, SGLang's batch code prefills its prompt (SGLang's torch-native attention; an MLA model the
    Triton extend kernels, which the torch-native backend cannot run over the latent pool) and then decodes, one
    eager step of a batch of one on the torch-native backend per decode step of the batch, the tokens the batch
    chose for it."""

    def __init__(self, target) -> None:
        self.target = target
        self.requests: dict[str, tuple[Scheduler, Any]] = {}  # rid -> (its scheduler, its decode backend)

    def admit(self, reqs) -> None:
        import copy

        from sglang.srt.layers.attention.torch_native_backend import TorchNativeAttnBackend
        from sglang.srt.layers.attention.triton_backend import TritonAttnBackend

        from harness.models.real.pools import Pools

        target = self.target
        for req in reqs:
            pools = Pools(target.real.model_config, 1, target.pools.tokens, target.device)
            runner = copy.copy(target.model_runner)
            pools.bind(runner)
            scheduler = Scheduler(target, pools, runner)
            scheduler.running = batch = scheduler.extend_batch([tuple(req.origin_input_ids)])
            prefill = (TritonAttnBackend if pools.mla else TorchNativeAttnBackend)(runner)
            target.run_eager(scheduler.forward_batch(batch), prefill)
            self.requests[req.rid] = (scheduler, TorchNativeAttnBackend(runner))

    def finish(self, reqs) -> None:
        for req in reqs:
            self.requests.pop(req.rid, None)

    def step(self, req, decode_window: bool = True) -> torch.Tensor:
        """The next-token logits of `req` decoding alone its last chosen token (its cache then holds it); a window
        layer reads the Triton decode's window (`decode_window`), else the model's own (what SGLang's extend kernel
        reads: a running request's row of a mixed batch)."""
        scheduler, backend = self.requests[req.rid]
        batch = scheduler.running
        batch.reqs[0].output_ids[:] = req.output_ids
        batch.input_ids = torch.tensor(req.output_ids[-1:], dtype=torch.int64, device=batch.device)
        with kernels():
            batch.prepare_for_decode()
        windows = triton_decode_windows(self.target.model) if decode_window else contextlib.nullcontext()
        with windows:  # the window the batch's kernels read
            return self.target.run_eager(scheduler.forward_batch(batch), backend).next_token_logits[0]


def held_against_history(batch: ScheduledBatch, index: int, history: list[int]) -> str:
    """What the batch held for request `index` beside what its history implies (a decode step reads the history's
    last token at position len - 1 with seq_len len); a diagnosis."""
    implied = {"seq_len": len(history), "position": len(history) - 1, "input id": history[-1]}
    held = {"seq_len": batch.seq_lens[index], "position": batch.positions[index], "input id": batch.input_ids[index]}
    wrong = [f"{name} {held[name]} where its history implies {value}" for name, value in implied.items()
             if held[name] != value]
    held = ", ".join(wrong) if wrong else "the seq_len, position and input id its history implies"
    return f"; the batch held {held} (pool row {batch.pool_rows[index]}, cache slot {batch.cache_slots[index]})"


def servable(target, batch_size: int) -> bool:
    """Whether the case says the runner replays a decode batch of `batch_size` (padding on: the largest captured
    size holds it)."""
    return batch_size <= max(target.capture_bs)


class ProgramPlayer:
    """Plays scheduler steps on `target` one at a time (see the module docstring): a drawn program's
    (`run_program`), or a state machine's rules, each step checked as it runs."""

    def __init__(self, target) -> None:
        self.target = target
        self.scheduler, self.alone = Scheduler(target), Alone(target)
        self.steps: list[tuple[str, int]] = []  # the decode steps: (verdict, batch size)

    @property
    def running(self) -> int:
        running = self.scheduler.running
        return 0 if running is None else len(running.reqs)

    def play(self, index: int, step) -> None:
        if isinstance(step, Admit):
            self.alone.admit(self.scheduler.admit(step.prompts))
        elif isinstance(step, Finish):
            self.alone.finish(self.scheduler.finish(step.positions))
        elif isinstance(step, Decode):
            self.decode(index)
        elif isinstance(step, Mix):
            self.mix(index, step.prompts)
        else:
            raise TypeError(f"unknown program step {step!r}")

    def decode(self, index: int) -> None:
        """One decode step of every running request: replayed where the case says a captured size holds the batch
        ("replayed"), else refused by the runner and served eager ("eager"); every request held to itself alone."""
        from harness.oracles.batch_invariance import check_requests_alone

        target, scheduler = self.target, self.scheduler
        batch = scheduler.prepare_decode()
        where = (f"scheduled decode step {index} (batch of {batch.batch_size}, seq_lens {batch.seq_lens}, pool "
                 f"rows {batch.pool_rows}, cache slots {batch.cache_slots})")
        if servable(target, batch.batch_size):
            logits = check_replay(target, batch, where, index)
            self.steps.append(("replayed", batch.batch_size))
        else:
            if target.can_replay(batch):
                raise OracleFailure("admission", f"{where}: the runner offers a graph for a batch of "
                                    f"{batch.batch_size} having captured {target.capture_bs} (padding on: "
                                    "none holds it)", batch=batch)
            logits = target.serve_eager(target.forward_batch(batch), where).next_token_logits
            self.steps.append(("eager", batch.batch_size))
        reqs = scheduler.running.reqs
        histories = [scheduler.history(req) for req in reqs]
        check_requests_alone(logits, histories, [self.alone.step(req) for req in reqs], where,
                             lambda i, b=batch: held_against_history(b, i, histories[i]))
        scheduler.advance(scheduler.running, logits[:batch.batch_size].argmax(-1))


    def mix(self, index: int, prompts) -> None:
        """A mixed batch (`Scheduler.mixed_batch`) through the server's eager path: every row held to SGLang's
        torch-native attention over the same cache, each running request's row to its decode step alone (its
        extend kernel's window: `Alone.step(decode_window=False)`); then every request advances and the new ones
        run on."""
        from harness.oracles.batch_invariance import check_requests_alone

        target, scheduler = self.target, self.scheduler
        running = list(scheduler.running.reqs)
        histories = [scheduler.history(req) for req in running]
        batch = scheduler.mixed_batch(prompts)
        where = (f"scheduled mixed step {index} ({[len(p) for p in prompts]}-token prompts with {len(running)} "
                 "running request(s) decoding, MIXED)")
        pools = target.pools
        before = pools.snapshot()
        reference = None
        if not pools.mla:  # an MLA model's extend takes its MHA path, which the torch-native backend cannot run
            reference = target.run_eager(scheduler.forward_batch(batch), target.reference_attn_backend)
            pools.restore(before)
        logits = target.serve_eager(scheduler.forward_batch(batch), where).next_token_logits
        if reference is not None:
            eager_matches_reference(logits, reference.next_token_logits, where)
        check_requests_alone(logits[len(prompts):], histories,
                             [self.alone.step(req, decode_window=False) for req in running], where,
                             lambda i: f"; running request {i} of the mixed batch")
        scheduler.advance(batch, logits.argmax(-1))
        self.alone.admit(list(batch.reqs[:len(prompts)]))
        scheduler.running = batch  # SGLang's next iteration merges the mixed batch back as the running one


def run_program(target, program, note: Callable[[str, Any], None] | None = None) -> list[tuple[str, int]]:
    """Play `program` on `target` (see the module docstring); returns the decode steps as (verdict, batch size):
    "replayed" or "eager" (a batch the case says no graph holds)."""
    player = ProgramPlayer(target)
    for index, step in enumerate(program):
        player.play(index, step)
    if note is not None:
        note("decode_steps", player.steps)
    return player.steps
