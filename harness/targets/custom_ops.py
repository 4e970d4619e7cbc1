"""SGLang's custom-op registry, as a compiled region meets it: every op SGLang registers in its `sglang` library,
where its source defines it, and its own Python implementation.

Found from SGLang's source, not listed by hand: every module whose text calls one of SGLang's registration helpers
(`register_custom_op`, `direct_register_custom_op`, `register_custom_op_from_extern`) is imported (one that cannot
import on this machine is kept with its error), then the dispatcher's `sglang::` ops are matched to the file and
line that define them. An op no SGLang file defines (the harness's own split op registers under the same library)
is not SGLang's and is left out.

    registry = load()          # imports the registering modules; PathMissing on a release without the helpers
    registry.sites             # {"bf16_gemm_dispatch": "srt/layers/quantization/unquant.py:465", ...}
    registry.import_errors     # {"sglang.srt.layers.foo": "ImportError: ..."}
    registry.implementation("bf16_gemm_dispatch")   # SGLang's function, for a CPU kernel (`add_cpu_kernel`)
"""
from __future__ import annotations

import ast
import dataclasses
import functools
import importlib
import re
from collections.abc import Callable
from pathlib import Path

import torch

from harness.errors import PathMissing
from harness.versions import require_sglang, sglang_version

NAMESPACE = "sglang"
HELPERS = ("register_custom_op", "direct_register_custom_op", "register_custom_op_from_extern")
_ANY_HELPER = "|".join(HELPERS)
_CALLS = re.compile(rf"\b(?:{_ANY_HELPER})\(")
_DEFINES = re.compile(rf"^def (?:{_ANY_HELPER})\(", re.M)
HELPER_HOME = "sglang.srt.utils.common"  # `direct_register_custom_op`, in every release the harness supports
# SGLang Diffusion's runtime and kernels: another server, whose ops no LLM graph runner or model class reaches
OUTSIDE = ("sglang.multimodal_gen.", "sglang.kernels.ops.diffusion.")


# Import errors of this machine, not of SGLang: a third-party package absent (cutlass, flashinfer, sgl_kernel), a CPU
# build of torch without CUDA's bindings, no GPU driver.
ENVIRONMENT = re.compile(r"^ModuleNotFoundError: No module named '(?!sglang)|torch\._C|NVIDIA|CUDA|[Dd]river")


def _described(error: BaseException) -> str:
    """`Type: first line (file:line)` of an exception, the line where it was raised."""
    import traceback

    frames = traceback.extract_tb(error.__traceback__)
    where = f" ({Path(frames[-1].filename).name}:{frames[-1].lineno})" if frames else ""
    lines = str(error).splitlines()
    return f"{type(error).__name__}: {lines[0][:200] if lines else ''}{where}"


@dataclasses.dataclass
class CustomOpRegistry:
    root: Path  # the sglang package directory
    modules: dict[str, Path]  # registering module -> its file
    import_errors: dict[str, str]  # registering module that cannot import here -> why (and where it raised)
    sites: dict[str, str]  # op name -> "path inside sglang:line" of its definition
    declared: dict[str, str]  # op name -> "path:line" of a registration its module runs at import

    def own_import_errors(self) -> dict[str, str]:
        """The import errors that are SGLang's, not this machine's: a module that fails for want of a package or a
        GPU (`ENVIRONMENT`) hides its registrations honestly; one that fails in SGLang's own code hides them
        from every other check, so it is a failure itself."""
        return {module: why for module, why in self.import_errors.items() if not ENVIRONMENT.search(why)}

    def runnable(self) -> tuple[str, ...]:
        """The ops of `RUNNABLE` this SGLang registers."""
        return tuple(sorted(name for name in RUNNABLE if name in self.sites))

    def implementation(self, name: str) -> Callable:
        """SGLang's own Python function behind `sglang::name`: what its registration registered as the kernel,
        kept as `__wrapped__` by the eager shortcut newer releases return; where the module holds only the op
        (0.5.9 binds `torch.ops.sglang.name` there), the `def` compiled from SGLang's source without its
        decorators, in its module's globals."""
        path, line = self.sites[name].rsplit(":", 1)
        module = importlib.import_module("sglang." + path.removesuffix(".py").replace("/", "."))
        value = getattr(module, name, None)
        function = getattr(value, "__wrapped__", None) or getattr(value, "op_func", None)
        if callable(function):
            return function
        tree = ast.parse((self.root / path).read_text(), filename=str(self.root / path))
        for node in tree.body:
            if isinstance(node, ast.FunctionDef) and node.name == name:
                node.decorator_list = []
                namespace: dict = {}
                exec(compile(ast.Module([node], []), str(self.root / path), "exec"), vars(module), namespace)
                return namespace[name]
        raise PathMissing(f"SGLang {sglang_version()}: {path}:{line} registers sglang::{name}, but defines no "
                          f"function of that name at its top level ({type(value).__name__} {name})")


def registering_modules(root: Path) -> dict[str, Path]:
    """Every module of the sglang package at `root` whose source calls a registration helper (the modules that
    define the helpers, and SGLang Diffusion's, `OUTSIDE`, aside)."""
    found = {}
    for path in sorted(root.rglob("*.py")):
        text = path.read_text(errors="replace")
        if _CALLS.search(text) and not _DEFINES.search(text):
            name = "sglang." + str(path.relative_to(root).with_suffix("")).replace("/", ".")
            if not name.endswith(".__init__") and not name.startswith(OUTSIDE):
                found[name] = path
    return found


def registered_ops() -> list[str]:
    """Names of the ops the dispatcher holds in SGLang's library now."""
    prefix = NAMESPACE + "::"
    return sorted({name[len(prefix):].split(".")[0] for name in torch._C._dispatch_get_all_op_names()
                   if name.startswith(prefix)})


def _definition(name: str, modules: dict[str, Path], root: Path) -> str | None:
    """`path:line` where a registering file defines `name`: its `def` under a registration decorator, else any
    `def`, else the registration of a function defined elsewhere (`name = register_custom_op(name, ...)`), else
    the name given as a string (`op_name=`)."""
    word = re.escape(name)
    helper = _ANY_HELPER
    for pattern in (rf"^[ \t]*@(?:{helper})\b(?:(?![ \t]*def )[^\n]*\n){{0,12}}?[ \t]*def {word}\(",
                    rf"^[ \t]*def {word}\(", rf"\b(?:{helper})\(\s*{word}\b", rf"[\"']{word}[\"']"):
        compiled = re.compile(pattern, re.M)
        for path in modules.values():
            text = path.read_text(errors="replace")
            match = compiled.search(text)
            if match:
                return f"{path.relative_to(root)}:{text.count(chr(10), 0, match.start()) + 1}"
    return None


def _helper(call: ast.AST) -> str | None:
    """Which registration helper `call` calls, if it is a call of one (`helper(...)` or `module.helper(...)`)."""
    if not isinstance(call, ast.Call):
        return None
    name = getattr(call.func, "id", None) or getattr(call.func, "attr", None)
    return name if name in HELPERS else None


def _keyword(call: ast.Call, name: str):
    """The constant passed as keyword `name` to `call`, or None."""
    for keyword in call.keywords:
        if keyword.arg == name and isinstance(keyword.value, ast.Constant):
            return keyword.value.value
    return None


def _eager(call: ast.Call) -> bool:
    """Whether `register_custom_op(...)` registers at once: `eager` absent (its default, True) or the constant True;
    an expression (0.5.9's `eager=_use_aiter`) depends on the platform, so it is not counted."""
    given = [keyword.value for keyword in call.keywords if keyword.arg == "eager"]
    return not given or (isinstance(given[0], ast.Constant) and given[0].value is True)


def _registrations(node: ast.stmt):
    """(op name, line) of each registration a module's top-level statement `node` runs at import: a function
    decorated by `register_custom_op` (eagerly: `eager=False` defers it to the first call), or a call of
    `register_custom_op(function, ...)` / `direct_register_custom_op("name", ...)`."""
    if isinstance(node, ast.FunctionDef):
        for decorator in node.decorator_list:
            if getattr(decorator, "id", None) == "register_custom_op":
                yield node.name, decorator.lineno
            elif _helper(decorator) == "register_custom_op" and not decorator.args and _eager(decorator):
                yield _keyword(decorator, "op_name") or node.name, decorator.lineno
        return
    call = getattr(node, "value", None) if isinstance(node, (ast.Assign, ast.Expr)) else None
    helper = _helper(call)
    if helper == "register_custom_op" and call.args and isinstance(call.args[0], ast.Name) and _eager(call):
        yield _keyword(call, "op_name") or call.args[0].id, call.lineno
    elif helper == "direct_register_custom_op":
        first = call.args[0] if call.args else None
        name = _keyword(call, "op_name") or (first.value if isinstance(first, ast.Constant) else None)
        if isinstance(name, str):
            yield name, call.lineno


def declared_at_import(modules: dict[str, Path], root: Path, skip=()) -> dict[str, str]:
    """{op name: "path:line"} of every registration at the top level of a module of `modules` (those in `skip`,
    which did not import here, aside): each must exist once its module imported. Registrations nested in a
    condition, a function or a class (a platform's kernels, a lazily built op) are not counted."""
    declared: dict[str, str] = {}
    for module, path in modules.items():
        if module in skip:
            continue
        for node in ast.parse(path.read_text(errors="replace")).body:
            for name, line in _registrations(node):
                declared.setdefault(name, f"{path.relative_to(root)}:{line}")
    return declared


@functools.cache
def load() -> CustomOpRegistry:
    """Import every registering module of the installed SGLang (recording the ones that fail) and map its ops;
    once per process."""
    root = Path(require_sglang())
    if not hasattr(importlib.import_module(HELPER_HOME), "direct_register_custom_op"):
        raise PathMissing(f"SGLang {sglang_version()} has no direct_register_custom_op in {HELPER_HOME}")
    modules = registering_modules(root)
    errors = {}
    for name in modules:
        try:
            importlib.import_module(name)
        except Exception as error:  # noqa: BLE001 - kept with its reason; `own_import_errors` judges it
            errors[name] = _described(error)
    sites = {}
    for name in registered_ops():
        site = _definition(name, modules, root)
        if site is not None:
            sites[name] = site
    return CustomOpRegistry(root, modules, errors, sites, declared_at_import(modules, root, skip=errors))


def _gemm(case, group: str, make) -> tuple:
    x, weight = make(case.rows, case.inner), make(case.cols, case.inner)
    return x, weight, make(case.cols) if case.bias else None


def _into(case, group: str, make) -> tuple:  # (output, input, group): a one-rank world's sizes
    return make(case.rows, case.cols), make(case.rows, case.cols), group


# SGLang's ops whose implementation runs on the CPU (a torch fallback, or SGLang's collectives on the process's
# gloo group), and their arguments from a drawn case (`strategies.custom_ops.OpCase`). The rest of the registry
# calls GPU kernels (CUDA JIT, FlashInfer, TRT-LLM, DeepGEMM, CUTLASS, Marlin) or needs a layer's forward context
# (the piecewise MoE ops), and is held to `check_fakes` only.
RUNNABLE: dict[str, Callable] = {
    "bf16_gemm_dispatch": _gemm,
    "inplace_all_reduce": lambda case, group, make: (make(case.rows, case.cols), group),
    "outplace_all_reduce": lambda case, group, make: (make(case.rows, case.cols), group, "auto"),
    "reg_all_gather_into_tensor": _into,
    "reg_reduce_scatter_tensor": _into,
    "reg_all_to_all_single": _into,
}


def inputs(case, group: str, device: str) -> tuple:
    """The arguments of `case.op` (a `RUNNABLE` op): seeded random tensors of the case's sizes and dtype on `device`
    (each output buffer distinct from its input, so a write into it shows)."""
    generator = torch.Generator().manual_seed(case.seed)
    dtype = getattr(torch, case.dtype)

    def make(*shape):
        return torch.randn(*shape, generator=generator).to(device=device, dtype=dtype)

    return RUNNABLE[case.op](case, group, make)


def one_rank_group() -> str:
    """The unique name of SGLang's TP group in a one-rank gloo world (created once per process, with default
    server args published for its parallel config where none are): what a collective op's `group_name` names."""
    from sglang.srt.distributed import parallel_state

    from harness.targets.sglang_plumbing import ensure_tp_group, publish_server_args

    if not parallel_state.model_parallel_is_initialized():
        from sglang.srt.server_args import ServerArgs

        publish_server_args(ServerArgs(model_path="dummy", device="cpu"))
        ensure_tp_group()
    return parallel_state.get_tp_group().unique_name


def refusal(name: str, args: tuple) -> str | None:
    """Why SGLang's `sglang::name` refuses `args` when run eagerly on copies of them (its own precondition: 0.5.9's
    out-of-place all-reduce asserts a communicator, which a one-rank CPU group lacks), or None when it runs.
    opcheck would report such a refusal as a failure of each of its tests; it is the input's, not the
    registration's."""
    copies = tuple(arg.clone() if isinstance(arg, torch.Tensor) else arg for arg in args)
    try:
        getattr(torch.ops.sglang, name).default(*copies)
    except Exception as error:  # noqa: BLE001 - any refusal, kept with where SGLang raised it
        return _described(error)
    return None
