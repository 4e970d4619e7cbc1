"""Hypothesis strategies for the decode runner's switches (`harness.targets.decode.switches.RunnerSwitches`).

- `npu_cases()` with `npu_batches()`: decode cases for SGLang's NPU runner: speculative or not, the model's
  architecture (one the NPU runner updates KV lengths the v2 way, the v1 way, or not at all: DeepSeek V4),
  capture profiling now and then; batches with or without the host mirror of seq_lens.
- `profile_cases()`: `--enable-profile-cuda-graph`, one trace per shape (`SGLANG_GRAPH_BATCH_CAPTURE`) or one pass,
  with the replay log on (its padded replays name the padded size).
- `dp_gather_cases()` with `dp_batches()`: `--moe-dense-tp-size 1` (the gathered DP buffers on one rank), batches
  with the scheduler's DP fields.
- `glue_cases()` with `glue_batches()`: the metadata glue graph, which only serves unpadded, LoRA-free batches
  after its warm-ups (two per replay key): batches of captured sizes, each size replayed several times, and one
  padded batch it must leave to the eager prep (DSPARK's causal TARGET_VERIFY batches, `dspark_batch()`, for a
  speculative case).
- `dspark_cases()`: a DSPARK target worker's static verify, under its own switches (its verify metadata glue, its
  pre-planned input skip); with `glue_batches()`, or `prefilled_batches()` for the pre-planned skip.
  A DFLASH draft worker's case with the draft glue (`draft_glue`) gets `glue_batches()` of draft batches.
"""
from __future__ import annotations

import dataclasses

from hypothesis import strategies as st

from harness.oracles.npu_graph_update import NO_UPDATE_ARCHITECTURES, V2_SEQ_LEN_ARCHITECTURES
from harness.targets.decode.switches import DEFAULT_ARCHITECTURE, RunnerSwitches
from strategies.capture import decode_batch, decode_cases, replay_batches
from strategies.ragged import draft_batch


@st.composite
def npu_cases(draw):
    case = draw(decode_cases(speculative=None))
    switches = RunnerSwitches(  # the v2 architectures every release with the v2 update knows (Step3p5ForCausalLM
        # joined the list on main in June 2026: absent at 70c71ba1)
        architecture=draw(st.sampled_from([DEFAULT_ARCHITECTURE, DEFAULT_ARCHITECTURE,
                                           *V2_SEQ_LEN_ARCHITECTURES[:2], *NO_UPDATE_ARCHITECTURES,
                                           "DeepseekV3ForCausalLM"])),
        profile=draw(st.sampled_from([None, "single"])))
    return dataclasses.replace(case, switches=switches)


@st.composite
def npu_batches(draw, case, capture_bs: list[int]):
    """`replay_batches`, a third without the host mirror of seq_lens (the NPU runner then reads the device lengths)."""
    return [dataclasses.replace(batch, host_seq_lens=draw(st.sampled_from([True, True, False])))
            for batch in draw(replay_batches(case, capture_bs))]


@st.composite
def profile_cases(draw):
    case = draw(decode_cases(compile=False))
    return dataclasses.replace(case, switches=RunnerSwitches(profile=draw(st.sampled_from(["per_shape", "single"])),
                                                             log_graph_key=True))


@st.composite
def dp_gather_cases(draw):
    case = draw(decode_cases(speculative=None))
    return dataclasses.replace(case, switches=RunnerSwitches(dp_gather=True))


@st.composite
def dp_batches(draw, case, capture_bs: list[int]):
    """`replay_batches` carrying the scheduler's DP-attention fields of one rank."""
    return [dataclasses.replace(batch, dp_fields=True) for batch in draw(replay_batches(case, capture_bs))]


@st.composite
def pdmux_cases(draw):
    """`--enable-pdmux` (`enable_pdmux`) with 3 to 5 SM groups (`sm_group_num`; SGLang's default is 8: more captures
    of the same code), without LoRA or speculative decoding, which SGLang refuses beside it. Uncompiled, so
    captures are recorded: a CUDA graph's kernels keep the buffers of the backend they were captured on, which a
    record replays as they are; a rerun (compiled) replay re-enters Python, and where the runner enters the forward
    context outside the captured block (0.5.1x) it would read the replay-time backend, which no CUDA graph does."""
    case = draw(decode_cases(compile=False, speculative=False, lora=False))
    return dataclasses.replace(case, switches=RunnerSwitches(pdmux_groups=draw(st.integers(3, 5),
                                                                               label="sm_group_num")))


@st.composite
def glue_cases(draw):
    case = draw(decode_cases(lora=False))
    return dataclasses.replace(case, switches=RunnerSwitches(metadata_glue=True, skip_glued_view=draw(st.booleans()),
                                                             log_graph_key=draw(st.booleans())))


@st.composite
def glue_batches(draw, case, capture_bs: list[int]):
    """Two captured sizes at most, interleaved, each drawn 2 or 3 times (with the suite's shifted replay, 4 to 6
    replays per key: past the glue's two warm-ups and its capture, into glued replays); and, where the capture list
    leaves a gap below its largest size, one padded batch at a drawn place, which the runner must not route to the
    glue (its prep runs eagerly)."""
    sizes = draw(st.lists(st.sampled_from(sorted(capture_bs)), min_size=1, max_size=2, unique=True))
    order = draw(st.permutations([s for s in sizes for _ in range(draw(st.integers(2, 3)))]))
    gaps = [s for s in range(1, max(capture_bs)) if s not in capture_bs]
    if gaps:
        order.insert(draw(st.integers(0, len(order))), draw(st.sampled_from(gaps)))
    if case.switches.draft_glue:
        return [draw(draft_batch(case, size)) for size in order]
    return [draw(dspark_batch(case, size)) if case.spec else
            draw(decode_batch(size, lora=False, pool=case.max_running_requests)) for size in order]


def dspark_batch(case, size: int):
    """A DSPARK TARGET_VERIFY batch: its draft block causal (row j sees drafts 0..j), as DFLASH drafts a block."""
    width = case.tokens_per_request
    chain = [[k <= j for k in range(width)] for j in range(width)]
    return decode_batch(size, lora=False, forward_mode="TARGET_VERIFY", width=width,
                        pool=case.max_running_requests).map(
        lambda b: dataclasses.replace(b, draft_visibility=[chain] * size))


@st.composite
def dspark_cases(draw, **switches):
    """A DSPARK target worker's uniform (static) verify case, LoRA-free, under `switches` (`RunnerSwitches`)."""
    case = draw(decode_cases(lora=False, speculative=True))
    return dataclasses.replace(case, spec=dataclasses.replace(case.spec, algorithm="DSPARK"),
                               switches=RunnerSwitches(**switches))


@st.composite
def prefilled_batches(draw, case, capture_bs: list[int]):
    """Two or three TARGET_VERIFY batches of one captured size (so a mark without a plan fits the last plan), each
    batch's input_ids and positions raised by twice its index: with the suite's shifted replay (+1) no two
    consecutive replays share them, so a re-copy skipped where the tensors differ shows."""
    size = draw(st.sampled_from(sorted(capture_bs)))
    batches = [draw(dspark_batch(case, size)) for _ in range(draw(st.integers(2, 3)))]
    return [dataclasses.replace(b, input_ids=[t + 2 * k for t in b.input_ids],
                                positions=[p + 2 * k for p in b.positions]) for k, b in enumerate(batches)]
