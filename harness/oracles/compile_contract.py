"""The contract of `build_torch_compile_kwargs` (SGLang PR #36249), one clause per check.

- never both `mode` and `options` (torch.compile rejects them together);
- out-of-tree platform: the backend is what `get_compile_backend(mode)` returned, asked once with the mode;
  per-module options are what `get_compile_options(module)` returned, asked once with that very module
  (not asked without a module); `mode` is passed exactly when there are no options, the backend is inductor
  and a mode was given;
- NPU: the backend is the NPU graph compiler's, with `dynamic=False`, and neither mode nor options;
- built-in platforms: plain `mode` (when given), no options, inductor (no backend or "inductor").
"""
from __future__ import annotations

from typing import Any

from harness.oracles import OracleFailure
from harness.oracles.hooks import HookRecorder
from harness.personalities.ascend import NpuBackendStandIn

KWARGS = "kwargs-validity"
HOOKS = "hook-contract"


def _fail(oracle: str, diagnosis: str, kwargs: dict, **details) -> None:
    raise OracleFailure(oracle, diagnosis, kwargs=kwargs, **details)


def check(kind: str, *, mode: str | None, module: Any, backend: Any, options: Any, kwargs: dict,
          hooks: HookRecorder) -> None:
    """Raise OracleFailure on the first broken clause; `backend`/`options` are what the hooks returned."""
    if "mode" in kwargs and "options" in kwargs:
        _fail(KWARGS, "mode and options both reach torch.compile, which rejects them together", kwargs)
    if kind == "oot":
        _check_out_of_tree(mode=mode, module=module, backend=backend, options=options, kwargs=kwargs, hooks=hooks)
    elif kind == "npu":
        if not isinstance(kwargs.get("backend"), NpuBackendStandIn):
            _fail(KWARGS, "NPU platform did not get the NPU graph compiler backend", kwargs)
        if kwargs.get("dynamic") is not False:
            _fail(KWARGS, f"NPU platform got dynamic={kwargs.get('dynamic')!r}, expected dynamic=False", kwargs)
        for key in ("mode", "options"):
            if key in kwargs:
                _fail(KWARGS, f"NPU platform got {key}={kwargs[key]!r}; its compiler takes neither", kwargs)
    else:
        if kwargs.get("backend", "inductor") != "inductor":
            _fail(KWARGS, f"built-in platform {kind} got backend={kwargs['backend']!r}, expected inductor", kwargs)
        if "options" in kwargs:
            _fail(KWARGS, f"built-in platform {kind} got options={kwargs['options']!r}", kwargs)
        if mode is not None and kwargs.get("mode") != mode:
            _fail(KWARGS, f"built-in platform {kind}: mode {mode!r} did not reach torch.compile "
                          f"(got {kwargs.get('mode')!r})", kwargs)
        if mode is None and "mode" in kwargs:
            _fail(KWARGS, f"built-in platform {kind}: no mode was given, yet mode={kwargs['mode']!r}", kwargs)


def _check_out_of_tree(*, mode, module, backend, options, kwargs, hooks: HookRecorder) -> None:
    hooks.assert_called("get_compile_backend", times=1,
                        why="an out-of-tree platform's backend must come from get_compile_backend(mode)")
    hooks.assert_argument("get_compile_backend", 0, "mode", mode,
                          why="get_compile_backend must be asked with the compile mode")
    if kwargs.get("backend", "<absent>") is not backend:
        _fail(HOOKS, f"backend {kwargs.get('backend', '<absent>')!r} is not what get_compile_backend returned "
                     f"({backend!r})", kwargs)
    if module is None:
        hooks.assert_not_called("get_compile_options", why="there is no module to ask options for")
        got_options = None
    else:
        hooks.assert_called("get_compile_options", times=1,
                            why="the module being compiled must reach get_compile_options(module)")
        hooks.assert_argument("get_compile_options", 0, "module", module,
                              why="get_compile_options must receive the module being compiled")
        got_options = options
    if got_options is None and "options" in kwargs:
        _fail(KWARGS, f"options={kwargs['options']!r} reached torch.compile though the hook returned None", kwargs)
    if got_options is not None and kwargs.get("options", "<absent>") is not got_options:
        _fail(HOOKS, f"options {kwargs.get('options', '<absent>')!r} are not what get_compile_options returned "
                     f"({got_options!r})", kwargs)
    wants_mode = got_options is None and backend == "inductor" and mode is not None
    if wants_mode and kwargs.get("mode") != mode:
        _fail(KWARGS, f"mode {mode!r} was dropped for the inductor backend without options", kwargs)
    if not wants_mode and "mode" in kwargs:
        _fail(KWARGS, f"mode={kwargs['mode']!r} passed where it must not be (backend={backend!r}, "
                      f"options={got_options!r})", kwargs)
