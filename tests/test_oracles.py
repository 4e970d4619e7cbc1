"""Every oracle fires on a deliberately wrong input, names itself and the evidence, and stays quiet on a right one."""
from __future__ import annotations

import math
import sys

import pytest
import torch

from harness.counter import counter
from harness.devices import cpu
from harness.models.small import ModuleSpec
from harness.oracles import OracleFailure, compile_contract
from harness.oracles.compiles import PlatformError, check_compiles
from harness.oracles.eager import assert_matches_eager
from harness.oracles.graph_replay import check_eager_forward, check_graph_forward, replay_delta
from harness.oracles.hooks import HookRecorder
from harness.oracles.recompile import RecompileWatcher
from harness.personalities.ascend import AscendUnavailable, ascend_standins


def fires(oracle: str, *text: str):
    """Context: the block must raise OracleFailure from `oracle` with each of `text` in its message."""
    class Expect:
        def __enter__(self):
            return self

        def __exit__(self, kind, error, tb):
            assert kind is OracleFailure, f"oracle {oracle} did not fire"
            assert error.oracle == oracle, error
            for piece in text:
                assert piece in str(error), str(error)
            return True
    return Expect()


# eager equality ---------------------------------------------------------------------------------------------

def test_eager_quiet_on_equal_and_within_tolerance():
    x = torch.arange(6.0).reshape(2, 3)
    assert_matches_eager(x, x.clone(), exact=True)
    assert_matches_eager(x + 1e-7, x)
    assert_matches_eager({"a": (x, 3)}, {"a": (x.clone(), 3)})


def test_eager_fires_and_reports_worst_element():
    x = torch.zeros(2, 3)
    wrong = x.clone()
    wrong[1, 2] = 0.5
    with fires("eager-equality", "worst_index: (1, 2)", "actual: 0.5"):
        assert_matches_eager(wrong, x)


def test_eager_exact_fires_on_one_ulp():
    x = torch.ones(4)
    with fires("eager-equality", "bit-equal"):
        assert_matches_eager(torch.nextafter(x, x + 1), x, exact=True)


def test_eager_nan_never_passes():
    x = torch.ones(3)
    with fires("eager-equality", "NaN/Inf"):
        assert_matches_eager(torch.tensor([1.0, math.nan, 1.0]), x)


def test_eager_fires_on_shape_and_structure():
    with fires("eager-equality", "shape or dtype"):
        assert_matches_eager(torch.ones(2, 3), torch.ones(3, 2))
    with fires("eager-equality", "structure"):
        assert_matches_eager((torch.ones(1),), (torch.ones(1), torch.ones(1)))


def test_eager_fp64_reference_judges_by_eagers_own_error():
    reference = torch.randn(64, dtype=torch.float64)
    eager = reference.to(torch.bfloat16)
    assert_matches_eager(eager.clone(), eager, fp64_reference=reference)  # same error as eager: quiet
    with fires("eager-equality", "fp64 reference"):
        assert_matches_eager((reference + 0.5).to(torch.bfloat16), eager, fp64_reference=reference)


# recompilation ---------------------------------------------------------------------------------------------

def test_recompile_watcher_fires_with_the_failing_guard():
    torch._dynamo.reset()

    def scaled(x, mode):
        return x * 2 if mode == 1 else x + 1

    compiled = torch.compile(scaled, backend="eager")
    with RecompileWatcher("scaled") as watcher, counter.expect(num_dynamo_frames_compiled=2):
        compiled(torch.ones(2), 1)
        watcher.arm()
        compiled(torch.ones(2), 1)
        watcher.check()  # same guard inputs: quiet
        compiled(torch.ones(2), 3)
    compiled(torch.ones(2), 5)  # after the watcher's block: not its business
    assert watcher.warmup_compiles == 1
    with fires("no-recompile", "1 frame(s) of scaled after capture", "mode == 1"):
        watcher.check()


# graph replay, from the virtual device's counts ----------------------------------------------------------------

def test_graph_replay_oracle_reads_the_virtual_devices_counts():
    x = torch.ones(2)
    with cpu.install():
        graphs = [torch.cuda.CUDAGraph() for _ in range(2)]
        for graph in graphs:
            with torch.cuda.graph(graph):
                x * 2
        mark = counter.mark()
        for graph in graphs:  # a forward of two captured pieces
            graph.replay()
        check_graph_forward(replay_delta(counter.since(mark)), 2)
        with fires("graph-replay", "replayed 1 graph(s), the capture recorded 2"):
            mark = counter.mark()
            graphs[0].replay()  # one piece ran outside its graph
            check_graph_forward(replay_delta(counter.since(mark)), 2)
        mark = counter.mark()
        check_eager_forward(replay_delta(counter.since(mark)))
        with fires("graph-replay", "created 1 new graph(s) at serve time"):
            mark = counter.mark()
            late = torch.cuda.CUDAGraph()
            with torch.cuda.graph(late):
                x * 2
            for graph in graphs:
                graph.replay()
            check_graph_forward(replay_delta(counter.since(mark)), 2)


# hook contract ---------------------------------------------------------------------------------------------

def test_hook_recorder_counts_and_checks_arguments():
    hooks = HookRecorder()
    sentinel = object()
    hook = hooks.wrap("get_compile_options", lambda module: {"a": 1})
    assert hook(sentinel) == {"a": 1}
    hooks.assert_called("get_compile_options", times=1)
    hooks.assert_argument("get_compile_options", 0, "module", sentinel)
    with fires("hook-contract", "ran 1 time(s), expected 2"):
        hooks.assert_called("get_compile_options", times=2)
    with fires("hook-contract", "received module=None"):
        hook(None)
        hooks.assert_argument("get_compile_options", 0, "module", sentinel)
    mode = hooks.wrap("get_compile_backend", lambda mode=None: "inductor")
    mode("".join(["max-", "autotune"]))  # an equal string, not the same object
    hooks.assert_argument("get_compile_backend", 0, "mode", "max-autotune")
    with fires("hook-contract", "received mode='default'"):
        mode("default")
        hooks.assert_argument("get_compile_backend", 0, "mode", "max-autotune")


# compile kwargs contract -----------------------------------------------------------------------------------

def _oot_hooks(module, mode, backend="inductor", options=None):
    hooks = HookRecorder()
    hooks.wrap("get_compile_backend", lambda mode=None: backend)(mode)
    if module is not None:
        hooks.wrap("get_compile_options", lambda m: options)(module)
    return hooks


def test_contract_quiet_on_each_branch():
    module, options = torch.nn.Linear(2, 2), {"epilogue_fusion": True}
    compile_contract.check("oot", mode="max-autotune", module=module, backend="inductor", options=options,
                           kwargs={"backend": "inductor", "options": options},
                           hooks=_oot_hooks(module, "max-autotune", options=options))
    compile_contract.check("oot", mode="default", module=module, backend="inductor", options=None,
                           kwargs={"backend": "inductor", "mode": "default"}, hooks=_oot_hooks(module, "default"))
    compile_contract.check("cpu", mode="default", module=None, backend=None, options=None,
                           kwargs={"mode": "default"}, hooks=HookRecorder())


@pytest.mark.parametrize("kwargs, text", [
    ({"backend": "inductor", "options": {"x": 1}, "mode": "default"}, "mode and options both"),
    ({"backend": "eager", "options": {"x": 1}}, "is not what get_compile_backend returned"),
    ({"backend": "inductor"}, "options '<absent>' are not what get_compile_options returned"),
])
def test_contract_fires_on_out_of_tree_breaks(kwargs, text):
    module, options = torch.nn.Linear(2, 2), {"x": 1}
    with pytest.raises(OracleFailure, match=text.replace("(", r"\(")):
        compile_contract.check("oot", mode="default", module=module, backend="inductor", options=options,
                               kwargs=kwargs, hooks=_oot_hooks(module, "default", options=options))


def test_contract_fires_when_hooks_are_skipped_or_miss_the_module():
    module = torch.nn.Linear(2, 2)
    with fires("hook-contract", "get_compile_backend ran 0"):
        compile_contract.check("oot", mode=None, module=None, backend="inductor", options=None,
                               kwargs={"backend": "inductor"}, hooks=HookRecorder())
    with fires("hook-contract", "received module=None"):
        compile_contract.check("oot", mode=None, module=module, backend="inductor", options=None,
                               kwargs={"backend": "inductor"}, hooks=_wrong_module_hooks())


def _wrong_module_hooks():
    hooks = HookRecorder()
    hooks.wrap("get_compile_backend", lambda mode=None: "inductor")(None)
    hooks.wrap("get_compile_options", lambda m: None)(None)
    return hooks


def test_contract_fires_on_npu_and_builtin_breaks():
    with ascend_standins():
        import torchair
        backend = torchair.get_npu_backend()
    with fires("kwargs-validity", "expected dynamic=False"):
        compile_contract.check("npu", mode=None, module=None, backend=None, options=None,
                               kwargs={"backend": backend, "dynamic": None}, hooks=HookRecorder())
    with fires("kwargs-validity", "did not reach torch.compile"):
        compile_contract.check("cuda", mode="max-autotune", module=None, backend=None, options=None,
                               kwargs={}, hooks=HookRecorder())


# compiled equals eager -------------------------------------------------------------------------------------

SPEC = ModuleSpec("mlp", 2, 8, "float32")


def test_compiles_quiet_on_valid_kwargs_and_caches():
    cache = {}
    check_compiles({"backend": "eager"}, SPEC, platform_values=None, cache=cache)
    assert list(cache.values()) == [None]


@pytest.mark.slow
def test_compiles_fires_when_torch_rejects_what_sglang_built():
    with fires("compiles", "torch.compile rejected", "Either mode or options"):
        check_compiles({"backend": "inductor", "mode": "default", "options": {}}, SPEC,
                       platform_values={"backend": "inductor", "options": {}}, cache={})


def test_compiles_blames_the_platform_for_its_own_unknown_backend():
    with pytest.raises(PlatformError, match="Invalid backend"):
        check_compiles({"backend": "no_such_backend"}, SPEC,
                       platform_values={"backend": "no_such_backend", "options": None}, cache={})


def test_compiles_fires_on_wrong_numerics():
    def wrong_backend(graph_module, example_inputs):
        return lambda *args: tuple(out + 1 for out in graph_module.forward(*args))

    with fires("eager-equality", "not bit-equal"):
        check_compiles({"backend": wrong_backend}, SPEC, platform_values=None, cache={})


def test_ascend_standin_fails_loudly_on_a_kernel_call():
    before = getattr(torch, "npu", None), {name for name in sys.modules if name.startswith("torchair")}
    with ascend_standins():
        assert torch.npu.is_available() and torch.npu.device_count() == 1
        with pytest.raises(AscendUnavailable, match="torch.npu.synchronize"):
            torch.npu.synchronize()
        with pytest.raises(AscendUnavailable, match="torch.npu.NPUGraph"):
            torch.npu.NPUGraph()  # path selection only: no graph off the virtual device
    after = getattr(torch, "npu", None), {name for name in sys.modules if name.startswith("torchair")}
    assert after == before  # undone after the block


def test_npu_compile_backend_counts_its_compiles():
    with ascend_standins():
        import torchair
        backend = torchair.get_npu_backend()
    compiled = torch.compile(lambda x: x * 2 + 1, backend=backend)
    torch._dynamo.reset()
    with counter.expect(num_platform_backend_compiles=1, num_dynamo_frames_compiled=1):
        assert compiled(torch.ones(2)).tolist() == [3.0, 3.0]  # 2 * 1 + 1
        compiled(torch.ones(2))  # same guards: no second compile


def test_capture_failure_message_without_its_way_out_fires_and_a_full_one_passes():
    from harness.oracles.capture_failure import check_capture_failure_message

    cause = "CUDA out of memory (injected)"
    full = (f"Capture prefill CUDA graph failed: {cause}. backend: tc_piecewise. Retry with "
            "--cuda-graph-backend-prefill=breakable")
    check_capture_failure_message(full, cause=cause, backend="tc_piecewise")
    with fires("capture-failure", "lacks ['--cuda-graph-backend-prefill=breakable']"):
        check_capture_failure_message(full.split(" Retry")[0], cause=cause, backend="tc_piecewise")


def test_size_class_compile_admits_only_dynamos_zero_one_specialisation():
    from harness.oracles.recompile import size_class_compile

    head = "Recompiling function get_masked_input_and_mask in vocab_parallel_embedding.py:138\n" \
           "    triggered by the following guard failure(s):\n"
    assert size_class_compile(head + "    - 0/1: 2 <= input_.size()[0]  # org_vocab_mask = ...")
    assert size_class_compile(head + "    - 0/0: tensor 'input_' size mismatch at index 0. expected 1, actual 6")
    assert size_class_compile(head + "    - 0/1: 2 <= input_.size()[0]  # ...\n"
                                     "    - 0/0: input_._base.size()[0] == input_.size()[0]  # (unknown var s45)")
    # a static function: one frame per size
    assert not size_class_compile(head + "    - 0/0: tensor 'input_' size mismatch at index 0. expected 1, actual 4\n"
                                         "    - 0/1: tensor 'input_' size mismatch at index 0. expected 2, actual 4")
    assert not size_class_compile(head + "    - 0/0: L['mode'] == 1")
    assert not size_class_compile("a new frame")
