"""What the prefill suite draws: capture grids, replay token counts on/between/beyond the grid, batches (chunked
requests, mixed batches with decoding requests), the batch's forward_mode and global_forward_mode drawn
independently, and the compiler of the pieces."""
from __future__ import annotations

import dataclasses

from hypothesis import strategies as st

from harness.conditions import narrow
from harness.models.prefill_model import ADAPTER_SCALES
from harness.targets.prefill import Batch, PrefillCase, Request

MAX_REQUESTS = 8  # req_to_token rows; row 0 is the padding row, so up to 7 requests
MAX_CONTEXT = 64
TOKEN_IDS = st.integers(0, 9)
# No 1: Dynamo specialises a size-1 dimension, so a 1-token capture is never a graph (see the suite's
# test_findings_capture_size_one_never_replays); 1-token batches still replay, padded to the smallest size.
GRID_VALUES = (2, 3, 4, 6, 8, 12, 16, 24, 32)


def _mode(name: str):
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    return ForwardMode[name]


def all_modes() -> list:
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    return list(ForwardMode)


def capture_grids(max_size: int = 4) -> st.SearchStrategy[tuple[int, ...]]:
    """A capture token-count grid, as `cuda_graph_config.prefill.bs`: 1 to `max_size` distinct sizes."""
    return st.lists(st.sampled_from(GRID_VALUES), min_size=1, max_size=max_size, unique=True).map(
        lambda sizes: tuple(sorted(sizes)))


def compilers(inductor: bool = False) -> st.SearchStrategy[str]:
    """The compiler of the pieces. Inductor costs ~25 s cold on this machine, so it is drawn only on request."""
    return st.sampled_from(("eager", "inductor") if inductor else ("eager",))


def compile_sizes(grid: tuple[int, ...], *, none: bool = True) -> st.SearchStrategy[tuple[int, ...]]:
    """Token counts the pieces get a specialised Inductor compile for: one captured count, or (`none`) no count
    (each size costs one more compile per piece)."""
    return st.sampled_from((((),) if none else ()) + tuple((size,) for size in sorted(set(grid))))


def cases(backend: str = "tc_piecewise", *, grids=None, inductor: bool = False) -> st.SearchStrategy[PrefillCase]:
    return st.builds(PrefillCase, backend=st.just(backend), capture_tokens=grids or capture_grids(),
                     compiler=compilers(inductor), max_requests=st.just(MAX_REQUESTS),
                     max_context=st.just(MAX_CONTEXT))


def replay_num_tokens(grid: tuple[int, ...], beyond: bool = True) -> st.SearchStrategy[int]:
    """A token count on the grid, strictly between two grid values (or below the smallest), or (`beyond`) beyond
    it; narrowed by `python -m harness repro` to a reported count ("num_tokens") when the harness can build it."""
    return narrow("num_tokens", _replay_num_tokens(grid, beyond), domain=range(1, MAX_CONTEXT))


@st.composite
def _replay_num_tokens(draw, grid: tuple[int, ...], beyond: bool) -> int:
    where = draw(st.sampled_from(("on", "between", "beyond") if beyond else ("on", "between")))
    if where == "on":
        return draw(st.sampled_from(grid))
    if where == "between":
        gaps = [(low + 1, high - 1) for low, high in zip((0,) + grid, grid) if high - low > 1]
        if gaps:
            low, high = draw(st.sampled_from(gaps))
            return draw(st.integers(low, high))
        return draw(st.sampled_from(grid))
    return draw(st.integers(grid[-1] + 1, min(2 * grid[-1] + 3, MAX_CONTEXT - 1)))


def forward_modes() -> st.SearchStrategy:
    """Every ForwardMode of the installed SGLang (narrowed by repro to the reported "forward_mode")."""
    return narrow("forward_mode", st.sampled_from(all_modes()), domain=all_modes())


def global_forward_modes() -> st.SearchStrategy:
    """Every ForwardMode, or None (a batch that went through no DP sync)."""
    return st.one_of(st.none(), forward_modes())


@st.composite
def batches(draw, num_tokens: int, forward_mode, global_forward_mode, *, decoding: bool = True,
            chunked: bool = True, context: int = MAX_CONTEXT) -> Batch:
    """A batch of `num_tokens` new tokens in `forward_mode`.

    Extend-family modes: the tokens are split over 1..7 requests; a request may arrive with a cached prefix
    (a later chunk of a chunked prefill) and, when `decoding`, some requests are decoding (one new token after
    their history), which is what a MIXED batch carries. Decode-shaped modes: one new token per request, each
    after a history. IDLE: no requests.
    """
    if forward_mode.is_idle():
        return Batch((), forward_mode, global_forward_mode)
    extend = forward_mode.is_extend(include_draft_extend_v2=True)
    free_rows = list(range(1, MAX_REQUESTS))
    requests = []
    remaining = num_tokens
    while remaining > 0 and free_rows:
        row = free_rows.pop(draw(st.integers(0, len(free_rows) - 1)))
        if not extend:
            count = 1
        elif not free_rows:
            count = remaining
        else:
            count = draw(st.integers(1, remaining))
        kind = "fresh"
        if not extend:
            kind = "decoding"
        elif count == 1 and decoding and draw(st.booleans()):
            kind = "decoding"
        elif chunked and draw(st.booleans()):
            kind = "chunk"
        history_len = 0
        if kind in ("decoding", "chunk"):
            history_len = draw(st.integers(1, max(1, context - count - 1)))
        history_len = min(history_len, MAX_CONTEXT - count)
        history = tuple(draw(st.lists(TOKEN_IDS, min_size=history_len, max_size=history_len)))
        tokens = tuple(draw(st.lists(TOKEN_IDS, min_size=count, max_size=count)))
        requests.append(Request(row, tokens, prefix=history_len, history=history))
        remaining -= count
    return Batch(tuple(requests), forward_mode, global_forward_mode)


GRAPH_MODE_NAMES = ("EXTEND", "MIXED")  # what an EXTEND capture replays (the runner maps MIXED to EXTEND)


def graph_modes() -> st.SearchStrategy:
    """EXTEND or MIXED, the local modes a prefill graph serves (narrowed by repro to the reported one)."""
    modes = [_mode(name) for name in GRAPH_MODE_NAMES]
    return narrow("forward_mode", st.sampled_from(modes), domain=modes)


@st.composite
def graph_bound_batches(draw, grid: tuple[int, ...], beyond: bool = True, context: int = MAX_CONTEXT) -> Batch:
    """A batch the prefill graph is for: forward_mode and global_forward_mode each EXTEND or MIXED, drawn
    independently; a token count on, between or (`beyond`) beyond the grid; chunked and decoding requests whose
    sequences reach at most `context` tokens."""
    num_tokens = draw(replay_num_tokens(grid, beyond))
    local = draw(graph_modes())
    batch_wide = draw(st.sampled_from(GRAPH_MODE_NAMES).map(_mode))
    return draw(batches(num_tokens, local, batch_wide, context=context))


@st.composite
def batches_near_context(draw, grid: tuple[int, ...], limit: int) -> Batch:
    """A graph-bound batch within the grid one of whose requests reaches a context (cached prefix + new) within 3
    tokens of `limit` either side, so a context limit is probed at its edge: limit 32 -> that request's
    sequence is 29..35 tokens."""
    batch = draw(graph_bound_batches(grid, beyond=False, context=limit))
    index = draw(st.integers(0, len(batch.requests) - 1))
    request = batch.requests[index]
    new = len(request.tokens)
    total = draw(st.integers(max(new + 1, limit - 3), max(new + 1, min(limit + 3, MAX_CONTEXT))))
    history = tuple(draw(st.lists(TOKEN_IDS, min_size=total - new, max_size=total - new)))
    edge = dataclasses.replace(request, prefix=total - new, history=history)
    return dataclasses.replace(batch, requests=batch.requests[:index] + (edge,) + batch.requests[index + 1:])


HIDDEN_MODES = ("NULL", "LAST", "FULL")  # CaptureHiddenMode names


# What a multimodal server's batch adds; one at a time, the text batches the graphs serve most of the time.
MODEL_INPUT_KINDS = ("text",) * 5 + ("image", "hidden-states", "logprob")


@st.composite
def model_input_batches(draw, grid: tuple[int, ...]) -> Batch:
    """A graph-bound batch within the grid as a multimodal server and its callers make it: per-request mRoPE
    shifts, and now and then one of what the graphs cannot serve (`MODEL_INPUT_KINDS`): a fresh image request
    bringing its own embeddings, a hidden-state mode (LAST, FULL), return_logprob."""
    kind = draw(st.sampled_from(MODEL_INPUT_KINDS))
    batch = draw(graph_bound_batches(grid, beyond=False))
    image_row = draw(st.sampled_from([r.row for r in batch.requests if r.prefix == 0] or [None]))
    requests = []
    for request in batch.requests:
        delta = tuple(draw(st.lists(st.integers(0, 5), min_size=3, max_size=3)))
        embeds = None
        if kind == "image" and request.row == image_row:
            embeds = tuple(tuple(draw(st.lists(TOKEN_IDS, min_size=2, max_size=2))) for _ in request.tokens)
        requests.append(dataclasses.replace(request, embeds=embeds, mrope_delta=delta))
    hidden = draw(st.sampled_from(HIDDEN_MODES[1:])) if kind == "hidden-states" else "NULL"
    return dataclasses.replace(batch, requests=tuple(requests), capture_hidden_mode=hidden,
                               return_logprob=kind == "logprob")


@st.composite
def lora_batches(draw, grid: tuple[int, ...]) -> Batch:
    """A graph-bound batch within the grid on a LoRA server: each request on a drawn adapter or the base model."""
    batch = draw(graph_bound_batches(grid, beyond=False))
    adapters = st.sampled_from(sorted(ADAPTER_SCALES, key=str))
    return dataclasses.replace(batch, requests=tuple(dataclasses.replace(r, adapter=draw(adapters))
                                                     for r in batch.requests))


def describe(batch: Batch) -> dict:
    """Drawn values of a batch for the record."""
    return {
        "forward_mode": batch.forward_mode.name,
        "global_forward_mode": getattr(batch.global_forward_mode, "name", None),
        "num_tokens": batch.num_tokens,
        "capture_hidden_mode": batch.capture_hidden_mode,
        "return_logprob": batch.return_logprob,
        "replace_embeds": batch.replace_embeds,
        "requests": [{"row": r.row, "new": len(r.tokens), "prefix": r.prefix, "tokens": list(r.tokens),
                      "history": list(r.history), "embeds": r.embeds and [list(e) for e in r.embeds],
                      "mrope_delta": list(r.mrope_delta), "adapter": r.adapter} for r in batch.requests],
    }


def batch_from_drawn(drawn: dict) -> Batch:
    """The batch a record's `drawn` values describe (`describe` above): what a replay without Hypothesis runs.
    Records without token ids (older ones) get deterministic ids of the recorded sizes."""
    requests = []
    for index, request in enumerate(drawn.get("requests") or ()):
        new, prefix = int(request["new"]), int(request.get("prefix", 0))
        tokens = tuple(request.get("tokens") or [(index + offset) % 10 for offset in range(new)])
        history = tuple(request.get("history") or [(index + offset) % 10 for offset in range(prefix)])
        embeds = request.get("embeds")
        requests.append(Request(int(request["row"]), tokens, prefix=prefix, history=history,
                                embeds=embeds and tuple(tuple(e) for e in embeds),
                                mrope_delta=tuple(request.get("mrope_delta") or (0, 0, 0)),
                                adapter=request.get("adapter")))
    global_mode = drawn.get("global_forward_mode")
    return Batch(tuple(requests), _mode(drawn["forward_mode"]), _mode(global_mode) if global_mode else None,
                 capture_hidden_mode=drawn.get("capture_hidden_mode") or "NULL",
                 return_logprob=bool(drawn.get("return_logprob")), replace_embeds=bool(drawn.get("replace_embeds")))
