"""Hypothesis strategies for a diffusion LLM's decode graphs (`harness/targets/decode/dllm.py`).

- `dllm_cases(inputs)`: the architecture (and so the algorithm SGLang lets it run) and in-graph input preparation
  (Gemma4Renoise only) named by `inputs`, the block size (1 to 4 tokens a request) drawn, capture sizes and pool
  as `capture.decode_cases` draws them; no speculation, LoRA or compile (the dLLM path is the block width, the
  fill value, the embeddings).
- `dllm_batches(case, capture_bs)`: DLLM_EXTEND batches of sizes on, between and at the edges of the grid, with the
  drawn embeddings or preparation state the algorithm reads (multiples of 0.125, exact in float32).
"""
from __future__ import annotations

import dataclasses

from hypothesis import strategies as st

from harness.models.decode_model import HIDDEN
from harness.targets.decode import DllmSettings
from harness.targets.decode.dllm import ALGORITHMS, DllmBatch
from strategies.capture import decode_batch, decode_cases, replay_sizes


# what the forward reads besides the tokens -> (architecture, capture_input_preparation)
INPUTS = {"tokens": ("SDARForCausalLM", False), "input_embeds": ("DiffusionGemmaForBlockDiffusion", False),
          "prepared": ("DiffusionGemmaForBlockDiffusion", True)}


@st.composite
def dllm_cases(draw, inputs: str):
    """`inputs` (`INPUTS`): the model family, so each gate example drives one of the runner's dLLM input paths."""
    architecture, prepared = INPUTS[inputs]
    settings = DllmSettings(algorithm=ALGORITHMS[architecture], architecture=architecture,
                            block_size=draw(st.integers(1, 4)), capture_input_preparation=prepared)
    case = draw(decode_cases(lora=False, compile=False))
    return dataclasses.replace(case, dllm=settings, default_max_bs=None)


def per_token_values(count: int):
    return st.lists(st.lists(st.integers(-16, 16).map(lambda v: v / 8), min_size=HIDDEN, max_size=HIDDEN),
                    min_size=count, max_size=count)


@st.composite
def dllm_batches(draw, case, capture_bs: list[int], *, max_batches: int = 3) -> list[DllmBatch]:
    settings, batches = case.dllm, []
    for _ in range(draw(st.integers(1, max_batches))):
        batch = draw(decode_batch(draw(replay_sizes(capture_bs)), lora=False, forward_mode="DLLM_EXTEND",
                                  width=settings.block_size, pool=case.max_running_requests))
        values = draw(per_token_values(len(batch.input_ids))) if settings.algorithm == "Gemma4Renoise" else None
        prepared = settings.capture_input_preparation
        batches.append(DllmBatch(**{f.name: getattr(batch, f.name) for f in dataclasses.fields(batch)},
                                 input_embeds=None if prepared else values,
                                 preparation_state=values if prepared else None))
    return batches
