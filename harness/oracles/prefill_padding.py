"""Padded rows of the prefill runner's static inputs after a graph replay hold what SGLang promises (part of
`eager-equality`, as decode's padded-rows check): a padded token the graph processes must be benign, and a stale
tail from an earlier, longer batch is not, whatever the outputs show.

The expectation comes from the batch: its real tokens and requests end where the batch ends, the padded ones run
to the captured size that serves it (the smallest of the case's sizes at or above its token count) and, on the
full backend, to the case's request slots. The promised values are read from SGLang:
- token-axis slots of the runner's buffer registry (`input_ids`, `positions`, `out_cache_loc`, `mrope_positions`
  `[3, T]`, the `input_embeds` slot): each slot's own `padding_policy` (ZERO: 0; FILL_SENTINEL: its `pad_value`;
  a policy that promises nothing per replay is skipped and said so);
- the full backend's request slots past the batch (`_prefill_static_buffers`; the runner's replay sentinels):
  zero lengths, pool row 0, `extend_start_loc` at the flat end of the real tokens; the host seq_lens mirror 0;
- a chunked-prefix replay: the chunk seq_lens rows of the variant serving the batch, 0 for every unused slot
  (a zero-length prefix).
The failure names the static input and the first row that differs.
"""
from __future__ import annotations

from collections.abc import Sequence

from harness.oracles import OracleFailure

ORACLE = "eager-equality"
TOKEN_SLOTS = ("input_ids", "positions", "out_cache_loc", "mrope_positions", "input_embeds")
# The full backend's per-request static inputs and what an unused slot holds ("tokens": the batch's token count).
REQUEST_SLOTS = {"seq_lens": 0, "extend_seq_lens": 0, "extend_prefix_lens": 0, "req_pool_indices": 0,
                 "orig_seq_lens": 0, "extend_start_loc": "tokens"}


def padded_size(num_tokens: int, sizes: Sequence[int]) -> int:
    """The captured token count that serves `num_tokens`: the smallest of `sizes` at or above it."""
    return min(s for s in sizes if s >= num_tokens)


def promised_value(slot) -> object | None:
    """What the registry promises a padded row of `slot` holds after `fill_from` (None: no per-replay promise)."""
    policy = getattr(slot.padding_policy, "name", str(slot.padding_policy))
    if policy == "ZERO":
        return 0
    if policy == "FILL_SENTINEL":
        return slot.pad_value
    return None


def _first_bad(rows, value, start: int) -> tuple[int, object] | None:
    """(row index, what it holds) of the first row in `rows` (a tensor whose first axis is the row) != value."""
    for offset in range(rows.shape[0]):
        if bool((rows[offset] != value).any()):
            return start + offset, rows[offset].tolist()
    return None


def _fail(name: str, row: int, held, value, extent: str, **evidence) -> None:
    raise OracleFailure(ORACLE, f"padded row {row} of the prefill static input `{name}` holds {held}, SGLang "
                        f"promises {value} ({extent})", static_input=name, row=row, held=held, promised=value,
                        **evidence)


def check_padded_rows(runner, batch, case, *, sizes: Sequence[int], prefix_variants: Sequence[int] = ()) -> str:
    """Check every padded row the replay of `batch` read (see the module docstring); returns what was checked.
    `sizes`: the token counts the case captures; `prefix_variants`: its chunked-prefix variants (chunk counts)."""
    registry = getattr(runner, "buffer_registry", None)
    if registry is None:
        return "not checked: this release's prefill runner has no buffer registry (no declared padding policy)"
    raw, padded = batch.num_tokens, padded_size(batch.num_tokens, sizes)
    extent = f"batch of {raw} token(s) padded to the captured {padded}"
    checked, skipped = [], []
    for name in TOKEN_SLOTS:
        if not registry.has_slot(name):
            continue
        slot = registry.get_slot(name)
        value = promised_value(slot)
        if value is None or slot.buffer is None:
            skipped.append(f"{name} ({getattr(slot.padding_policy, 'name', slot.padding_policy)})")
            continue
        tail = slot.buffer[:, raw:padded].T if name == "mrope_positions" else slot.buffer[raw:padded]
        bad = _first_bad(tail, value, raw)
        if bad:
            _fail(name if name != "mrope_positions" else "mrope_positions (token column)", *bad, value, extent,
                  num_tokens=raw, padded_tokens=padded)
        checked.append(name)
    static = getattr(runner, "_prefill_static_buffers", None)
    if case.backend == "full" and static is not None:
        checked += _check_request_slots(runner, static, batch, case, prefix_variants)
    note = f"padded rows checked ({extent}): {', '.join(checked)}"
    return note + (f"; no per-replay promise: {', '.join(skipped)}" if skipped else "")


def _check_request_slots(runner, static: dict, batch, case, prefix_variants: Sequence[int]) -> list[str]:
    """The full backend's unused request slots [requests, full_prefill_max_req) and a chunked-prefix variant's."""
    bs, slots = len(batch.requests), case.full_prefill_max_req
    extent = f"{bs} request(s) in {slots} request slots of the full graph"
    checked = []
    for name, value in REQUEST_SLOTS.items():
        if name not in static:
            continue
        promised = batch.num_tokens if value == "tokens" else value
        bad = _first_bad(static[name][bs:slots], promised, bs)
        if bad:
            _fail(name, *bad, promised, extent, requests=bs, request_slots=slots)
        checked.append(name)
    mirror = getattr(runner, "_full_cg_seq_lens_cpu", None)
    if mirror is not None:
        bad = _first_bad(mirror[bs:slots], 0, bs)
        if bad:
            _fail("seq_lens_cpu (host mirror)", *bad, 0, extent, requests=bs, request_slots=slots)
        checked.append("seq_lens_cpu")
    chunks = _prefix_chunks(batch, case, prefix_variants)
    buffers = getattr(runner, "_prefix_capture_buffers", None)
    if chunks and buffers is not None:
        for name in ("seq_lens", "seq_lens_cpu"):
            rows = getattr(buffers, name)[:chunks, bs:slots].T  # one row per unused request slot
            bad = _first_bad(rows, 0, bs)
            if bad:
                _fail(f"prefix chunk {name}", *bad, 0, f"{extent}, a {chunks}-chunk prefix variant: an unused "
                      "slot has a zero-length prefix", requests=bs, request_slots=slots, chunks=chunks)
        checked.append(f"prefix chunk seq_lens ({chunks} chunks)")
    return checked


def _prefix_chunks(batch, case, variants: Sequence[int]) -> int:
    """The chunked-prefix variant (chunk count) serving `batch`: the smallest at or above the chunks its longest
    cached prefix needs (a chunk holds prefix_chunk_tokens // request slots tokens per request, at most the
    table's columns); 0 without a cached prefix or without chunked-prefix capture."""
    longest = max((r.prefix for r in batch.requests), default=0)
    if not variants or not longest or case.prefix_chunk_tokens is None:
        return 0
    slots = case.full_prefill_max_req
    per_request = max(min(case.prefix_chunk_tokens, case.max_context * slots) // slots, 1)
    needed = -(-longest // per_request)
    return min((n for n in variants if n >= needed), default=0)
