"""The EAGLE draft model's prefill through SGLang's prefill runner: speculative decoding meeting the prefill graphs.

After the target model prefills a batch, SGLang's EAGLE worker runs the draft model over the same tokens with the
target's hidden states (`forward_draft_extend`: an EXTEND batch whose `spec_info` is an `EagleDraftInput` holding
them, `CaptureHiddenMode.LAST`). Under the breakable prefill backend the draft worker's `PrefillCudaGraphRunner`
captures that forward: it allocates a static hidden-state buffer the graphs read (`static_draft_hidden_states`,
sized by `get_draft_input_from_target_hidden_dim`), builds a capture `EagleDraftInput` over it, and refreshes it
from the live batch's hidden states in `load_batch` at every replay.

Here the runner is the real-model prefill target's (`RealModelPrefillTarget`) built as a draft worker's
(`spec_algorithm` EAGLE, `is_draft_worker`) over SGLang's `LlamaForCausalLMEagle` (the `eagle` draft family). A
batch comes from SGLang's batch code; its hidden states are drawn (seeded: what a target would hand over). Each is
replayed twice with different hidden states on the same graph, and each replay must equal the draft model's eager
forward on the same batch and hidden states, eager SGLang's torch-native attention, and the KV caches agree
(`real_model._replay_against_eager`): a static buffer a replay forgot to refresh holds the previous hidden states.
"""
from __future__ import annotations

import torch

from harness.errors import PathMissing
from harness.models.real import draft_algorithm
from harness.targets.prefill.real_model import RealModelPrefillTarget, _admitted, _replay_against_eager

DRAFT_FAMILY = "eagle"
HIDDEN_SCALE = 0.5  # drawn hidden states: normal * this (what a target's last layer hands over is of this order)


def draft_target(case, family: str = DRAFT_FAMILY) -> RealModelPrefillTarget:
    """The draft worker's prefill runner for `case` (breakable) over the draft `family` (`DRAFT_FAMILIES`), or
    PathMissing where the release's runner keeps no static hidden-state buffer for a draft."""
    target = RealModelPrefillTarget(case, family)
    if getattr(target.runner, "static_draft_hidden_states", None) is None:
        from harness.versions import sglang_version

        raise PathMissing(f"SGLang {sglang_version()}: the prefill runner keeps no static_draft_hidden_states for an "
                          "EAGLE draft worker: the draft's prefill is not captured")
    return target


def hidden_states(target, tokens: int, seed: int) -> torch.Tensor:
    """The target's hidden states for `tokens` tokens, drawn from `seed` (the draft's input width)."""
    width = target.runner.static_draft_hidden_states.shape[1]
    return torch.randn((tokens, width), generator=torch.Generator().manual_seed(seed)) * HIDDEN_SCALE


def composed_embeds(target, tokens: int, seed: int) -> torch.Tensor:
    """A multimodal target's merged embeddings for `tokens` tokens, drawn from `seed` (the draft's hidden width)."""
    width = target.real.model_config.hidden_size
    return torch.randn((tokens, width), generator=torch.Generator().manual_seed(seed + 1)) * HIDDEN_SCALE


def with_hidden_states(fb, hidden: torch.Tensor, family: str = DRAFT_FAMILY):
    """`fb` as the EAGLE worker hands it to the draft model: an `EagleDraftInput` of the target's hidden states,
    the draft family's speculative algorithm, the last token's hidden state captured (`forward_draft_extend`)."""
    from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode
    from sglang.srt.speculative.eagle_info import EagleDraftInput

    fb.spec_info = EagleDraftInput(hidden_states=hidden.to(fb.input_ids.device))
    fb.spec_algorithm = draft_algorithm(family)
    fb.capture_hidden_mode = CaptureHiddenMode.LAST
    return fb


def with_composed_embeds(fb, embeds: torch.Tensor):
    """`fb` as a multimodal target hands it to its EAGLE3 draft: the merged embedding sequence it composed
    (`mm_input_embeds`, here drawn) and an image on every request. The draft replaces each request's last row by
    its sampled token's embedding (eager in `LlamaModel.forward`, in the graph runner's `load_batch`)."""
    from sglang.srt.managers.schedule_batch import Modality, MultimodalDataItem, MultimodalInputs

    fb.mm_input_embeds = embeds.to(fb.input_ids.device).clone()
    fb.mm_inputs = [MultimodalInputs(mm_items=[MultimodalDataItem(modality=Modality.IMAGE)])
                    for _ in range(fb.batch_size)]
    return fb


def check_draft_prefill(target: RealModelPrefillTarget, prompts, seeds, index: int,
                        multimodal: bool = False) -> list[str]:
    """The draft's prefill of `prompts` (one extend batch), once per hidden-state seed in `seeds`, each on the
    cache as it was before the first; `multimodal`: the target's composed embeddings beside them (drawn from the
    same seed, `with_composed_embeds`). Returns per replay "replayed" or "refused" (no captured count holds it)."""
    from harness.targets.decode.scheduled import Scheduler

    pools = target.pools
    scheduler = Scheduler(target, pools, target.model_runner)
    batch = scheduler.extend_batch(prompts)
    tokens = sum(len(p) for p in prompts)
    before = pools.snapshot()
    verdicts = []
    for turn, seed in enumerate(seeds):
        hidden = hidden_states(target, tokens, seed)
        embeds = composed_embeds(target, tokens, seed) if multimodal else None

        def fresh(hidden=hidden, embeds=embeds):
            fb = with_hidden_states(scheduler.forward_batch(batch), hidden, target.family)
            return fb if embeds is None else with_composed_embeds(fb, embeds)

        fb = fresh()
        where = (f"{target.family} draft prefill {index}.{turn} ({len(prompts)} request(s), "
                 f"{[len(p) for p in prompts]} tokens, hidden states{' and composed embeddings' * multimodal} of "
                 f"seed {seed}, captured token counts {list(target.case.capture_tokens)})")
        if not _admitted(target, fb, where):
            verdicts.append("refused")
            continue
        pools.restore(before)
        _replay_against_eager(target, fb, fresh, where, logprobs=False)
        verdicts.append("replayed")
    return verdicts
