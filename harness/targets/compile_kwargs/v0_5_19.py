"""`build_torch_compile_kwargs` (SGLang PR #36249, releases from 0.5.19) and its caller
`resolve_torch_compile_kwargs` in `multimodal_gen/runtime/utils/torch_compile.py`, under a platform of the case's
kind.

The platform is an instance of SGLang's own platform classes (CPU, CUDA, NPU, or an out-of-tree subclass of
its `Platform` with `_enum = OOT`), so SGLang's own `is_out_of_tree()` / `is_npu()` decide the branch. It is
bound where the function reads it: `torch_compile.current_platform` (bound at import, so patched there).
The out-of-tree hooks return the drawn values and are recorded by a `HookRecorder`.
"""
from __future__ import annotations

import contextlib
import dataclasses
import importlib
import inspect
from pathlib import Path
from types import ModuleType
from typing import Any
from collections.abc import Callable
from unittest import mock

from harness.errors import HarnessError, PathMissing
from harness.oracles.hooks import HookRecorder
from harness.personalities.ascend import ascend_standins
from harness.versions import require_sglang, sglang_version

MODULE = "sglang.multimodal_gen.runtime.utils.torch_compile"
INTERFACE = "sglang.multimodal_gen.runtime.platforms.interface"
PLATFORM_KINDS = ("cpu", "cuda", "npu", "oot")
_BUILTIN_CLASSES = {"cpu": ("sglang.multimodal_gen.runtime.platforms.cpu", "CpuPlatform"),
                    "cuda": ("sglang.multimodal_gen.runtime.platforms.cuda", "CudaPlatformBase"),
                    "npu": ("sglang.multimodal_gen.runtime.platforms.npu", "NPUPlatformBase")}


@dataclasses.dataclass
class CompileKwargsPath:
    module: ModuleType
    build: Callable[..., dict]
    resolve: Callable[..., tuple] | None
    platform_base: type
    oot_enum: Any
    comm_overlap: bool  # build_torch_compile_kwargs takes enable_inductor_compute_comm_overlap (after 0.5.19)

    @property
    def entries(self) -> tuple[str, ...]:
        return ("build", "resolve") if self.resolve is not None else ("build",)

    def __repr__(self) -> str:
        return f"<build_torch_compile_kwargs of SGLang {sglang_version()}>"


def detect() -> CompileKwargsPath | None:
    """This layout when the installed SGLang has it (PathMissing when it has it only in part), else None."""
    version = sglang_version()
    source = Path(require_sglang()) / (MODULE.removeprefix("sglang.").replace(".", "/") + ".py")
    if not source.exists():  # by file: importing the parent packages would need the diffusion stack
        return None
    try:
        module = importlib.import_module(MODULE)
        interface = importlib.import_module(INTERFACE)
    except ImportError as error:  # the path exists but the environment cannot import it: a setup error
        raise HarnessError(f"SGLang {version}: {MODULE} exists but does not import ({error}); add the missing "
                           f"package to this release's requirements file") from error
    build = getattr(module, "build_torch_compile_kwargs", None)
    if build is None:
        raise PathMissing(f"SGLang {version}: {MODULE} has no build_torch_compile_kwargs (added in 0.5.19)")
    base = interface.Platform
    if not (hasattr(base, "get_compile_backend") and hasattr(base, "get_compile_options")):
        raise PathMissing(f"SGLang {version}: Platform has no get_compile_backend/get_compile_options hooks, "
                          f"so build_torch_compile_kwargs has no out-of-tree branch to test")
    comm_overlap = "enable_inductor_compute_comm_overlap" in inspect.signature(build).parameters
    return CompileKwargsPath(module, build, getattr(module, "resolve_torch_compile_kwargs", None), base,
                             interface.PlatformEnum.OOT, comm_overlap)


def _platform(path: CompileKwargsPath, kind: str, backend: Any, options: Any, hooks: HookRecorder):
    if kind == "oot":
        recorded_backend = hooks.wrap("get_compile_backend", lambda mode=None: backend)
        recorded_options = hooks.wrap("get_compile_options", lambda module: options)

        class HarnessOutOfTreePlatform(path.platform_base):
            """An out-of-tree platform whose compile hooks return the drawn values."""
            _enum = path.oot_enum
            device_name = device_type = "harness_oot"
            dispatch_key = "PrivateUse1"

            def get_compile_backend(self, mode=None):
                return recorded_backend(mode)

            def get_compile_options(self, module):
                return recorded_options(module)

        return HarnessOutOfTreePlatform()
    module_name, class_name = _BUILTIN_CLASSES[kind]
    return getattr(importlib.import_module(module_name), class_name)()


@contextlib.contextmanager
def platform_scope(path: CompileKwargsPath, kind: str, *, backend: Any = None, options: Any = None,
                   hooks: HookRecorder | None = None):
    """Bind a platform of `kind` where the function reads it; NPU also gets the Ascend stand-ins."""
    hooks = hooks if hooks is not None else HookRecorder()
    platform = _platform(path, kind, backend, options, hooks)
    stand_ins = ascend_standins() if kind == "npu" else contextlib.nullcontext()
    with stand_ins, mock.patch.object(path.module, "current_platform", platform):
        yield platform


def call(path: CompileKwargsPath, entry: str, *, mode: str | None, module: Any, comm_overlap: bool = False) -> dict:
    """Call SGLang's entry point: `build` (build_torch_compile_kwargs) or `resolve` (the stages' caller).

    Inductor's process-wide config, which the comm-overlap option sets, is restored afterwards.
    """
    import torch._inductor.config as inductor_config

    overlap = {"enable_inductor_compute_comm_overlap": comm_overlap} if path.comm_overlap else {}
    with inductor_config.patch(reorder_for_compute_comm_overlap=inductor_config.reorder_for_compute_comm_overlap):
        if entry == "build":
            return path.build(mode=mode, module=module, **overlap)
        if path.resolve is None:
            raise PathMissing(f"SGLang {sglang_version()} has no resolve_torch_compile_kwargs")
        kwargs, _ = path.resolve(config=type("DitConfig", (), {"torch_compile_mode": mode})(),
                                 default="max-autotune-no-cudagraphs", module=module, **overlap)
        return kwargs
