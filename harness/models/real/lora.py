"""LoRA adapters for a real model, and the models they merge into: what SGLang's multi-LoRA serving must equal.

`adapter_folder(family, name)` writes a PEFT adapter (`adapter_config.json` and `adapter_model.safetensors`, the
format SGLang's `LoRAManager` loads from `--lora-paths`) for the family's transformers checkpoint
(`transformers_reference.checkpoint`): for each module the adapter targets, `lora_A` [r, in] and `lora_B` [out, r]
drawn from the adapter's seed, under PEFT's key names. The adapters (`ADAPTERS`) differ in rank, scaling and target
modules, so SGLang's memory pool pads the smaller rank to the largest and leaves untargeted modules empty.

`merged_model(family, name)` is the reference: by PEFT's definition an adapter changes each targeted weight to
W + (lora_alpha / r) * B @ A, so the merged checkpoint (that arithmetic done on transformers' weights, under their
HF names) loaded by SGLang's own loader into the family's plain class computes, with no LoRA code at all, what a
request using the adapter must get. `merged_model(family, None)` is the base checkpoint itself. With `tied` (a base
checkpoint whose LM head is its token embedding) the merged checkpoint is untied: an adapter's `lm_head` and
`embed_tokens` deltas are two (PEFT keeps them apart, and SGLang gives the LM head LoRA layers of its own by untying
it onto the shared base weight).
"""
from __future__ import annotations

import dataclasses
import functools
import json
import os
import tempfile

import torch

from harness.models.real import FAMILIES, RealModel, write_config


@dataclasses.dataclass(frozen=True)
class Adapter:
    name: str
    rank: int
    alpha: float
    modules: tuple[str, ...]  # HF module names the adapter targets (q_proj, ..., down_proj)
    seed: int

    @property
    def scaling(self) -> float:
        """PEFT's LoRA scaling (no rsLoRA): lora_alpha / r."""
        return self.alpha / self.rank


ATTENTION = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP = ("gate_proj", "up_proj", "down_proj")
# what `--lora-target-modules all` reaches in the dense family
ALL_MODULES = ATTENTION + MLP + ("embed_tokens", "lm_head")
# two adapters of different ranks, scalings and targets: the memory pool pads "b"'s rank to "a"'s, and "b" leaves
# k_proj, o_proj, gate_proj and up_proj without weights (SGLang's buffers for them stay zero for its slot). The
# server starts with these (`--lora-paths`), so SGLang infers --max-lora-rank 4 and every module as a target.
ADAPTERS = {
    "a": Adapter("a", rank=4, alpha=8.0, modules=ATTENTION + MLP, seed=21),
    "b": Adapter("b", rank=2, alpha=3.0, modules=("q_proj", "v_proj", "down_proj"), seed=22),
}
# adapters a server loads after its start (`load_lora_adapter`, `load_lora_adapter_from_tensors`): "c" targets k_proj,
# gate_proj and up_proj, which "b" leaves empty, and leaves o_proj and down_proj empty, at a rank between (SGLang
# stacks q/k/v assuming q_proj and v_proj are targeted); "a2" is "a" retrained (same rank and targets, new weights),
# served under the name "a" once "a" is unloaded; "wide" has a rank past the pool's, which SGLang must refuse
RUNTIME_ADAPTERS = {
    "c": Adapter("c", rank=3, alpha=6.0, modules=("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj"), seed=23),
    "a2": Adapter("a2", rank=4, alpha=4.0, modules=ATTENTION + MLP, seed=31),
    "wide": Adapter("wide", rank=8, alpha=8.0, modules=("q_proj", "v_proj"), seed=24),
    # the token embedding and the LM head (PEFT's embedding LoRA), with q_proj and v_proj: a server starts with it
    # when its LoRA targets reach those two (`real_lora.Serving.embeddings`)
    "e": Adapter("e", rank=2, alpha=4.0, modules=("embed_tokens", "lm_head", "q_proj", "v_proj"), seed=26),
    # k_proj without q_proj: a PEFT adapter SGLang loads and then cannot place in its pool (a finding)
    "konly": Adapter("konly", rank=2, alpha=4.0, modules=("k_proj", "o_proj"), seed=25),
}
LORA_FAMILIES = ("dense",)  # families whose SGLang class serves LoRA on the Triton LoRA backend here
A_RANGE = 0.3  # lora_A and lora_B entries: uniform over +-A_RANGE (a delta of the base weights' order)


def checkpoint_weights(family: str, tied: bool | None = None) -> dict[str, torch.Tensor]:
    """The weights of `transformers_reference.checkpoint` as saved, under the names a checkpoint carries (an MoE's
    experts one by one, `experts.{e}.gate_proj.weight`, where transformers holds them fused), a tied LM head
    spelled out."""
    from safetensors.torch import load_file

    from harness.models.real.transformers_reference import checkpoint

    folder, model = checkpoint(family, tied)
    state = load_file(os.path.join(folder, "model.safetensors"))
    if model.config.tie_word_embeddings and "lm_head.weight" not in state:
        state["lm_head.weight"] = state["model.embed_tokens.weight"].clone()
    return state


def _targeted(family: str, adapter: Adapter) -> dict[str, torch.Size]:
    """HF weight name -> shape, for every weight of the family's checkpoint the adapter targets."""
    return {name: w.shape for name, w in checkpoint_weights(family).items()
            if name.endswith(".weight") and name.split(".")[-2] in adapter.modules}


@functools.cache
def adapter_weights(family: str, name: str) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """HF weight name -> (lora_A [r, in], lora_B [out, r]), drawn from the adapter's seed."""
    adapter = adapter_spec(name)
    generator = torch.Generator().manual_seed(adapter.seed)
    weights = {}
    for weight, (out_features, in_features) in sorted(_targeted(family, adapter).items()):
        a = (torch.rand(adapter.rank, in_features, generator=generator) * 2 - 1) * A_RANGE
        b = (torch.rand(out_features, adapter.rank, generator=generator) * 2 - 1) * A_RANGE
        weights[weight] = (a, b)
    return weights


def adapter_spec(name: str) -> Adapter:
    """A startup or runtime adapter by its key."""
    return ADAPTERS[name] if name in ADAPTERS else RUNTIME_ADAPTERS[name]


def adapter_tensors(family: str, name: str) -> dict[str, torch.Tensor]:
    """The adapter's weights under PEFT's key names (what `adapter_model.safetensors` holds, and what SGLang's
    `load_lora_adapter_from_tensors` takes)."""
    tensors = {}
    for weight, (a, b) in adapter_weights(family, name).items():
        module = weight[:-len(".weight")]
        if module.endswith("embed_tokens"):  # PEFT's Embedding: A [r, vocab], B [hidden, r], delta (B @ A).T
            tensors[f"base_model.model.{module}.lora_embedding_A"] = b.T.contiguous()
            tensors[f"base_model.model.{module}.lora_embedding_B"] = a.T.contiguous()
            continue
        tensors[f"base_model.model.{module}.lora_A.weight"] = a.contiguous()
        tensors[f"base_model.model.{module}.lora_B.weight"] = b.contiguous()
    return tensors


def adapter_config(family: str, name: str) -> dict:
    """The adapter's `adapter_config.json`."""
    adapter = adapter_spec(name)
    return {"peft_type": "LORA", "task_type": "CAUSAL_LM", "r": adapter.rank, "lora_alpha": adapter.alpha,
            "target_modules": list(adapter.modules), "lora_dropout": 0.0, "bias": "none",
            "base_model_name_or_path": FAMILIES[family].architecture}


@functools.cache
def adapter_folder(family: str, name: str) -> str:
    """The adapter in PEFT's format, in a folder of its own (one per family, adapter and process)."""
    from safetensors.torch import save_file

    folder = tempfile.mkdtemp(prefix=f"harness-lora-{family}-{name}-")
    save_file(adapter_tensors(family, name), os.path.join(folder, "adapter_model.safetensors"))
    with open(os.path.join(folder, "adapter_config.json"), "w") as f:
        json.dump(adapter_config(family, name), f, indent=1)
    return folder


@functools.cache
def merged_checkpoint(family: str, name: str | None, tied: bool | None = None) -> str:
    """A checkpoint folder of the family's transformers weights (`tied`: as `transformers_reference.checkpoint`)
    with adapter `name` merged in (W + s * B @ A); None: the base checkpoint. A tied base merges untied."""
    from safetensors.torch import save_file

    from harness.models.real.transformers_reference import checkpoint

    if name is None:
        return checkpoint(family, tied)[0]
    scaling = adapter_spec(name).scaling
    state = checkpoint_weights(family, tied)  # a tied pair: two copies
    for weight, (a, b) in adapter_weights(family, name).items():
        state[weight] += scaling * (b @ a)
    merged = tempfile.mkdtemp(prefix=f"harness-merged-{family}-{name}-")
    save_file({k: v.contiguous() for k, v in state.items()}, os.path.join(merged, "model.safetensors"))
    write_config(FAMILIES[family], merged, tie_word_embeddings=False)
    return merged


@functools.cache
def merged_model(family: str, name: str | None, tied: bool | None = None) -> RealModel:
    """SGLang's plain class for `family` (no LoRA layers) loaded by SGLang's loader from `merged_checkpoint`."""
    from harness.models.real.transformers_reference import load_sglang

    return load_sglang(family, merged_checkpoint(family, name, tied))
