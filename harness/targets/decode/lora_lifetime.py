"""A LoRA server over its lifetime: adapters loaded (from a folder or from tensors, pinned or not), unloaded and
loaded again while the decode graphs captured at the server's start serve batches on whatever SGLang's memory pool
holds by then.

`LoRAServer` starts one server (`real_lora.RealLoRATarget` with a `Serving` of its own: `--lora-paths a=... b=...`,
and "e" with `embeddings`, so SGLang infers `--max-lora-rank` 4 and every projection, and then the token embedding
and the LM head, as targets) and plays steps on it, in order:
- `Load(name, weights, pinned, source, stable_id)`: SGLang's `LoRAManager.load_lora_adapter` (the folder) or
  `load_lora_adapter_from_tensors` (the same weights as tensors, as an RL trainer pushes them) of `weights`
  (`harness.models.real.lora`: a startup adapter, "c", "a2" which is "a" retrained, or "wide" past the pool's rank)
  under the served `name`; `stable_id`: the `LoRARef` id `--lora-paths` would give (`deterministic_id`), so an
  adapter unloaded and loaded again keeps its id (only while its name is free: SGLang asserts a held id is
  never sent), else a fresh one as the tokenizer manager mints;
- `Unload(name)`: `unload_lora_adapter` of the served adapter's `LoRARef`;
- `Serve(staged)`: a decode batch of requests on served adapters (or none) offered to the scheduler's admission
  (`validate_lora_batch`) and, if admitted, replayed through the captured graphs.

Checked at each step (`lora-lifecycle`, each expectation derived from the adapters and the pool's shape, not read
back from SGLang):
- a load succeeds exactly when `load_refusal` finds nothing (a name already served; a rank past --max-lora-rank
  or a target the pool lacks; a pin that would leave the base model and unpinned adapters no slot), and SGLang's
  list of loaded adapters is then the served set; an unload succeeds and frees the adapter's pool slot, zeroed;
- admission (`validate_lora_batch`) answers what `batch_refusal` derives from the pinned adapters' slots;
- a pinned adapter, once in the pool, keeps its slot until it is unloaded;
- an admitted batch replays equal to eager, and each request equals the model with its served adapter's weights
  merged (`real_lora.check_lora_replays`: `eager-equality`, `lora-reference`), so weights of an adapter unloaded,
  evicted or replaced earlier in the lifetime show in the step that reads them.
"""
from __future__ import annotations

import dataclasses
import itertools
from typing import Any

import torch

from harness.models.real.lora import adapter_config, adapter_folder, adapter_spec, adapter_tensors
from harness.oracles import OracleFailure
from harness.targets.decode.base import DecodeCase
from harness.targets.decode.real_lora import RealLoRATarget, Serving, check_lora_replays
from harness.targets.decode.real_model import StagedBatch

ORACLE = "lora-lifecycle"
_INSTANCES = itertools.count(1)


@dataclasses.dataclass(frozen=True)
class Load:
    name: str
    weights: str
    pinned: bool = False
    source: str = "path"  # or "tensors"
    stable_id: bool = False


@dataclasses.dataclass(frozen=True)
class Unload:
    name: str


@dataclasses.dataclass(frozen=True)
class Serve:
    staged: StagedBatch  # its batch's lora_ids: served names (None: the base model)

    def __str__(self) -> str:
        b = self.staged.batch
        return f"Serve(adapters {b.lora_ids}, seq_lens {b.seq_lens}, pool rows {b.pool_rows})"


@dataclasses.dataclass(frozen=True)
class Served:
    """An adapter the server serves: its weights' key and its `LoRARef`."""
    weights: str
    ref: Any

    @property
    def pinned(self) -> bool:
        return bool(self.ref.pinned)


def load_refusal(served: dict[str, Served], step: Load, serving: Serving) -> str | None:
    """Why SGLang must refuse `step` (None: it must load it), from what is served and the pool's shape (the
    rank and targets SGLang infers from the serving's `--lora-paths`).

    Examples: "a" while "a" is served -> already loaded; "wide" (rank 8) -> past --max-lora-rank 4; "e" on a
    server started without it -> embed_tokens and lm_head have no buffers; a pin with `--max-loras-per-batch` 3
    while two adapters are pinned -> the base model and unpinned adapters would have no slot (SGLang keeps one
    free: pinned < max_loras_per_batch - 1)."""
    spec, max_rank, targets = adapter_spec(step.weights), serving.max_rank(), serving.target_modules()
    if step.name in served:
        return f"an adapter named {step.name!r} is already loaded"
    if spec.rank > max_rank:
        return f"its rank {spec.rank} exceeds the pool's --max-lora-rank {max_rank} (inferred from --lora-paths)"
    if not set(spec.modules) <= targets:
        return f"it targets {sorted(set(spec.modules) - targets)}, which the pool holds no buffers for"
    pinned, max_loras = sum(s.pinned for s in served.values()), serving.max_loras_per_batch
    if step.pinned and pinned >= max_loras - 1:
        return (f"pinning it would make {pinned + 1} pinned adapters of {max_loras} pool slots, leaving none for "
                "the base model and unpinned adapters")
    return None


def batch_refusal(served: dict[str, Served], names: list, max_loras: int) -> str | None:
    """Why the scheduler must not form a batch of requests on `names` (None: it may): more distinct adapters
    (the base model counts) than slots, or more unpinned ones than the slots pinned adapters leave."""
    distinct = set(names)
    if len(distinct) > max_loras:
        return f"its {len(distinct)} distinct adapters exceed the pool's {max_loras} slots"
    pinned = sum(s.pinned for s in served.values())
    if pinned == 0:
        return None
    unpinned = len([n for n in distinct if n is None or not served[n].pinned])
    if unpinned > max_loras - pinned:
        return (f"its {unpinned} unpinned adapters (the base model counts) exceed the {max_loras - pinned} slots "
                f"its {pinned} pinned adapter(s) leave of {max_loras}")
    return None


class LoRAServer:
    """See the module docstring. `note(key, value)`: where facts go (the example's record)."""

    def __init__(self, case: DecodeCase, serving: Serving, *, hooks: Any = None, note=None) -> None:
        self.note = note or (lambda key, value: None)
        self.max_loras = serving.max_loras_per_batch
        serving = dataclasses.replace(serving, instance=next(_INSTANCES))
        self.target = RealLoRATarget(case, family="dense", serving=serving, hooks=hooks)
        self.manager = self.target.lora_manager
        # --enable-lora-overlap-loading: the scheduler admits each request's adapter through SGLang's
        # LoRAOverlapLoader, which copies it into the pool on its own stream (ForwardBatch.init_new then loads none)
        self.loader = None
        if serving.overlap_loading:
            from sglang.srt.lora.lora_overlap_loader import LoRAOverlapLoader

            self.loader = LoRAOverlapLoader(self.manager)
        self.served = {name: Served(name, ref) for ref in self.manager.lora_refs.values()
                       for name in [ref.lora_name]}
        self.pinned_slots: dict[str, int] = {}
        self.replayed: list[tuple[str, int]] = []  # (forward mode, batch size) of every batch replayed
        self.refused: list[str] = []  # SGLang's own error of every refused load, and every batch not admitted
        self.held = 0  # requests held to merged models
        self.steps = 0

    def stop(self) -> None:
        self.target.serving.stop()

    @property
    def pool(self):
        return self.manager.memory_pool

    def play(self, index: int, step) -> None:
        where = f"step {index} ({step})"
        if isinstance(step, Load):
            self._load(step, where)
        elif isinstance(step, Unload):
            self._unload(step, where)
        else:
            self._serve(step.staged, where)
        self._check_pinned(where)
        self.steps += 1

    def _load(self, step: Load, where: str) -> None:
        from sglang.srt.lora.lora_registry import LoRARef

        path = adapter_folder("dense", step.weights)
        ids = {"lora_id": LoRARef.deterministic_id(step.name, path)} if step.stable_id else {}
        ref = LoRARef(lora_name=step.name, lora_path=path, pinned=step.pinned, **ids)
        with self.target.scope(), torch.no_grad():
            result = (self.manager.load_lora_adapter(ref) if step.source == "path" else
                      self.manager.load_lora_adapter_from_tensors(ref, adapter_tensors("dense", step.weights),
                                                                  adapter_config("dense", step.weights)))
        refusal = load_refusal(self.served, step, self.target.serving)
        if refusal is None and not result.success:
            raise OracleFailure(ORACLE, f"{where}: SGLang refused to load it ({result.error_message}), but nothing "
                                "forbids it: its rank and targets fit the pool, its name is free and any pin leaves "
                                "a slot")
        if refusal is not None and result.success:
            raise OracleFailure(ORACLE, f"{where}: SGLang loaded it, but {refusal}")
        if result.success:
            self.served[step.name] = Served(step.weights, ref)
            self.target.weights[step.name] = step.weights
        else:
            self.refused.append(f"load of {step.name!r}: {result.error_message}")
            self.note("refused", self.refused)
        self._check_listed(result, where)

    def _unload(self, step: Unload, where: str) -> None:
        served = self.served.pop(step.name)
        uid = served.ref.lora_id
        slot = self.pool.uid_to_buffer_id.get(uid)
        result = self.manager.unload_lora_adapter(served.ref)
        if not result.success:
            raise OracleFailure(ORACLE, f"{where}: SGLang failed to unload a served adapter: {result.error_message}")
        self.pinned_slots.pop(step.name, None)
        self._check_listed(result, where)
        if uid in self.manager.loras or uid in self.pool.uid_to_buffer_id:
            raise OracleFailure(ORACLE, f"{where}: the unloaded adapter {step.name!r} (id {uid}) is still held: "
                                f"in the manager's adapters {uid in self.manager.loras}, in the pool at slot "
                                f"{self.pool.uid_to_buffer_id.get(uid)}")
        if slot is not None:
            left = [name for name, buffers in (*self.pool.A_buffer.items(), *self.pool.B_buffer.items())
                    if any(t[slot].count_nonzero() for t in buffers)]
            if left:
                raise OracleFailure(ORACLE, f"{where}: the unloaded adapter's pool slot {slot} still holds weights "
                                    f"in {sorted(set(left))}: a request reading that slot before another adapter "
                                    "fills it gets them")

    def _check_listed(self, result, where: str) -> None:
        want = {name: s.ref.lora_path for name, s in self.served.items()}
        if dict(result.loaded_adapters) != want:
            raise OracleFailure(ORACLE, f"{where}: SGLang lists {dict(result.loaded_adapters)} as loaded, where the "
                                f"server's history leaves {want}")

    def _admit(self, names: list, where: str) -> bool:
        """SGLang's admission of a batch on `names`: `validate_lora_batch` of its adapters, or with overlap loading
        the scheduler's request-by-request `try_overlap_load_lora` (an adapter whose copy is in flight is not
        admitted yet; the virtual device's copies complete at once, so a second try admits it). Each adapter's
        answer there is held to `batch_refusal` of those admitted before it and itself."""
        uid = {n: self.served[n].ref.lora_id if n else None for n in names}
        if self.loader is None:
            return self.manager.validate_lora_batch(set(uid.values()))
        running: set = set()
        for name in sorted(set(names), key=str):
            admitted = any(self.loader.try_overlap_load_lora(uid[name], running) for _ in range(2))
            refusal = batch_refusal(self.served, [*[n for n in uid if uid[n] in running], name], self.max_loras)
            if admitted != (refusal is None):
                said = "admitted" if admitted else "refused"
                raise OracleFailure(ORACLE, f"{where}: the overlap loader {said} adapter {name!r} beside "
                                    f"{sorted((n for n in uid if uid[n] in running), key=str)}, "
                                    f"{'but ' + refusal if refusal else 'though it fits the pool'}")
            if not admitted:
                return False
            running.add(uid[name])
        return True

    def _serve(self, staged: StagedBatch, where: str) -> None:
        names = staged.batch.lora_ids
        refusal = batch_refusal(self.served, names, self.max_loras)
        admitted = self._admit(names, where)
        if admitted != (refusal is None):
            said = "admitted it" if admitted else "refused it"
            why = f"but {refusal}" if refusal else "though it fits the slots the pinned adapters leave"
            pins = sorted(n for n, s in self.served.items() if s.pinned)
            raise OracleFailure(ORACLE, f"{where}: SGLang's admission {said} (adapters {names}, pinned {pins}, "
                                f"{self.max_loras} slots), {why}")
        if refusal is not None:
            self.refused.append(f"batch on {names}: {refusal}")
            self.note("refused", self.refused)
            return
        self.held += check_lora_replays(self.target, [[staged]])
        self.note("held_to_merged_models", self.held)
        self.replayed.append(("DECODE", len(names)))
        self.note("replayed", self.replayed)

    def _check_pinned(self, where: str) -> None:
        for name, served in self.served.items():
            slot = self.pool.uid_to_buffer_id.get(served.ref.lora_id)
            if not served.pinned:
                continue
            first = self.pinned_slots.setdefault(name, slot) if slot is not None else self.pinned_slots.get(name)
            if first is not None and slot != first:
                raise OracleFailure(ORACLE, f"{where}: the pinned adapter {name!r} moved from pool slot {first} to "
                                    f"{slot}: a pinned adapter is never evicted while loaded")
