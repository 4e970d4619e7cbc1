"""Hypothesis strategies for decode graph capture and replay.

- `decode_cases()`: a `DecodeCase`: the capture batch-size list and the request pool size (SGLang's own
  `get_batch_sizes_to_capture` turns them into the captured and compiled sizes: it appends the pool size when the
  list outgrows it and drops sizes above it), torch.compile on/off with `torch_compile_max_bs`, LoRA on/off with
  `record_nolora_graph`.
- `replay_batches(capture_bs, lora=...)`: batches to replay against the sizes really captured: on the grid, between
  grid points (so the runner pads), at the edges (1 and the largest captured size), with a forward mode (DECODE, or
  IDLE with no rows) and, with LoRA, which requests carry an adapter.
"""
from __future__ import annotations

from hypothesis import strategies as st

from harness.models.decode_model import LORA_SCALES
from harness.targets.decode import DecodeBatch, DecodeCase

MAX_CAPTURE_BS = 12  # small sizes keep a capture under a second on two cores
ADAPTERS = sorted(k for k in LORA_SCALES if k is not None)


def at_edges(sizes: list[int]) -> st.SearchStrategy[int]:
    """A size of the list, or one below it: where `s <= limit` and `s < limit` part ways."""
    return st.sampled_from(sizes).flatmap(lambda size: st.sampled_from([size, size, max(1, size - 1)]))


@st.composite
def decode_cases(draw, *, compile: bool | None = None, lora: bool | None = None, compile_backend: str = "eager",
                 compile_every_size: bool = False) -> DecodeCase:
    """`compile_every_size`: `torch_compile_max_bs` above every size, so each captured size is compiled."""
    capture_bs = draw(st.lists(st.integers(1, MAX_CAPTURE_BS), min_size=1, max_size=4, unique=True).map(sorted))
    # The pool: often above the list (no change), sometimes below it (SGLang appends it and drops larger sizes),
    # and at a captured size or one below it, the edges of SGLang's `<=` comparisons.
    pool = draw(st.one_of(st.integers(max(capture_bs), MAX_CAPTURE_BS + 4), at_edges(capture_bs),
                          st.integers(1, MAX_CAPTURE_BS)))
    enable_compile = draw(st.booleans()) if compile is None else compile
    # The compile limit: anywhere, or at a captured size or one below it (an off-by-one there compiles one size
    # more or less).
    max_bs = draw(st.one_of(at_edges(capture_bs), st.integers(0, MAX_CAPTURE_BS))) \
        if enable_compile and not compile_every_size else 32
    # LoRA and its two-graph variant are drawn more often than a fair coin would (Hypothesis starts from the
    # simplest values, so a gate budget of tens of examples would otherwise rarely reach them).
    with_lora = draw(st.sampled_from([True, True, False])) if lora is None else lora
    nolora_graph = draw(st.sampled_from([True, False])) if with_lora else False
    return DecodeCase(capture_bs=tuple(capture_bs), max_running_requests=pool, enable_torch_compile=enable_compile,
                      torch_compile_max_bs=max_bs, lora=with_lora, record_nolora_graph=nolora_graph,
                      compile_backend=compile_backend)


def replay_sizes(capture_bs: list[int]) -> st.SearchStrategy[int]:
    """Batch sizes the runner must serve: grid points, the gaps between them (padding), and the edges."""
    grid = sorted(capture_bs)
    gaps = [b for low, high in zip([0] + grid, grid) for b in range(low + 1, high)]
    choices = [st.sampled_from(grid), st.sampled_from([1, grid[-1]])]
    if gaps:
        choices.append(st.sampled_from(gaps))
    return st.one_of(*choices)


@st.composite
def decode_batch(draw, size: int, *, lora: bool, forward_mode: str = "DECODE") -> DecodeBatch:
    if forward_mode == "IDLE":
        size = 0
    rows = st.lists(st.integers(0, 50), min_size=size, max_size=size)
    lora_ids = None
    if lora:
        lora_ids = draw(st.lists(st.sampled_from([None] + ADAPTERS), min_size=size, max_size=size))
    return DecodeBatch(input_ids=draw(rows), positions=draw(st.lists(st.integers(0, 100), min_size=size,
                                                                         max_size=size)),
                       seq_lens=draw(st.lists(st.integers(1, 100), min_size=size, max_size=size)),
                       lora_ids=lora_ids, forward_mode=forward_mode)


@st.composite
def replay_batches(draw, capture_bs: list[int], *, lora: bool, max_batches: int = 4) -> list[DecodeBatch]:
    """A sequence of batches to replay one after another (sizes repeat, so graphs are replayed again)."""
    count = draw(st.integers(1, max_batches))
    batches = []
    for _ in range(count):
        mode = draw(st.sampled_from(["DECODE"] * 5 + ["IDLE"]))
        batches.append(draw(decode_batch(draw(replay_sizes(capture_bs)), lora=lora, forward_mode=mode)))
    return batches


def compile_probe_batch(size: int, *, lora: bool) -> DecodeBatch:
    """A fixed batch of `size` rows (every adapter, with LoRA) for calling a compiled forward outside capture."""
    return DecodeBatch(input_ids=[(7 * i + 3) % 50 for i in range(size)],
                       positions=[(5 * i + 1) % 100 for i in range(size)],
                       seq_lens=[(3 * i + 2) % 100 + 1 for i in range(size)],
                       lora_ids=[([None] + ADAPTERS)[i % 4] for i in range(size)] if lora else None)

