"""The sgl_kernel stand-in: strict import-time names on a CPU machine, every kernel name on a GPU machine without
the package, and kernels that raise when called (each case in a fresh process: the stand-in is process-wide)."""
from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from harness.devices import prepare


def run(code: str) -> str:
    result = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr
    return result.stdout


@pytest.mark.subprocess
def test_gpu_standin_answers_every_kernel_and_keeps_non_kernel_fallbacks():
    out = run("""
        import torch
        from harness.devices import sgl_kernel_standin as s
        assert s.ensure("cuda") is not None
        from sgl_kernel import top_k_renorm_prob, weak_ref_tensor      # a lazily imported kernel name
        from sgl_kernel.quantization import ggml_dequantize
        t = torch.arange(3.0)
        alias = weak_ref_tensor(t)
        assert alias.data_ptr() == t.data_ptr()                        # the device layer's weak reference
        try:
            top_k_renorm_prob(t)
        except s.SglKernelStandInCalled as error:
            print("raised:", error)
        try:
            import sgl_kernel.scalar_type                              # SGLang falls back when it is missing
        except ImportError:
            print("scalar_type missing")
    """)
    assert "raised: sgl_kernel.top_k_renorm_prob() was called" in out
    assert "scalar_type missing" in out


@pytest.mark.subprocess
def test_cpu_standin_answers_only_the_import_time_names():
    out = run("""
        from harness.devices import sgl_kernel_standin as s
        s.ensure("cpu")
        from sgl_kernel.kvcacheio import transfer_kv_direct
        try:
            from sgl_kernel import rmsnorm
        except ImportError:
            print("rmsnorm missing: SGLang's fallback is taken")
    """)
    assert "rmsnorm missing" in out


def test_prepare_needs_nothing_without_a_gpu():
    assert prepare("cpu") == "not needed"
    assert prepare("cuda") == "not needed (no GPU)"
