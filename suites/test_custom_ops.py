"""SGLang's custom ops as torch.compile meets them (`harness/oracles/custom_op_contract.py`): every op SGLang
registers, found from its source (`harness/targets/custom_ops.py`), must have a fake implementation, and each op
whose own implementation runs off-GPU passes PyTorch's `torch.library.opcheck` on drawn sizes and dtypes.

On the CPU virtual device no compiled region of a real family reaches an SGLang op (its layers take their native
paths there), so the registry, not a family's trace, says which ops to hold. On a GPU (`--device cuda`) the same
opcheck runs the ops' CUDA kernels."""
from __future__ import annotations

import dataclasses

import pytest
from hypothesis import example as explicit, given, strategies as st

from harness.devices.custom_ops import add_cpu_kernel
from harness.errors import PathMissing
from harness.oracles import custom_op_contract
from harness.profiles import suite_settings
from harness.record import example
from harness.targets import custom_ops
from harness.versions import sglang_version
from strategies.custom_ops import OpCase, op_cases

RECORD = "real_models_custom_ops"


@pytest.fixture(scope="module")
def registry(layout):  # the layout first: it prepares SGLang's imports (the sgl_kernel stand-in where needed)
    try:
        return custom_ops.load()
    except PathMissing as missing:
        pytest.skip(str(missing))


def test_every_sglang_custom_op_is_registered_with_a_fake_implementation(registry, device):
    with example(RECORD, check="fake implementations") as ex:
        ex.note("registering_modules", len(registry.modules))
        ex.note("modules_not_importable_here", registry.import_errors)
        custom_op_contract.check_imports(registry.own_import_errors(), len(registry.modules))
        ex.note("declared_at_import", custom_op_contract.check_registered(registry.declared,
                                                                           set(custom_ops.registered_ops())))
        ex.note("ops_checked", custom_op_contract.check_fakes(registry.sites))


def each_runnable_op(test):
    """An explicit case of every op the harness can run here, so every gate holds each one: sizes where a GEMM's
    in and out features differ (a fake that swaps them is wrong) and a collective's output starts unlike its
    input (a write into it shows)."""
    for seed, op in enumerate(sorted(custom_ops.RUNNABLE)):
        test = explicit(case=OpCase(op, rows=3, cols=5, inner=8, dtype="float32", bias=True, seed=seed))(test)
    return test


@suite_settings(gate_examples=6)
@each_runnable_op
@given(case=st.deferred(lambda: op_cases(custom_ops.load().runnable())))
def test_custom_op_passes_opcheck(registry, case, device):
    with example(RECORD, **dataclasses.asdict(case)) as ex:
        if case.op not in registry.sites:  # an explicit case on an older release: nothing to hold
            ex.note("absent", f"SGLang {sglang_version()} registers no sglang::{case.op}")
            return
        add_cpu_kernel(case.op, registry.implementation(case.op))  # SGLang's function; a no-op where one exists
        args = custom_ops.inputs(case, custom_ops.one_rank_group(), device.torch_device)
        ex.note("site", registry.sites[case.op])
        refused = custom_ops.refusal(case.op, args)
        if refused:  # the op's own precondition, not its registration: nothing for opcheck to judge
            ex.note("refused", refused)
            return
        ex.note("opcheck", custom_op_contract.check_opcheck(case.op, registry.sites[case.op], args))
