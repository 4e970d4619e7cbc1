"""Self-tests of the virtual device's capture legality and stream ordering: each rule fires inside a capture with
CUDA's text and stays quiet outside it (warm-up, eager, replay); the stream-order checker fails an unordered
access naming both streams and stays quiet when an event, a stream wait or a synchronisation orders it."""
from __future__ import annotations

import pytest
import torch

from harness.devices import cpu, legality, stream_order
from harness.oracles import OracleFailure
from harness.oracles import capture_legality as legality_oracle
from harness.oracles import stream_order as order_oracle
from harness.record import Example

GENERATOR = legality.generator_text("current_seed")
# name -> (the call, CUDA's text, the operation the violation names)
RULES = {
    "device synchronize": (lambda x: torch.cuda.synchronize(), legality.NOT_PERMITTED, "torch.cuda.synchronize"),
    "cpu synchronize": (lambda x: torch.cpu.synchronize(), legality.NOT_PERMITTED, "torch.cuda.synchronize"),
    "stream synchronize": (lambda x: torch.cuda.current_stream().synchronize(), legality.NOT_PERMITTED,
                           "Stream.synchronize"),
    "event synchronize": (lambda x: torch.cuda.Event().synchronize(), legality.NOT_PERMITTED, "Event.synchronize"),
    "event query": (lambda x: torch.cuda.Event().query(), legality.NOT_PERMITTED, "Event.query"),
    "item": (lambda x: x.sum().item(), legality.NOT_PERMITTED, "aten._local_scalar_dense"),
    "bool": (lambda x: bool(x[0] > 0), legality.NOT_PERMITTED, "aten._local_scalar_dense"),
    "int": (lambda x: int(x[0]), legality.NOT_PERMITTED, "aten._local_scalar_dense"),
    "nonzero": (lambda x: x.nonzero(), legality.NOT_PERMITTED, "aten.nonzero"),
    "masked_select": (lambda x: x.masked_select(x > 1), legality.NOT_PERMITTED, "aten.masked_select"),
    "boolean index": (lambda x: x[x > 1], legality.NOT_PERMITTED, "aten.index"),
    "unique": (lambda x: torch.unique(x), legality.NOT_PERMITTED, "aten._unique2"),
    "tolist": (lambda x: x.tolist(), legality.PINNED_COPY, "Tensor.tolist"),
    "numpy": (lambda x: x.numpy(), legality.PINNED_COPY, "Tensor.numpy"),
    "cuda initial_seed": (lambda x: torch.cuda.initial_seed(), GENERATOR, "torch.cuda.initial_seed"),
    "cuda get_rng_state": (lambda x: torch.cuda.get_rng_state(), GENERATOR, "torch.cuda.get_rng_state"),
    "manual_seed": (lambda x: torch.manual_seed(0), legality.generator_text("set_current_seed"),
                    "torch.manual_seed"),
}


@pytest.fixture
def virtual():
    with cpu.install():
        cpu.reset_log()
        legality.reset_log()
        stream_order.reset()
        yield cpu


def capture(fn, mode="record", stream=None):
    graph = torch.cuda.CUDAGraph()
    with cpu.capture_mode(mode), torch.cuda.graph(graph, stream=stream or torch.cuda.Stream()):
        out = fn()
    return graph, out


@pytest.mark.parametrize("mode", cpu.MODES)
@pytest.mark.parametrize("rule", sorted(RULES))
def test_rule_fires_inside_a_capture_with_cuda_text(virtual, rule, mode):
    call, text, operation = RULES[rule]
    x = torch.tensor([1.0, 2.0, 3.0])
    call(x)  # warm-up, eager: allowed
    with pytest.raises(legality.CaptureLegalityError) as raised:
        capture(lambda: call(x), mode)
    assert str(raised.value) == text
    assert not torch.cuda.is_current_stream_capturing()  # the failed capture closed
    [violation] = legality.VIOLATIONS
    assert operation in violation.operation
    assert violation.site.startswith(__file__)  # the line in this test that made the call
    call(x)  # after the capture: allowed again


def test_legal_capture_replays_and_stays_quiet(virtual):
    x = torch.tensor([1.0, 2.0])
    graph, out = capture(lambda: x * 2 + 1)
    x.copy_(torch.tensor([3.0, 4.0]))
    graph.replay()
    torch.cuda.synchronize()  # after replay: allowed
    assert out.tolist() == [7.0, 9.0]  # 2 * [3, 4] + 1
    assert legality.VIOLATIONS == []


def test_reads_of_pinned_host_memory_pass_inside_a_capture(virtual):
    """SGLang reads pinned host tensors in captured code (LoRA's `output_offset_cpu[-1].item()`), legal on a GPU
    for host memory: inside `pinned_host_memory` they are host memory, views included, and pass; the same read of
    a tensor not pinned there is still refused."""
    from harness.devices.host_memory import is_pinned_host, pinned_host_memory

    with pinned_host_memory():
        offsets = torch.tensor([0, 64, 96], dtype=torch.int32, pin_memory=True)
        copied = torch.zeros(3).pin_memory()
    plain = torch.tensor([0, 64, 96], dtype=torch.int32)
    assert is_pinned_host(offsets[-1:]) and is_pinned_host(copied) and not is_pinned_host(plain)
    capture(lambda: (offsets[-1].item(), offsets.tolist(), copied[0].item()))
    assert legality.VIOLATIONS == []
    with pytest.raises(legality.CaptureLegalityError):
        capture(lambda: plain[-1].item())
    with pytest.raises(RuntimeError):  # outside the block torch without CUDA refuses pinning, as it does
        torch.tensor([1], pin_memory=True)


def test_capture_on_the_default_stream_is_refused(virtual):
    graph = torch.cuda.CUDAGraph()
    with pytest.raises(legality.CaptureLegalityError, match=r"non-default stream"):
        graph.capture_begin()
    assert str(legality.VIOLATIONS[0].message) == legality.DEFAULT_STREAM
    with torch.cuda.stream(torch.cuda.Stream()):  # on a side stream: allowed
        graph.capture_begin()
        graph.capture_end()


def test_graph_without_a_stream_captures_on_a_side_stream(virtual):
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        seen = torch.cuda.current_stream()
    assert seen is not torch.cuda.default_stream() and seen is cpu.graph.default_capture_stream


def test_an_op_the_rules_cannot_classify_is_an_advisory(virtual):
    lib = torch.library.Library("harness_legality_test", "FRAGMENT")
    lib.define("double(Tensor x) -> Tensor")
    lib.impl("double", lambda x: x * 2, "CPU")
    x = torch.ones(2)
    capture(lambda: torch.ops.harness_legality_test.double(x))
    assert "harness_legality_test::double" in legality.ADVISORIES
    assert legality.VIOLATIONS == []


def test_oracle_turns_a_swallowed_violation_into_its_failure(virtual):
    x = torch.ones(2)

    def swallowing():
        try:
            x.sum().item()
        except RuntimeError:
            pass  # SGLang swallowing the error would still be caught
        return x + 1

    with pytest.raises(OracleFailure) as failed:
        with legality_oracle.checking(Example("t", {})):
            capture(swallowing)
    assert failed.value.oracle == "capture-legality"
    assert legality.NOT_PERMITTED in failed.value.diagnosis
    with legality_oracle.checking(Example("t", {})):  # quiet when nothing was refused
        capture(lambda: x + 1)


# -- stream order ---------------------------------------------------------------------------------------------
def _side_reads(x, order):
    """Default stream writes x; a side stream reads it, ordered by `order(side)` (or not at all)."""
    side = torch.cuda.Stream()
    x.fill_(2.0)
    order(side)
    with torch.cuda.stream(side):
        return x * 3


ORDERINGS = {
    "wait_stream": lambda side: side.wait_stream(torch.cuda.current_stream()),
    "event record + wait": lambda side: side.wait_event(torch.cuda.current_stream().record_event()),
    "event.wait": lambda side: torch.cuda.current_stream().record_event().wait(side),
    "device synchronize": lambda side: torch.cuda.synchronize(),
    "stream synchronize": lambda side: torch.cuda.current_stream().synchronize(),
}


@pytest.mark.parametrize("ordering", sorted(ORDERINGS))
def test_ordered_cross_stream_access_is_quiet(virtual, ordering):
    ex = Example("t", {})
    with order_oracle.checking(ex):
        _side_reads(torch.zeros(4), ORDERINGS[ordering])
    assert ex.notes["stream_order"].startswith("checked: 2 streams")


def test_unordered_read_after_write_names_both_streams_and_sites(virtual):
    with pytest.raises(OracleFailure) as failed:
        with order_oracle.checking(Example("t", {})):
            _side_reads(torch.zeros(4), lambda side: None)
    failure = failed.value
    assert failure.oracle == "stream-order"
    side = failure.details["streams"].split(" -> ")[1]
    assert failure.details["streams"] == f"0 -> {side}" and side != "0"
    assert failure.details["tensor"] == "float32[4]"
    assert "reading from float32[4]" in failure.diagnosis and "last written on stream 0 in aten.fill_" in (
        failure.diagnosis)
    assert __file__ in failure.details["site"] and __file__ in failure.details["previous_site"]


def test_unordered_write_after_read_is_a_race(virtual):
    x = torch.ones(3)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with pytest.raises(OracleFailure, match="writing to float32"):
        with order_oracle.checking(Example("t", {})):
            with torch.cuda.stream(side):
                x.sum()
            x.add_(1)  # the default stream overwrites what the side stream may still read


def test_reused_address_is_a_new_tensor(virtual):
    side = torch.cuda.Stream()
    with order_oracle.checking(Example("t", {})):
        with torch.cuda.stream(side):
            tmp = torch.ones(1024) * 2
        del tmp
        fresh = torch.ones(1024) * 3  # may land at the freed address: a fresh output, no history
        fresh.add_(1)


def test_work_inside_a_capture_is_not_an_access_until_replay(virtual):
    x = torch.ones(2)
    ex = Example("t", {})
    with order_oracle.checking(ex):
        graph, out = capture(lambda: x * 2)  # captured on a side stream: nothing ran there
        x.fill_(5.0)
        graph.replay()  # replayed on the default stream
    assert out.tolist() == [10.0, 10.0]


def test_one_stream_and_no_events_pass_trivially_and_say_so(virtual):
    ex = Example("t", {})
    with order_oracle.checking(ex):
        torch.ones(2).add_(1)
    assert ex.notes["stream_order"] == "trivially ordered: one stream, no events"


def test_switched_off_says_so(monkeypatch):
    monkeypatch.setenv(stream_order.SWITCH, "off")
    with cpu.install():
        ex = Example("t", {})
        with order_oracle.checking(ex):
            _side_reads(torch.zeros(4), lambda side: None)  # a race, not looked for
    assert ex.notes["stream_order"] == "off (HARNESS_STREAM_ORDER=off)"
