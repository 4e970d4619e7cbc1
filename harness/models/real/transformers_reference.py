"""Hugging Face `transformers` as an independent reference for SGLang's model classes.

Every other check of a real model compares SGLang with SGLang: replay with eager, the Triton backend with SGLang's
torch-native one, a batch with a request alone. A bug in the model's own code (a rotary embedding not built, a norm
or an activation swapped, a weight loaded into the wrong shard) moves all of them together. Here the family's
config is instantiated by `transformers` (its own implementation of the architecture), its weights drawn over
+-`WEIGHT_RANGE` from a seed and saved as a safetensors checkpoint, and SGLang builds its model class from that
checkpoint through its real loader (`load_format="auto"`: `DefaultModelLoader`, the model's `load_weights` with
its stacked-parameter mapping). The two forwards of the same prompt must then agree within float32 tolerance.

Where the two read a config differently, transformers gets its own spelling (`TRANSFORMERS_OVERRIDES`) and SGLang
the family's config.json, rewritten over it after the save: MLA's rope is SGLang's CPU `deepseek_yarn`, which
transformers spells `yarn` (at factor 1 and mscale 1 both are the plain rotary embedding). `reference_missing`
says why a family has no reference (the installed transformers lacks its class).
"""
from __future__ import annotations

import functools
from typing import Any

import torch

from harness.models.real import WEIGHT_RANGE, RealModel, cpu_construction, model_config, runner_startup, spec, \
    write_config

SEED = 5
# family -> the config keys transformers reads in its own spelling
TRANSFORMERS_OVERRIDES = {
    "mla": {"rope_scaling": {"type": "yarn", "rope_type": "yarn", "factor": 1.0,
                             "original_max_position_embeddings": 512, "beta_fast": 32, "beta_slow": 1,
                             "mscale": 1.0, "mscale_all_dim": 1.0}},
}


def reference_missing(family: str) -> str | None:
    """Why `family` has no transformers reference (the installed transformers lacks its class), or None."""
    import transformers

    architecture = spec(family).architecture
    if not hasattr(transformers, architecture):
        return f"transformers {transformers.__version__} has no {architecture}"
    return None


# families whose SGLang class reads `tie_word_embeddings` (the LM head then the embedding): a drawn variant flips it.
# Gemma2 ties always; SGLang's Qwen2MoeForCausalLM never reads the flag (a finding: a tied checkpoint, which
# carries no lm_head.weight, loads without a word and its LM head keeps its construction values)
TIE_VARIANTS = ("dense", "mla", "vlm")


@functools.cache
def checkpoint(family: str, tied: bool | None = None) -> tuple[str, Any]:
    """(folder, the transformers model): the family's config (with `tie_word_embeddings=tied`, None: the family's
    own) instantiated by transformers, weights drawn from `SEED` over +-WEIGHT_RANGE, saved as safetensors beside
    the config (one per family, variant and process)."""
    import transformers

    family_spec = spec(family)
    both = {} if tied is None else {"tie_word_embeddings": tied}  # what SGLang and transformers both read
    folder = write_config(family_spec, **both, **TRANSFORMERS_OVERRIDES.get(family, {}))
    config = transformers.AutoConfig.from_pretrained(folder)
    model = getattr(transformers, family_spec.architecture)._from_config(config, torch_dtype=torch.float32)
    generator = torch.Generator().manual_seed(SEED)
    with torch.no_grad():
        for _, parameter in sorted(model.named_parameters()):
            parameter.copy_((torch.rand(parameter.shape, generator=generator) * 2 - 1) * WEIGHT_RANGE)
    model.eval()
    model.save_pretrained(folder, safe_serialization=True)
    write_config(family_spec, folder, **both)  # SGLang reads the family's own config beside the weights
    return folder, model


def sglang_model(family: str, tied: bool | None = None) -> RealModel:
    """SGLang's class for `family` loaded from `checkpoint(family, tied)` by SGLang's loader (the published config
    and model-parallel groups must be in place, as for `harness.models.real.build`)."""
    folder, _ = checkpoint(family, tied)
    return load_sglang(family, folder)


def load_sglang(family: str, folder: str) -> RealModel:
    """SGLang's class for `family` loaded by SGLang's loader (`load_format="auto"`) from the checkpoint `folder`."""
    from sglang.srt.configs.device_config import DeviceConfig
    from sglang.srt.configs.load_config import LoadConfig
    from sglang.srt.model_loader import get_model

    config = model_config(folder)
    runner_startup()
    with cpu_construction():
        model = get_model(model_config=config, load_config=LoadConfig(load_format="auto"),
                          device_config=DeviceConfig("cpu"))
    model.requires_grad_(False)
    return RealModel(spec(family), model, config, folder)


def logits(family: str, tokens: list[int], tied: bool | None = None) -> torch.Tensor:
    """transformers' next-token logits after `tokens` (one sequence from position 0, no cache)."""
    _, model = checkpoint(family, tied)
    with torch.no_grad():
        return model(input_ids=torch.tensor([tokens])).logits[0, -1]
