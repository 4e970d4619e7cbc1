"""Oracle `custom-op-contract`: every custom op SGLang registers can go through torch.compile, and its registration
tells PyTorch the truth about it, as PyTorch's own `torch.library.opcheck` judges.

Dynamo and AOTAutograd never run a custom op's kernel while tracing: they run its fake implementation on fake
tensors, and trust its schema for what it mutates and aliases. So the contract has three parts:
- `check_imports` and `check_registered`: every module of SGLang that registers ops imports (unless a package or
  GPU this machine lacks stops it), and every op it registers at its import (found in its source) exists after.
- `check_fakes`: every op of SGLang's library has a fake implementation (or a Meta kernel, or decomposes). Without
  one, the first compiled region that reaches it fails at trace time ("... has no fake impl"), a failure users
  report from model code; the check needs no kernel, so it holds every op SGLang registers, GPU-only ones included.
- `check_opcheck`: where the op's own implementation runs on this machine, `torch.library.opcheck` on drawn inputs:
  `test_schema` (every input it writes is declared mutable, nothing it returns aliases an input), `test_faketensor`
  (the fake output has the real output's shape, dtype and strides), `test_autograd_registration`, and
  `test_aot_dispatch_dynamic` (AOTAutograd with dynamic shapes gives the eager result). A wrong `mutates_args` lets
  a compiled graph reorder or drop the write; a wrong fake shape mis-sizes every buffer after it.
Each diagnosis names the op, the file and line where SGLang defines it, the test and the relation broken.
"""
from __future__ import annotations

import torch
from torch.utils._python_dispatch import _disable_current_modes

from harness.oracles import OracleFailure

ORACLE = "custom-op-contract"
OPCHECK_TESTS = ("test_schema", "test_autograd_registration", "test_faketensor", "test_aot_dispatch_dynamic")
BROKEN = {  # what a failing opcheck test means for the op's registration
    "test_schema": "the op writes an input its schema does not declare mutable (`mutates_args`), or returns an "
                   "alias of an input",
    "test_autograd_registration": "inputs that require grad reach a kernel with no autograd registration",
    "test_faketensor": "its fake implementation disagrees with its real output (or is missing), so every traced "
                       "size after it is wrong",
    "test_aot_dispatch_dynamic": "AOTAutograd with dynamic shapes does not give eager's result",
}


def has_fake(qualname: str) -> bool:
    """Whether torch.compile can trace a call of `qualname` (`ns::name`): a registered fake, a Meta kernel, or a
    composite kernel that decomposes into ops that have one."""
    from torch._library.simple_registry import singleton

    if singleton.find(qualname).fake_impl.kernel is not None:
        return True
    return any(torch._C._dispatch_has_kernel_for_dispatch_key(qualname, key)
               for key in ("Meta", "CompositeImplicitAutograd", "CompositeExplicitAutograd"))


def check_fakes(sites: dict[str, str], namespace: str = "sglang") -> int:
    """Fail naming every op of `sites` ({name: "path:line"}) without a fake implementation; returns how many were
    checked."""
    missing = sorted(name for name in sites if not has_fake(f"{namespace}::{name}"))
    if missing:
        where = ", ".join(f"{namespace}::{name} ({sites[name]})" for name in missing)
        raise OracleFailure(
            ORACLE, f"{len(missing)} of the {len(sites)} custom ops SGLang registers have no fake implementation: "
            f"{where}; a compiled region that reaches one fails at trace time (\"has no fake impl\"): "
            "`register_custom_op` takes `fake_impl=` or derives one from `out_shape=`",
            ops=missing, sites={name: sites[name] for name in missing})
    return len(sites)


def check_imports(own_errors: dict[str, str], modules: int) -> None:
    """Fail naming every module of SGLang that registers ops and fails to import here for a reason in SGLang's own
    code (`own_errors`: {module: "Type: message (file:line)"}): its ops are missing from every other check."""
    if own_errors:
        where = "; ".join(f"{module}: {why}" for module, why in sorted(own_errors.items()))
        raise OracleFailure(
            ORACLE, f"{len(own_errors)} of the {modules} SGLang modules that register custom ops fail to import, "
            f"in SGLang's own code (not for a package or GPU this machine lacks): {where}", modules=own_errors)


def check_registered(declared: dict[str, str], registered: set[str], namespace: str = "sglang") -> int:
    """Fail naming every op SGLang's source registers at a module's import (`declared`: {name: "path:line"}) that
    the dispatcher does not hold once the module imported: the registration did not run (or ran under another
    name), so the first call of it, compiled or not, fails; returns how many were checked."""
    missing = sorted(set(declared) - registered)
    if missing:
        where = ", ".join(f"{namespace}::{name} ({declared[name]})" for name in missing)
        raise OracleFailure(
            ORACLE, f"{len(missing)} of the {len(declared)} custom ops SGLang's modules register at import are not "
            f"registered after the import: {where}; the registration helper returned without registering them",
            ops=missing, sites={name: declared[name] for name in missing})
    return len(declared)


def _shapes(values) -> list:
    return [f"{tuple(v.shape)} {str(v.dtype).removeprefix('torch.')}" if isinstance(v, torch.Tensor) else repr(v)
            for v in values]


def check_opcheck(name: str, site: str, args: tuple, kwargs: dict | None = None, namespace: str = "sglang") -> dict:
    """`torch.library.opcheck` of `namespace::name` on (`args`, `kwargs`); fail on the first test it fails. Run
    outside any dispatch mode the caller holds (the virtual device's stream-order mode would meet opcheck's own
    higher-order ops). Returns opcheck's verdict per test."""
    op = getattr(getattr(torch.ops, namespace), name).default
    with _disable_current_modes():
        results = torch.library.opcheck(op, args, kwargs or {}, test_utils=OPCHECK_TESTS, raise_exception=False)
    for test in OPCHECK_TESTS:
        outcome = results.get(test, "SUCCESS")
        if outcome != "SUCCESS":
            cause = outcome.__cause__ or outcome
            first = (str(cause).strip().splitlines() or [type(cause).__name__])[0][:400]
            raise OracleFailure(
                ORACLE, f"torch.library.opcheck of {namespace}::{name} ({site}) fails {test}: {BROKEN[test]} "
                f"({type(cause).__name__}: {first}); inputs {_shapes(args)}",
                op=f"{namespace}::{name}", site=site, test=test, error=f"{type(outcome).__name__}: {outcome}"[:2000],
                inputs=_shapes(args))
    return {test: "SUCCESS" for test in results}
