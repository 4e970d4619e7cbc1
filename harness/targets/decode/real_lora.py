"""The decode runner serving LoRA adapters on a real model: SGLang's `LoRAManager`, its LoRA layers and memory
pool, and a drawn LoRA kernel backend (`--lora-backend`: triton, csgmv, torch_native), under capture.

`RealLoRATarget` is the real-model decode target (`real_model.RealModelTarget`) of a server started with
`--enable-lora --lora-paths a=... b=... --max-loras-per-batch N --lora-backend B`:
- the model is the family's class loaded by SGLang's loader from the transformers checkpoint
  (`transformers_reference.checkpoint`), so that merged references exist (`harness.models.real.lora`);
- the server args go through SGLang's own `check_lora_server_args` (which turns `--lora-paths` into `LoRARef`s) and
  are published; the `LoRAManager` is built by SGLang's own `ModelRunner.init_lora_manager` on the runner double:
  it wraps the model's projections in SGLang's LoRA layers and loads the PEFT adapters from disk into host memory;
- the LoRA backend's Triton kernels (the modules its kernel functions come from) run by Triton's CPU interpreter,
  recorded as launches in a capture like the attention kernels; SGLang's pinned host buffers are the virtual
  device's host memory (`harness.devices.host_memory`);
- each batch goes through what `ForwardBatch.init_new` does for a LoRA server: `fetch_new_loras` (adapters into the
  GPU memory pool, evicting by SGLang's policy when the pool is full) then `prepare_lora_batch` (weight indices,
  ranks, scalings; in place into the graph's static batch info for a decode batch the graph holds).

The manager and its model live for the process per (family, pool size, backend), as in a server: later examples
find adapters already in the pool, or evict them. The runner captures with every request on no adapter, as SGLang's
runner does (`lora_ids = [None] * bs`); `record_nolora_graph` captures a "lora" and a "nolora" graph per size.

`check_lora_replays(target, staged)`: every check of `real_model.check_replay` (replay equals eager, the KV cache,
padded rows, eager against the torch-native attention), then `lora-reference` per request: its replayed logits
against the merged model's (the plain class loaded from the checkpoint with its adapter merged) on the cache the
replay saw.
"""
from __future__ import annotations

import contextlib
import dataclasses
import functools
import importlib
import inspect
import sys
from typing import Any

from harness.devices.host_memory import pinned_host_memory
from harness.devices.triton_interpreter import interpret_kernels
from harness.errors import PathMissing
from harness.models.real import RealModel
from harness.models.real.lora import ALL_MODULES, LORA_FAMILIES, adapter_folder, adapter_spec, merged_model
from harness.oracles import OracleFailure, lora_reference
from harness.targets.decode.base import DecodeBatch, DecodeCase
from harness.targets.decode.real_model import RealModelTarget, StagedBatch, triton_modules, check_replay

LORA_BACKENDS = ("triton", "csgmv", "torch_native")  # --lora-backend values that run on the virtual device
# SGLang's torch_native LoRA backend, for a batch a decode graph holds, runs its graph ops (`graph_lora_ops`), which
# read a stacked projection's (qkv, gate_up) LoRA A and B at a stride of the pool's max rank, where SGLang's memory
# pool packs an adapter of lower rank at its own rank: such a request's k/v and up deltas come from the wrong rows
# (a strict-xfail finding in the suite). Those requests are held to replay against eager only, unless this is set
# (the finding's test sets it).
HOLD_TORCH_NATIVE_LOWER_RANK = False
_SERVED: dict = {}  # Serving -> (RealModel, LoRAManager or None before a runner built it)


def lora_missing(backend: str) -> str | None:
    """Why the installed SGLang cannot serve LoRA with `backend` here, or None."""
    from harness.versions import module_exists, sglang_version

    for module in ("sglang.srt.lora.lora_manager", "sglang.srt.lora.backend.lora_registry"):
        if not module_exists(module):
            return f"SGLang {sglang_version()} has no {module}"
    registry = importlib.import_module("sglang.srt.lora.backend.lora_registry")
    if backend not in getattr(registry, "LORA_SUPPORTED_BACKENDS", {}):
        return f"SGLang {sglang_version()} has no LoRA backend {backend!r}"
    backend_class = registry.get_backend_from_name(backend)
    if 'torch.device("cuda")' in inspect.getsource(backend_class):  # 0.5.19's csgmv; later: the manager's device
        return (f"SGLang {sglang_version()}'s LoRA backend {backend!r} ({backend_class.__name__}) allocates its "
                "graph batch info on torch.device(\"cuda\") by name, which the CPU virtual device cannot hold")
    return None


@functools.cache
def lora_kernel_modules(backend: str) -> tuple:
    """The modules holding the Triton kernels `backend`'s LoRA class launches: those its module's kernel functions
    come from (they moved between releases: `sglang.srt.lora.triton_ops`, `sglang.kernels.ops.gemm`,
    `sglang.kernels.ops.lora.dense`)."""
    registry = importlib.import_module("sglang.srt.lora.backend.lora_registry")
    backend_module = inspect.getmodule(registry.get_backend_from_name(backend))
    modules = {inspect.getmodule(value) for value in vars(backend_module).values()
               if callable(value) and getattr(value, "__module__", "").startswith(
                   ("sglang.kernels.ops", "sglang.srt.lora.triton_ops"))}
    return tuple(sorted((m for m in modules if m is not None), key=lambda m: m.__name__))


VIRTUAL_DEVICE_NAME = "Virtual CPU Device"  # no tuned kernel config is filed under it: SGLang's defaults apply


@contextlib.contextmanager
def device_name():
    """SGLang's `get_device_name` answering `VIRTUAL_DEVICE_NAME` in the LoRA kernel modules that bound it (it
    returns None without a visible GPU, and the csgmv kernels' tuned-config lookup calls `.replace` on the name)."""
    from unittest import mock

    import sglang.srt.utils as utils

    original = getattr(utils, "get_device_name", None)
    with contextlib.ExitStack() as stack:
        for name, module in list(sys.modules.items()):
            if name.startswith(("sglang.kernels.ops", "sglang.srt.lora")) and original is not None and \
                    getattr(module, "get_device_name", None) is original:
                stack.enter_context(mock.patch.object(module, "get_device_name",
                                                      lambda device_id=0: VIRTUAL_DEVICE_NAME))
        yield


@dataclasses.dataclass(frozen=True)
class Serving:
    """A LoRA server of the real-model targets (decode here, prefill in `prefill/real_model.py`): its family,
    `--lora-backend` and `--max-loras-per-batch` (the memory pool's slots; the base model takes one). The model and
    its `LoRAManager` live for the process per serving (`_SERVED`), as in a server: a later example finds adapters
    already in the pool, or evicts them; the decode and the prefill runner of one serving share them."""

    backend: str = "triton"
    max_loras_per_batch: int = 3
    family: str = "dense"
    instance: int = 0  # a server of its own (a lifetime machine's, whose adapters come and go), not the shared one
    embeddings: bool = False  # "e" among --lora-paths: the pool and the model's LoRA layers reach embed and LM head
    max_lora_rank: int | None = None  # --max-lora-rank (None: SGLang infers it from --lora-paths)
    all_targets: bool = False  # --lora-target-modules all (else SGLang infers the targets from --lora-paths)
    overlap_loading: bool = False  # --enable-lora-overlap-loading (adapters copied in on a load stream)
    tied: bool = False  # a base checkpoint with tie_word_embeddings: SGLang unties its LM head for lm_head LoRA

    def base(self) -> bool | None:
        """The `tied` argument of the base checkpoint and merged references (None: the family's own config)."""
        return True if self.tied else None

    def startup(self) -> tuple[str, ...]:
        """The adapters of `--lora-paths`: "a" and "b", and "e" (embed_tokens and lm_head) with `embeddings`."""
        return ("a", "b", "e") if self.embeddings else ("a", "b")

    def max_rank(self) -> int:
        """The pool's rank: --max-lora-rank, or as SGLang infers it from `--lora-paths` (their largest)."""
        return self.max_lora_rank or max(adapter_spec(name).rank for name in self.startup())

    def target_modules(self) -> frozenset:
        """The modules SGLang's pool holds buffers for: with `--lora-target-modules all` every LoRA-capable module of
        the family (its projections, the token embedding and the LM head), else those `--lora-paths` target."""
        if self.all_targets:
            return frozenset(ALL_MODULES)
        return frozenset(module for name in self.startup() for module in adapter_spec(name).modules)

    def max_loaded_loras(self) -> int | None:
        """--max-loaded-loras: SGLang requires one of at most twice the pool's slots with overlap loading (the
        adapters' host copies stay pinned); the tokenizer manager refuses loads past it."""
        return 2 * self.max_loras_per_batch if self.overlap_loading else None

    def missing(self) -> str | None:
        if self.family not in LORA_FAMILIES:
            return f"the LoRA targets serve {', '.join(LORA_FAMILIES)}, not {self.family!r}"
        return lora_missing(self.backend)

    def prefill_graph_missing(self) -> str | None:
        """Why SGLang serves this backend's LoRA prefill without a prefill graph (its class's
        `supports_prefill_cuda_graph`: SGLang routes such a server's prefill to the eager runner), or None."""
        registry = importlib.import_module("sglang.srt.lora.backend.lora_registry")
        if not getattr(registry.get_backend_from_name(self.backend), "supports_prefill_cuda_graph", False):
            return (f"SGLang's LoRA backend {self.backend!r} supports no prefill CUDA graph: a LoRA server's "
                    "prefill runs eagerly")
        return None

    def flags(self) -> dict[str, Any]:
        """The server flags: `--enable-lora --lora-paths a=... b=... --max-loras-per-batch N --lora-backend B`, and
        where drawn `--max-lora-rank R`, `--lora-target-modules all`, `--enable-lora-overlap-loading
        --max-loaded-loras 2N`."""
        return {"enable_lora": True,
                "lora_paths": [f"{name}={adapter_folder(self.family, name)}" for name in self.startup()],
                "max_loras_per_batch": self.max_loras_per_batch, "lora_backend": self.backend,
                **({"max_lora_rank": self.max_lora_rank} if self.max_lora_rank else {}),
                **({"lora_target_modules": ["all"]} if self.all_targets else {}),
                **({"enable_lora_overlap_loading": True, "max_loaded_loras": self.max_loaded_loras()}
                   if self.overlap_loading else {})}

    def scope(self) -> contextlib.AbstractContextManager:
        """The real-model targets' interpreter, for the LoRA backend's kernels too; pinned host memory; and a GPU
        name for the LoRA kernels' tuned-config lookup (`device_name`)."""
        stack = contextlib.ExitStack()
        stack.enter_context(interpret_kernels(triton_modules() + lora_kernel_modules(self.backend)))
        stack.enter_context(pinned_host_memory())
        stack.enter_context(device_name())
        return stack

    def model(self) -> RealModel:
        """The family's class loaded from the transformers checkpoint (SGLang's LoRA manager wraps its projections
        in LoRA layers, so it is this serving's own)."""
        if self not in _SERVED:
            from harness.models.real.lora import merged_checkpoint
            from harness.models.real.transformers_reference import load_sglang

            _SERVED[self] = (load_sglang(self.family, merged_checkpoint(self.family, None, self.base())), None)
        return _SERVED[self][0]

    def stop(self) -> None:
        """The server's model and manager forgotten (a lifetime machine's, at its end)."""
        _SERVED.pop(self, None)

    def manager(self, runner) -> Any:
        """The serving's `LoRAManager`, built once by SGLang's own `ModelRunner.init_lora_manager` on `runner` (a
        runner double carrying `model()`, its config, dtype and server args), and set on `runner`."""
        real, manager = _SERVED[self]
        if manager is None:
            from sglang.srt.configs.load_config import LoadConfig
            from sglang.srt.model_executor.model_runner import ModelRunner

            object.__setattr__(runner, "load_config", LoadConfig(load_format="auto"))
            ModelRunner.init_lora_manager(runner)
            manager = runner.lora_manager
            _SERVED[self] = real, manager
        object.__setattr__(runner, "lora_manager", manager)
        return manager


def validated(args: Any) -> Any:
    """The server args as SGLang's validation leaves them: `check_lora_server_args` parses `--lora-paths` into
    `LoRARef`s (where the release has it)."""
    from harness.versions import module_exists

    if module_exists("sglang.srt.arg_groups.lora_hook"):
        from sglang.srt.arg_groups.lora_hook import check_lora_server_args

        check_lora_server_args(args)
    return args


def lora_id(manager: Any, name: str | None) -> str | None:
    """The id SGLang serves adapter `name` under (its `LoRARef`'s, which a request carries once the tokenizer
    manager resolved its `lora_path`)."""
    if name is None:
        return None
    return {ref.lora_name: uid for uid, ref in manager.lora_refs.items()}[name]


class RealLoRATarget(RealModelTarget):
    """See the module docstring. `max_loras_per_batch`, `backend`: the `Serving`'s."""

    def __init__(self, case: DecodeCase, *, family: str = "dense", max_loras_per_batch: int = 3,
                 backend: str = "triton", serving: Serving | None = None, **kwargs: Any) -> None:
        self.serving = serving or Serving(backend, max_loras_per_batch, family)
        # the weights each served adapter name stands for (a lifetime machine reloads "a" with "a2"'s)
        self.weights: dict[str, str] = {name: name for name in self.serving.startup()}
        reason = self.serving.missing()
        if reason:
            raise PathMissing(reason)
        super().__init__(dataclasses.replace(case, lora=True), family=family, **kwargs)

    def scope(self) -> contextlib.AbstractContextManager:
        return self.serving.scope()

    def load_model(self) -> RealModel:
        return self.serving.model()

    def server_flags(self, case: DecodeCase) -> dict[str, Any]:
        return {**super().server_flags(case), **self.serving.flags()}

    def server_args(self, case: DecodeCase, device: str) -> Any:
        """`validated` server args, the decode phase's `max_bs` its largest captured size (what SGLang's config
        resolution sets; `init_lora_cuda_graph_moe_buffers` reads it)."""
        args = super().server_args(case, device)
        decode = getattr(getattr(args, "cuda_graph_config", None), "decode", None)
        if decode is not None and getattr(decode, "max_bs", 0) is None:
            decode.max_bs = max(case.capture_bs)
        return validated(args)

    def build_parts(self, case: DecodeCase, device: str) -> tuple:
        model, _, runner_backend, eager_backend = super().build_parts(case, device)
        return model, self.serving.manager(self._model_runner), runner_backend, eager_backend

    def forward_batch(self, batch: DecodeBatch):
        """The batch (adapters by name) as the scheduler hands it over: each request's adapter by its id."""
        if batch.lora_ids is not None:
            batch = dataclasses.replace(batch, lora_ids=[lora_id(self.lora_manager, name) for name in batch.lora_ids])
        with pinned_host_memory():  # prepare_lora_batch stages its indices in pinned host memory
            return super().forward_batch(batch)


def batch_info_report(target: RealLoRATarget, batch: DecodeBatch) -> str:
    """The LoRA backend's graph batch info against the batch: per request, the pool slot its weight index names
    and that slot's rank and scaling, beside its adapter's (`adapter_spec`); a padded row's slot. A diagnosis only."""
    backend = target.lora_manager.lora_backend
    info = getattr(backend, "cuda_graph_batch_info", None)
    if info is None:
        return ""
    padded = min(s for s in target.capture_bs if s >= batch.batch_size)
    slots = info.weight_indices[:padded].tolist()
    ranks, scalings = info.lora_ranks.tolist(), info.scalings.tolist()
    rows = []
    for request, (adapter, slot) in enumerate(zip(list(batch.lora_ids) + [None] * padded, slots)):
        spec = None if adapter is None else adapter_spec(target.weights[adapter])
        want = (0, 0.0) if spec is None else (spec.rank, spec.scaling)
        held = (ranks[slot], round(scalings[slot], 4)) if 0 <= slot < len(ranks) else ("?", "?")
        kind = "padded row" if request >= batch.batch_size else f"request {request} ({adapter or 'no adapter'})"
        mark = "" if held[0] == want[0] and (want[0] == 0 or held[1] == want[1]) else \
            f" where its adapter has rank {want[0]}, scaling {want[1]}"
        rows.append(f"{kind}: slot {slot}, rank {held[0]}, scaling {held[1]}{mark}")
    return f"; the LoRA backend's graph batch info ({target.serving.backend}): " + "; ".join(rows)


def check_lora_replays(target: RealLoRATarget, staged: list[list[StagedBatch]]) -> int:
    """See the module docstring; returns the requests held to a merged model."""
    pools, compared = target.pools, 0
    for step, group in enumerate(staged):
        for which, item in enumerate(group):
            batch = target.stage_item(item)
            where = f"replay {step}.{which} (batch of {batch.batch_size}, adapters {batch.lora_ids}, seq_lens " \
                    f"{batch.seq_lens}, pool rows {batch.pool_rows})"
            before = pools.snapshot()
            try:
                got = check_replay(target, batch, where, step)
            except OracleFailure as failure:
                raise OracleFailure(failure.oracle, failure.diagnosis + batch_info_report(target, batch),
                                    **failure.details) from None
            after = pools.snapshot()
            compared += check_against_merged(target, batch, got, before, where)
            pools.restore(after)
    return compared


def check_against_merged(target: RealLoRATarget, batch: DecodeBatch, got, before, where: str) -> int:
    """Each request's replayed logits (`got`) against the merged model of its adapter, run eagerly on the whole
    batch over the cache `before` (its other rows are not read). Returns the requests compared."""
    plain = dataclasses.replace(batch, lora_ids=None)  # the merged model has no LoRA layers to prepare

    def merged(adapter):
        target.pools.restore(before)
        return target.run_eager(target.forward_batch(plain), target.eager_attn_backend,
                                forward=merged_model(target.family, target.weights.get(adapter),
                                                     target.serving.base()).model.forward
                                ).next_token_logits

    return hold_to_merged(got, batch.lora_ids, merged, serving=target.serving, where=where,
                          batch_info=lambda: batch_info_report(target, batch), weights=target.weights)


def hold_to_merged(got, lora_ids: list, merged, *, serving: Serving, where: str, batch_info=lambda: "",
                   weights: dict | None = None) -> int:
    """`lora-reference` for each request of a batch: its row of `got` against the row `merged(adapter)` gives
    (the merged model of its adapter run on the whole batch). Returns the requests compared (the torch_native
    lower-rank finding's are held to replay only: `HOLD_TORCH_NATIVE_LOWER_RANK`). `weights`: the adapter each
    served name stands for (default: itself)."""
    max_rank = serving.max_rank()
    compared = 0
    for adapter in sorted(set(lora_ids), key=str):
        if serving.backend == "torch_native" and not HOLD_TORCH_NATIVE_LOWER_RANK and adapter is not None and \
                adapter_spec((weights or {}).get(adapter, adapter)).rank < max_rank:
            continue
        reference = merged(adapter)
        for request, used in enumerate(lora_ids):
            if used == adapter:
                lora_reference.check(got[request], reference[request], adapter=adapter,
                                     where=f"{where}, request {request}", batch_info=batch_info)
                compared += 1
    return compared
