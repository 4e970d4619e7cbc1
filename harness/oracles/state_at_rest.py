"""Oracle `state-at-rest`: a capture or compile pass leaves the model and the process as it found them.

SGLang's runners enter states for their capture and compile passes and must leave them: `patch_model` switches
every fused op (`BaseFusedOp.enter_torch_compile`: `is_torch_compile`, `_forward_method`,
`_original_forward_method`) and backs up the TP group's custom all-reduce (`ca_comm`); a capture runs under
`torch.no_grad` or inference mode; a compile pass may set flags on modules. A state left changed is invisible
where the op's two forwards agree (most do on a CPU) and changes what the next eager forward runs on hardware.

What is compared, before the pass and after it (`snapshot`), derived from the objects, not listed per op:
- every module of the model: its non-tensor, non-module attributes (flags, numbers, strings, None, and callables
  by identity: a bound method by its function and owner), `training`, and an instance-level `forward` override;
- the TP group's `ca_comm` (by identity);
- torch's process state: grad mode, inference mode, default dtype, float32 matmul precision, deterministic
  algorithms, `torch.compiler.is_compiling()`.

Not leaks, by SGLang's design:
- a fused op's dispatch (`_forward_method`) resolved lazily on first use (a capture's warm-up is often the first):
  None becoming exactly the op's own `_resolve_forward_method()` is allowed, anything else is not;
- a forward SGLang installs for the runner's lifetime (`install_torch_compiled`'s: the piecewise prefill runner
  compiles the model body in place; `INSTALLERS`);
- what a first forward builds lazily: an attribute created at rest (a falsy flag, None, 0), a placeholder None
  replaced by a registered submodule, parameter or buffer.
A warm model (it ran before the pass: the suites keep one model per family and process, and SGLang shares one
rotary embedding per configuration across models) has nothing left to resolve or build, so nothing of it may
change. Each difference is named by module, attribute and both values."""
from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch

from harness.oracles import OracleFailure

ORACLE = "state-at-rest"
_SKIP = {"_parameters", "_buffers", "_modules", "_non_persistent_buffers_set", "_state_dict_hooks",
         "_state_dict_pre_hooks", "_load_state_dict_pre_hooks", "_load_state_dict_post_hooks"}
_LAZY = "_forward_method"  # a fused op's dispatch, resolved on first use
# SGLang functions whose product is a forward installed on a module for the runner's lifetime (the piecewise
# prefill runner compiles the model body in place: `install_torch_compiled` sets an instance `forward`)
INSTALLERS = ("install_torch_compiled",)
_NOT_COMPARED = object()  # `_token` of a value the snapshot leaves out


def _token(value: Any) -> Any:
    """What identifies a value for the comparison, or a sentinel for values not compared (tensors, modules,
    containers the pass may legitimately fill)."""
    if value is None or isinstance(value, (bool, int, float, str, torch.dtype)):
        return value
    if hasattr(value, "__func__") and hasattr(value, "__self__"):  # a bound method
        return ("method", id(value.__self__), value.__func__)
    if callable(value) and not isinstance(value, (torch.nn.Module, type)):
        return ("callable", id(value))
    return _NOT_COMPARED



def _describe(value: Any) -> str:
    if isinstance(value, tuple) and value and value[0] == "method":
        return f"<bound {getattr(value[2], '__qualname__', value[2])}>"
    if isinstance(value, tuple) and value and value[0] == "callable":
        return f"<callable at {value[1]:#x}>"
    return repr(value)


def process_state() -> dict[str, Any]:
    return {
        "torch.is_grad_enabled()": torch.is_grad_enabled(),
        "torch.is_inference_mode_enabled()": torch.is_inference_mode_enabled(),
        "torch.get_default_dtype()": torch.get_default_dtype(),
        "torch.get_float32_matmul_precision()": torch.get_float32_matmul_precision(),
        "torch.are_deterministic_algorithms_enabled()": torch.are_deterministic_algorithms_enabled(),
        "torch.compiler.is_compiling()": torch.compiler.is_compiling(),
    }


def snapshot(model: torch.nn.Module, tp_group: Any = None) -> dict[str, Any]:
    """The state a pass must leave as it found it, keyed "module.attribute" (the model's own keys start with
    "model")."""
    state: dict[str, Any] = {}
    for name, module in model.named_modules(prefix="model"):
        for attribute, value in vars(module).items():
            if attribute in _SKIP or attribute.endswith("_hooks"):
                continue
            token = _token(value)
            if token is not _NOT_COMPARED:
                state[f"{name}.{attribute}"] = token
    if tp_group is not None:
        state["tp_group.ca_comm"] = ("object", id(getattr(tp_group, "ca_comm", None)))
    state.update(process_state())
    return state


def _owner(model: torch.nn.Module, key: str) -> tuple[torch.nn.Module, str]:
    """The module a "model.a.b.attribute" key lives on, and the attribute."""
    *path, attribute = key.split(".")[1:]
    module = model
    for part in path:
        module = getattr(module, part)
    return module, attribute


def _resolved_forward(model: torch.nn.Module, key: str) -> Any:
    """What a fused op's lazy dispatch resolves to (`_resolve_forward_method()`), as a token; None where the
    module has no resolver."""
    resolve = getattr(_owner(model, key)[0], "_resolve_forward_method", None)
    return None if resolve is None else _token(resolve())


def _lazily_built(model: torch.nn.Module, key: str, was: Any, now: Any) -> bool:
    """A first forward's own construction, not a leak: an attribute created at rest (a falsy flag, None, 0), or
    one moved into the module's registered children, parameters or buffers (set as a module after a placeholder
    None)."""
    if was == "<absent>":
        return not isinstance(now, tuple) and not now
    if now == "<absent>" and key.startswith("model."):
        module, attribute = _owner(model, key)
        return attribute in module._modules or attribute in module._parameters or attribute in module._buffers
    return False


def _installed(token: Any) -> bool:
    function = token[2] if isinstance(token, tuple) and token and token[0] == "method" else None
    qualname = getattr(function, "__qualname__", "")
    return any(f"{installer}.<locals>." in qualname for installer in INSTALLERS)


def differences(before: dict[str, Any], after: dict[str, Any], model: torch.nn.Module) -> list[str]:
    """Every key whose value the pass changed, in words, less what the module docstring lists as SGLang's design
    (a lazy dispatch resolved to its own forward, an installed compiled forward, a first forward's construction)."""
    changed = []
    for key in sorted(before.keys() | after.keys()):
        was, now = before.get(key, "<absent>"), after.get(key, "<absent>")
        if was == now:
            continue
        if key.endswith("." + _LAZY) and was is None and now == _resolved_forward(model, key):
            continue
        if key.endswith(".forward") and was == "<absent>" and _installed(now):
            continue
        if _lazily_built(model, key, was, now):
            continue
        changed.append(f"{key}: {_describe(was)} before, {_describe(now)} after")
    return changed


@contextlib.contextmanager
def watching(model: torch.nn.Module, what: str, *, tp_group: Any = None) -> Iterator[None]:
    """Raise `OracleFailure` if the pass inside the block leaves any of `snapshot`'s state changed."""
    before = snapshot(model, tp_group)
    yield
    fresh = any(key.endswith("." + _LAZY) and value is None for key, value in before.items())  # any unresolved
    changed = differences(before, snapshot(model, tp_group), model)
    if changed:
        shown = "; ".join(changed[:6]) + (f"; and {len(changed) - 6} more" if len(changed) > 6 else "")
        raise OracleFailure(ORACLE, f"{what} left {len(changed)} piece(s) of state changed on a "
                                    f"{'fresh' if fresh else 'warm'} model: {shown}", changed=changed)
