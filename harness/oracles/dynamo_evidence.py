"""The compile contract as Dynamo's own evidence shows it (oracle "dynamo-contract").

Two promises of SGLang's compile glue that no output shows:

- Prefill tc_piecewise (`compile.install_torch_compiled`): the compiled body traces once for every captured size,
  because SGLang marks, with `torch._dynamo.maybe_mark_dynamic`, the token axis of each argument annotated as a
  tensor (`torch.Tensor`, `Optional[torch.Tensor]`, written as objects or as strings under `from __future__ import
  annotations`; `IntermediateTensors`' tensors), and of each direct tensor field of the ForwardBatch; the token
  axis is the last one for mRoPE positions (`positions`, `position_ids`, `mrope_positions`: `[3, T]`), else
  axis 0. The evidence is the FX graph Dynamo hands the backend: each placeholder's Dynamo source (`L['input_ids']`,
  `L['forward_batch'].out_cache_loc`) and example value, whose sizes are symbols exactly on the axes Dynamo traced
  dynamic, and the marks Dynamo keeps on the traced tensors (`_dynamo_weak_dynamic_indices` for `maybe_mark_dynamic`,
  `_dynamo_dynamic_indices` for the strict `mark_dynamic`, under which a specialisation the body forces is a
  ConstraintViolationError at startup instead of a static axis). The first trace is judged; a second
  one over the captured sizes is a failure where one trace is promised.
  Axes of size 0 or 1 at the trace are exempt: Dynamo specialises them whatever `maybe_mark_dynamic` says.
- Decode (`torch_compile_decoration`): `patch_model` compiles one specialisation per batch size (`dynamic=False`),
  so `set_torch_compile_config` raises Dynamo's per-frame `recompile_limit` (default 8) and the accumulated limit;
  the compiled sizes the case implies (`patch_contract.expected_sizes`) must fit the limits in force, and no frame
  may hit a limit during the run (Dynamo then runs the frame uncompiled, silently: its `counters["unimplemented"]`
  records "Dynamo recompile limit exceeded").

`TraceRecorder` observes the graphs: while active, `torch.compile` wraps a callable backend with a recorder that
notes the placeholders and hands the graph on unchanged (string backends are left alone, so decode's per-size
caches stay valid).
"""
from __future__ import annotations

import dataclasses
import functools
import inspect
import re
import types
import typing
from typing import Any
from collections.abc import Callable
from unittest import mock

import torch

from harness.models.fused_ops import fused_ops_of
from harness.oracles import OracleFailure

ORACLE = "dynamo-contract"
# SGLang's rule (compile.py `_MROPE_TOKEN_AXIS_ARGUMENTS`): these names carry mRoPE positions [3, T]
MROPE_NAMES = frozenset({"positions", "position_ids", "mrope_positions"})
LIMIT_HIT = "Dynamo recompile limit exceeded"  # Dynamo's graph-break type when a frame hits a recompile limit
_SOURCE = re.compile(r"^L\['(\w+)'\](.*)$")
_FIELD = re.compile(r"^\.(\w+)$")
_INTERMEDIATE = re.compile(r"^\.tensors\[['\"](\w+)['\"]\]$")


@dataclasses.dataclass(frozen=True)
class Placeholder:
    """One tensor input of a traced graph: Dynamo's source name, its sizes at the trace, the axes traced as
    symbols, and the axes Dynamo holds marked strictly (`mark_dynamic`) or weakly (`maybe_mark_dynamic`)."""

    source: str
    sizes: tuple[int, ...]
    symbolic: tuple[int, ...]
    strict: tuple[int, ...]
    weak: tuple[int, ...]


@dataclasses.dataclass
class Trace:
    """One graph Dynamo handed a backend: the function compiled, its tensor placeholders, and whether it was the
    first trace of that code in this process (later ones may inherit Dynamo's automatic-dynamic frame state: an
    earlier trace of another rank or size makes more axes symbolic than anyone marked)."""

    function: Callable | None
    placeholders: list[Placeholder]
    fresh: bool = True

    def describe(self) -> dict:
        return {p.source: {"sizes": list(p.sizes), "symbolic": list(p.symbolic), "strict": list(p.strict)}
                for p in self.placeholders}


def _placeholders(gm: torch.fx.GraphModule) -> list[Placeholder]:
    found = []
    for node in gm.graph.nodes:
        if node.op != "placeholder":
            continue
        value, arg = node.meta.get("example_value"), node.meta.get("grapharg")
        if not isinstance(value, torch.Tensor) or arg is None:
            continue  # a SymInt input (a size Dynamo passes along), not a tensor
        name = arg.source.name
        real = getattr(arg, "example", None)
        symbolic = tuple(i for i, size in enumerate(value.shape) if isinstance(size, torch.SymInt)
                         and size.node.expr.free_symbols)
        found.append(Placeholder(
            source=name() if callable(name) else str(name),
            sizes=tuple(int(s) for s in real.shape) if isinstance(real, torch.Tensor) else (),
            symbolic=symbolic,
            strict=tuple(sorted(getattr(real, "_dynamo_dynamic_indices", ()) or ())),
            weak=tuple(sorted(getattr(real, "_dynamo_weak_dynamic_indices", ()) or ()))))
    return found


_TRACED_CODES: set = set()  # code objects some recorder saw traced in this process


def _owner(compiled: object) -> torch.nn.Module | None:
    """The module whose bound method `torch.compile` was handed, through decorators (`torch.no_grad()(f)`)."""
    while compiled is not None and not hasattr(compiled, "__self__"):
        compiled = getattr(compiled, "__wrapped__", None)
    owner = getattr(compiled, "__self__", None)
    return owner if isinstance(owner, torch.nn.Module) else None


class TraceRecorder:
    """Context manager: every graph a `torch.compile` made while active hands its callable backend is recorded
    in `traces` (first trace first), then compiled by that backend as before. `stop()` ends it early.

    Whatever the backend (decode's is a string), each frame Dynamo converts while active also records the compile
    mode of the fused ops of every module compiled so far (`fused_modes`, one {op name: is_torch_compile} per
    conversion; Dynamo's bytecode hook runs right after the trace); `fused_ops()` are those ops now."""

    def __init__(self) -> None:
        self.traces: list[Trace] = []
        self.fused_modes: list[dict[str, bool]] = []
        self._owners: list[torch.nn.Module] = []
        self._patch = self._hook = None

    def fused_ops(self) -> dict[str, torch.nn.Module]:
        return {name: op for owner in self._owners for name, op in fused_ops_of(owner).items()}

    def _recording(self, backend: Callable, function: Callable | None) -> Callable:
        @functools.wraps(backend)
        def record(gm, example_inputs):
            code = getattr(function, "__code__", None)
            self.traces.append(Trace(function, _placeholders(gm), fresh=code not in _TRACED_CODES))
            _TRACED_CODES.add(code)
            return backend(gm, example_inputs)
        return record

    def _converted(self, old_code, new_code) -> None:
        modes = {name: bool(op.is_torch_compile) for name, op in self.fused_ops().items()}
        if modes:
            self.fused_modes.append(modes)

    def __enter__(self) -> TraceRecorder:
        original = torch.compile

        def compile_recording(model=None, *args, **kwargs):
            owner = _owner(model)
            if owner is not None and all(owner is not seen for seen in self._owners):
                self._owners.append(owner)
            backend = kwargs.get("backend")
            if callable(backend):
                kwargs["backend"] = self._recording(backend, getattr(model, "__func__", model))
            return original(model, *args, **kwargs)

        self._patch = mock.patch.object(torch, "compile", compile_recording)
        self._patch.start()
        self._hook = torch._dynamo.convert_frame.register_bytecode_hook(self._converted)
        return self

    def stop(self) -> None:
        if self._patch is not None:
            self._patch.stop()
            self._hook.remove()
            self._patch = self._hook = None

    def __exit__(self, *exc) -> None:
        self.stop()


# -- the promise, from the compiled function's signature ------------------------------------------------------
def _annotation(function: Callable, name: str) -> Any:
    """The annotation of parameter `name`, a string evaluated in the function's module (as `typing.get_type_hints`
    would), or inspect's `empty`."""
    parameter = inspect.signature(function).parameters.get(name)
    if parameter is None:
        return inspect.Parameter.empty
    annotation = parameter.annotation
    if isinstance(annotation, str):
        try:
            annotation = eval(annotation, dict(vars(typing), **function.__globals__))  # noqa: S307 - own source
        except Exception:  # noqa: BLE001 - an annotation naming what the module lacks: no promise from it
            return inspect.Parameter.empty
    return annotation


def _kind(annotation: Any) -> str | None:
    """"tensor" for torch.Tensor / Optional[torch.Tensor], "intermediate" for (Optional) IntermediateTensors."""
    union = typing.get_origin(annotation) in (typing.Union, types.UnionType)
    members = typing.get_args(annotation) if union else (annotation,)
    if any(m is torch.Tensor for m in members):
        return "tensor"
    if any(getattr(m, "__name__", "") == "IntermediateTensors" for m in members):
        return "intermediate"
    return None


def token_axis(name: str, ndim: int) -> int | None:
    """The axis SGLang promises dynamic for a tensor named `name`: the last for mRoPE positions ([3, T]: 1), else
    0; None for a 0-d tensor."""
    if not ndim:
        return None
    return ndim - 1 if name in MROPE_NAMES else 0


def promised_axes(function: Callable | None, placeholder: Placeholder, *,
                  forward_batch_fields: bool = True) -> set[int] | None:
    """The axes SGLang's rule makes dynamic for `placeholder` of a trace of `function`, None where the rule says
    nothing (a tensor reached through deeper attributes; ForwardBatch fields when `forward_batch_fields` is off,
    releases before `_mark_dynamic_forward_batch`). Module state (`L['self']...`) stays static."""
    match = _SOURCE.match(placeholder.source)
    if match is None or function is None:
        return None
    root, rest = match.groups()
    ndim = len(placeholder.sizes)
    if root == "self":
        axis = None
    elif root == "forward_batch":
        field = _FIELD.match(rest)
        if field is None or not forward_batch_fields:
            return None
        axis = token_axis(field.group(1), ndim)
    else:
        kind = _kind(_annotation(function, root))
        if rest == "":
            axis = token_axis(root, ndim) if kind == "tensor" else None
        elif kind == "intermediate" and _INTERMEDIATE.match(rest):
            axis = token_axis("", ndim)
        else:
            return None
    return {axis} if axis is not None and placeholder.sizes[axis] > 1 else set()  # Dynamo specialises 0 and 1


def check_symbolic_axes(traces: list[Trace], *, what: str, sizes: list[int], one_trace: bool = True,
                        forward_batch_fields: bool = True) -> dict:
    """The first trace of `what` marks (as Dynamo recorded the marks) and traces symbolically exactly the promised
    axes, none strictly; with `one_trace`, it was the only trace over the captured `sizes`. Returns what was
    checked, for the example's record."""
    if not traces:
        raise OracleFailure(ORACLE, f"no graph of {what} reached the compile backend: SGLang never traced it",
                            sizes=sizes)
    first = traces[0]
    name = getattr(first.function, "__qualname__", "?")
    checked, unpromised, wrong_marks, wrong_symbols = {}, [], [], []
    for p in first.placeholders:
        if p.strict:
            raise OracleFailure(ORACLE, f"{what} ({name}): axis {list(p.strict)} of `{p.source}` is marked dynamic "
                                "strictly (torch._dynamo.mark_dynamic); SGLang promises maybe_mark_dynamic, which "
                                "lets Dynamo specialise an axis instead of failing the compile",
                                source=p.source, strict=list(p.strict), sizes=list(p.sizes))
        promised = promised_axes(first.function, p, forward_batch_fields=forward_batch_fields)
        if promised is None:
            unpromised.append(p.source)
            continue
        marked = {axis for axis in p.weak if p.sizes[axis] > 1}
        symbolic = set(p.symbolic)
        # the marks say what SGLang asked for; the symbols what Dynamo traced (on a frame traced before in this
        # process, automatic dynamic may add symbols nobody marked: only missing ones count there)
        if marked != promised:
            wrong_marks.append((p, f"SGLang marked axes {sorted(marked)} dynamic", marked, symbolic, promised))
        elif not promised <= symbolic or (first.fresh and symbolic != promised):
            wrong_symbols.append((p, f"Dynamo traced axes {sorted(symbolic)} as symbols", marked, symbolic, promised))
        checked[p.source] = sorted(promised)
    # A missing mark is the cause; a symbol missing beside a right mark is its effect (Dynamo specialised a dim
    # that an unmarked input shares), so the first wrong mark is named, every difference listed.
    wrong = wrong_marks + wrong_symbols
    if wrong:
        p, what_went_wrong, marked, symbolic, promised = wrong[0]
        raise OracleFailure(
            ORACLE, f"{what} ({name}): `{p.source}` (sizes {list(p.sizes)} at the trace): {what_went_wrong} where "
                    f"SGLang promises axes {sorted(promised)} (the token axis: the last for mRoPE positions "
                    f"{sorted(MROPE_NAMES)}, else 0)", source=p.source, marked=sorted(marked),
            symbolic=sorted(symbolic), promised=sorted(promised), sizes=list(p.sizes),
            differing=[f"{q.source}: {text}, promised {sorted(want)}" for q, text, _, _, want in wrong])
    if one_trace and len(traces) != 1:
        raise OracleFailure(ORACLE, f"{what} ({name}) was traced {len(traces)} times over captured sizes {sizes}; "
                            "one trace with symbolic token axes must serve them all", traces=len(traces),
                            last=traces[-1].describe())
    return {"traces": len(traces), "dynamic_axes": checked, "unpromised": unpromised,
            "one_trace": one_trace, "fresh_frame": first.fresh}


def check_annotations_accepted(function: Callable, error: BaseException, *, what: str) -> None:
    """SGLang refused to compile `function` (`error`): a failure when its signature annotates a tensor argument
    (objects or strings), from which SGLang must infer the dynamic dims; return when it annotates none."""
    parameters = inspect.signature(function).parameters
    tensors = [name for name in parameters if name != "self" and _kind(_annotation(function, name))]
    if tensors:
        spelled = ", ".join(repr(parameters[name].annotation) for name in tensors)
        raise OracleFailure(ORACLE, f"SGLang refused to compile {what} ({function.__qualname__}), whose forward "
                            f"annotates {tensors} as tensors ({spelled}): it must infer their dynamic dims; it "
                            f"raised {type(error).__name__}: {error}", annotated=tensors) from error


# -- the decode recompile budget ------------------------------------------------------------------------------
def limits_in_force() -> dict[str, int]:
    """Dynamo's per-frame and accumulated recompile limits now (`cache_size_limit` is an alias on torch 2.14)."""
    config = torch._dynamo.config
    return {"recompile_limit": int(getattr(config, "recompile_limit", getattr(config, "cache_size_limit", 8))),
            "accumulated_recompile_limit": int(getattr(config, "accumulated_recompile_limit",
                                                       getattr(config, "accumulated_cache_size_limit", 256)))}


def limit_hits() -> int:
    """How many times Dynamo refused to compile a frame past a recompile limit (its own counters)."""
    from torch._dynamo.utils import counters

    return sum(n for key, n in counters["unimplemented"].items() if key.startswith(LIMIT_HIT))


class BudgetWatcher:
    """Made before a decode run: `note_limits()` once the runner has set Dynamo up, `check(compile_bs)` after."""

    def __init__(self) -> None:
        self.hits_before = limit_hits()
        self.limits: dict[str, int] | None = None

    def note_limits(self) -> None:
        """Read the limits in force (call after the runner's constructor, which sets them, while the run goes on)."""
        self.limits = limits_in_force()

    def check(self, compile_bs: list[int], *, what: str = "the decode forward") -> dict:
        """`compile_bs`: the sizes the case compiles (one specialisation of the frame each, dynamic=False), derived
        from the case. Returns what was checked, for the example's record."""
        limits = self.limits or limits_in_force()
        hits = limit_hits() - self.hits_before
        for name, limit in limits.items():
            if len(compile_bs) > limit:
                raise OracleFailure(ORACLE, f"the case compiles {len(compile_bs)} batch sizes {compile_bs} of {what} "
                                    f"(one specialisation each, dynamic=False), but torch._dynamo.config.{name} in "
                                    f"force is {limit}: the sizes past it run uncompiled (set_torch_compile_config "
                                    "must raise it)", limit=name, value=limit, compile_bs=compile_bs)
        if hits:
            raise OracleFailure(ORACLE, f"Dynamo hit a recompile limit {hits} time(s) while compiling {what} "
                                f"(limits in force {limits}; the case compiles {compile_bs}): those frames ran "
                                "uncompiled, silently", hits=hits, limits=limits, compile_bs=compile_bs)
        return {"compiled_sizes": len(compile_bs), **limits, "limit_hits": hits}
