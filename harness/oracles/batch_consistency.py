"""Oracle `batch-consistency`: every batch a runner hands to an attention backend agrees with itself. An attention
backend's metadata entry points (`init_forward_metadata`, eager; `init_forward_metadata_out_graph`, capture and
replay, where the decode runner hands over its padded view of the batch) are where a runner's padding becomes a
backend's truth; the Triton backend ignores some fields (their consumers are GPU backends), so a padded batch whose
fields disagree still replays equal to eager, and only the batch itself shows it. The relations, from the batch:

    per request (req_pool_indices, seq_lens, seq_lens_cpu, encoder_lens, extend_seq_lens, extend_prefix_lens,
      extend_start_loc, extend_seq_lens_cpu, extend_prefix_lens_cpu, lora_ids): batch_size rows each, or a static
      buffer handed whole (the draft-extend runner's), of which the first batch_size rows are the batch's
    seq_lens_sum = sum(seq_lens)                       (padded rows at their fill value included)
    seq_lens_cpu = seq_lens, row for row               (the host mirror a GPU backend plans from)
    positions: as many rows as input_ids
    DECODE: input_ids has batch_size rows (a verify's token count is the ragged tiers' to judge: decode_replay)
    EXTEND / MIXED: extend_num_tokens = sum(extend_seq_lens) = rows of input_ids;
      extend_prefix_lens + extend_seq_lens = seq_lens; extend_start_loc = the exclusive prefix sum of extend_seq_lens;
      the _cpu lists equal their tensors

A field the batch does not carry (None, or absent from the runner's view) is not judged. Broken relations are
collected while the example runs and fail it at its end (SGLang may catch what a backend raises), naming the entry
point, the field, the row and both sides. A hand-off inside a device capture (the metadata glue graph captures the
prep) is not read: a host read there is what CUDA refuses; nor one a rerun-mode replay makes again (its host values
are the capture's, frozen, as a graph's are)."""
from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from typing import Any

from harness.oracles import OracleFailure

ORACLE = "batch-consistency"
PER_REQUEST = ("req_pool_indices", "seq_lens", "seq_lens_cpu", "encoder_lens", "extend_seq_lens",
               "extend_prefix_lens", "extend_start_loc", "extend_seq_lens_cpu", "extend_prefix_lens_cpu", "lora_ids")
ENTRY_POINTS = ("init_forward_metadata", "init_forward_metadata_out_graph")
BASE = "sglang.srt.layers.attention.base_attn_backend"


def _values(value: Any) -> list | None:
    if value is None:
        return None
    if hasattr(value, "tolist"):
        return value.reshape(-1).tolist() if value.dim() else [value.item()]
    return list(value) if isinstance(value, (list, tuple)) else None


def _mode(batch, name: str) -> bool:
    mode = getattr(batch, "forward_mode", None)
    probe = getattr(mode, name, None)
    return bool(probe()) if callable(probe) else False


def relations(batch) -> list[str]:
    """Every relation `batch` breaks, in words (empty: consistent)."""
    broken = []
    bs = getattr(batch, "batch_size", None)
    if not isinstance(bs, int):
        return broken
    fields = {name: _values(getattr(batch, name, None)) for name in PER_REQUEST}
    for name, rows in fields.items():
        if rows is not None and len(rows) < bs:
            broken.append(f"`{name}` has {len(rows)} rows, the batch {bs} requests")
    # a runner may hand a static buffer whole (the draft-extend runner's view: `req_pool_indices`, `seq_lens`,
    # `seq_lens_cpu` at the largest captured size), of which the backend reads the batch's rows
    fields = {name: rows if rows is None else rows[:bs] for name, rows in fields.items()}
    seq_lens, mirror = fields["seq_lens"], fields["seq_lens_cpu"]
    total = getattr(batch, "seq_lens_sum", None)
    if seq_lens is not None and isinstance(total, int) and total != sum(seq_lens):
        broken.append(f"`seq_lens_sum` is {total}, the sum of `seq_lens` {seq_lens} is {sum(seq_lens)}")
    if seq_lens is not None and mirror is not None and len(mirror) == len(seq_lens) and mirror != seq_lens:
        row = next(i for i, (a, b) in enumerate(zip(mirror, seq_lens)) if a != b)
        broken.append(f"`seq_lens_cpu` row {row} is {mirror[row]}, `seq_lens` row {row} is {seq_lens[row]} "
                      f"(mirror {mirror}, device {seq_lens})")
    tokens, positions = _values(getattr(batch, "input_ids", None)), _values(getattr(batch, "positions", None))
    if tokens is not None and positions is not None and len(tokens) != len(positions):
        broken.append(f"`positions` has {len(positions)} rows, `input_ids` {len(tokens)}")
    if tokens is not None:
        broken += _token_rows(batch, bs, len(tokens), fields)
    return broken


def _token_rows(batch, bs: int, tokens: int, fields: dict) -> list[str]:
    broken = []
    if _mode(batch, "is_decode") and tokens != bs:
        broken.append(f"a DECODE batch of {bs} requests has {tokens} `input_ids` rows")
    extend, prefix, start = fields["extend_seq_lens"], fields["extend_prefix_lens"], fields["extend_start_loc"]
    if not _mode(batch, "is_extend") or extend is None:
        return broken
    counted = getattr(batch, "extend_num_tokens", None)
    if sum(extend) != tokens or (isinstance(counted, int) and counted != sum(extend)):
        broken.append(f"`extend_seq_lens` {extend} sum to {sum(extend)}, `extend_num_tokens` is {counted}, "
                      f"`input_ids` has {tokens} rows")
    if prefix is not None and fields["seq_lens"] is not None and len(prefix) == len(extend) == len(fields["seq_lens"]) \
            and [p + e for p, e in zip(prefix, extend)] != fields["seq_lens"]:
        broken.append(f"`extend_prefix_lens` {prefix} + `extend_seq_lens` {extend} != `seq_lens` {fields['seq_lens']}")
    starts = [sum(extend[:i]) for i in range(len(extend))]
    if start is not None and start != starts:
        broken.append(f"`extend_start_loc` is {start}, the exclusive prefix sum of `extend_seq_lens` is {starts}")
    for name, tensor in (("extend_seq_lens_cpu", extend), ("extend_prefix_lens_cpu", prefix)):
        if fields[name] is not None and tensor is not None and fields[name] != tensor:
            broken.append(f"`{name}` {fields[name]} != its tensor {tensor}")
    return broken


class Watch:
    """The hand-offs seen in one example and the first broken one."""

    def __init__(self) -> None:
        self.checked = 0
        self.first: OracleFailure | None = None

    def see(self, backend, entry: str, batch, in_capture: bool) -> None:
        import torch

        from harness.devices import cpu

        if self.first is not None or torch.cuda.is_current_stream_capturing() or cpu.replaying():
            return  # inside a device capture (a metadata glue graph) a host read is illegal; inside a rerun-mode
            # replay the captured block sees its frozen host values beside the live buffers, as kernels would
        self.checked += 1
        broken = relations(batch)
        if broken:
            where = f"{type(backend).__name__}.{entry}({'capture' if in_capture else 'replay or eager'})"
            mode = getattr(getattr(batch, "forward_mode", None), "name", None)
            self.first = OracleFailure(ORACLE, f"the batch handed to {where} ({mode}, {batch.batch_size} requests) "
                                       f"disagrees with itself: {'; '.join(broken)}", entry=where, broken=broken)


def _backends() -> list[type]:
    """Every attention backend class loaded so far: SGLang's subclasses of its AttentionBackend (the harness's too),
    and the classes of SGLang's attention modules that take a batch at an entry point without subclassing it (the
    multi-step draft backends, `TritonMultiStepDraftBackend` and its kin, which take the EAGLE draft runner's padded
    batch and hand each step's backend a view of it)."""
    base = getattr(sys.modules.get(BASE), "AttentionBackend", None)
    found, stack = [], [base] if base else []
    while stack:
        cls = stack.pop()
        found.append(cls)
        stack.extend(cls.__subclasses__())
    known = set(found)
    for name, module in list(sys.modules.items()):
        if module is None or not name.startswith("sglang.") or ".attention" not in name:
            continue
        for value in list(vars(module).values()):
            if isinstance(value, type) and value.__module__ == name and value not in known \
                    and any(entry in vars(value) for entry in ENTRY_POINTS):
                found.append(value)
                known.add(value)
    return found


def _wrapped(watch: Watch, entry: str, original):
    def entry_point(self, forward_batch, *args, **kwargs):
        in_capture = bool(kwargs.get("in_capture", args[0] if args else False))
        watch.see(self, entry, forward_batch, in_capture)
        return original(self, forward_batch, *args, **kwargs)
    entry_point.__wrapped__ = original
    return entry_point


@contextlib.contextmanager
def checking(ex) -> Iterator[None]:
    """Around one example: the backends' entry points watched; a broken relation fails the example at its end."""
    import pytest

    watch = Watch()
    with pytest.MonkeyPatch.context() as patch:
        for cls in _backends():
            for entry in ENTRY_POINTS:
                if entry in vars(cls):
                    patch.setattr(cls, entry, _wrapped(watch, entry, vars(cls)[entry]))
        yield
    if watch.checked:
        ex.note("batch_consistency", {"hand_offs": watch.checked})
    if watch.first is not None:
        raise watch.first


RESTORED = ("batch_size", "positions", "seq_lens", "req_pool_indices", "out_cache_loc", "extend_seq_lens",
            "mrope_positions")


def raw_fields(batch) -> dict:
    """The fields of `batch` a runner pads in place and must hand back (`RESTORED`): copies, before its replay."""
    kept = {}
    for name in RESTORED:
        value = getattr(batch, name, None)
        kept[name] = value.clone() if hasattr(value, "clone") else value
    return kept


def check_restored(kept: dict, batch, where: str) -> None:
    """After a runner's `execute` returns, the caller's batch is the raw batch again: every field of `kept`
    (`raw_fields` before the replay) has its shape and values back. A runner pads a batch by pointing its fields at
    the static buffers' padded rows; what it forgets to point back reaches the caller (the scheduler's next step,
    the verify) at the padded size."""
    for name, before in kept.items():
        after = getattr(batch, name, None)
        if hasattr(before, "shape") and hasattr(after, "shape"):
            same = before.shape == after.shape and bool((before.cpu() == after.cpu()).all())
            said = f"{tuple(after.shape)} rows {_values(after)[:12]}"
            was = f"{tuple(before.shape)} rows {_values(before)[:12]}"
        else:
            same, said, was = before == after, repr(after), repr(before)
        if not same:
            raise OracleFailure(ORACLE, f"{where}: after the runner's execute the batch's `{name}` is {said}, where "
                                f"the raw batch handed in was {was}: the padded view was not handed back",
                                field=name)
