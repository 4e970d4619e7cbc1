"""The decode runner driving a real SGLang model class, SGLang's Triton attention backend and SGLang's real pools.

`RealModelTarget` is the 0.5.14+ decode target (`v0_5_14.Target`: published config, the model-runner double,
SGLang's constructor capturing every size, replay through its `execute`) with its two doubles replaced: the model
is SGLang's own class for a family (`harness.models.real.build`), and the runner's attention backend is SGLang's
`TritonAttnBackend` over SGLang's `ReqToTokenPool` / `MHATokenToKVPool` (`harness.models.real.pools`), its kernels
run by Triton's CPU interpreter (`harness.devices.triton_interpreter`, scoped to the target's calls). The model
runner double carries the real `ModelConfig`, the pools, the allocator and the KV index translator.

A staged batch is built by hand: the ForwardBatch (`DecodeBatch.to_forward_batch`, as the tiny target builds it)
and the prefix in the KV cache (`Pools.stage`: what a prefill would have written). A scheduled batch
(`decode/scheduled.py`) comes from SGLang's own `ScheduleBatch` and `ForwardBatch.init_new`, its prefix written by
a real prefill; `forward_batch` hands it over as SGLang built it.

`check_replays(target, replays)`: each drawn batch is staged, replayed, and compared with eager of the same model
on a second `TritonAttnBackend` over the same pools restored to the cache the replay saw (bit-exact on a captured
size: the same ops and kernels on the same shapes; a batch padded to a larger size runs GEMMs with more rows,
whose float32 rounding differs, so it gets `torch._dynamo.utils.same`'s tolerance, worst element named); the
one replayed graph is counted; the KV cache the replay leaves must equal eager's, SGLang's padding slot 0 aside (a
padded row writing into a live slot shows there); padded rows of the static inputs hold SGLang's promise
(`decode_replay.check_padding_promises`); eager itself is held to SGLang's `TorchNativeAttnBackend` (plain torch
SDPA over the cached K/V) within float32 tolerance, so a wrong kernel cannot make both sides agree. A failure's
diagnosis names the static inputs and the Triton backend's graph metadata (`kv_indptr`, `cuda_graph_kv_indices`,
a sliding-window model's `window_kv_indptr` and `cuda_graph_window_kv_indices`) that differ from what the staged
batch implies. The runner double's `sliding_window_size` is SGLang's own (`harness.models.real.sliding_window_size`);
the torch references of a window layer read the Triton decode's window (`triton_decode_windows`, a finding).

`split_tile=N` runs the target under `--enable-deterministic-inference` with that KV split tile: each decode
replay's split counts are then held to ceil(seq_len / N) (`batch_invariance.check_split_counts`).

A hybrid-state family (`Family.hybrid`) is served as `ModelRunner` serves it: SGLang's hybrid pools
(`pools.HybridPools`, a conv and a recurrent state slot per request) and its `attn_backend_wrapper` around each
backend (`HybridLinearAttnBackend`: the Triton or torch-native backend for the full-attention layers, GDN's for the
linear ones); the cache compared after a replay includes every request's state, and a diagnosis names the linear
backend's `state_indices_list` against the batch's slots.

A family whose SGLang path the device cannot capture (`Family.capture_refusal`: Qwen2-MoE's non-CUDA MoE) is
constructed all the same; its refusal is checked to be the declared one (`capture_refused`) and `check_eager`
holds its eager forward to the torch reference.
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import importlib
import itertools
from typing import Any

import torch

from harness.counter import counter
from harness.devices.triton_interpreter import interpret_kernels
from harness.errors import HarnessError, PathMissing
from harness.models.real import RealModel, build, missing, sliding_window_size, spec, triton_decode_windows
from harness.models.real.pools import Pools, pools_for
from harness.oracles import OracleFailure
from harness.oracles.batch_invariance import check_split_counts
from harness.oracles.decode_replay import check_padding_promises
from harness.oracles.eager import assert_matches_eager
from harness.oracles.graph_key import check_replayed_key, expected_variant, replay_counts
from harness.oracles.graph_replay import check_graph_forward, replay_delta
from harness.targets.decode import v0_5_14
from harness.targets.decode.base import DecodeBatch, DecodeCase, make_model_runner

# the modules whose Triton kernels a decode step (and a scheduled prefill) of the Triton backend launches
TRITON_MODULES = ("sglang.srt.layers.attention.triton_backend", "sglang.kernels.ops.attention.decode_attention",
                  "sglang.kernels.ops.attention.metadata", "sglang.srt.mem_cache.kv_index_translator",
                  "sglang.kernels.ops.elementwise.elementwise",  # Qwen2-MoE's shared-expert gate
                  "sglang.kernels.ops.attention.extend_attention",  # a scheduled batch's prefill (scheduled.py)
                  "sglang.srt.mem_cache.allocation",  # up to 0.5.1x the scheduler's req_to_token writes
                  "sglang.kernels.ops.attention.position",  # up to 0.5.1x ForwardBatch.init_new's extend positions
                  "sglang.kernels.ops.speculative.cache_locs",  # an EAGLE draft's per-step KV rails (eagle_draft.py)
                  "sglang.kernels.ops.speculative.row_argmax",  # its proposal under rejection sampling (fast_sample)
                  "sglang.kernels.ops.memory.memcpy_triton",  # DP attention's gather and scatter (harness.worlds)
                  # a hybrid family's linear-attention layers: projections, gating, conv and recurrent state
                  # updates, the gated norm, the state-slot bookkeeping of its backend
                  "sglang.kernels.ops.attention.triton_gdn_fused_proj",
                  "sglang.kernels.ops.attention.linear.fused_gdn_gating",
                  "sglang.kernels.ops.mamba.causal_conv1d_triton", "sglang.kernels.ops.attention.fla.fused_recurrent",
                  "sglang.kernels.ops.attention.fla.layernorm_gated",
                  "sglang.kernels.ops.mamba.mamba_state_indices_triton",
                  "sglang.kernels.ops.mamba.mamba_state_scatter_triton")
# Under --enable-deterministic-inference SGLang's Triton backend runs a TARGET_VERIFY's attention through its unified
# extend kernel, which on a sliding-window layer attends another key set than the plain verify, the torch-native
# backend and the HF window (logits up to 1.6 apart on the swa family; a strict-xfail finding in the suite). Such a
# verify is held to its replay only, unless this is set (the finding's test sets it).
HOLD_DETERMINISTIC_WINDOW_VERIFY = False
KV_SPLITS = 1  # --triton-attention-num-kv-splits (SGLang's default 8: eight times the interpreted programs)
KV_TOKENS = 512  # KV slots of the pool (slot 0: SGLang's padding slot)

_MODELS: dict = {}  # family -> RealModel
_POOLS: dict = {}  # (family, request rows) -> Pools


def load():
    """The decode layout this target drives (0.5.14+), or PathMissing naming what the installed SGLang lacks."""
    from harness.targets.decode import load as decode_layout
    from harness.versions import module_exists, sglang_version

    layout = decode_layout()
    if layout is not v0_5_14.LAYOUT:
        raise PathMissing(f"SGLang {sglang_version()}: the real-model target drives the 0.5.14+ decode runner; this "
                          f"release has the {layout.name} layout")
    if not module_exists("sglang.srt.layers.attention.triton_backend"):
        raise PathMissing(f"SGLang {sglang_version()} has no sglang.srt.layers.attention.triton_backend")
    asked = runner_state_asked()
    if asked:
        raise PathMissing(f"SGLang {sglang_version()}: its TritonAttnBackend asks the ModelRunner for {asked} (state "
                          "its constructor derives through private caches), which the real-model runner double "
                          "does not carry; the real-model target drives releases whose backend reads the model "
                          "config (0.5.19 on)")
    return layout


def runner_state_asked() -> str | None:
    """The ModelRunner-derived model kinds the installed Triton backend's constructor reads (`model_runner.
    hybrid_gdn_config`, ...: 0.5.14), named, or None."""
    import inspect

    from sglang.srt.layers.attention.triton_backend import TritonAttnBackend

    source = inspect.getsource(TritonAttnBackend.__init__)
    asked = [name for name in ("hybrid_gdn_config", "kimi_linear_config", "linear_attn_model_spec")
             if f"model_runner.{name}" in source]
    return ", ".join(asked) or None


def refusal(family, error: BaseException) -> str | None:
    """The family's known capture refusal (`Family.capture_refusal`: CUDA's own text raised by the virtual device
    at a site in the named SGLang file), described and taken off the violation log, or None when `error` is
    anything else."""
    from harness.devices import legality

    expected = family.capture_refusal
    if expected is None:
        return None
    texts = f"{error} {getattr(error, '__cause__', '')}"
    site = legality.VIOLATIONS[-1].site if legality.VIOLATIONS else ""
    if expected[0] in site or expected[0] in texts:
        # the declared refusal is what the refusal test checks, not a capture-legality failure; any other
        # violation stays filed for that oracle
        legality.VIOLATIONS[:] = [v for v in legality.VIOLATIONS if expected[0] not in v.site]
        return f"capture refused at {site}: {expected[1]} ({str(error).splitlines()[0][:200]})"
    return None


def family_missing(family: str) -> str | None:
    """Why `family` cannot be built on the installed SGLang (the missing module or class), or None."""
    return missing(family)


def real_model(family: str) -> RealModel:
    """One model per family and process (building costs seconds; the weights never change)."""
    if family not in _MODELS:
        _MODELS[family] = build(family)
    return _MODELS[family]


@functools.cache
def triton_modules() -> tuple:
    """The `TRITON_MODULES` the installed release has, imported (asked once: `kernels` wraps every replay)."""
    from harness.versions import module_exists

    return tuple(importlib.import_module(name) for name in TRITON_MODULES if module_exists(name))


def kernels() -> contextlib.AbstractContextManager:
    """Triton's CPU interpreter for the kernels of `TRITON_MODULES` (those the installed release has)."""
    return interpret_kernels(triton_modules())


@dataclasses.dataclass
class StagedBatch:
    """A decode batch and the KV-cache prefix staged for it (`Pools.stage` with `seed`); for an mRoPE family, each
    request's mRoPE delta (what its earlier image tokens shifted the text positions by: <= 0)."""

    batch: DecodeBatch
    seed: int
    mrope_deltas: list[int] | None = None


@contextlib.contextmanager
def _split_tile_environment(tile: int | None):
    """SGLANG_TRITON_DECODE_SPLIT_TILE_SIZE set to `tile` for the block (left as it is for None)."""
    import os
    from unittest import mock

    with mock.patch.dict(os.environ, {} if tile is None else {"SGLANG_TRITON_DECODE_SPLIT_TILE_SIZE": str(tile)}):
        yield


class RealModelTarget(v0_5_14.Target):
    """See the module docstring. `family`: a key of `harness.models.real.FAMILIES`."""

    def __init__(self, case: DecodeCase, *, family: str, layout=None, personality: str = "cuda",
                 device: str = "cpu", hooks: Any = None, split_tile: int | None = None,
                 mamba_track: int | None = None) -> None:
        """`mamba_track`: a hybrid family served with the Mamba extra buffer, its decode steps checkpointing each
        request's state every `mamba_track` tokens (`--mamba-track-interval`); None: no extra buffer."""
        if device != "cpu":
            raise HarnessError(f"the real-model target runs on the cpu virtual device (its Triton kernels by the CPU "
                               f"interpreter), not on {device!r}")
        self.family = family
        # `--enable-deterministic-inference` with this SGLANG_TRITON_DECODE_SPLIT_TILE_SIZE (None: off)
        self.split_tile = split_tile
        self.mamba_track = mamba_track
        if mamba_track is not None and not spec(family).hybrid:
            raise HarnessError(f"--mamba-track-interval {mamba_track} asks for a hybrid-state family, not {family}")
        reason = missing(family)
        if reason:
            raise PathMissing(reason)
        self.capture_refused: str | None = None
        with self.scope():
            try:
                with _split_tile_environment(split_tile):  # the backend reads it when it is built
                    super().__init__(case, layout=layout or v0_5_14.LAYOUT, personality=personality,
                                     device=device, hooks=hooks)
            except Exception as error:  # noqa: BLE001 - only the family's known refusal is kept, anything else raises
                self.capture_refused = refusal(spec(family), error)
                if self.capture_refused is None:
                    raise

    def scope(self) -> contextlib.AbstractContextManager:
        """What SGLang's code of this target needs from the device around construction, replay and eager: Triton's
        CPU interpreter for `TRITON_MODULES`."""
        return kernels()

    def load_model(self) -> RealModel:
        """The model this target serves: the family's, dummy weights (one per family and process)."""
        return real_model(self.family)

    def server_args(self, case: DecodeCase, device: str) -> Any:
        """The 0.5.14+ target's server args with `--triton-attention-num-kv-splits KV_SPLITS`: each split is a
        program the CPU interpreter runs one by one (stage 2 still reduces the one split)."""
        args = super().server_args(case, device)
        args.triton_attention_num_kv_splits = KV_SPLITS
        return args

    def server_flags(self, case: DecodeCase) -> dict[str, Any]:
        """`--enable-deterministic-inference` when asked: SGLang's Triton backend then sizes KV splits by a fixed
        tile (`SGLANG_TRITON_DECODE_SPLIT_TILE_SIZE`) from each replay's seq_lens, takes the non-lean decode path
        and the unified one-stage extend kernel (a TARGET_VERIFY's attention)."""
        flags = {"enable_deterministic_inference": True} if self.split_tile is not None else {}
        if self.mamba_track is not None:  # the radix cache on, its Mamba extra buffer, the checkpoint interval
            flags.update(disable_radix_cache=False, mamba_radix_cache_strategy="extra_buffer",
                         mamba_track_interval=self.mamba_track)
        return flags

    # -- the parts ---------------------------------------------------------------------------------------------
    def build_parts(self, case: DecodeCase, device: str) -> tuple:
        from sglang.srt.layers.attention.torch_native_backend import TorchNativeAttnBackend
        from sglang.srt.layers.attention.triton_backend import TritonAttnBackend

        self.real = self.load_model()
        self.pools = self.make_pools(case, device)
        self._model_runner = runner = self._runner_double(case, device)
        wrap = _hybrid_wrapper(runner) if self.real.family.hybrid else (lambda backend: backend)
        runner_backend = wrap(TritonAttnBackend(runner))
        runner.attn_backend = runner_backend
        self.reference_attn_backend = wrap(TorchNativeAttnBackend(runner))
        eager_backend = wrap(TritonAttnBackend(runner))
        runner.attn_backend = runner_backend  # the wrapper keeps the linear backends it built last on the runner
        return self.real.model, None, runner_backend, eager_backend

    def make_pools(self, case: DecodeCase, device: str) -> Pools:
        """The KV pools this target serves from (one per family and request rows in a process)."""
        track = self.mamba_track is not None
        key = (self.family, case.max_running_requests, track)
        if key not in _POOLS:
            _POOLS[key] = pools_for(self.real.model_config, self.real.family.hybrid, case.max_running_requests,
                                    KV_TOKENS, device, track=track)
        return _POOLS[key]

    def _runner_double(self, case: DecodeCase, device: str):
        runner = make_model_runner(self.real.model, None, device=device,
                                   max_running_requests=case.max_running_requests, server_args=self.server_args,
                                   lora_manager=None, spec=case.spec, architecture=self.real.family.architecture)
        runner.model_config = self.real.model_config
        self.pools.bind(runner)
        runner.sliding_window_size = sliding_window_size(self.real)
        runner.page_size, runner.kv_cache_dtype = 1, torch.float32
        runner.prefill_attention_backend_str = "triton"  # ModelRunner's, resolved from --attention-backend triton;
        # ForwardBatch.init_new reads it for a scheduler-built extend batch's positions (`decode/scheduled.py`)
        from harness.targets.prefill.v0_5_14 import parallel_view

        runner.ps = parallel_view()  # up to 0.5.19 ForwardBatch.init_new reads the runner's parallel view
        if self.real.family.hybrid:  # what SGLang's backend wrapper reads to build the linear-attention side
            runner.use_mla_backend, runner.is_draft_worker = False, False
            runner.decode_attention_backend_str = "triton"
        return runner

    def make_model_runner(self, case: DecodeCase, device: str):
        return self._model_runner

    # -- batches -----------------------------------------------------------------------------------------------
    def stage(self, seq_lens: list[int], pool_rows: list[int], input_ids: list[int], seed: int,
              mrope_deltas: list[int] | None = None) -> DecodeBatch:
        """Stage the KV prefix of the batch's requests and return the batch the scheduler would hand over (an mRoPE
        family's with its `mrope_positions`: a text token's three sections are its position plus the request's
        delta, as SGLang's mRoPE index gives a text token after an image, `mrope_rope_index.py`)."""
        slots = self.pools.stage(seq_lens, pool_rows, seed)
        positions = [n - 1 for n in seq_lens]
        mrope = None
        if self.real.family.mrope:
            deltas = mrope_deltas or [0] * len(seq_lens)
            mrope = [[p + d for p, d in zip(positions, deltas)] for _ in range(3)]
        return DecodeBatch(input_ids=list(input_ids), positions=positions, seq_lens=list(seq_lens),
                           req_pool_indices=list(pool_rows), out_cache_loc=slots, mrope_positions=mrope)

    def stage_verify(self, batch: DecodeBatch, seed: int, mrope_deltas: list[int] | None = None) -> DecodeBatch:
        """A TARGET_VERIFY batch (`batch.seq_lens`: the prefix in the cache; its input ids the drafts, D a request):
        each request's row maps prefix + D tokens, the drafts' slots its `out_cache_loc` (where the verify writes),
        as the EAGLE worker's prepare-for-verify leaves them; the drafts sit at positions prefix .. prefix + D - 1."""
        drafts = self.case.spec.num_draft_tokens
        self.pools.stage([n + drafts for n in batch.seq_lens], batch.pool_rows, seed)
        out = [slot for slots in self.pools.staged_slots for slot in slots[-drafts:]]
        positions = [n + i for n in batch.seq_lens for i in range(drafts)]
        mrope = None
        if self.real.family.mrope:
            deltas = [d for d in (mrope_deltas or [0] * batch.batch_size) for _ in range(drafts)]
            mrope = [[p + d for p, d in zip(positions, deltas)] for _ in range(3)]
        return dataclasses.replace(batch, positions=positions, out_cache_loc=out, mrope_positions=mrope)

    def stage_item(self, item: StagedBatch) -> DecodeBatch:
        batch = item.batch
        if batch.forward_mode == "TARGET_VERIFY":
            return self.stage_verify(batch, item.seed, item.mrope_deltas)
        staged = self.stage(batch.seq_lens, batch.pool_rows, batch.input_ids, item.seed, item.mrope_deltas)
        return dataclasses.replace(staged, lora_ids=batch.lora_ids)

    def forward_batch(self, batch: DecodeBatch):
        if getattr(batch, "built", None) is not None:  # a scheduler-built batch (`decode/scheduled.py`)
            return batch.built()
        fb = super().forward_batch(batch)
        fb.req_to_token_pool, fb.token_to_kv_pool = self.pools.req_to_token_pool, self.pools.token_to_kv_pool
        if self.mamba_track is not None and batch.forward_mode == "DECODE":
            indices, mask = self.pools.track_fields(batch.seq_lens, self.mamba_track)
            fb.mamba_track_indices = torch.tensor(indices, dtype=torch.int64)
            fb.mamba_track_mask = torch.tensor(mask, dtype=torch.bool)
        return fb

    def replay(self, batch: DecodeBatch):
        with self.scope():
            return super().replay(batch)

    def eager(self, batch: DecodeBatch, forward=None, attn_backend=None):
        """The model's forward on the real rows, no graph, with a fresh attention backend (`attn_backend`: another
        one, e.g. the torch reference)."""
        return self.run_eager(self.forward_batch(batch), attn_backend or self.eager_attn_backend, forward)

    def serve_eager(self, fb, where: str):
        """A forward the server runs eager (a prefill, a decode batch no captured size holds): here the model on
        the eager backend, apart from the runner's (`served.ServedTarget` serves it through SGLang's dispatch)."""
        return self.run_eager(fb, self.eager_attn_backend)

    def run_eager(self, fb, backend, forward=None):
        """The model's forward (or `forward`) on the ForwardBatch `fb`, no graph, on `backend`."""
        from harness.targets.sglang_plumbing import forward_context

        with self.scope():
            backend.init_forward_metadata(fb)
            with torch.no_grad(), forward_context(backend, fb):
                return (forward or self.model.forward)(fb.input_ids, fb.positions, fb)


def _hybrid_wrapper(runner):
    """SGLang's own `attn_backend_wrapper`, as `ModelRunner` applies it to the backend it chose: for a hybrid-state
    model, a `HybridLinearAttnBackend` over that backend (the full-attention layers) and the linear-attention
    backend the model's layers need (GDN's here)."""
    from sglang.srt.layers.attention.attention_registry import attn_backend_wrapper

    return lambda backend: attn_backend_wrapper(runner, backend)


# -- the check --------------------------------------------------------------------------------------------------
def _cache_difference(pools: Pools, replayed: list[torch.Tensor], eager: list[torch.Tensor],
                      exact: bool) -> str | None:
    """Where the KV cache (and a hybrid model's per-request state) a replay left differs from eager's, buffer by
    buffer, slot 0 (SGLang's padding slot, which padded rows write) aside."""
    found = []
    for (name, _), a, b in zip(pools.buffers(), replayed, eager):
        a, b = a[1:].flatten(1).float(), b[1:].flatten(1).float()
        differs = (a != b) if exact else ~torch.isclose(a, b, rtol=1e-4, atol=1e-5)
        slots = [slot + 1 for slot in differs.any(dim=1).nonzero().flatten().tolist()]
        if slots:
            kind = "state" if name.startswith("mamba") else "KV"  # a hybrid model's per-request state slots
            found.append(f"`{name}` differs at {kind} slot(s) {slots[:8]}")
    return "; ".join(found) or None


def static_input_report(target: RealModelTarget, batch: DecodeBatch) -> str:
    """The runner's static inputs for the real and the padded rows (a diagnosis only, read after a failure)."""
    padded = min(s for s in target.capture_bs if s >= batch.batch_size)
    width = target.case.tokens_per_request
    rows = []
    for name, per_token in (("input_ids", True), ("positions", True), ("out_cache_loc", True),
                            ("req_pool_indices", False), ("seq_lens", False), ("mamba_track_indices", False),
                            ("mamba_track_mask", False)):
        buffer = target.static_buffer(name)
        if buffer is not None:
            stop = padded * width if per_token else padded
            rows.append(f"`{name}`[:{stop}] = {buffer[:stop].tolist()}")
    mrope = target.static_buffer("mrope_positions") if batch.mrope_positions else None
    if mrope is not None:
        rows.append(f"`mrope_positions`[:, :{padded}] = {mrope[:, :padded].tolist()} (the batch's "
                    f"{batch.mrope_positions})")
    return f"; static inputs (batch of {batch.batch_size} padded to {padded}): " + ", ".join(rows)


def stale_metadata(target: RealModelTarget, batch: DecodeBatch) -> str:
    """Which of the Triton backend's graph metadata buffers differs from what the staged batch implies: the KV
    index pointer (cumulative seq_lens of the padded batch, padded rows SGLang's fill value) and the KV indices
    (each request's slots in order, a padded row the padding row's slot 0). A diagnosis, read after a failure."""
    backend = getattr(target.attn_backend, "full_attn_backend", target.attn_backend)  # a hybrid's Triton side
    padded = min(s for s in target.capture_bs if s >= batch.batch_size)
    fill = backend.get_cuda_graph_seq_len_fill_value()
    lens = list(batch.seq_lens) + [fill] * (padded - batch.batch_size)
    indptr = list(itertools.accumulate(lens, initial=0))
    indices = [slot for slots, n in zip(target.pools.staged_slots, batch.seq_lens) for slot in slots[:n]] + \
        [0] * (fill * (padded - batch.batch_size))  # a verify batch's rows also map its drafts, past seq_len
    wrong = []
    held = backend.kv_indptr[:padded + 1].tolist()
    if held != indptr:
        wrong.append(f"the Triton backend's `kv_indptr`[:{padded + 1}] holds {held} where the batch implies "
                     f"{indptr}")
    held = backend.cuda_graph_kv_indices[:len(indices)].tolist()
    if held != indices:
        wrong.append(f"its `cuda_graph_kv_indices`[:{len(indices)}] holds {held[:16]} where the batch's "
                     f"req_to_token rows imply {indices[:16]}")
    window = backend.sliding_window_size or 0
    if window > 0 and batch.forward_mode != "TARGET_VERIFY":  # the window layers' rail: each row's last W keys
        lens = [min(n, window) for n in lens]
        indptr = list(itertools.accumulate(lens, initial=0))
        indices = [slot for slots, n in zip(target.pools.staged_slots, batch.seq_lens)
                   for slot in slots[n - min(n, window):n]] + [0] * sum(lens[batch.batch_size:])
        held = backend.window_kv_indptr[:padded + 1].tolist()
        if held != indptr:
            wrong.append(f"its `window_kv_indptr`[:{padded + 1}] holds {held} where a window of {window} over the "
                         f"batch implies {indptr}")
        held = backend.cuda_graph_window_kv_indices[:len(indices)].tolist()
        if held != indices:
            wrong.append(f"its `cuda_graph_window_kv_indices`[:{len(indices)}] holds {held[:16]} where each "
                         f"request's last {window} slots are {indices[:16]}")
    linear = getattr(target.attn_backend, "linear_attn_backend", None)
    if linear is not None and batch.forward_mode == "DECODE":  # each row's state slot, a padded row SGLang's -1
        states = target.pools.staged_states + [-1] * (padded - batch.batch_size)
        held = linear.state_indices_list[padded - 1][:padded].tolist()
        if held != states:
            wrong.append(f"the linear-attention backend's `state_indices_list[{padded - 1}]` holds {held} where "
                         f"the batch's rows map state slots {states} (a padded row: SGLang's -1)")
        if target.mamba_track is not None:  # where each row checkpoints its state (a padded row: nowhere)
            tracks, mask = target.pools.track_fields(batch.seq_lens, target.mamba_track)
            held = linear.mamba_track_indices_buf[:batch.batch_size].tolist()
            if held != tracks:
                wrong.append(f"its `mamba_track_indices_buf`[:{batch.batch_size}] holds {held} where the batch's "
                             f"requests track into slots {tracks} (checkpointing {mask})")
    mask = batch.custom_mask()
    verify_mask = getattr(backend, "_verify_mask", None)
    if mask is not None and verify_mask is not None:  # the verify mask the replay's kernels read, request by request
        held = verify_mask.buffer[:len(mask)].tolist()
        start, stale = 0, []
        drafts = target.case.spec.num_draft_tokens
        for request, prefix in enumerate(batch.seq_lens):
            stop = start + drafts * (prefix + drafts)
            if held[start:stop] != mask[start:stop]:
                stale.append(request)
            start = stop
        if stale:
            wrong.append(f"its verify mask buffer (`_verify_mask`) differs from the batch's custom mask for "
                         f"request(s) {stale}")
    return ("; attention metadata: " + "; ".join(wrong)) if wrong else ""


def padding_slot_in_use(target: RealModelTarget, batch: DecodeBatch) -> str:
    """A padded replay's padded rows write their K/V into slot 0 (SGLang's padding slot, `out_cache_loc` padding);
    a real request holding that slot (from the staged layout) is overwritten. A diagnosis only."""
    padded = min(s for s in target.capture_bs if s >= batch.batch_size)
    users = [i for i, slots in enumerate(target.pools.staged_slots) if 0 in slots]
    if padded == batch.batch_size or not users:
        return ""
    extra = padded - batch.batch_size
    return (f"; request(s) {users} of the batch hold KV slot 0, SGLang's padding slot, which the {extra} padded "
            "row(s) of this replay write (the allocator handed the padding slot out)")


def check_eager(target: RealModelTarget, staged: list[list[StagedBatch]]) -> None:
    """Eager on the Triton backend equals SGLang's torch-native attention on the same staged cache, per batch (what
    a family whose capture the device refuses can still be held to)."""
    pools = target.pools
    for step, group in enumerate(staged):
        for which, item in enumerate(group):
            batch = target.stage_item(item)
            before = pools.snapshot()
            eager = target.eager(batch).next_token_logits
            pools.restore(before)
            check_eager_against_reference(target, batch, eager, f"eager {step}.{which} (seq_lens {batch.seq_lens})")


def check_eager_against_reference(target: RealModelTarget, batch, eager: torch.Tensor, where: str) -> None:
    """Eager on the Triton backend equals SGLang's torch-native attention over the same cache (restored before). A
    TARGET_VERIFY batch reaches the torch-native backend as the extend it is when its drafts form a chain (each
    draft sees the ones before it, SGLang's causal extend): the prefix lengths as extend prefixes, the drafts as
    the extended tokens (`Pools.stage` mapped their slots in each request's row). A draft tree has no torch-native
    counterpart: its eager is held to replay only."""
    backend = target.reference_attn_backend
    if batch.forward_mode != "TARGET_VERIFY":
        with triton_decode_windows(target.model):
            reference = target.eager(batch, attn_backend=backend).next_token_logits
        eager_matches_reference(eager, reference, where)
        return
    drafts = target.case.spec.num_draft_tokens
    chain = [[[col <= row for col in range(drafts)] for row in range(drafts)]] * batch.batch_size
    if batch.draft_visibility != chain:
        return
    if target.split_tile is not None and target._model_runner.sliding_window_size and \
            not HOLD_DETERMINISTIC_WINDOW_VERIFY:
        return  # a finding (test_findings_deterministic_verify_misreads_window): held to replay only
    fb = target.forward_batch(batch)
    fb.extend_prefix_lens, fb.extend_seq_lens = fb.seq_lens, torch.full_like(fb.seq_lens, drafts)
    fb.seq_lens = fb.seq_lens + drafts  # the mirror and the sum with it (`batch_consistency`)
    fb.seq_lens_cpu = None if fb.seq_lens_cpu is None else fb.seq_lens_cpu + drafts
    fb.seq_lens_sum = int(fb.seq_lens.sum())
    reference = target.run_eager(fb, backend).next_token_logits
    eager_matches_reference(eager, reference, f"{where}, its draft chain as an extend")


def eager_matches_reference(eager: torch.Tensor, reference: torch.Tensor, where: str) -> None:
    """Logits of the Triton backend within float32 tolerance of SGLang's torch-native attention's."""
    try:
        assert_matches_eager(eager, reference, exact=False)
    except OracleFailure as failure:
        raise OracleFailure(failure.oracle, f"{where}: eager on the Triton backend differs from SGLang's "
                            f"torch-native attention over the same cache: {failure.diagnosis}",
                            **failure.details) from None


def check_replays(target: RealModelTarget, staged: list[list[StagedBatch]]) -> None:
    """`staged`: per replay step, the batches replayed one after another on the same captured size (new inputs
    each time, so stale buffers show). See the module docstring for what is compared."""
    for step, group in enumerate(staged):
        for which, item in enumerate(group):
            batch = target.stage_item(item)
            where = f"replay {step}.{which} (batch of {batch.batch_size}, seq_lens {batch.seq_lens}, pool rows " \
                    f"{batch.pool_rows}, cache slots {batch.cache_slots})"
            check_replay(target, batch, where, step)


def check_replay(target: RealModelTarget, batch: DecodeBatch, where: str, step: int) -> torch.Tensor:
    """One batch (its KV prefix in the pools): replayed, then eager on the cache the replay saw; see the module
    docstring. The pools are left as the replay left them; returns the replay's logits of the batch's rows."""
    pools = target.pools
    if not target.can_replay(batch):
        raise OracleFailure("eager-equality", f"the runner refused {where} having captured {target.capture_bs}",
                            batch=batch)
    before = pools.snapshot()
    mark = counter.mark()
    graphs_before = replay_counts(target.runner)
    output = target.replay(batch)
    check_graph_forward(replay_delta(counter.since(mark)), 1, context=where)
    check_replayed_key(graphs_before, replay_counts(target.runner), requests=batch.batch_size,
                       capture_bs=target.capture_bs, where=where,
                       variant=expected_variant(batch.lora_ids, target.case.record_nolora_graph))
    if target.split_tile is not None and batch.forward_mode == "DECODE":  # the graph's kernels read these splits
        splits = target.attn_backend.cuda_graph_num_kv_splits[:batch.batch_size].tolist()
        check_split_counts(splits, batch.seq_lens, target.split_tile, where)
    got = output.next_token_logits[:len(batch.input_ids)].clone()  # a verify batch: every draft token's row
    after_replay = pools.snapshot()
    pools.restore(before)
    eager = target.eager(batch).next_token_logits
    after_eager = pools.snapshot()
    pools.restore(before)
    check_eager_against_reference(target, batch, eager, where)
    # bit-exact where replay runs the shapes eager runs; a padded batch's GEMMs have more rows, which changes
    # float32 rounding, so it gets torch._dynamo.utils.same's tolerance
    exact = batch.batch_size in target.capture_bs
    try:
        assert_matches_eager(got, eager, exact=exact)
    except OracleFailure as failure:
        cache = _cache_difference(pools, after_replay, after_eager, exact)
        raise OracleFailure(failure.oracle, f"{where}: replay differs from eager: {failure.diagnosis}"
                            f"{'; the KV cache after the replay: ' + cache if cache else ''}"
                            f"{padding_slot_in_use(target, batch)}{stale_metadata(target, batch)}"
                            f"{static_input_report(target, batch)}",
                            **failure.details, capture_bs=target.capture_bs) from None
    cache = _cache_difference(pools, after_replay, after_eager, exact)
    if cache:
        raise OracleFailure("eager-equality", f"{where}: the replay's logits equal eager's but the KV cache "
                            f"it leaves does not: {cache}{stale_metadata(target, batch)}"
                            f"{static_input_report(target, batch)}",
                            capture_bs=target.capture_bs)
    check_padding_promises(target, batch, step)
    pools.restore(after_replay)
    return got
