"""A diffusion LLM's decode graphs (`--dllm-algorithm`): SGLang's `DllmConfig.from_server_args` reads the
checkpoint's architecture and the algorithm config, and the decode runner then captures DLLM_EXTEND graphs one
block (`block_size` tokens) per request, pads seq_lens with the block size, and returns `full_logits` (every token's
logits, sliced to the batch's raw tokens) with `next_token_logits` None. An algorithm encoding the context apart
(Gemma4Renoise: `requires_separate_context_encoding`) hands the forward `input_embeds`: copied from the batch into
the static buffer, or, with `capture_input_preparation`, computed inside the graph by the algorithm's
`prepare_graph_inputs` from the batch's `dllm_input_preparation_state` (a static slot, ZERO-padded, copied on the
pre-planned branch too). Without embeddings such a batch is refused (ValueError) before any replay.

The harness writes the checkpoint (a `config.json` declaring the architecture) and the algorithm config (YAML:
the drawn block size, capture_input_preparation) into a scratch folder the server arguments point at. What the
oracles expect, from the case: token rows = requests x block_size, padded seq_lens = block_size, returned logits
= full_logits of exactly the raw tokens, each row the model's closed form (`decode_model`).
"""
from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import tempfile
from unittest import mock

import torch

from harness.models.decode_model import HIDDEN, VOCAB
from harness.oracles import OracleFailure
from harness.targets.decode.base import DecodeBatch, DllmSettings, Layout

REFUSAL = "Diffusion graph replay requires prepared input embeddings"
# architecture -> the algorithm SGLang lets it run (DLLM_PARAMS, `supported_architectures`)
ALGORITHMS = {"SDARForCausalLM": "LowConfidence", "DiffusionGemmaForBlockDiffusion": "Gemma4Renoise"}


def dllm_missing(layout: Layout, settings: DllmSettings) -> str | None:
    """Why this release cannot serve `settings`' dLLM graphs (naming the release and the missing name), or None."""
    from harness.targets.sglang_plumbing import load
    from harness.versions import module_exists, sglang_version

    needed = "sglang.srt.dllm.config"
    if settings.algorithm == "Gemma4Renoise":
        needed = "sglang.srt.dllm.algorithm.gemma4_renoise"
    if not module_exists(needed):
        return f"SGLang {sglang_version()} has no {needed}: no {settings.algorithm} decode graphs"
    if settings.capture_input_preparation and \
            not hasattr(load(layout.runner_module, layout.runner_class), "dllm_input_preparation"):
        return (f"SGLang {sglang_version()} has no {layout.runner_module}.{layout.runner_class}."
                "dllm_input_preparation: no in-graph dLLM input preparation")
    return None


_CHECKPOINTS: dict = {}


def checkpoint(settings: DllmSettings) -> tuple[str, str]:
    """(model folder, algorithm config path) for `settings`, written once per process."""
    if settings not in _CHECKPOINTS:
        folder = tempfile.mkdtemp(prefix="harness-dllm-")
        text = {"hidden_size": HIDDEN, "num_attention_heads": 1, "num_key_value_heads": 1, "num_hidden_layers": 1,
                "vocab_size": VOCAB, "intermediate_size": HIDDEN, "head_dim": HIDDEN, "tie_word_embeddings": True}
        config = {"architectures": [settings.architecture], "model_type": "llama", **text}
        if settings.architecture == "DiffusionGemmaForBlockDiffusion":  # tied embeddings, as SGLang insists
            config = {"architectures": [settings.architecture], "model_type": "diffusion_gemma", "text_config": text,
                      "tie_word_embeddings": True, "canvas_length": settings.block_size}
        with open(os.path.join(folder, "config.json"), "w") as f:
            json.dump(config, f)
        algorithm_config = os.path.join(folder, "algorithm.yaml")
        with open(algorithm_config, "w") as f:  # YAML is a superset of JSON
            json.dump({"block_size": settings.block_size,
                       "capture_input_preparation": settings.capture_input_preparation}, f)
        _CHECKPOINTS[settings] = (folder, algorithm_config)
    return _CHECKPOINTS[settings]


class _OnCuda:
    """A resolved view of the server arguments reporting device "cuda", the rest as resolved."""

    def __init__(self, view) -> None:
        self._view = view

    def __getattr__(self, name: str):
        return "cuda" if name == "device" else getattr(self._view, name)


@contextlib.contextmanager
def cuda_only_algorithms_accept():
    """Gemma4Renoise's `configure_server_args` refuses any device but "cuda"; the harness's device layer is the CUDA
    the runner sees, so while SGLang resolves the arguments that module's view reports "cuda" (the published device,
    which the runner's buffers are made on, stays the harness's)."""
    from harness.targets.sglang_plumbing import load

    module = load("sglang.srt.dllm.algorithm.gemma4_renoise")
    original = module.resolving_view
    with mock.patch.object(module, "resolving_view", lambda server_args: _OnCuda(original(server_args))):
        yield


@dataclasses.dataclass
class DllmBatch(DecodeBatch):
    """A DLLM_EXTEND batch: `block_size` tokens per request; `input_embeds` (HIDDEN values per token) where the
    algorithm encodes the context apart, `preparation_state` instead where it prepares them in the graph."""

    input_embeds: list[list[float]] | None = None
    preparation_state: list[list[float]] | None = None

    def to_forward_batch(self, device: str = "cpu", spec=None):
        fb = super().to_forward_batch(device, spec)
        for name in ("input_embeds", "dllm_input_preparation_state"):
            values = getattr(self, "preparation_state" if name.startswith("dllm") else name)
            setattr(fb, name, None if values is None else torch.tensor(values, dtype=torch.float32, device=device))
        return fb


def dllm_layout(layout: Layout) -> Layout:
    """`layout` whose target serves a diffusion LLM (`DllmTarget` over the layout's own target)."""
    target = type(f"Dllm{layout.target_class.__name__}", (DllmTarget, layout.target_class), {})
    return dataclasses.replace(layout, target_class=target)


class DllmTarget:
    """Mixin over a layout's target: the case's dLLM server arguments, and what the oracles expect of a dLLM."""

    def server_args(self, case, device: str):
        server_args = super().server_args(case, device)
        folder, algorithm_config = checkpoint(case.dllm)
        # set past the parser (it would resolve the dummy model path first), read when the runner builds DllmConfig
        server_args.model_path, server_args.dllm_algorithm = folder, case.dllm.algorithm
        server_args.dllm_algorithm_config = algorithm_config
        return server_args

    def publish_config(self, case, device: str):
        with cuda_only_algorithms_accept() if case.dllm.algorithm == "Gemma4Renoise" else contextlib.nullcontext():
            return super().publish_config(case, device)

    def seq_len_fill_value(self) -> int:
        return self.case.dllm.block_size

    def returned_logits(self, output, batch) -> torch.Tensor:
        """A dLLM replay returns `full_logits` of exactly the batch's raw tokens and no `next_token_logits`."""
        tokens = len(batch.input_ids)
        if output.next_token_logits is not None:
            raise OracleFailure("eager-equality", "a DLLM_EXTEND replay returned next_token_logits; SGLang's dLLM "
                                "contract returns full_logits only", batch=batch)
        if output.full_logits is None or output.full_logits.shape[0] != tokens:
            rows = None if output.full_logits is None else output.full_logits.shape[0]
            raise OracleFailure("eager-equality", f"a DLLM_EXTEND replay returned full_logits of {rows} rows; the "
                                f"batch has {tokens} raw tokens ({batch.batch_size} request(s) x block_size "
                                f"{self.case.dllm.block_size}), rows past them are padding", batch=batch)
        return output.full_logits

    def stale_embeddings(self, batch) -> str:
        """Where the static embeddings (or preparation state) the graph reads differ from the batch's (a diagnosis
        only)."""
        prepared = self.case.dllm.capture_input_preparation
        wanted = batch.preparation_state if prepared else batch.input_embeds
        if wanted is None:
            return ""
        name = "dllm_input_preparation_state" if prepared else "input_embeds"
        buffer = self.runner.buffer_registry.get_slot(name).buffer if prepared else self.runner.buffers.input_embeds
        held = buffer[: len(wanted)].tolist()
        if held == wanted:
            return ""
        return f"; the static `{name}` holds {held} where the batch has {wanted}"
