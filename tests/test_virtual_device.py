"""Self-tests of the cpu virtual device: a captured graph behaves like a CUDA graph.

Each test captures a small function whose effect is computable by hand, then checks what replay does.
"""
from __future__ import annotations

import functools
import sys

import pytest
import torch

from harness.counter import counter
from harness.devices import cpu, get_device
from harness.oracles import OracleFailure
from harness.oracles.eager import assert_matches_eager


@pytest.fixture
def virtual():
    with cpu.install():
        cpu.reset_log()
        yield cpu


def capture(fn, mode="record"):
    """Capture `fn()` into a new graph with the virtual device's `torch.cuda.graph`; return (graph, output)."""
    graph = torch.cuda.CUDAGraph()
    with cpu.capture_mode(mode):
        with torch.cuda.graph(graph, stream=torch.cpu.Stream()):
            out = fn()
    return graph, out


@pytest.mark.parametrize("mode", cpu.MODES)
def test_replay_after_inputs_changed_gives_the_new_result(virtual, mode):
    x = torch.tensor([1.0, 2.0, 3.0])
    with counter.expect(num_graphs_created=1, num_graphs_captured=1, num_graph_replays=0):
        graph, out = capture(lambda: 3 * x + 19, mode)
    assert out.tolist() == [22.0, 25.0, 28.0]  # 3 * [1, 2, 3] + 19, computed during capture
    x.copy_(torch.tensor([10.0, 0.0, -1.0]))
    with counter.expect(num_graphs_created=0, num_graphs_captured=0, num_graph_replays=1):
        graph.replay()
    assert out.tolist() == [49.0, 19.0, 16.0]  # 3 * [10, 0, -1] + 19, in the same output tensor
    assert [c.mode for c in virtual.CAPTURES] == [mode]  # one capture since the fixture's reset_log()


def test_record_mode_freezes_a_python_branch_and_side_effect(virtual):
    x = torch.tensor([1.0, 2.0])
    calls = []
    big = {"flag": False}  # host state (a device value read with .item() would be refused inside a capture)

    def body():
        calls.append("ran")
        if big["flag"]:  # False at capture: the graph holds the other branch
            return x * 100
        return x + 1

    graph, out = capture(body, "record")
    x.copy_(torch.tensor([10.0, 20.0]))
    big["flag"] = True
    graph.replay()
    assert calls == ["ran"]  # the Python side effect happened at capture only
    assert out.tolist() == [11.0, 21.0]  # x + 1 (branch frozen), not x * 100


def test_rerun_mode_runs_the_python_again(virtual):
    x = torch.tensor([1.0, 2.0])
    calls = []

    def body():
        calls.append("ran")
        return x * 2

    graph, out = capture(body, "rerun")
    x.copy_(torch.tensor([5.0, 6.0]))
    graph.replay()
    assert calls == ["ran", "ran"]
    assert out.tolist() == [10.0, 12.0]


@pytest.mark.parametrize("mode", cpu.MODES)
def test_recorded_in_place_update_is_replayed(virtual, mode):
    total = torch.zeros(2)
    step = torch.tensor([1.0, 2.0])

    def body():
        total.add_(step)  # in place on a static buffer
        return total * 10

    graph, out = capture(body, mode)
    assert total.tolist() == [1.0, 2.0]
    with counter.expect(num_graph_replays=2):
        graph.replay()
        graph.replay()
    assert total.tolist() == [3.0, 6.0]  # captured once + replayed twice: 3 * [1, 2]
    assert out.tolist() == [30.0, 60.0]


@pytest.mark.parametrize("mode", cpu.MODES)
def test_reading_an_output_between_replays_sees_the_last_replay(virtual, mode):
    x = torch.tensor([1.0])
    graph, out = capture(lambda: x * 2, mode)
    seen = []
    for value in (5.0, 7.0):
        x.fill_(value)
        graph.replay()
        seen.append(out.item())  # the same tensor object every time, holding the last replay's result
    assert seen == [10.0, 14.0]


def test_a_replay_that_does_nothing_is_caught_by_the_eager_oracle(virtual):
    x = torch.tensor([1.0, 2.0])
    graph, out = capture(lambda: x * 3, "record")
    graph.replay = lambda: None  # a broken replay: the output keeps the capture-time values
    x.copy_(torch.tensor([4.0, 5.0]))
    graph.replay()
    with pytest.raises(OracleFailure, match="eager-equality"):
        assert_matches_eager(out, x * 3, exact=True)


def test_scalars_read_at_capture_stay_baked_in(virtual):
    x = torch.tensor([2.0])
    scale = [3.0]  # a host value (reading a device value with .item() would be refused inside a capture)
    graph, out = capture(lambda: x * scale[0], "record")  # the op's scalar argument is 3 at capture
    scale[0] = 100.0
    x.fill_(5.0)
    graph.replay()
    assert out.item() == 15.0  # 5 * 3: the scalar is baked in, as a kernel argument in a CUDA graph


def test_capture_state_streams_pools_and_weak_refs(virtual):
    seen = []
    graph, _ = capture(lambda: seen.append(torch.cuda.is_current_stream_capturing()) or torch.ones(1), "record")
    assert seen == [True] and not torch.cuda.is_current_stream_capturing()
    assert torch.cpu.graph_pool_handle() != torch.cpu.graph_pool_handle()
    t = torch.arange(3.0)
    weak = cpu.weak_ref_tensor(t)
    t.add_(1)
    assert weak.tolist() == [1.0, 2.0, 3.0]  # shares the storage
    # SGLang's module raises NotImplementedError at import on a CPU; installed, it imports as SGLang imports it.
    from sglang.srt.model_executor.runner_backend_utils.weak_ref_tensor import weak_ref_tensors
    assert weak_ref_tensors([t])[0].data_ptr() == t.data_ptr()
    # GroupCoordinator.graph_capture calls torch.get_device_module() without a device.
    assert torch.get_device_module() is torch.cpu and hasattr(torch.get_device_module, "__wrapped__")


def _plug_points():
    """Everything the device and the npu personality patch, as it is now."""
    from sglang.srt.platforms import current_platform

    return (torch.cuda.CUDAGraph, torch.cuda.graph, torch.get_device_module, getattr(torch.cpu, "graph", None),
            getattr(torch, "npu", None), {k: v for k, v in sys.modules.items() if k.split(".")[0] in STANDINS},
            dict(vars(current_platform)), cpu.current_capture_mode())


STANDINS = ("torch_npu", "torchair")


def test_install_restores_everything():
    before = _plug_points()
    with get_device("cpu").install("npu"), cpu.capture_mode("rerun"):
        from sglang.srt.platforms import current_platform

        assert torch.cuda.CUDAGraph is cpu.VirtualGraph and issubclass(torch.npu.NPUGraph, cpu.VirtualGraph)
        assert current_platform.is_out_of_tree() and cpu.installed() and cpu.current_capture_mode() == "rerun"
        assert {"torch_npu", "torchair"} <= set(sys.modules)
    assert _plug_points() == before and not hasattr(torch, "npu") and not cpu.installed()


def test_npu_standin_fails_loudly_on_a_kernel():
    from harness.personalities.ascend import AscendUnavailable

    with get_device("cpu").install("npu"):
        import torch_npu

        with pytest.raises(AscendUnavailable, match="npu_fused_infer_attention_score"):
            torch_npu.npu_fused_infer_attention_score(torch.ones(1))


def test_get_device_names_the_choices_for_an_unknown_device():
    with pytest.raises(ValueError, match="cpu, cuda, npu"):
        get_device("tpu")
    with pytest.raises(ValueError, match="personality 'tpu'"):
        get_device("cpu").install("tpu").__enter__()
    assert get_device("cpu").available
    cuda = get_device("cuda")
    assert cuda.available or "no CUDA GPU" in cuda.skip_reason
    npu = get_device("npu")
    assert npu.available or "torch_npu" in npu.skip_reason or "NPU" in npu.skip_reason


def test_compiled_function_records_and_reruns(virtual):
    """Compiled code: rerun mode runs the compiled function at replay; record mode records its eager ops."""
    x = torch.tensor([1.0, 2.0])
    compiled = torch.compile(lambda: x * 3 + 1, backend="eager")
    compiled()  # warm-up compile outside capture, as SGLang's runners do
    for mode in cpu.MODES:
        graph, out = capture(functools.partial(compiled), mode)
        x.copy_(torch.tensor([2.0, 3.0]))
        graph.replay()
        assert out.tolist() == [7.0, 10.0], mode
        x.copy_(torch.tensor([1.0, 2.0]))


def test_a_captured_triton_launch_replays_in_order_on_new_inputs(virtual):
    """A Triton kernel (run by the interpreter) launched inside a record-mode capture, between two aten ops, is
    launched again at replay, in order: the aten op after it reads what the re-launched kernel wrote."""
    import triton
    import triton.language as tl

    from harness.devices.triton_interpreter import InterpretedKernel

    @triton.jit
    def axpy(x_ptr, y_ptr, out_ptr, n, alpha, BLOCK: tl.constexpr):
        offsets = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offsets < n
        x = tl.load(x_ptr + offsets, mask=mask)
        y = tl.load(y_ptr + offsets, mask=mask)
        tl.store(out_ptr + offsets, alpha * x + y, mask=mask)

    kernel = InterpretedKernel(axpy)
    x = torch.tensor([1.0, 2.0, 3.0])
    out = torch.zeros(3)

    def body():
        y = x * 2  # aten, before the launch
        kernel[(triton.cdiv(3, 2),)](x, y, out, 3, 10.0, BLOCK=2)  # out = 10 x + 2 x = 12 x
        return out + 1  # aten, reads the launch's output

    graph, z = capture(body, "record")
    assert z.tolist() == [13.0, 25.0, 37.0]  # 12 * [1, 2, 3] + 1
    assert virtual.CAPTURES[-1].num_launches == 1
    x.copy_(torch.tensor([0.5, -1.0, 10.0]))
    graph.replay()
    assert out.tolist() == [6.0, -12.0, 120.0]  # 12 * [0.5, -1, 10]: the kernel ran again on the new x
    assert z.tolist() == [7.0, -11.0, 121.0]  # ... before the aten op that reads it


def test_wrapped_kernels_get_their_heuristics_computed_per_launch_and_the_first_config():
    """A kernel under `@triton.heuristics` (FLA's chunked gated-delta-rule kernels are) gets each heuristic computed
    from the launch's own arguments, as `Heuristics.run` computes it, and sees what an autotuner outside it added
    (its first config); a caller's own value wins over a config's."""
    import triton
    import triton.language as tl

    from harness.devices.triton_interpreter import InterpretedKernel

    @triton.autotune(configs=[triton.Config({"SCALE": 3}), triton.Config({"SCALE": 5})], key=["n"])
    @triton.heuristics({"HAS_BIAS": lambda args: args["bias"] is not None,
                        "BLOCK": lambda args: triton.next_power_of_2(args["n"]) * args["SCALE"] // args["SCALE"]})
    @triton.jit
    def scaled(x_ptr, bias, n, SCALE: tl.constexpr, HAS_BIAS: tl.constexpr, BLOCK: tl.constexpr):
        offsets = tl.arange(0, BLOCK)
        mask = offsets < n
        x = tl.load(x_ptr + offsets, mask=mask) * SCALE
        if HAS_BIAS:
            x += tl.load(bias + offsets, mask=mask)
        tl.store(x_ptr + offsets, x, mask=mask)

    kernel = InterpretedKernel(scaled)
    x = torch.tensor([1.0, 2.0, 3.0])
    kernel[(1,)](x, None, 3)  # BLOCK 4, no bias, SCALE 3 (the first config)
    assert x.tolist() == [3.0, 6.0, 9.0]
    kernel[(1,)](x, torch.tensor([1.0, 1.0, 1.0]), 3, SCALE=2)  # the caller's SCALE, with the bias
    assert x.tolist() == [7.0, 13.0, 19.0]


@pytest.mark.parametrize("measured", [False, True])
def test_an_interpreted_launch_runs_untraced_unless_its_file_is_measured(measured, monkeypatch):
    """A launch runs without the thread's trace function (coverage's tracer: half a real-model example's time) and
    gives it back; a kernel in a file the campaign measures (`keep_traced`: SGLang's dp_attention.py holds two)
    stays traced."""
    import os

    import triton
    import triton.language as tl

    from harness.devices import triton_interpreter
    from harness.devices.triton_interpreter import InterpretedKernel

    @triton.jit
    def double(x_ptr, BLOCK: tl.constexpr):
        offsets = tl.arange(0, BLOCK)
        tl.store(x_ptr + offsets, tl.load(x_ptr + offsets) * 2)

    monkeypatch.setattr(triton_interpreter, "_TRACED_FILES", {os.path.realpath(__file__)} if measured else set())
    seen = []

    def tracer(frame, event, arg):
        seen.append(frame.f_code.co_name)
        return None

    x = torch.tensor([1.0, 2.0])
    previous = sys.gettrace()
    sys.settrace(tracer)
    try:
        InterpretedKernel(double)[(1,)](x, BLOCK=2)
        restored = sys.gettrace()
    finally:
        sys.settrace(previous)
    assert x.tolist() == [2.0, 4.0]
    assert restored is tracer
    assert ("double" in seen) is measured  # the kernel's body, run by the interpreter
    assert "_launch" in seen  # the launch itself is traced either way


def test_coverage_keeps_the_lines_its_callers_run_after_an_untraced_launch(tmp_path):
    """Under coverage.py's own tracer, a launch run untraced costs no line of the measured code around it: the
    lines after the launch in the calling function, and in its caller, are recorded."""
    import coverage

    source = tmp_path / "measured_caller.py"
    source.write_text(
        "import torch\n"
        "def launch_then_more(kernel):\n"
        "    x = torch.tensor([1.0, 2.0])\n"
        "    kernel[(1,)](x, BLOCK=2)\n"
        "    y = x.tolist()\n"  # line 5: after the launch
        "    return y\n"
        "def caller(kernel):\n"
        "    y = launch_then_more(kernel)\n"
        "    z = y + [0.0]\n"  # line 9
        "    return z\n")
    import triton
    import triton.language as tl

    from harness.devices.triton_interpreter import InterpretedKernel

    @triton.jit
    def double(x_ptr, BLOCK: tl.constexpr):
        offsets = tl.arange(0, BLOCK)
        tl.store(x_ptr + offsets, tl.load(x_ptr + offsets) * 2)

    kernel = InterpretedKernel(double)
    sys.path.insert(0, str(tmp_path))
    cov = coverage.Coverage(data_file=None, include=[str(source)], branch=True, config_file=False)
    try:
        cov.start()
        try:
            import measured_caller

            result = measured_caller.caller(kernel)
        finally:
            cov.stop()
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("measured_caller", None)
    assert result == [2.0, 4.0, 0.0]
    _, _, _, missing, _ = cov.analysis2(str(source))
    assert missing == [], f"lines lost around an untraced launch: {missing}"


@pytest.mark.parametrize("mode", cpu.MODES)
@pytest.mark.parametrize("grad_in_capture", [False, True])
def test_a_guard_failing_inside_a_capture_is_seen_as_on_cuda(virtual, mode, grad_in_capture):
    """A compiled function warmed up twice without autograd, then captured: on CUDA the capture's call looks up
    Dynamo's cache and, with autograd on, misses it and compiles inside the capture. The capture's record says so
    in both modes (rerun compiles; record, where Dynamo runs eagerly under the recorder, notes the miss with
    Dynamo's guard text), and `RecompileWatcher.arm` fails naming the graph; with autograd off it passes."""
    from harness.oracles.recompile import RecompileWatcher

    torch._dynamo.reset()
    compiled = torch.compile(lambda x: x * 2 + 1, backend="eager")
    x = torch.ones(3)
    with RecompileWatcher("the compiled function") as watcher:
        for _ in range(2):
            with torch.no_grad():
                compiled(x)
        with torch.set_grad_enabled(grad_in_capture):
            graph, out = capture(lambda: compiled(x), mode)
        record = cpu.CAPTURES[-1]
        assert record.compiles + len(record.cache_misses) == int(grad_in_capture), record
        if not grad_in_capture:
            watcher.arm()
            return
        if mode == "record":
            assert "GLOBAL_STATE changed: grad_mode" in record.cache_misses[0], record
        with pytest.raises(OracleFailure, match=f"graph {graph.graph_id} ") as failure:
            watcher.arm()
        assert "grad_mode" in failure.value.details["failing_guard"]
    graph.replay()
    assert torch.equal(out, x * 2 + 1)
