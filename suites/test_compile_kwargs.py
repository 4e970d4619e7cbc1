"""build_torch_compile_kwargs: draw a platform and what its compile hooks return, let SGLang's real function
build the torch.compile kwargs, check the hook contract, then compile a real module with them and compare with
eager (known bug class 3, SGLang PR #36249)."""
from __future__ import annotations

import inspect

import pytest
from hypothesis import example as explicit, given, strategies as st

from harness.errors import HarnessError, PathMissing
from harness.models.small import ModuleSpec
from harness.oracles import compile_contract
from harness.oracles.compiles import PlatformError, check_compiles
from harness.oracles.hooks import HookRecorder
from harness.profiles import suite_settings
from harness.record import example
from harness.targets import compile_kwargs as target
from strategies.compile_kwargs import CompileCase, compile_cases, recording_backend

RESOLVE_DEFAULT_MODE = "max-autotune-no-cudagraphs"  # what the denoising stage passes as default
SMALL = ModuleSpec("mlp", 2, 8, "float32")


@pytest.fixture(scope="module")
def compile_path():
    try:
        return target.load()
    except PathMissing as missing:
        pytest.skip(str(missing))
    except HarnessError as error:
        pytest.fail(str(error), pytrace=False)


class CompileOutcomes(dict):
    """Compile outcomes per (kwargs, module) for this module's run: a compile costs seconds on a CPU."""

    def __repr__(self) -> str:
        return f"<{len(self)} cached compile outcomes>"


@pytest.fixture(scope="module")
def compile_outcomes() -> CompileOutcomes:
    return CompileOutcomes()


def effective_mode(case: CompileCase) -> str | None:
    """The mode SGLang's entry point works with: resolve_torch_compile_kwargs asks none on NPU, else the
    configured mode or its default."""
    if case.entry == "build":
        return case.mode
    return None if case.platform == "npu" else (case.mode or RESOLVE_DEFAULT_MODE)


@suite_settings(gate_examples=40)
# Drawn lazily, after the path fixture resolved the release: only entry points and flags it has.
@given(case=st.deferred(lambda: compile_cases(**target.capabilities())))
# Pinned regressions of bug class 3: options with a mode, hooks answering for inductor, a callable backend.
@explicit(case=CompileCase("oot", "inductor", {"epilogue_fusion": True, "max_autotune": False}, "max-autotune",
                      "build", True, SMALL))
@explicit(case=CompileCase("oot", "inductor", None, "max-autotune-no-cudagraphs", "build", True, SMALL))
@explicit(case=CompileCase("oot", recording_backend, None, None, "build", True, SMALL))
@explicit(case=CompileCase("npu", "inductor", None, None, "build", True, SMALL))
def test_compile_kwargs(case: CompileCase, compile_path, compile_outcomes):
    check_case(case, compile_path, compile_outcomes)


def platform_refusal(case: CompileCase) -> tuple[str, str] | None:
    """(rule, reason) when the out-of-tree platform's own hook values cannot compile, from the case alone (None:
    they can). torch.compile looks a string backend up among its registered names, and hands a backend other than
    inductor its non-empty options as the keyword `options` (`torch._TorchCompileWrapper`). The platform's options
    are per module (its `get_compile_options(module)` hook): a call without a module asks for none, so none reach
    torch.compile."""
    if case.platform != "oot":
        return None
    from torch._dynamo import list_backends
    from torch._dynamo.backends.registry import lookup_backend

    name = getattr(case.backend, "__name__", case.backend)
    if isinstance(case.backend, str) and case.backend not in list_backends(exclude_tags=()) + ["inductor"]:
        return "platform-unknown-backend", f"the platform's backend {name!r} is no registered torch.compile backend"
    if case.options and case.pass_module and case.backend != "inductor":
        params = inspect.signature(lookup_backend(case.backend)).parameters.values()
        if not any(p.name == "options" or p.kind is p.VAR_KEYWORD for p in params):
            return ("platform-backend-takes-no-options", f"torch.compile hands the platform's backend {name} its "
                    "options as keyword `options`, which it does not take")
    return None


def replay_case(drawn: dict) -> None:
    """One recorded example, without Hypothesis or pytest: what repro scripts and pinned regressions call."""
    check_case(CompileCase.from_drawn(drawn), target.load(), CompileOutcomes())


def check_case(case: CompileCase, compile_path, compile_outcomes) -> None:
    """One example: SGLang builds the kwargs under the case's platform; the contract and the compile are checked."""
    rule = platform_refusal(case)  # from the case, before SGLang builds anything
    with example("compile_kwargs", **case.drawn()) as ex:
        hooks, module, mode = HookRecorder(), case.module.build(), effective_mode(case)
        with target.platform_scope(compile_path, case.platform, backend=case.backend, options=case.options,
                                   hooks=hooks):
            kwargs = target.call(compile_path, case.entry, mode=case.mode,
                                 module=module if case.pass_module else None, comm_overlap=case.comm_overlap)
        ex.note("kwargs", {k: getattr(v, "__name__", v) for k, v in kwargs.items()})
        compile_contract.check(case.platform, mode=mode, module=module if case.pass_module else None,
                               backend=case.backend, options=case.options, kwargs=kwargs, hooks=hooks)
        own = {"backend": case.backend, "options": case.options} if case.platform == "oot" else None
        refused = None
        try:
            check_compiles(kwargs, case.module, platform_values=own, cache=compile_outcomes)
        except PlatformError as error:
            refused = str(error)
        ex.audit_refusal(rule, refused=refused, oracle="compiles", what="the platform's own compile settings",
                         backend=getattr(case.backend, "__name__", case.backend), options=case.options)
