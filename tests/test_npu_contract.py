"""The npu-standin-contract oracle (`harness.personalities.npu_contract`): the clean stand-in and clean SGLang
pass against the real torch_npu wheel; a stand-in parameter renamed or defaulted otherwise, and an SGLang source
using a torch.npu / torch_npu name the real package lacks (or calling one with a keyword it refuses), each fail
naming the attribute, where SGLang uses it and the real signature. All in-process, no import of torch_npu: about
5 s of CPU with the wheel cached (its first download is 44 MB). Without the wheel (no network) they skip, saying
so; under CI (CI set) that is a failure, since CI reaches PyPI."""
from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

import harness.devices.streams as streams
from harness.devices import cpu
from harness.mutants import scratch_sglang
from harness.oracles import OracleFailure
from harness.personalities import ascend, npu_contract

RUNNER = "srt/hardware_backend/npu/graph_runner/npu_graph_runner.py"


def _under_ci() -> bool:
    return os.environ.get("CI", "").lower() not in ("", "0", "false")


def real_or_skip() -> npu_contract.RealTorchNpu:
    try:
        return npu_contract.RealTorchNpu(npu_contract.fetch_wheel())
    except npu_contract.WheelUnavailable as error:
        if _under_ci():
            pytest.fail(f"{error}; under CI (CI={os.environ['CI']}) the npu-standin-contract check must run",
                        pytrace=False)
        pytest.skip(f"{error}; the npu-standin-contract check did not run")


@pytest.fixture(scope="module")
def real():
    return real_or_skip()


def _failure(real, **kwargs) -> OracleFailure:
    with pytest.raises(OracleFailure) as raised:
        npu_contract.check(real, **kwargs)
    assert raised.value.oracle == "npu-standin-contract"
    return raised.value


def _line(relative: str, text: str) -> int:
    """The line of `text` in the installed SGLang's file (where a mutant edit lands)."""
    from harness.versions import require_sglang

    source = (Path(require_sglang()) / relative).read_text()
    return source[: source.index(text)].count("\n") + 1


def test_clean_standin_and_clean_sglang_pass(real):
    contract = npu_contract.check(real)
    # every graph entry point the stand-in offers was compared, NPUGraph's methods included, and agreed
    compared = set(contract.signatures)
    assert {f"torch.npu.{name}" for name in npu_contract.GRAPH_API} <= compared
    assert {f"torch.npu.NPUGraph.{m}" for m in ("capture_begin", "capture_end", "replay", "reset", "pool",
                                                 "update")} <= compared
    assert {f"torch_npu.profiler.{name}" for name in npu_contract.PROFILER_API} <= compared
    assert all(ours == theirs for ours, theirs, _ in contract.signatures.values())
    assert contract.signatures["torch.npu.NPUGraph.update"][1] == "(self, cpu_update_input)"
    # what SGLang's NPU capture path uses was found, at the sites the scan read
    assert f"{RUNNER}:{_line(RUNNER, 'return torch.npu.NPUGraph()')}" in contract.uses["torch.npu.NPUGraph"][0]
    assert {"torch.npu.graph", "torch_npu.profiler.ExportType.Text", "torch_npu._C._weak_ref_tensor",
            "torch.npu.graph_pool_handle"} <= set(contract.uses)
    assert "missing" not in {evidence for _, evidence in contract.uses.values()}


def _update_renamed(self, cpu_update_inputs):
    """NPUGraph.update with its parameter renamed."""


def _graph_with_cuda_defaults(self, cuda_graph, pool=None, stream=None, capture_error_mode=None, **ignored):
    """The stand-in's graph before the contract: the CUDA stand-in's signature."""


@pytest.mark.parametrize("target, name, replacement, expected", [
    (ascend.NPUGraph, "update", _update_renamed,
     ["torch.npu.NPUGraph.update", "(self, cpu_update_inputs)", "(self, cpu_update_input)",
      "'cpu_update_input' in the real one): name 'cpu_update_inputs'"]),
    (ascend.npu_graph, "__init__", _graph_with_cuda_defaults,
     ["torch.npu.graph", "(cuda_graph, pool=None, stream=None, capture_error_mode=None, **ignored)",
      "(npu_graph, pool=None, stream=None, auto_dispatch_capture=False, capture_error_mode='global')",
      "parameter 1 ('npu_graph' in the real one): name 'cuda_graph'"]),
], ids=["NPUGraph.update-renamed", "graph-cuda-signature"])
def test_a_standin_signature_unlike_the_real_one_fails(real, monkeypatch, target, name, replacement, expected):
    monkeypatch.setattr(target, name, replacement)
    failure = _failure(real)
    for words in expected:
        assert words in failure.diagnosis, failure.diagnosis
    assert "torch_npu/npu/graphs.py:" in failure.diagnosis  # where the real signature is


def test_a_standin_task_update_entry_without_its_handle_fails(real, monkeypatch):
    def graph_task_update_begin(stream): ...

    monkeypatch.setitem(ascend.GRAPH_TASK_API, "graph_task_update_begin",
                        ascend._task_group_only("graph_task_update_begin", graph_task_update_begin))
    failure = _failure(real)
    assert "torch.npu.graph_task_update_begin(stream)" in failure.diagnosis
    assert "torch.npu.graph_task_update_begin(stream, handle)" in failure.diagnosis
    assert "only the real one has parameter(s) handle" in failure.diagnosis


@pytest.mark.parametrize("relative, old, new, expected", [
    (RUNNER, "return torch.npu.NPUGraph()", "return torch.npu.NPUGraphV2()",
     ["torch.npu.NPUGraphV2", "torch_npu.npu has no 'NPUGraphV2'"]),
    (RUNNER, "torch_npu.profiler.ExportType.Text", "torch_npu.profiler.ExportType.Txt",
     ["torch_npu.profiler.ExportType.Txt", "torch_npu.profiler.ExportType has no 'Txt'"]),
    (RUNNER, "                auto_dispatch_capture=True,", "                auto_dispatch=True,",
     ["SGLang calls torch.npu.graph(", "auto_dispatch=True", "unexpected keyword argument 'auto_dispatch'",
      "auto_dispatch_capture=False"]),
], ids=["torch.npu-attribute", "profiler-member", "graph-keyword"])
def test_sglang_using_what_the_real_package_lacks_fails(real, relative, old, new, expected):
    root = scratch_sglang([(relative, old, new)])
    failure = _failure(real, sglang_dir=root / "sglang")
    site = f"{relative}:{_line(relative, old)}"
    assert site in failure.diagnosis or relative in failure.diagnosis and "calls" in failure.diagnosis, \
        failure.diagnosis  # a call's site is where its callee is named, a line or two above the keyword
    for words in expected:
        assert words in failure.diagnosis, failure.diagnosis
    assert len(failure.details["mismatches"]) == 1  # that one, nothing else


def test_npu_graph_update_needs_auto_dispatch_capture_as_the_real_one():
    """The stand-in refuses `update` on a graph captured without `auto_dispatch_capture=True`, as torch_npu does
    (SGLang passes it, so dropping it fails here as on an NPU), and records the update otherwise (the classes the
    npu personality binds as `torch.npu.NPUGraph` / `torch.npu.graph`, on the bare virtual device)."""
    with cpu.install():
        x = torch.zeros(2)
        plain, dispatched = ascend.NPUGraph(), ascend.NPUGraph()
        with ascend.npu_graph(plain, stream=streams.Stream()):
            x.add_(1)
        with pytest.raises(RuntimeError, match="auto_dispatch_capture=True"):
            plain.update(cpu_update_input=[{"actual_seq_lengths_kv": [3, 0]}])
        with ascend.npu_graph(dispatched, stream=streams.Stream(), auto_dispatch_capture=True):
            x.add_(1)
        dispatched.update(cpu_update_input=[{"actual_seq_lengths_kv": [3, 0]}])
        dispatched.replay()
        assert dispatched.updates == [[{"actual_seq_lengths_kv": [3, 0]}]] and x.tolist() == [3.0, 3.0]
    update_begin = ascend.GRAPH_TASK_API["graph_task_update_begin"]
    with pytest.raises(TypeError):
        update_begin(object())  # the real signature: (stream, handle)
    with pytest.raises(ascend.AscendUnavailable, match="graph_task_update_begin"):
        update_begin(object(), None)


@pytest.mark.subprocess
@pytest.mark.parametrize("ci", ["", "true"])
def test_a_wheel_that_cannot_be_had_skips_or_fails_under_ci(monkeypatch, tmp_path, ci):
    monkeypatch.setenv(npu_contract.CACHE_VARIABLE, str(tmp_path))
    monkeypatch.setenv("CI", ci)
    monkeypatch.setattr(npu_contract.subprocess, "run", lambda command, **kwargs: npu_contract.subprocess.
                        CompletedProcess(command, 1, "", "ERROR: Could not find a version (network unreachable)"))
    outcome = pytest.fail.Exception if ci else pytest.skip.Exception
    words = f"could not download torch-npu=={npu_contract.pinned_version()}.*network unreachable"
    with pytest.raises(outcome, match=words) as raised:
        real_or_skip()
    assert ("must run" in str(raised.value)) == bool(ci)
