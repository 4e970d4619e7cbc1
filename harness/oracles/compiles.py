"""Compiled equals eager: kwargs that SGLang built must be accepted by a real `torch.compile` of a real module,
compile to what eager computes, and not recompile on a second call with the same shapes.

Compiling costs seconds on a CPU, so outcomes are cached per (kwargs, module spec) for the process: the
contract on the kwargs is still checked for every example (that is where SGLang's logic is), the compile once.
When torch.compile rejects the kwargs, the platform's own hook values are compiled without SGLang in between:
if they fail too, the failure is the platform's (an unknown backend name, a callable that takes no options),
recorded as an expected error; if they compile, SGLang broke them.
"""
from __future__ import annotations

import copy
import json
from typing import Any

import torch
import torch._dynamo

from harness.models.small import ModuleSpec
from harness.oracles import OracleFailure
from harness.oracles.eager import assert_matches_eager
from harness.oracles.recompile import RecompileWatcher
from harness.personalities.ascend import NpuBackendStandIn

ORACLE = "compiles"


class PlatformError(Exception):
    """The platform's own backend/options cannot compile this module, with or without SGLang."""


def backend_key(backend: Any) -> str:
    if isinstance(backend, NpuBackendStandIn):
        return f"npu-backend(mode={backend.compiler_config.mode})"
    return backend if isinstance(backend, str) else getattr(backend, "__qualname__", repr(backend))


def cache_key(kwargs: dict, spec: ModuleSpec) -> str:
    plain = {k: (backend_key(v) if k == "backend" else v) for k, v in sorted(kwargs.items())}
    return json.dumps([plain, spec.__dict__], sort_keys=True, default=repr)


def _runs_graph_as_traced(backend: Any) -> bool:
    """Backends that run the traced FX graph unchanged: their output must be bit-equal to eager."""
    return backend == "eager" or isinstance(backend, NpuBackendStandIn) or callable(backend)


def _compile_and_call(module: torch.nn.Module, kwargs: dict, first: torch.Tensor, second: torch.Tensor):
    torch._dynamo.reset()  # instances of one class share code objects: never let a stale cache entry answer
    with RecompileWatcher("the compiled module") as watcher:
        compiled = torch.compile(module, **kwargs)
        with torch.no_grad():
            out_first = compiled(first)
            watcher.arm()
            out_second = compiled(second)
    return out_first, out_second, watcher


def check_compiles(kwargs: dict, spec: ModuleSpec, *, platform_values: dict | None,
                   cache: dict[str, Exception | None]) -> None:
    """Raise OracleFailure if SGLang's kwargs fail; PlatformError if the platform's own values fail too."""
    key = cache_key(kwargs, spec)
    if key not in cache:
        cache[key] = _outcome(kwargs, spec, platform_values)
    if cache[key] is not None:
        raise cache[key]


def _outcome(kwargs: dict, spec: ModuleSpec, platform_values: dict | None) -> Exception | None:
    """Compile once and return what went wrong (None when nothing did)."""
    module = spec.build()
    first, second = spec.input(1), spec.input(2)
    with torch.no_grad():
        expected = [module(first), module(second)]
        reference = copy.deepcopy(module).double()
        references = [reference(first.double()), reference(second.double())]
    try:
        outputs = _compile_and_call(module, kwargs, first, second)
    except Exception as error:  # torch.compile or the backend rejected the kwargs
        rejected = f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"[:500]
        own_error = _platform_own_error(spec, platform_values)
        if own_error is not None:
            return PlatformError(f"the platform's own compile settings fail without SGLang: {own_error}")
        return OracleFailure(ORACLE, "torch.compile rejected the kwargs SGLang built", error=rejected,
                             kwargs=repr(kwargs), platform_values=repr(platform_values))
    out_first, out_second, watcher = outputs
    try:
        watcher.check("a second call with the same shapes")
        exact = _runs_graph_as_traced(kwargs.get("backend", "inductor"))
        assert_matches_eager(out_first, expected[0], fp64_reference=references[0], exact=exact)
        assert_matches_eager(out_second, expected[1], fp64_reference=references[1], exact=exact)
    except OracleFailure as failure:
        failure.details["kwargs"] = repr(kwargs)
        return failure
    return None


def _platform_own_error(spec: ModuleSpec, platform_values: dict | None) -> str | None:
    """Compile with only what the platform's hooks returned; the error text if that fails too."""
    if platform_values is None:
        return None
    own = {key: value for key, value in platform_values.items() if value is not None}
    try:
        _compile_and_call(spec.build(), own, spec.input(1), spec.input(2))
    except Exception as error:
        return f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"[:500]
    return None
