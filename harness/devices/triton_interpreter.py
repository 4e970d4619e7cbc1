"""SGLang's Triton kernels on the CPU virtual device: run by Triton's own CPU interpreter.

The virtual device has no Triton driver, so a `@triton.jit` kernel cannot compile here. `interpret_kernels(modules)`
swaps every Triton kernel those modules hold by name (`JITFunction`s, and `Autotuner`/`Heuristics` wrappers: an
autotuner's first config, each heuristic computed per launch as Triton computes it) for an `InterpretedKernel`,
launched as SGLang launches it (`kernel[grid](*args)`) and run by `triton.runtime.interpreter.InterpretedFunction`.
The `@triton.jit` helpers a kernel calls (its module's, `tl.cdiv` ...) are interpreted too while it runs.

Why this route and not `TRITON_INTERPRET=1`: that switch acts when `@triton.jit` decorates, i.e. at the import of
SGLang's kernel modules, process-wide and for every suite of a pytest worker; this one is scoped to a `with` block
(a `pytest.MonkeyPatch`) and to the modules named, and it gives each launch one place to be recorded.

Each launch is opaque to Dynamo (`torch._dynamo.disable`): a compiled region of a real model (`--enable-torch-compile`)
calls it as a graph break instead of tracing Triton's interpreter, which Dynamo cannot (`_patch_attr.<lambda>`).

Inside a record-mode capture each launch goes through `harness.devices.cpu.record_launch`: the kernel, its grid
and its arguments (tensors by identity, scalars baked in) are kept and launched again, in order with the recorded
aten ops, at every replay, as a CUDA graph replays its kernels.
"""
from __future__ import annotations

import contextlib
import functools
import os
import sys
import types
from typing import Any
from collections.abc import Iterable, Iterator

import pytest

__all__ = ["InterpretedKernel", "interpret_kernels", "keep_traced", "LAUNCHES"]

LAUNCHES: list[str] = []  # kernel names launched while a patch set was active (the harness's evidence of real use)


def _jit_function(kernel: Any) -> Any:
    """The `JITFunction` under Triton's `Autotuner` / `Heuristics` wrappers, or None for anything else."""
    from triton.runtime.jit import JITFunction

    seen = 0
    while kernel is not None and seen < 4:
        if isinstance(kernel, JITFunction):
            return kernel
        kernel, seen = getattr(kernel, "fn", None), seen + 1
    return None


_PATCHED_LANGS: set[int] = set()  # ids of the triton.language modules the running launch's patch holds


def _langs(fn: Any) -> set[int]:
    """The `triton.language` modules Triton's interpreter patches for `fn` (those its globals name)."""
    import triton.language as tl

    return {id(v) for v in fn.__globals__.values() if isinstance(v, types.ModuleType) and v in (tl, tl.core)}


@functools.cache
def _helper_class() -> type:
    """Triton's `InterpretedFunction` for a helper called inside a launch (see `_helper`)."""
    from triton.runtime.interpreter import InterpretedFunction, InterpreterError

    class InterpretedHelper(InterpretedFunction):
        def __call__(self, *args, **kwargs):
            langs = _langs(self.fn)
            if not langs <= _PATCHED_LANGS:
                _PATCHED_LANGS.update(langs)
                return super().__call__(*args, **kwargs)  # patches them (Triton never restores that patch)
            try:
                return self.rewrite()(*args, **kwargs)
            except Exception as error:
                raise InterpreterError(repr(error)) from error

    return InterpretedHelper


@functools.cache  # keyed by the Python function (plain identity)
def _helper(fn: Any) -> Any:
    """`fn` (a `@triton.jit` helper's Python function) as Triton's `InterpretedFunction`, called inside a launch;
    one per function (built at every launch, its `inspect.signature` was 3 s of the real-model gate examples).

    Triton's interpreter re-patches all of `triton.language` at every device-function call (a scan of its members,
    about 3.5 ms, a third of a real model's interpreted time) and never restores that scope. The launch's own patch
    of the same modules holds for its whole grid, so the helper runs on it: the same rewritten body, without the
    re-patch."""
    return _helper_class()(fn)


@functools.cache
def _interpreted_builtin(member: Any) -> Any:
    """A `triton.language` builtin as Triton's interpreter patches it (`interpreter._patch_attr`)."""
    from triton.runtime.interpreter import interpreter_semantic

    def call(*args, **kwargs):
        return member(*args, **{k: v for k, v in kwargs.items() if k != "_semantic"}, _semantic=interpreter_semantic)

    return call


def _nested_patches(fn_globals: dict, patches: pytest.MonkeyPatch, done: set) -> None:
    """Interpret the `@triton.jit` helpers reachable from a kernel's globals (and `triton.language`'s own)."""
    import triton.language as tl
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction

    if id(fn_globals) in done:
        return
    done.add(id(fn_globals))
    for name, value in list(fn_globals.items()):
        if isinstance(value, InterpretedKernel):  # a helper swapped at module level: called, not launched
            value = value.original
        if _jit_function(value) is not None and not isinstance(value, InterpretedFunction):
            fn = _jit_function(value).fn
            patches.setitem(fn_globals, name, _helper(fn))
            _nested_patches(fn.__globals__, patches, done)
        elif tl.core.is_builtin(value):  # bound to a module-level name (FLA's `exp = tl.exp`): Triton's
            # interpreter patches `triton.language`'s own attributes only, so give it the same wrapper
            patches.setitem(fn_globals, name, _interpreted_builtin(value))
        elif isinstance(value, types.ModuleType) and value in (tl, tl.math) and id(value) not in done:
            done.add(id(value))
            for attr in dir(value):
                member = getattr(value, attr, None)
                if isinstance(member, JITFunction):
                    patches.setattr(value, attr, _helper(member.fn))


class InterpretedKernel:
    """One Triton kernel run by the CPU interpreter, launched as `kernel[grid](*args, **kwargs)`."""

    def __init__(self, kernel: Any) -> None:
        from triton.runtime.interpreter import InterpretedFunction

        jit = _jit_function(kernel)
        if jit is None:
            raise TypeError(f"{kernel!r} is not a Triton kernel")
        self.original = kernel
        self.name = jit.fn.__name__
        self.filename = os.path.realpath(jit.fn.__code__.co_filename)
        self.interpreted = InterpretedFunction(jit.fn)
        self.wrappers = _wrappers(kernel)

    def __getitem__(self, grid):
        return functools.partial(_launch, self, grid)

    def _run(self, grid, args, kwargs):
        LAUNCHES.append(self.name)
        traced = self.filename in _TRACED_FILES
        with contextlib.nullcontext() if traced else _untraced(), pytest.MonkeyPatch.context() as patches:
            _nested_patches(self.interpreted.fn.__globals__, patches, set())
            _PATCHED_LANGS.clear()
            _PATCHED_LANGS.update(_langs(self.interpreted.fn))
            try:
                return self.interpreted[grid](*args, **kwargs)
            finally:
                _PATCHED_LANGS.clear()

    def __repr__(self) -> str:
        return f"InterpretedKernel({self.name})"


_TRACED_FILES: set[str] = set()


def keep_traced(paths: Iterable[str]) -> None:
    """Kernels defined in `paths` (files a coverage run measures) run under the trace function; others do not."""
    _TRACED_FILES.update(os.path.realpath(path) for path in paths)


@contextlib.contextmanager
def _untraced() -> Iterator[None]:
    """The interpreter runs without this thread's trace function (coverage.py's tracer in a campaign), restored
    after: the tracer sees each of the interpreter's Python calls, and with it on a real-model EAGLE example took
    36 s instead of 18 s. A kernel in a file the campaign measures (`keep_traced`) stays traced.

    Coverage's C tracer is paused with its own `stop()`/`start()`: `sys.settrace(None)` and back would drop the
    return event of the frame that paused, and coverage would lose the lines its callers run afterwards."""
    tracer = sys.gettrace()
    if tracer is None:
        yield
    elif callable(getattr(tracer, "stop", None)) and callable(getattr(tracer, "start", None)):
        tracer.stop()
        try:
            yield
        finally:
            tracer.start()
    else:
        sys.settrace(None)
        try:
            yield
        finally:
            sys.settrace(tracer)


def _opaque_to_dynamo(fn):
    """`fn` marked opaque to Dynamo (`torch._dynamo.disable`): a compiled region calls it as a graph break. Dynamo
    cannot trace Triton's interpreter (`_patch_attr.<lambda>`); on a GPU the kernel is a real Triton launch, which
    Dynamo wraps natively, so this break is the device's, not SGLang's (`harness.oracles.graph_break.DEVICE_BREAKS`)."""
    import torch

    return torch._dynamo.disable(fn, reason="a Triton kernel run by Triton's CPU interpreter (the virtual device)")


@_opaque_to_dynamo
def _launch(kernel: InterpretedKernel, grid, *args, **kwargs):
    """One launch of `kernel` on `grid`, as SGLang launches it (`kernel[grid](*args, **kwargs)`)."""
    from harness.devices import cpu

    merged = _wrapper_kwargs(kernel.wrappers, args, kwargs)
    return cpu.record_launch(kernel.name, lambda: kernel._run(grid, args, merged))


def _wrappers(kernel: Any) -> list:
    """Triton's `Autotuner` / `Heuristics` wrappers around a kernel, outermost first (the order they run in)."""
    from triton.runtime.autotuner import Autotuner, Heuristics
    from triton.runtime.jit import JITFunction

    chain = []
    while not isinstance(kernel, JITFunction):
        if not isinstance(kernel, (Autotuner, Heuristics)):
            raise TypeError(f"{kernel!r}: a Triton wrapper the interpreted launch does not know")
        chain.append(kernel)
        kernel = kernel.fn
    return chain


def _wrapper_kwargs(wrappers: list, args: tuple, kwargs: dict) -> dict:
    """The keyword arguments the kernel gets once its wrappers ran, each seeing what the ones outside it added:
    an `Autotuner` adds its first config's kwargs (the caller's own value wins; the interpreter ignores num_warps);
    a `Heuristics` computes each of its values from the launch's arguments as `Heuristics.run` does (FLA's
    `lambda args: args["h0"] is not None`, SGLang's block sizes)."""
    from triton.runtime.autotuner import Heuristics

    kwargs = dict(kwargs)
    for wrapper in wrappers:
        if isinstance(wrapper, Heuristics):
            for name, heuristic in wrapper.values.items():
                kwargs[name] = heuristic({**dict(zip(wrapper.arg_names, args)), **kwargs})
        else:
            kwargs = {**wrapper.configs[0].kwargs, **kwargs}
    return kwargs


def _skip_dropped_overflow_checks(patches: pytest.MonkeyPatch) -> None:
    """Triton's interpreter options with `sanitize_overflow` off unless `debug` is on.

    With `sanitize_overflow` on, every integer add, sub and mul of a kernel is redone in int64 and compared with
    the type's bounds, only to feed a `device_assert` that Triton drops when `debug` is off (`semantic.device_assert`
    returns first), as a compiled kernel drops it on a GPU. That dead check was a fifth of a real-model example's
    time (`bench/bench_real_models.py`); nothing it computes is ever seen."""
    import dataclasses

    from triton.runtime import interpreter

    options = interpreter.interpreter_builder.options
    if options.sanitize_overflow and not options.debug:
        patches.setattr(interpreter.interpreter_builder, "options",
                        dataclasses.replace(options, sanitize_overflow=False))


_INTERPRETED: dict[int, InterpretedKernel] = {}  # id(kernel) -> its InterpretedKernel (which holds the kernel)


def _interpreted(kernel: Any) -> InterpretedKernel:
    """One `InterpretedKernel` per kernel object, kept across `interpret_kernels` blocks: each block swaps every
    kernel of its modules (hundreds), and building them anew was 2.5 s of the real-model gate examples. Keyed by
    identity: a `JITFunction`'s own hash is its cache key, computed from its globals (and failing on some)."""
    kept = _INTERPRETED.get(id(kernel))
    if kept is None or kept.original is not kernel:
        kept = _INTERPRETED[id(kernel)] = InterpretedKernel(kernel)
    return kept


@contextlib.contextmanager
def interpret_kernels(modules: Iterable[types.ModuleType]) -> Iterator[list[str]]:
    """Within the block, every Triton kernel the `modules` hold by name is an `InterpretedKernel`; yields the names
    swapped."""
    swapped = []
    with pytest.MonkeyPatch.context() as patches:
        _skip_dropped_overflow_checks(patches)
        for module in modules:
            for name, value in list(vars(module).items()):
                if isinstance(value, InterpretedKernel) or _jit_function(value) is None:
                    continue
                try:
                    patches.setattr(module, name, _interpreted(value))
                except TypeError:
                    continue  # a wrapper Triton does not ship: left as it is (its launch needs a GPU)
                swapped.append(f"{module.__name__}.{name}")
        yield swapped
