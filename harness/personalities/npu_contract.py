"""The `npu-standin-contract` oracle: the npu personality's stand-in (`harness.personalities.ascend`) held against
the real torch_npu, read from its wheel (pinned in requirements/torch-npu.txt; never imported or installed: it
needs Ascend's CANN). Without it the stand-in could drift from the API SGLang really calls on an NPU and every
NPU suite would still pass.

Checks, one verdict (`check()`):
- the stand-in's graph API (`NPUGraph` and its methods, `graph`, `graph_pool_handle`,
  `is_current_stream_capturing`, `graph_task_group_*`, `graph_task_update_*`, `NPUGraph.update`) and the
  profiler's `profile` and `tensorboard_trace_handler` have the real signatures: parameter names, order, kinds
  and defaults, parsed from the wheel's source;
- every `torch.npu.X` / `torch_npu.X` (`torch_npu.npu.X`, `torch_npu.profiler.X`, ...) that SGLang's NPU capture
  path uses (`SCANNED`, read by AST, naming file:line; `device_module.X` counts as `torch.npu.X`, which it is on
  an NPU) exists in the real package, and each such call binds to the real signature where one is in Python;
- every name the stand-in provides explicitly exists in the real package.

Resolution rule (`RealTorchNpu.resolve`): `torch.npu` is the module the wheel registers with
`torch._register_device_module("npu", ...)`. A module's attribute exists if its source binds it at top level
(def, class, assignment, import, also inside top-level if/try/with blocks; last binding wins), a `from M import *`
of a wheel module exports it (M's `__all__`, else its public names), a submodule file of that name is in the wheel,
the module's `__getattr__` compares its argument with that name, or (weakest) the module's `__all__` lists it.
A class's attribute: its body, then its bases. Limits: names bound only at run time (`setattr`, `globals()[...]`,
the NPU ops `_export_npu_ops` copies from `torch.ops.npu`) are not seen; a member of the native extension
(`torch_npu._C...`, a class with a native base) exists when its name ends a string in the wheel's shared
libraries, which shows a binding of that name somewhere, not on that object; members of values and of objects
from outside the wheel (torch's) are recorded as unchecked.
"""
from __future__ import annotations

import ast
import dataclasses
import functools
import inspect
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import types
import zipfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from harness.checkout import REPO_ROOT
from harness.errors import HarnessError
from harness.oracles import OracleFailure

ORACLE = "npu-standin-contract"
REPO = REPO_ROOT
PIN_FILE = REPO / "requirements" / "torch-npu.txt"
CACHE_VARIABLE = "HARNESS_WHEEL_CACHE"
DEFAULT_CACHE = Path.home() / ".cache" / "sglang-harness" / "wheels"
PLATFORMS = ("manylinux_2_28_x86_64", "manylinux2014_x86_64")  # torch_npu 2.14 ships the first
# SGLang's NPU capture path, relative to the sglang package: its NPU graph runners and backends, the NPU piece
# backend, the weak-reference helper it imports on an NPU, and the decode runner it subclasses (`device_module`)
SCANNED = ("srt/hardware_backend/npu/graph_runner", "srt/compilation/npu_piecewise_backend.py",
           "srt/model_executor/runner_backend_utils/weak_ref_tensor.py",
           "srt/model_executor/runner/decode_cuda_graph_runner.py",
           "srt/model_executor/runner/base_cuda_graph_runner.py")
DEVICE_MODULE_NAMES = ("device_module", "_device_module")  # torch.get_device_module("npu") is torch.npu
# the stand-in's graph API whose signatures must be the real ones (NPUGraph's methods are added from the class)
GRAPH_API = ("NPUGraph", "graph", "graph_pool_handle", "is_current_stream_capturing", "graph_task_group_begin",
             "graph_task_group_end", "graph_task_update_begin", "graph_task_update_end")
PROFILER_API = ("profile", "tensorboard_trace_handler")  # torch_npu.profiler's, which SGLang's capture profile calls
ROOTS = ("torch.npu", "torch_npu")
DOTTED = re.compile(r"^(torch\.npu|torch_npu)(\.\w+)+$")


class WheelUnavailable(HarnessError):
    """The torch_npu wheel is neither in the cache nor downloadable (no network, no such release)."""


# -- the wheel ---------------------------------------------------------------------------------------------------
def pinned_version(pin_file: Path = PIN_FILE) -> str:
    for line in pin_file.read_text().splitlines():
        match = re.match(r"^\s*torch-npu==(\S+)", line)
        if match:
            return match.group(1)
    raise HarnessError(f"{pin_file} pins no torch-npu version (a line `torch-npu==X`)")


def wheel_cache() -> Path:
    return Path(os.environ.get(CACHE_VARIABLE) or DEFAULT_CACHE).expanduser()


def fetch_wheel(version: str | None = None, cache: Path | None = None, *, timeout: float = 600) -> Path:
    """The cp311 manylinux x86_64 wheel of torch-npu `version` (default: the pin), downloaded once into the cache
    with `pip download --no-deps` (not installed), atomically so parallel workers can share the folder."""
    version = version or pinned_version()
    cache = Path(cache or wheel_cache())
    pattern = f"torch_npu-{version}-cp311-cp311-manylinux*x86_64.whl"
    found = sorted(cache.glob(pattern))
    if found:
        return found[0]
    try:
        cache.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=".download-", dir=cache))
    except OSError as error:
        raise WheelUnavailable(f"cannot write the wheel cache {cache} ({error}); point ${CACHE_VARIABLE} at a "
                               "writable folder") from None
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", "--python-version",
               "3.11", "--implementation", "cp", "--abi", "cp311", "--quiet", "--dest", str(staging)]
    command += [arg for platform in PLATFORMS for arg in ("--platform", platform)] + [f"torch-npu=={version}"]
    try:
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired:
            raise WheelUnavailable(f"`{' '.join(command)}` ran past {timeout:.0f} s") from None
        wheels = sorted(staging.glob(pattern))
        if done.returncode != 0 or not wheels:
            tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
            raise WheelUnavailable(f"could not download torch-npu=={version} (`{' '.join(command)}`, exit "
                                   f"{done.returncode}): {' / '.join(tail)}; put the wheel in {cache} "
                                   f"(or point ${CACHE_VARIABLE} at a folder holding it)")
        target = cache / wheels[0].name
        os.replace(wheels[0], target)
        return target
    finally:
        shutil.rmtree(staging, ignore_errors=True)


# -- signatures --------------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Expr:
    """A default that is not a literal, kept as its source text."""
    text: str

    def __repr__(self) -> str:
        return self.text


EMPTY = Expr("<none>")
Param = tuple  # (name, kind, default): kind as inspect's names, default EMPTY when there is none


def ast_signature(node: ast.FunctionDef, *, drop_first: bool = False) -> tuple[Param, ...]:
    a = node.args

    def default(expr):
        if expr is None:
            return EMPTY
        try:
            return ast.literal_eval(expr)
        except ValueError:
            return Expr(ast.unparse(expr))

    positional = a.posonlyargs + a.args
    defaults = [None] * (len(positional) - len(a.defaults)) + list(a.defaults)
    params = [(p.arg, "POSITIONAL_ONLY" if i < len(a.posonlyargs) else "POSITIONAL_OR_KEYWORD", default(d))
              for i, (p, d) in enumerate(zip(positional, defaults))]
    if a.vararg:
        params.append((a.vararg.arg, "VAR_POSITIONAL", EMPTY))
    params += [(p.arg, "KEYWORD_ONLY", default(d)) for p, d in zip(a.kwonlyargs, a.kw_defaults)]
    if a.kwarg:
        params.append((a.kwarg.arg, "VAR_KEYWORD", EMPTY))
    return tuple(params[1:] if drop_first else params)


def object_signature(obj: Any) -> tuple[Param, ...]:
    return tuple((p.name, p.kind.name, EMPTY if p.default is inspect.Parameter.empty else p.default)
                 for p in inspect.signature(obj).parameters.values())


def render(params: Iterable[Param]) -> str:
    out, star = [], False
    for name, kind, default in params:
        if kind == "KEYWORD_ONLY" and not star:
            out.append("*")
            star = True
        prefix = {"VAR_POSITIONAL": "*", "VAR_KEYWORD": "**"}.get(kind, "")
        star = star or kind == "VAR_POSITIONAL"
        out.append(prefix + name + ("" if default is EMPTY else f"={default!r}"))
    return f"({', '.join(out)})"


def first_difference(standin: tuple, real: tuple) -> str:
    for i, (ours, theirs) in enumerate(zip(standin, real)):
        for field, a, b in zip(("name", "kind", "default"), ours, theirs):
            if a != b and not (field == "default" and type(a) is not type(b) and repr(a) == repr(b)):
                return f"parameter {i + 1} ({theirs[0]!r} in the real one): {field} {a!r} in the stand-in, {b!r} real"
    longer, side = (standin, "stand-in") if len(standin) > len(real) else (real, "real one")
    return f"only the {side} has parameter(s) {', '.join(p[0] for p in longer[min(len(standin), len(real)):])}"


def signatures_equal(standin: tuple, real: tuple) -> bool:
    return len(standin) == len(real) and not any(
        a != b and not (type(a) is not type(b) and repr(a) == repr(b))
        for ours, theirs in zip(standin, real) for a, b in zip(ours, theirs))


# -- the real package, from its sources --------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Found:
    """What a dotted name is in the real package; `kind`: module, function, class, value, native, unchecked."""
    kind: str
    where: str  # file:line in the wheel, or the evidence
    node: ast.AST | None = None
    module: str = ""  # the module whose namespace `node` lives in (a module's own name when kind is module)


class RealTorchNpu:
    """The Python half of a torch_npu wheel, parsed, never imported."""

    def __init__(self, wheel: Path):
        self.wheel = Path(wheel)
        with zipfile.ZipFile(self.wheel) as archive:
            names = archive.namelist()
            self._sources = {n: archive.read(n).decode("utf-8", "replace") for n in names
                             if n.startswith("torch_npu/") and n.endswith(".py")}
        self._libraries = sorted((n for n in names if n.startswith("torch_npu/") and n.endswith(".so")),
                                 key=lambda n: "libtorch_npu" in n)  # the 97 MB one last
        self._library_data: dict[str, bytes] = {}
        self._native_cache = self.wheel.with_name(self.wheel.name + ".native-names.json")
        try:
            self._native_names = json.loads(self._native_cache.read_text())
        except (OSError, ValueError):
            self._native_names = {}
        named = re.match(r"torch_npu-([^-]+)-", self.wheel.name)
        self.version = named.group(1) if named else "?"
        self.aliases = self._device_module_aliases()

    # modules
    def file(self, module: str) -> str | None:
        base = module.replace(".", "/")
        return next((f for f in (f"{base}/__init__.py", f"{base}.py") if f in self._sources), None)

    def is_module(self, module: str) -> bool:
        return self.file(module) is not None

    def extension(self, module: str) -> str | None:
        """The shared library that is the native module `module` (torch_npu._C), if the wheel has one."""
        stem = module.replace(".", "/") + "."
        return next((n for n in self._libraries if n.startswith(stem) and "/" not in n[len(stem):]), None)

    @functools.cache
    def tree(self, module: str) -> ast.Module:
        path = self.file(module)
        return ast.parse(self._sources[path], path)

    def _device_module_aliases(self) -> dict[str, str]:
        """{"torch.npu": "torch_npu.npu"}, from the wheel's own `torch._register_device_module` call."""
        aliases = {}
        for path, text in self._sources.items():
            if "_register_device_module" not in text:
                continue
            for node in ast.walk(ast.parse(text, path)):
                if (isinstance(node, ast.Call) and ast.unparse(node.func).endswith("_register_device_module")
                        and len(node.args) == 2 and isinstance(node.args[0], ast.Constant)):
                    aliases[f"torch.{node.args[0].value}"] = ast.unparse(node.args[1])
        if "torch.npu" not in aliases:
            raise HarnessError(f"{self.wheel.name} registers no torch.npu device module "
                               "(`torch._register_device_module(\"npu\", ...)`): the resolution rule needs updating")
        return aliases

    @functools.cache
    def _scope(self, module: str) -> tuple[dict, list, list | None, set]:
        """(bindings name -> node, star-imported modules, __all__ or None, names the module __getattr__ answers)."""
        bindings, stars, public, lazy = {}, [], None, set()
        package = module if self.file(module).endswith("__init__.py") else module.rpartition(".")[0]

        def absolute(node: ast.ImportFrom) -> str:
            if not node.level:
                return node.module or ""
            anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
            return ".".join(anchor + ([node.module] if node.module else []))

        def visit(statements):
            nonlocal public
            for node in statements:
                if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    bindings[node.name] = node
                    if node.name == "__getattr__" and node.args.args:
                        argument = node.args.args[0].arg
                        for compare in ast.walk(node):
                            if isinstance(compare, ast.Compare) and ast.unparse(compare.left) == argument:
                                for c in ast.walk(compare):
                                    if isinstance(c, ast.Constant) and isinstance(c.value, str):
                                        lazy.add(c.value)
                elif isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
                    targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                    for target in targets:  # names bound, not those an attribute or item store goes through
                        unpacked = target.elts if isinstance(target, (ast.Tuple, ast.List)) else [target]
                        for name in unpacked:
                            if isinstance(name, ast.Name):
                                bindings[name.id] = node
                                if name.id == "__all__":
                                    try:
                                        public = list(ast.literal_eval(node.value))
                                    except ValueError:
                                        pass
                elif isinstance(node, ast.Import):
                    for alias in node.names:
                        bindings[alias.asname or alias.name.split(".")[0]] = ("import", alias.asname and alias.name
                                                                            or alias.name.split(".")[0], node)
                elif isinstance(node, ast.ImportFrom):
                    source = absolute(node)
                    for alias in node.names:
                        if alias.name == "*":
                            stars.append(source)
                        else:
                            bindings[alias.asname or alias.name] = ("from", f"{source}.{alias.name}", node)
                elif isinstance(node, ast.If):
                    visit(node.body), visit(node.orelse)
                elif isinstance(node, ast.Try):
                    visit(node.body), visit(node.orelse), visit(node.finalbody)
                    for handler in node.handlers:
                        visit(handler.body)
                elif isinstance(node, ast.With):
                    visit(node.body)

        visit(self.tree(module).body)
        return bindings, stars, public, lazy

    def _where(self, module: str, node: Any) -> str:
        return f"{self.file(module)}:{getattr(node, 'lineno', 0)}"

    def member(self, module: str, name: str, _seen: frozenset = frozenset()) -> Found | None:
        """`module.name`, by the resolution rule of the module docstring."""
        if (module, name) in _seen:
            return None
        seen = _seen | {(module, name)}
        bindings, stars, public, lazy = self._scope(module)
        node = bindings.get(name)
        if isinstance(node, tuple):
            return self._imported(node[1], self._where(module, node[2]), seen)
        if isinstance(node, ast.ClassDef):
            return Found("class", self._where(module, node), node, module)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            return Found("function", self._where(module, node), node, module)
        if node is not None:
            return Found("value", self._where(module, node), node, module)
        for star in stars:
            if self.is_module(star) and not name.startswith("_"):
                star_public = self._scope(star)[2]
                if star_public is None or name in star_public:
                    found = self.member(star, name, seen)
                    if found is not None:
                        return found
        if self.is_module(f"{module}.{name}"):
            return Found("module", self.file(f"{module}.{name}"), module=f"{module}.{name}")
        extension = self.extension(f"{module}.{name}")
        if extension:
            return Found("native", f"{module}.{name}: the native extension {extension}")
        if name in lazy:
            return Found("value", f"{self.file(module)}: answered by its module __getattr__", module=module)
        if public is not None and name in public:
            return Found("value", f"{self.file(module)}: listed in __all__ (its binding not in the source)",
                         module=module)
        return None

    def _imported(self, dotted: str, where: str, seen: frozenset) -> Found | None:
        """What an import binds: a wheel module or its member, a native member (checked), or an outside name."""
        if self.is_module(dotted):
            return Found("module", self.file(dotted), module=dotted)
        module, _, name = dotted.rpartition(".")
        if self.is_module(module):
            return self.member(module, name, seen)
        if dotted.split(".")[0] == "torch_npu":  # inside a native extension (torch_npu._C._profiler ...), or gone
            parts = module.split(".")
            inside = any(self.extension(".".join(parts[:i])) for i in range(2, len(parts) + 1))
            return self.native(dotted, f"imported at {where}") if inside else None
        return Found("unchecked", f"{dotted} (outside the wheel, imported at {where})")

    def native(self, dotted: str, where: str = "") -> Found | None:
        """A member of the native extension: found when its name ends a string in one of the wheel's shared
        libraries (answers cached beside the wheel: reading the 97 MB library takes seconds)."""
        name = dotted.rpartition(".")[2]
        if name not in self._native_names:
            self._native_names[name] = self._library_naming(name)
            try:  # atomically: parallel workers share the cache
                staged = self._native_cache.with_name(f"{self._native_cache.name}.{os.getpid()}")
                staged.write_text(json.dumps(self._native_names, indent=0, sort_keys=True))
                os.replace(staged, self._native_cache)
            except OSError:
                pass  # a read-only cache only costs the next run the seconds again
        library = self._native_names[name]
        if library is None:
            return None
        return Found("native", f"{dotted}: named in {library}" + (f" ({where})" if where else ""))

    def _library_naming(self, name: str) -> str | None:
        for library in self._libraries:
            if library not in self._library_data:
                with zipfile.ZipFile(self.wheel) as archive:
                    self._library_data[library] = archive.read(library)
            if name.encode() + b"\0" in self._library_data[library]:
                return library
        return None

    def class_member(self, found: Found, name: str, _depth: int = 0) -> Found | None:
        node, module = found.node, found.module
        for statement in node.body:
            if isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef)) and statement.name == name:
                return Found("function", self._where(module, statement), statement, module)
            if isinstance(statement, ast.ClassDef) and statement.name == name:
                return Found("class", self._where(module, statement), statement, module)
            if isinstance(statement, (ast.Assign, ast.AnnAssign)):
                targets = statement.targets if isinstance(statement, ast.Assign) else [statement.target]
                if any(isinstance(t, ast.Name) and t.id == name for t in targets):
                    return Found("value", self._where(module, statement), statement, module)
        for base in node.bases:
            text = ast.unparse(base)
            if text == "object" or _depth > 8:
                continue
            based = self._in_module(module, text)
            if based is None:
                continue
            if based.kind == "class":
                inherited = self.class_member(based, name, _depth + 1)
            elif based.kind == "native":
                inherited = self.native(f"{text}.{name}", f"the native base of {found.where}")
            else:
                inherited = Found("unchecked", f"{text}.{name} (base {text} of {found.where} is outside the wheel)")
            if inherited is not None:
                return inherited
        return None

    def _in_module(self, module: str, text: str) -> Found | None:
        """A dotted expression as written in `module` (a base class name)."""
        root, *rest = text.split(".")
        found = self.member(module, root)
        if found is None and root == "torch_npu":
            found = Found("module", self.file("torch_npu"), module="torch_npu")
        for part in rest:
            found = None if found is None else self.attribute(found, part, text)
        return found

    def attribute(self, found: Found, name: str, dotted: str) -> Found | None:
        if found.kind == "module":
            return self.member(found.module, name)
        if found.kind == "class":
            return self.class_member(found, name)
        if found.kind == "native":
            return self.native(dotted)
        return Found("unchecked", f"{dotted}: an attribute of a {found.kind} ({found.where})")

    def canonical(self, dotted: str) -> str:
        for alias, target in self.aliases.items():
            if dotted == alias or dotted.startswith(alias + "."):
                return target + dotted[len(alias):]
        return dotted

    def resolve(self, dotted: str) -> tuple[Found | None, str]:
        """(what `dotted` is, or None; the longest prefix of it that exists)."""
        parts = self.canonical(dotted).split(".")
        if parts[0] != "torch_npu":
            raise HarnessError(f"{dotted} is not a torch.npu / torch_npu name")
        found, reached = Found("module", self.file("torch_npu"), module="torch_npu"), "torch_npu"
        for part in parts[1:]:
            found = self.attribute(found, part, f"{reached}.{part}")
            if found is None:
                return None, reached
            reached = f"{reached}.{part}"
        return found, reached

    def signature(self, found: Found) -> tuple[Param, ...] | None:
        """The call signature of a function (as written, self included) or a class (its Python __init__, else
        __new__, first parameter dropped); None where the source does not say."""
        if found.kind == "function":
            return ast_signature(found.node)
        if found.kind == "class":
            for method in ("__init__", "__new__"):
                defined = self.class_member(found, method)
                if defined is not None and defined.kind == "function":
                    return ast_signature(defined.node, drop_first=True)
        return None


# -- what SGLang uses --------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class Use:
    name: str  # e.g. torch.npu.graph
    site: str  # file:line, relative to the sglang package
    call: ast.Call | None = None


def _chain(node: ast.AST) -> list[str] | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    return [node.id] + parts[::-1]


def uses_in(text: str, site_prefix: str) -> list[Use]:
    """Every torch.npu / torch_npu name a source uses: attribute chains from names bound to them by an import
    anywhere in the file (function-local imports too), imports from them, `device_module.X`, dotted strings."""
    tree = ast.parse(text, site_prefix)
    aliases, found = {"torch": "torch"}, []
    calls = {id(n.func): n for n in ast.walk(tree) if isinstance(n, ast.Call)}

    def keep(name: str, node: ast.AST, call=None):
        use = Use(name, f"{site_prefix}:{node.lineno}", call)
        if (name.startswith(ROOTS[0] + ".") or name.split(".")[0] == ROOTS[1]) and use not in found:
            found.append(use)

    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                aliases[alias.asname or alias.name.split(".")[0]] = alias.name if alias.asname else \
                    alias.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for alias in node.names:
                if alias.name != "*" and node.module.split(".")[0] == "torch_npu":
                    aliases[alias.asname or alias.name] = f"{node.module}.{alias.name}"
                    keep(f"{node.module}.{alias.name}", node)
    parents = {id(child): parent for parent in ast.walk(tree) for child in ast.iter_child_nodes(parent)}
    for node in ast.walk(tree):
        if isinstance(node, (ast.Attribute, ast.Name)) and not isinstance(parents.get(id(node)), ast.Attribute):
            parts = _chain(node)
            if not parts:
                continue
            device = next((i for i, p in enumerate(parts[:-1]) if p in DEVICE_MODULE_NAMES), None)
            if device is not None:
                keep(".".join(["torch.npu"] + parts[device + 1:]), node, calls.get(id(node)))
            elif parts[0] in aliases and (len(parts) > 1 or aliases[parts[0]] != parts[0]):
                if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                    continue
                keep(".".join([aliases[parts[0]]] + parts[1:]), node, calls.get(id(node)))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and DOTTED.match(node.value):
            keep(node.value, node)
    return found


def sglang_uses(sglang_dir: Path | None = None) -> list[Use]:
    if sglang_dir is None:
        from harness.versions import require_sglang

        sglang_dir = Path(require_sglang())
    sglang_dir, uses = Path(sglang_dir), []
    for relative in SCANNED:
        path = sglang_dir / relative
        files = sorted(path.glob("*.py")) if path.is_dir() else [path] if path.exists() else []
        for file in files:
            uses += uses_in(file.read_text(), str(file.relative_to(sglang_dir)))
    return uses


def _binds(signature: tuple, call: ast.Call) -> str | None:
    """Why the call cannot bind to the signature, or None (unknowable with *args / **kwargs at the call)."""
    if any(isinstance(a, ast.Starred) for a in call.args) or any(k.arg is None for k in call.keywords):
        return None
    parameters = [inspect.Parameter(name, getattr(inspect.Parameter, kind),
                                    **({} if default is EMPTY else {"default": default}))
                  for name, kind, default in signature]
    try:
        inspect.Signature(parameters).bind(*call.args, **{k.arg: k.value for k in call.keywords})
    except TypeError as error:
        return str(error)
    return None


# -- the stand-in ------------------------------------------------------------------------------------------------
def standin_surfaces() -> dict[str, types.ModuleType]:
    """The stand-in modules by the real name they stand for (built afresh, nothing installed)."""
    from harness.personalities import ascend

    return ascend.standin_modules()


def _explicit(module: types.ModuleType, prefix: str) -> dict[str, Any]:
    """The names a stand-in module provides itself (not its raising fallback), dotted, one level of members."""
    names = {}
    for name, value in vars(module).items():
        if name.startswith("__"):
            continue
        names[f"{prefix}.{name}"] = value
        if isinstance(value, types.SimpleNamespace):
            names.update({f"{prefix}.{name}.{member}": v for member, v in vars(value).items()})
    return names


def compared_api(surfaces: dict[str, types.ModuleType]) -> dict[str, Any]:
    """Real name -> the stand-in object, for GRAPH_API, the public methods of its NPUGraph and PROFILER_API."""
    npu, profiler = surfaces["torch.npu"], surfaces["torch_npu.profiler"]
    api = {f"torch.npu.{name}": vars(npu)[name] for name in GRAPH_API if name in vars(npu)}
    api.update({f"torch_npu.profiler.{name}": vars(profiler)[name] for name in PROFILER_API if name in vars(profiler)})
    graph_class = vars(npu).get("NPUGraph")
    if isinstance(graph_class, type):
        for klass in graph_class.__mro__[:-1]:
            for name, value in vars(klass).items():
                if not name.startswith("_") and callable(value):
                    api.setdefault(f"torch.npu.NPUGraph.{name}", getattr(graph_class, name))
    return api


# -- the check ---------------------------------------------------------------------------------------------------
@dataclasses.dataclass
class Contract:
    """What `check` compared: a failure lists `mismatches`; `unchecked` are the limits met on the way."""
    version: str
    signatures: dict = dataclasses.field(default_factory=dict)  # name -> (stand-in, real, where)
    uses: dict = dataclasses.field(default_factory=dict)  # name -> (sites, evidence)
    provided: dict = dataclasses.field(default_factory=dict)  # stand-in name -> evidence
    unchecked: list = dataclasses.field(default_factory=list)
    mismatches: list = dataclasses.field(default_factory=list)


def compare_signatures(real: RealTorchNpu, api: dict[str, Any], contract: Contract) -> None:
    for name, obj in api.items():
        found, reached = real.resolve(name)
        if found is None:
            contract.mismatches.append(
                f"the stand-in offers {name}, which the real torch_npu {real.version} lacks ({reached} has no "
                f"{name[len(reached) + 1:].split('.')[0]!r})")
            continue
        theirs = real.signature(found)
        if theirs is None:
            contract.unchecked.append(f"{name}: no Python signature in the wheel ({found.where})")
            continue
        ours = object_signature(obj)
        contract.signatures[name] = (render(ours), render(theirs), found.where)
        if not signatures_equal(ours, theirs):
            contract.mismatches.append(
                f"stand-in {name}{render(ours)} differs from the real {name}{render(theirs)} ({found.where}): "
                f"{first_difference(ours, theirs)}")


def check_uses(real: RealTorchNpu, uses: list[Use], contract: Contract) -> None:
    for use in uses:
        found, reached = real.resolve(use.name)
        sites, _ = contract.uses.get(use.name, ([], ""))
        contract.uses[use.name] = (sites + [use.site], found.where if found else "missing")
        if found is None:
            contract.mismatches.append(
                f"SGLang uses {use.name} at {use.site}, which the real torch_npu {real.version} lacks ({reached} "
                f"has no {real.canonical(use.name)[len(reached) + 1:].split('.')[0]!r})")
            continue
        if found.kind == "unchecked":
            contract.unchecked.append(f"{use.name} at {use.site}: {found.where}")
        theirs = real.signature(found) if use.call is not None else None
        why = _binds(theirs, use.call) if theirs is not None else None
        if why:
            contract.mismatches.append(
                f"SGLang calls {use.name}({', '.join(ast.unparse(a) for a in use.call.args + use.call.keywords)}) at "
                f"{use.site}, which the real signature {use.name}{render(theirs)} ({found.where}) refuses: {why}")


def check_provided(real: RealTorchNpu, surfaces: dict[str, types.ModuleType], contract: Contract) -> None:
    for prefix, module in surfaces.items():
        for name in _explicit(module, prefix):
            found, reached = real.resolve(name)
            contract.provided[name] = found.where if found else "missing"
            if found is None:
                contract.mismatches.append(f"the stand-in provides {name}, which the real torch_npu {real.version} "
                                           f"lacks ({reached} has no {name[len(reached) + 1:].split('.')[0]!r})")


def check(real: RealTorchNpu | None = None, *, surfaces: dict | None = None,
          sglang_dir: Path | None = None) -> Contract:
    """All three checks; raises OracleFailure naming every mismatch, else returns what was compared."""
    real = real or RealTorchNpu(fetch_wheel())
    surfaces = surfaces if surfaces is not None else standin_surfaces()
    contract = Contract(real.version)
    compare_signatures(real, compared_api(surfaces), contract)
    check_uses(real, sglang_uses(sglang_dir), contract)
    check_provided(real, surfaces, contract)
    if contract.mismatches:
        raise OracleFailure(ORACLE, contract.mismatches[0], mismatches=contract.mismatches,
                            torch_npu=f"{real.version} ({real.wheel})", unchecked=contract.unchecked)
    return contract
