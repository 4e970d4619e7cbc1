"""SGLang's custom-op registrations (`suites/test_custom_ops.py`, oracle `custom-op-contract`), each mutant on a
scratch copy of SGLang, the clean run the suite's own:

- fake_removed: MXFP4's dequantisation op registered without its fake implementation (a GPU-only op: the check of
  fakes holds the whole registry, not the ops this machine can run); its first compiled caller would fail at trace
  time with "has no fake impl".
- function_form_registers_nothing: `register_custom_op(function, ...)` (the call form, not the decorator) returns
  its decorator instead of applying it, so the op is never registered (seed 12011 of `mutate` left this alive
  before `check_registered`): the registry's source scan names each op a module registers at import.
- registration_raises_at_import: NemotronH's Mamba2 op given both `fake_impl=` and `out_shape=`, which the helper
  refuses with an assertion, so `nemotron_h.py` (no served family imports it here) no longer imports and every op
  it registers drops out of the other checks: a module failing in SGLang's own code is a failure, unlike one that
  lacks a package or a GPU. (A module the served families import fails their collection first, loudly.)
- gemm_fake_swaps_features: the bf16 GEMM op's fake sizes its output by the weight's in-features, not its
  out-features; opcheck's `test_faketensor` sees the fake and real outputs differ.
- all_gather_write_undeclared: the all-gather op registered without `mutates_args=["output"]`, so its schema says
  it writes nothing while it fills its output; opcheck's `test_schema` sees the write (a compiled graph may drop or
  reorder it).
"""
from __future__ import annotations

import pytest

from tests.mutant_runs import Mutant, assert_caught, tiered

pytestmark = pytest.mark.subprocess

FAKES = "suites/test_custom_ops.py::test_every_sglang_custom_op_is_registered_with_a_fake_implementation"
OPCHECK = "suites/test_custom_ops.py::test_custom_op_passes_opcheck"

MUTANTS = {
    "fake_removed": Mutant(
        test=FAKES,
        edits=[("srt/layers/quantization/mxfp4.py", "@register_custom_op(fake_impl=_dequant_mxfp4_fake)\n",
                "@register_custom_op(fake_impl=None)\n")],
        oracle="custom-op-contract",
        texts=["sglang::dequant_mxfp4 (srt/layers/quantization/mxfp4.py:292)", "no fake implementation"]),
    "function_form_registers_nothing": Mutant(
        test=FAKES,
        edits=[("srt/utils/custom_op.py",
                "    if fn is not None:\n        return decorator(fn)\n    return decorator\n",
                "    return decorator\n")],
        oracle="custom-op-contract",
        texts=["are not registered after the import", "sglang::fused_inplace_qknorm (srt/models/utils.py:773)"]),
    "registration_raises_at_import": Mutant(
        test=FAKES,
        edits=[("srt/models/nemotron_h.py", '@register_custom_op(mutates_args=["output"])\n@register_split_op()\n',
                '@register_custom_op(mutates_args=["output"], out_shape=None, fake_impl=None)\n'
                '@register_split_op()\n')],
        oracle="custom-op-contract",
        texts=["fail to import, in SGLang's own code", "sglang.srt.models.nemotron_h: AssertionError"]),
    "gemm_fake_swaps_features": Mutant(
        test=OPCHECK,
        edits=[("srt/layers/quantization/unquant.py",
                "    return x.new_empty((*x.shape[:-1], weight.shape[0]))\n",
                "    return x.new_empty((*x.shape[:-1], weight.shape[1]))\n")],
        oracle="custom-op-contract",
        texts=["sglang::bf16_gemm_dispatch (srt/layers/quantization/unquant.py:465)", "fails test_faketensor"]),
    "all_gather_write_undeclared": Mutant(
        test=OPCHECK,
        edits=[("srt/distributed/parallel_state.py",
                '@register_custom_op(mutates_args=["output"])\ndef reg_all_gather_into_tensor(',
                "@register_custom_op()\ndef reg_all_gather_into_tensor(")],
        oracle="custom-op-contract",
        texts=["sglang::reg_all_gather_into_tensor", "fails test_schema", "does not declare mutable"]),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", tiered(MUTANTS))
def test_mutant_fails_with_its_diagnosis(name, tmp_path):
    assert_caught(name, MUTANTS[name], tmp_path)
