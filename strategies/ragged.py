"""Hypothesis strategies for the decode runner's speculative side paths: the compact ragged verify layout
(`harness/targets/decode/ragged.py`) and a draft worker's verify graphs (`draft.py`).

- `ragged_cases()`: a DSPARK target worker's `DecodeCase` (steps, draft tokens = the widest a request verifies),
  capture sizes and pool as `capture.decode_cases` draws them, no LoRA (the runner refuses it in compact mode).
- `ragged_batches(case, grid, max_bs)`: verify batches whose requests each verify 1 to draft-tokens tokens (the
  anchor always), request counts up to one past the largest captured size (so the slot admission is met at its
  edge and beyond), totals up to the largest tier; now and then a TARGET_VERIFY batch without a layout (compact
  mode must run it eagerly). No IDLE batch: SGLang pads it to the smallest captured size, not to the slots its
  tier's graph was captured with, which only a re-run compiled forward (the virtual device's compile mode) sees.
- `ragged_layout_requests()`, `ragged_layout_fields()`: what a worker hands SGLang's layout builders and the
  layout's own fields, well formed or malformed in one way the contract names (no request,
  a zero row, a row past its cap, totals that disagree, past the last tier, an empty grid);
  `capture_verify_shapes()`: a capture's tokens, slots and draft width.
- `draft_cases()`, `draft_batches(case, capture_bs)`: a DFLASH draft worker's case and verify batches, with drawn
  per-token embeddings.
"""
from __future__ import annotations

import dataclasses

from hypothesis import strategies as st

from harness.models.decode_model import HIDDEN
from harness.oracles.ragged_layout import LayoutRequest
from harness.targets.decode import DecodeBatch, SpecSettings
from harness.targets.decode.draft import DraftBatch
from harness.targets.decode.ragged import RaggedBatch, round_up
from strategies.capture import decode_batch, decode_cases, replay_sizes


@st.composite
def ragged_cases(draw, **kwargs):
    steps = draw(st.integers(1, 3))
    spec = SpecSettings(num_steps=steps, topk=1, num_draft_tokens=steps + 1, algorithm="DSPARK")
    # No default capture list (its up to 16 sizes would be as many tiers to capture; the decode suite draws it) and
    # no torch.compile (the gate's seconds): the ragged path is the tiers, the slots and the staged layout.
    case = draw(decode_cases(lora=False, compile=False, **kwargs))
    return dataclasses.replace(case, spec=spec, default_max_bs=None)


@st.composite
def ragged_batch(draw, case, grid: tuple[int, ...], max_bs: int) -> RaggedBatch:
    """Real tokens drawn, rows up to the tier zero (as the planner pads them)."""
    width = case.tokens_per_request
    size = draw(st.integers(1, min(max_bs + 1, grid[-1])))
    # Often 1 (the anchor only: every draft rejected), so many requests share a low tier and fill its slots.
    lens = draw(st.lists(st.one_of(st.just(1), st.integers(1, width)), min_size=size, max_size=size))
    while sum(lens) > grid[-1]:  # the planner never builds a batch above the largest tier
        lens[lens.index(max(lens))] -= 1
    total = sum(lens)
    pad = [0] * (round_up(total, grid) - total)
    flat = draw(decode_batch(size, lora=False, forward_mode="DECODE", width=1, pool=case.max_running_requests))
    tokens = draw(decode_batch(total, lora=False, forward_mode="DECODE", width=1, pool=total))
    return RaggedBatch(input_ids=tokens.input_ids + pad, positions=tokens.positions + pad, seq_lens=flat.seq_lens,
                       forward_mode="TARGET_VERIFY", req_pool_indices=flat.req_pool_indices,
                       out_cache_loc=tokens.out_cache_loc + pad, verify_lens=lens, grid=grid)


@st.composite
def ragged_batches(draw, case, grid: tuple[int, ...], max_bs: int, *, max_batches: int = 3) -> list[DecodeBatch]:
    batches = []
    for _ in range(draw(st.integers(1, max_batches))):
        if draw(st.sampled_from([True] * 6 + [False])):
            batches.append(draw(ragged_batch(case, grid, max_bs)))
        else:
            batches.append(draw(decode_batch(draw(st.integers(1, max_bs)), lora=False, forward_mode="TARGET_VERIFY",
                                             width=case.tokens_per_request, pool=case.max_running_requests)))
    return batches


@st.composite
def draft_cases(draw, algorithm: str = "DFLASH"):
    """A draft worker's case: steps, draft tokens = steps + 1 (DFLASH verifies a chain), no LoRA, no compile."""
    steps = draw(st.integers(1, 3))
    spec = SpecSettings(num_steps=steps, topk=1, num_draft_tokens=steps + 1, algorithm=algorithm)
    return dataclasses.replace(draw(decode_cases(lora=False, compile=False)), spec=spec, default_max_bs=None)


@st.composite
def draft_batches(draw, case, capture_bs: list[int], *, max_batches: int = 3) -> list[DraftBatch]:
    """Verify batches of a draft worker: sizes on, between and at the edges of the grid, each token's embeddings
    drawn (multiples of 0.125, exact in float32)."""
    return [draw(draft_batch(case, draw(replay_sizes(capture_bs)))) for _ in range(draw(st.integers(1, max_batches)))]


@st.composite
def draft_batch(draw, case, size: int) -> DraftBatch:
    batch = draw(decode_batch(size, lora=False, forward_mode="TARGET_VERIFY", width=case.tokens_per_request,
                              pool=case.max_running_requests))
    embeds = draw(st.lists(st.lists(st.integers(-16, 16).map(lambda v: v / 8), min_size=HIDDEN, max_size=HIDDEN),
                           min_size=len(batch.input_ids), max_size=len(batch.input_ids)))
    return DraftBatch(**{**{f.name: getattr(batch, f.name) for f in dataclasses.fields(batch)},
                         "draft_visibility": None, "input_embeds": embeds})


@st.composite
def ragged_layout_requests(draw) -> LayoutRequest:
    grid = sorted(draw(st.sets(st.integers(1, 24), min_size=1, max_size=4)))
    lens = draw(st.lists(st.integers(1, 4), min_size=1, max_size=6).filter(lambda v: sum(v) <= grid[-1]))
    floor = draw(st.integers(0, grid[-1]))
    flaw = draw(st.sampled_from([None, "empty", "zero row", "past last tier", "no grid"]))
    if flaw == "empty":
        lens = []
    elif flaw == "zero row":
        lens = [*lens, 0]
    elif flaw == "past last tier":
        lens = [*lens, grid[-1]]
    elif flaw == "no grid":
        grid = []
    return LayoutRequest(verify_lens=lens, grid=grid, floor=floor)


@st.composite
def ragged_layout_fields(draw) -> dict:
    lens = draw(st.lists(st.integers(1, 5), min_size=1, max_size=5))
    cap = draw(st.one_of(st.none(), st.integers(max(lens), 6)))
    total, tier = sum(lens), sum(lens) + draw(st.integers(0, 3))
    flaw = draw(st.sampled_from([None, "empty", "zero row", "past cap", "total off", "past tier"]))
    if flaw == "empty":
        lens, total = [], 0
    elif flaw == "zero row":
        lens = [*lens, 0]
    elif flaw == "past cap":
        cap = max(lens) - 1 or None
    elif flaw == "total off":
        total += draw(st.sampled_from([-1, 1]))
    elif flaw == "past tier":
        tier = total - 1
    return dict(verify_lens_cpu=lens, total_verify_tokens=total, graph_num_tokens=tier, cap=cap)


@st.composite
def capture_verify_shapes(draw) -> tuple[int, int, int]:
    """(num_tokens, num_slots, num_draft_tokens) for a capture's placeholder rows: packable, or
    one token short of the slots, one past what they hold, or no slot."""
    slots, draft = draw(st.integers(1, 4)), draw(st.integers(1, 4))
    flaw = draw(st.sampled_from([None, "short", "over", "no slot"]))
    if flaw == "short":
        return slots - 1, slots, draft
    if flaw == "over":
        return slots * draft + 1, slots, draft
    if flaw == "no slot":
        return draw(st.integers(0, 4)), 0, draft
    return draw(st.integers(slots, slots * draft)), slots, draft
