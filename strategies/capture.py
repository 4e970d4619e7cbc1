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

from harness.conditions import narrow
from harness.models.decode_model import LORA_SCALES
from harness.targets.decode import DecodeBatch, DecodeCase, SpecSettings

MAX_CAPTURE_BS = 12  # small sizes keep a capture under a second on two cores
ADAPTERS = sorted(k for k in LORA_SCALES if k is not None)


def at_edges(sizes: list[int]) -> st.SearchStrategy[int]:
    """A size of the list, or one below it: where `s <= limit` and `s < limit` part ways."""
    return st.sampled_from(sizes).flatmap(lambda size: st.sampled_from([size, size, max(1, size - 1)]))


@st.composite
def decode_cases(draw, *, compile: bool | None = None, lora: bool | None = None, compile_backend: str = "eager",
                 compile_every_size: bool = False, speculative: bool | None = False,
                 disable_padding: bool = False, many_compiled_sizes: bool = False) -> DecodeCase:
    """`compile_every_size`: `torch_compile_max_bs` above every size, so each captured size is compiled;
    `speculative`: an EAGLE target worker's case (TARGET_VERIFY graphs, `spec_settings`); None: drawn;
    `disable_padding`: --disable-cuda-graph-padding; `many_compiled_sizes`: `long_compile_case`."""
    if many_compiled_sizes:
        return draw(long_compile_case(compile_backend))
    capture_bs = draw(st.lists(st.integers(1, MAX_CAPTURE_BS), min_size=1, max_size=4, unique=True).map(sorted))
    # The pool: often above the list (no change), sometimes below it (SGLang appends it and drops larger sizes),
    # and at a captured size or one below it, the edges of SGLang's `<=` comparisons.
    pool = draw(st.one_of(st.integers(max(capture_bs), MAX_CAPTURE_BS + 4), at_edges(capture_bs),
                          st.integers(1, MAX_CAPTURE_BS)))
    # narrow(...): a reported launch command's flags (repro's conditions) pin the value; otherwise unchanged
    enable_compile = draw(narrow("enable_torch_compile", st.booleans(), domain=[True, False])) \
        if compile is None else compile
    # The compile limit: anywhere, or at a captured size or one below it (an off-by-one there compiles one size
    # more or less).
    max_bs = draw(narrow("torch_compile_max_bs", st.one_of(at_edges(capture_bs),
                                                           st.integers(0, MAX_CAPTURE_BS)))) \
        if enable_compile and not compile_every_size else 32
    # LoRA and its two-graph variant are drawn more often than a fair coin would (Hypothesis starts from the
    # simplest values, so a gate budget of tens of examples would otherwise rarely reach them).
    with_lora = draw(narrow("lora", st.sampled_from([True, True, False]), domain=[True, False])) \
        if lora is None else lora
    nolora_graph = draw(st.sampled_from([True, False])) if with_lora else False
    # The capture list sometimes left to SGLang's default for a drawn --cuda-graph-max-bs (1 and the small sizes
    # where its generator's steps change, up to 16).
    default_max_bs = draw(narrow("default_max_bs", st.one_of(st.none(), st.none(), st.integers(1, 16))))
    return DecodeCase(capture_bs=tuple(capture_bs), max_running_requests=pool,
                      disable_padding=disable_padding, default_max_bs=default_max_bs,
                      enable_torch_compile=enable_compile,
                      torch_compile_max_bs=max_bs, lora=with_lora, record_nolora_graph=nolora_graph,
                      compile_backend=compile_backend,
                      spec=draw(spec_settings()) if (draw(st.booleans()) if speculative is None else speculative)
                      else None)


DYNAMO_DEFAULT_RECOMPILE_LIMIT = 8  # torch._dynamo.config.recompile_limit out of the box


@st.composite
def long_compile_case(draw, compile_backend: str = "eager") -> DecodeCase:
    """More compiled sizes than Dynamo's default per-frame recompile limit: 9 to 12 captured sizes out of 1..16,
    all compiled (the pool at or above the largest, `torch_compile_max_bs` from the largest up), no LoRA; decode
    compiles one specialisation per size (dynamic=False), so only SGLang raising the limit compiles them all."""
    top = MAX_CAPTURE_BS + 4
    capture_bs = draw(st.lists(st.integers(1, top), min_size=DYNAMO_DEFAULT_RECOMPILE_LIMIT + 1, max_size=12,
                               unique=True).map(sorted))
    return DecodeCase(capture_bs=tuple(capture_bs), max_running_requests=draw(st.integers(capture_bs[-1], top + 4)),
                      enable_torch_compile=True, torch_compile_max_bs=draw(st.integers(capture_bs[-1], 32)),
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
def draft_tree(draw, width: int) -> list[list[bool]]:
    """One request's verify mask over its drafts: row j sees itself and a drawn subset of the drafts before it
    (its ancestors in the token tree), never a later one."""
    return [[k == j or (k < j and draw(st.booleans())) for k in range(width)] for j in range(width)]


@st.composite
def decode_batch(draw, size: int, *, lora: bool, forward_mode: str = "DECODE", width: int = 1,
                 pool: int = 64, mrope: bool = False) -> DecodeBatch:
    """`width` tokens per request (TARGET_VERIFY: the draft tokens, with a drawn verify mask); pool rows distinct
    below the request pool (`pool`), cache slots distinct; `mrope`: mRoPE positions, each request's tokens at its
    position plus a drawn offset per section (a VLM request's image grid moves them apart)."""
    if forward_mode == "IDLE":
        size = 0
    tokens = size * width
    lora_ids = None
    if lora:
        lora_ids = draw(st.lists(st.sampled_from([None] + ADAPTERS), min_size=size, max_size=size))
    input_ids = draw(st.lists(st.integers(0, 50), min_size=tokens, max_size=tokens))
    positions = draw(st.lists(st.integers(0, 100), min_size=tokens, max_size=tokens))
    mrope_positions = None
    if mrope:
        offsets = draw(st.lists(st.tuples(*[st.integers(-8, 8)] * 3), min_size=size, max_size=size))
        mrope_positions = [[p + offsets[i // width][k] for i, p in enumerate(positions)] for k in range(3)]
    return DecodeBatch(
        input_ids=input_ids, positions=positions, mrope_positions=mrope_positions,
        seq_lens=draw(st.lists(st.integers(1, 100), min_size=size, max_size=size)),
        lora_ids=lora_ids, forward_mode=forward_mode,
        req_pool_indices=draw(st.lists(st.integers(0, max(pool, size) - 1), min_size=size, max_size=size,
                                       unique=True)),
        out_cache_loc=draw(st.lists(st.integers(1, 400), min_size=tokens, max_size=tokens, unique=True)),
        draft_visibility=[draw(draft_tree(width)) for _ in range(size)] if forward_mode == "TARGET_VERIFY"
        else None)


@st.composite
def replay_batches(draw, case: DecodeCase, capture_bs: list[int], *, max_batches: int = 4) -> list[DecodeBatch]:
    """A sequence of batches to replay one after another (sizes repeat, so graphs are replayed again): DECODE
    (TARGET_VERIFY when the case speculates), sometimes IDLE."""
    count = draw(st.integers(1, max_batches))
    active = "TARGET_VERIFY" if case.spec else "DECODE"
    batches = []
    for _ in range(count):
        mode = draw(st.sampled_from([active] * 5 + ["IDLE"]))
        batches.append(draw(decode_batch(draw(replay_sizes(capture_bs)), lora=case.lora, forward_mode=mode,
                                         width=case.tokens_per_request, pool=case.max_running_requests,
                                         mrope=case.switches.mrope)))
    return batches


@st.composite
def spec_settings(draw) -> SpecSettings:
    """Speculative settings as users give them: the algorithm (EAGLE, STANDALONE, NGRAM, DFLASH), steps, top-k, and
    draft tokens (steps + 1 for a chain, top-k 1; up to steps x top-k + 1 for a tree), kept small so a verify batch
    fits the static buffers."""
    steps = draw(st.integers(1, 3))
    topk = draw(st.sampled_from([1, 1, 2]))
    tokens = steps + 1 if topk == 1 else draw(st.integers(2, min(steps * topk + 1, 5)))
    algorithm = draw(st.sampled_from(["EAGLE", "DFLASH", "STANDALONE", "NGRAM"]))
    return SpecSettings(num_steps=steps, topk=topk, num_draft_tokens=tokens, algorithm=algorithm)


def compile_probe_batch(num_tokens: int, *, lora: bool, width: int = 1, mrope: bool = False) -> DecodeBatch:
    """A fixed batch of `num_tokens` token rows, `width` per request (every adapter, with LoRA; a chain verify mask
    when width > 1; `mrope`: sections offset by -m, 0 and m, m = 1 + request index mod 3), for calling a compiled
    forward outside capture."""
    size = num_tokens // width
    positions = [(5 * i + 1) % 100 for i in range(num_tokens)]
    return DecodeBatch(input_ids=[(7 * i + 3) % 50 for i in range(num_tokens)], positions=positions,
                       mrope_positions=[[p + (k - 1) * (i // width % 3 + 1) for i, p in enumerate(positions)]
                                        for k in range(3)] if mrope else None,
                       seq_lens=[(3 * i + 2) % 100 + 1 for i in range(size)],
                       lora_ids=[([None] + ADAPTERS)[i % 4] for i in range(size)] if lora else None,
                       req_pool_indices=[(5 * i + 2) % 64 for i in range(size)],
                       out_cache_loc=[3 * i + 1 for i in range(num_tokens)],
                       forward_mode="TARGET_VERIFY" if width > 1 else "DECODE",
                       draft_visibility=[[[k <= j for k in range(width)] for j in range(width)]
                                         for _ in range(size)] if width > 1 else None)

