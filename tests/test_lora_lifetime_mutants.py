"""Mutants of SGLang's LoRA adapter lifecycle (`harness/targets/decode/lora_lifetime.py`), in-process: one line of
an installed SGLang method recompiled by `edited` and set with pytest's MonkeyPatch, undone after. Each must fail
`lora-lifecycle` (or the replay checks) naming the adapter, slot or count that went wrong, and clean SGLang must
play the same lifetimes.

- unload_keeps_the_pool_slot: `LoRAManager._unload_lora_adapter` never asks the pool to drop the adapter, so its
  id keeps a slot; "a" loaded again under the same (stable) id would be served from the old weights.
- unload_leaves_weights_in_the_slot: `LoRAMemoryPool.remove_lora` frees the slot without zeroing it.
- pin_limit_off_by_one: `validate_new_adapter` lets pinned adapters take every slot, leaving the base model and
  unpinned adapters none (SGLang keeps one).
- admission_ignores_pins: `validate_lora_batch` answers as if nothing were pinned.
- eviction_takes_a_pinned_adapter: the pool's eviction no longer skips pinned adapters.
- overlap_load_never_awaited: `LoRAOverlapLoader._drain_completed_overlap_loads` drops the compute stream's wait on
  a finished load's event, so a replay reads pool buffers the load stream wrote with nothing ordering the two
  (`stream-order`, naming both streams and both sites).
"""
from __future__ import annotations

import re

import pytest

from harness.devices import get_device
from harness.oracles import OracleFailure
from harness.targets.decode.base import DecodeBatch, DecodeCase
from harness.targets.decode.lora_lifetime import Load, Serve, Unload
from harness.targets.decode.real_model import StagedBatch
from tests.mutant_runs import edited

pytestmark = pytest.mark.slow  # builds a LoRA server's model and captures it in this process

CASE = DecodeCase(capture_bs=(1, 3), max_running_requests=8)


def serve(ids, seq_lens, rows, seed) -> Serve:
    return Serve(StagedBatch(DecodeBatch(input_ids=[5 + 11 * i for i in range(len(ids))],
                                         positions=[n - 1 for n in seq_lens], seq_lens=seq_lens,
                                         req_pool_indices=rows, lora_ids=ids), seed))


# "a" served, unloaded, and "a" retrained loaded under the id --lora-paths gives it, then served
RELOAD = [serve(["a", None], [9, 4], [4, 2], 7), Unload("a"), Load("a", "a2", stable_id=True),
          serve(["a", None], [5, 8], [1, 3], 8)]
# two pins of three slots, a third refused; a batch of two unpinned adapters refused, one admitted
PINS = [Load("c", "c", pinned=True, source="tensors"), Load("b2", "b", pinned=True), Load("b3", "b", pinned=True),
        serve(["a", None], [6, 3], [2, 5], 9), serve(["c", "b2", "a"], [4, 7, 5], [1, 6, 3], 10)]
# a pool of two slots: "c" pinned and served, then "a", then "b" must evict "a", never "c"
PIN_EVICTION = [Load("c", "c", pinned=True), serve(["c"], [5], [2], 11), serve(["a"], [7], [3], 12),
                serve(["b"], [4], [5], 13), serve(["c"], [9], [1], 14)]


class _Record:
    """What `stream_order.checking` notes, outside a harness example."""

    def __init__(self) -> None:
        self.notes: dict = {}

    def note(self, key, value) -> None:
        self.notes[key] = value


@pytest.fixture
def device(monkeypatch):
    from harness.targets.decode import real_lora
    from harness.targets.decode.real_model import load

    load()
    reason = real_lora.lora_missing("triton")
    if reason:
        pytest.skip(reason)
    with get_device("cpu").install("cuda"):
        yield


def play(program, max_loras: int = 3, **settings):
    from harness.targets.decode.lora_lifetime import LoRAServer
    from harness.targets.decode.real_lora import Serving

    server = LoRAServer(CASE, Serving("triton", max_loras, **settings))
    try:
        for index, step in enumerate(program):
            server.play(index, step)
    finally:
        server.stop()
    return server


def mutate(monkeypatch, owner, name: str, old: str, new: str) -> None:
    monkeypatch.setattr(owner, name, edited(getattr(owner, name), old, new))


def failure_of(program, max_loras: int = 3) -> OracleFailure:
    with pytest.raises(OracleFailure) as failure:
        play(program, max_loras)
    return failure.value


def test_clean_sglang_plays_every_lifetime(device):
    assert play(RELOAD).held == 4
    pins = play(PINS)
    assert pins.held == 3 and len(pins.refused) == 2
    assert play(PIN_EVICTION, max_loras=2).held == 4


def test_clean_sglang_plays_a_lifetime_with_overlap_loading(device):
    from harness.oracles import stream_order

    record = _Record()
    with stream_order.checking(record):
        assert play(RELOAD, overlap_loading=True).held == 4
    assert record.notes["stream_order"].startswith("checked: 3 streams"), record.notes  # + the capture's


def test_overlap_load_never_awaited_fails_stream_order_naming_both_streams(device, monkeypatch):
    from sglang.srt.lora.lora_overlap_loader import LoRAOverlapLoader

    from harness.oracles import stream_order

    mutate(monkeypatch, LoRAOverlapLoader, "_drain_completed_overlap_loads",
           "self.device_module.current_stream().wait_event(event)", "pass")
    with pytest.raises(OracleFailure) as failure, stream_order.checking(_Record()):
        play(RELOAD, overlap_loading=True)
    assert failure.value.oracle == "stream-order"
    # the replay's LoRA kernel (stream 0) reads a pool buffer the load stream (its number: the process's count) wrote
    assert "stream 0 reading from" in failure.value.diagnosis, failure.value.diagnosis
    assert re.search(r"last written on stream [1-9]\d* in aten.copy_", failure.value.diagnosis)
    assert "copy_weight_into_buffer" in failure.value.diagnosis


def test_unload_keeping_the_pool_slot_fails_naming_the_slot(device, monkeypatch):
    from sglang.srt.lora.lora_manager import LoRAManager

    mutate(monkeypatch, LoRAManager, "_unload_lora_adapter",
           "removed_slot = self.memory_pool.remove_lora(lora_ref.lora_id)", "removed_slot = None")
    failure = failure_of(RELOAD)
    assert failure.oracle == "lora-lifecycle"
    assert "step 1 (Unload(name='a')): the unloaded adapter 'a'" in failure.diagnosis
    assert "in the pool at slot" in failure.diagnosis


def test_unload_leaving_weights_in_the_slot_fails_naming_the_modules(device, monkeypatch):
    from sglang.srt.lora.mem_pool import LoRAMemoryPool

    mutate(monkeypatch, LoRAMemoryPool, "remove_lora", "self._clear_buffer_slot_for_base(buffer_id)", "pass")
    failure = failure_of(RELOAD)
    assert failure.oracle == "lora-lifecycle"
    assert "the unloaded adapter's pool slot" in failure.diagnosis and "qkv_proj" in failure.diagnosis


def test_pin_limit_off_by_one_fails_at_the_third_pin(device, monkeypatch):
    from sglang.srt.lora.lora_manager import LoRAManager

    mutate(monkeypatch, LoRAManager, "validate_new_adapter",
           "self.num_pinned_loras >= self.max_loras_per_batch - 1", "self.num_pinned_loras >= self.max_loras_per_batch")
    failure = failure_of(PINS)
    assert failure.oracle == "lora-lifecycle"
    assert "step 2" in failure.diagnosis and "SGLang loaded it, but pinning it would make 3 pinned adapters of 3" \
        in failure.diagnosis


def test_admission_ignoring_pins_fails_naming_the_slots(device, monkeypatch):
    from sglang.srt.lora.lora_manager import LoRAManager

    mutate(monkeypatch, LoRAManager, "validate_lora_batch", "if self.num_pinned_loras == 0:", "if True:")
    failure = failure_of(PINS)
    assert failure.oracle == "lora-lifecycle"
    assert "step 3" in failure.diagnosis and "SGLang's admission admitted it" in failure.diagnosis
    assert "exceed the 1 slots its 2 pinned adapter(s) leave of 3" in failure.diagnosis


def test_eviction_taking_a_pinned_adapter_fails_naming_it(device, monkeypatch):
    from sglang.srt.lora.mem_pool import LoRAMemoryPool

    mutate(monkeypatch, LoRAMemoryPool, "prepare_lora_batch", "if lora_ref and lora_ref.pinned:",
           "if lora_ref and lora_ref.pinned and False:")
    failure = failure_of(PIN_EVICTION, max_loras=2)
    assert failure.oracle == "lora-lifecycle"
    assert "the pinned adapter 'c' moved from pool slot" in failure.diagnosis
