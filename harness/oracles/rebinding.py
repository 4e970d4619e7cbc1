"""Static check: no module imports by value a module attribute that another module rebinds at run time.

Known bug class 1 (SGLang PR #27774): the NPU graph runner rebinds `torch_compile_decoration.patch_model`; a
refactor made the decode runner do `from ...torch_compile_decoration import patch_model` and call that, so the
override never ran. The class is generic: whenever module P does `M.name = value` or `setattr(M, "name", value)`
on a module M that is not P, any module R that did `from M import name` and uses `name` keeps the old value.

`scan(root)` parses every `.py` file under `root` (a package directory, e.g. the installed `sglang`) with `ast`:
1. Import bindings per module (any scope): `import a.b as x`, `from a import b` (b a submodule or an attribute),
   relative imports resolved against the module's package.
2. Rebinding sites: an assignment whose target is `X.name` or a `setattr(X, "name", ...)` call where `X` is bound
   to a module other than the current one (via the imports above). Modules outside `root` count too (a rebinding
   of `torch.x` is as dangerous to a by-value importer of `torch.x`).
3. By-value imports: `from M import name [as alias]` of a rebound `(M, name)` (also through a package that
   re-exports it by value), in a module other than the rebinding one, whose alias is then read somewhere in that
   module.
A finding prints the rebinding site and the by-value import site (file:line) and the first use. Cases known to
be benign are listed in `BENIGN` with the reason; they are reported separately, never silently dropped.

Scope: the oracle fails on findings whose by-value importer is on the capture/compile path (`CAPTURE_PATH`, where
the stale value would be used while graphs are captured or replayed, or a model compiled); findings elsewhere (the
scheduler, LoRA weight loading, multimodal generation) are the same class but outside this harness's targets, so
they are returned as `advisories`, recorded with each run, and fail only with `HARNESS_REBINDING_SCOPE=all`.
"""
from __future__ import annotations

import ast
import dataclasses
import functools
import hashlib
import os
import re
from pathlib import Path
from collections.abc import Iterable

from harness.oracles import OracleFailure

ORACLE = "rebinding-by-value-import"


@dataclasses.dataclass(frozen=True)
class Site:
    module: str
    path: str
    line: int
    scope: str  # "module level" or "in <function>"

    def __str__(self) -> str:
        return f"{self.path}:{self.line} ({self.module}, {self.scope})"


@dataclasses.dataclass(frozen=True)
class Finding:
    target_module: str
    name: str
    rebinding: Site
    by_value_import: Site
    alias: str
    first_use_line: int
    benign_reason: str | None = None

    @property
    def key(self) -> tuple[str, str, str]:
        return (f"{self.target_module}.{self.name}", self.rebinding.module, self.by_value_import.module)

    def describe(self) -> str:
        return (f"{self.target_module}.{self.name} is rebound at {self.rebinding}, but "
                f"{self.by_value_import.module} imports it by value at {self.by_value_import} "
                f"(`from {self.target_module} import {self.name}"
                f"{'' if self.alias == self.name else ' as ' + self.alias}`) and uses it at line "
                f"{self.first_use_line}: it keeps the original; look the name up on the module at call time")


@dataclasses.dataclass
class Findings:
    findings: list[Finding]
    benign: list[Finding]
    rebinding_count: int
    rebindings: list[tuple[str, str, Site]]
    advisories: list[Finding] = dataclasses.field(default_factory=list)  # findings outside the scope


# Importers whose code runs while graphs are captured or replayed, or a model is compiled.
CAPTURE_PATH = ("sglang.srt.model_executor", "sglang.srt.compilation", "sglang.srt.hardware_backend",
                "sglang.srt.layers", "sglang.srt.models", "sglang.srt.distributed", "sglang.srt.speculative",
                "sglang.srt.lora.backend", "sglang.srt.platforms")


def in_scope(finding: Finding, scope: tuple[str, ...] | None) -> bool:
    module = finding.by_value_import.module
    return scope is None or any(module == p or module.startswith(p + ".") for p in scope)


# (rebound name, rebinding module, importing module) -> why the by-value import is harmless. Keep reasons concrete.
_RUN_BENCHMARK = ("sglang.benchmark.steady_state_serving.cli_main wraps serving.run_benchmark for its own CLI "
                  "process only; these test helpers call run_benchmark in processes where that CLI never runs")
_METAL_PROFILE = ("apply_metal_profiler_patches runs only on Apple MPS (profiler_manager imports it under "
                  "is_mps()), where no CUDA/XPU graph runner is constructed; a latent instance of the class if "
                  "that ever changes (the NPU profiler patch goes through a string path this scan does not see)")
BENIGN: dict[tuple[str, str, str], str] = {
    ("sglang.benchmark.serving.run_benchmark", "sglang.benchmark.steady_state_serving", importer): _RUN_BENCHMARK
    for importer in ("sglang.test.test_utils", "sglang.test.mock_model.utils", "sglang.test.ascend.test_ascend_utils")
}
BENIGN.update({
    ("torch.profiler.profile", "sglang.srt.hardware_backend.mlx.profiler", importer): _METAL_PROFILE
    for importer in ("sglang.srt.model_executor.runner.decode_cuda_graph_runner",
                     "sglang.srt.hardware_backend.xpu.graph_runner.xpu_graph_runner",
                     "sglang.multimodal_gen.test.unit.manual.bench_lora_merge_addmm")
})


@dataclasses.dataclass
class _Module:
    name: str
    path: Path
    tree: ast.Module
    is_package: bool


def _module_name(root: Path, path: Path) -> tuple[str, bool]:
    relative = path.relative_to(root.parent).with_suffix("")
    parts = list(relative.parts)
    is_package = parts[-1] == "__init__"
    if is_package:
        parts = parts[:-1]
    return ".".join(parts), is_package


def _files(root: Path) -> dict[str, tuple[Path, bool]]:
    files = {}
    for directory, dirs, names in os.walk(root):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for file in sorted(names):
            if file.endswith(".py"):
                path = Path(directory) / file
                name, is_package = _module_name(root, path)
                files[name] = (path, is_package)
    return files


_ASSIGN_ROOT = re.compile(r"^[ \t]*([A-Za-z_]\w*)(?:\.[A-Za-z_]\w*)+[ \t]*(?::[^=\n]*)?(?:\+|-|\|)?=(?!=)", re.M)
_SETATTR_ROOT = re.compile(r"\bsetattr\(\s*([A-Za-z_]\w*)")
# A line that may rebind a module attribute: `a.b = ...` (not self./cls.) or a setattr call. Only files with one
# are parsed for rebinding sites; only files that mention a rebound name next to an import are parsed for imports.
_REBIND_LINE = re.compile(r"^[ \t]*(?!self\.|cls\.)[A-Za-z_]\w*(?:\.[A-Za-z_]\w*)+[ \t]*(?::[^=\n]*)?(?:\+|-|\|)?=(?!=)"
                          r"|\bsetattr\(", re.M)


_IMPORT_TEXT = re.compile(r"^[ \t]*(?:from[ \t]+[\w.]+[ \t]+)?import[ \t]+(\([^)]*\)|[^\n]*)", re.M)
_WORD = re.compile(r"[A-Za-z_]\w*")


def _imported_words(text: str) -> set[str]:
    """Every word on an import statement of `text` (a superset of the names the file binds by importing)."""
    return {w for m in _IMPORT_TEXT.finditer(text) for w in _WORD.findall(m.group(1))}


def _parse_text(text: str, name: str, path: Path, is_package: bool) -> _Module | None:
    try:
        return _Module(name, path, ast.parse(text, str(path)), is_package)
    except (SyntaxError, ValueError):
        return None


def _is_test_code(path: Path) -> bool:
    parts = path.parts
    return any(p in ("test", "tests") for p in parts[:-1]) or parts[-1].startswith("test_") or \
        parts[-1] == "conftest.py"


def _resolve_relative(module: _Module, level: int, target: str | None) -> str:
    if level == 0:
        return target or ""
    base = module.name.split(".")
    if not module.is_package:
        base = base[:-1]
    base = base[: len(base) - (level - 1)] if level > 1 else base
    return ".".join(base + ([target] if target else []))


def _scopes(tree: ast.AST) -> list[tuple[int, int, str, bool]]:
    """(first line, last line, dotted name, is a class) of every function and class, to name a line's scope."""
    spans = []

    def walk(node, prefix):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                name = f"{prefix}.{child.name}" if prefix else child.name
                spans.append((child.lineno, child.end_lineno, name, isinstance(child, ast.ClassDef)))
                walk(child, name)
            elif isinstance(child, ast.stmt):
                walk(child, prefix)

    walk(tree, "")
    return spans


def _scope_of(spans, line: int) -> str:
    best = None
    for first, last, name, is_class in spans:
        if first <= line <= last and not is_class and (best is None or first >= best[0]):
            best = (first, name)
    return f"in {best[1]}" if best else "module level"


def _imports(mod: _Module):
    """(alias -> module for `import x [as y]`, every `from x import y [as z]` as (source, name, alias, line, scope),
    the scope spans)."""
    spans = _scopes(mod.tree)
    aliases, froms = {}, []
    for node in ast.walk(mod.tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                aliases[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom):
            source = _resolve_relative(mod, node.level, node.module)
            for a in node.names:
                if a.name != "*":
                    froms.append((source, a.name, a.asname or a.name, node.lineno, _scope_of(spans, node.lineno)))
    return aliases, froms, spans


def _dotted(node: ast.AST) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        head = _dotted(node.value)
        return f"{head}.{node.attr}" if head else None
    return None


def _summarise(text: str, name: str, path: Path, is_package: bool) -> dict | None:
    """What the scan needs from one file: imports, attribute assignments (owner text, attr, line, scope), first
    read of each name."""
    mod = _parse_text(text, name, path, is_package)
    if mod is None:
        return None
    aliases, froms, spans = _imports(mod)
    assigns, loads = [], {}
    for node in ast.walk(mod.tree):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
            loads[node.id] = min(loads.get(node.id, node.lineno), node.lineno)
        targets = []
        if isinstance(node, (ast.Assign, ast.AugAssign, ast.AnnAssign)):
            for target in (node.targets if isinstance(node, ast.Assign) else [node.target]):
                if isinstance(target, ast.Attribute):
                    targets.append((target.value, target.attr, node.lineno))
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "setattr" \
                and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant) \
                and isinstance(node.args[1].value, str):
            targets.append((node.args[0], node.args[1].value, node.lineno))
        for owner, attr, line in targets:
            owner_text = _dotted(owner)
            if owner_text and owner_text.split(".")[0] not in ("self", "cls"):
                assigns.append((owner_text, attr, line, _scope_of(spans, line)))
    return {"aliases": aliases, "froms": froms, "assigns": assigns, "loads": loads}


@functools.lru_cache(maxsize=1)
def _scanner_digest() -> str:
    """A hash of this scanner's own source: summaries made by another version of it are never reused."""
    return hashlib.sha1(Path(__file__).read_bytes()).hexdigest()


class _SummaryCache:
    """Per-file summaries keyed by (scanner hash, content hash, module name), kept between runs under
    HARNESS_CACHE_DIR (default ~/.cache/harness): parsing all of SGLang costs tens of seconds on two cores, a
    scratch copy with one edited file re-parses only that file."""

    def __init__(self, path: Path, entries: dict) -> None:
        self.path = path
        self.entries = entries
        self.dirty = False

    @staticmethod
    def location() -> Path:
        """Where the cache lives, read when it is used (so a test's or a user's HARNESS_CACHE_DIR counts)."""
        return Path(os.environ.get("HARNESS_CACHE_DIR", Path.home() / ".cache" / "harness")) / "rebinding-v1.pickle"

    @classmethod
    def load(cls) -> _SummaryCache:
        """The cache's entries made by this scanner (those of other versions are dropped)."""
        import pickle

        path, digest = cls.location(), _scanner_digest()
        try:
            with open(path, "rb") as f:
                entries = {key: value for key, value in pickle.load(f).items() if key[0] == digest}
        except Exception:  # noqa: BLE001 - a missing or unreadable cache is rebuilt
            entries = {}
        return cls(path, entries)

    def get(self, text: str, name: str, path: Path, is_package: bool) -> dict | None:
        key = (_scanner_digest(), hashlib.sha1(text.encode("utf-8", "replace")).hexdigest(), name, is_package)
        if key not in self.entries:
            self.entries[key] = _summarise(text, name, path, is_package)
            self.dirty = True
        return self.entries[key]

    def save(self) -> None:
        import pickle

        if not self.dirty:
            return
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            temporary = self.path.with_suffix(f".{os.getpid()}.tmp")
            with open(temporary, "wb") as f:
                pickle.dump(self.entries, f)
            os.replace(temporary, self.path)
        except OSError:
            pass


@dataclasses.dataclass
class _Package:
    """The scanned package: its module files and texts, and the summary cache (`_SummaryCache`)."""

    root: Path
    files: dict
    texts: dict
    cache: _SummaryCache

    def is_module(self, name: str) -> bool:
        if name in self.files:
            return True
        if name.split(".")[0] == self.root.name:
            return False  # inside the package: only real files are modules
        return name in _EXTERNAL_MODULES

    def summary(self, name: str) -> dict | None:
        path, is_package = self.files[name]
        return self.cache.get(self.texts[name], name, path, is_package)

    def site(self, name: str, line: int, scope: str) -> Site:
        return Site(name, str(self.files[name][0]), line, scope)


def scan(root: str | os.PathLike | None = None, *, benign: dict | None = None) -> Findings:
    """Scan the package directory `root` (default: the installed sglang) for by-value imports of rebound names, in
    three phases: where a module rebinds another's attribute, which modules import such a name by value (and which
    re-export it), and which of those imports read the name after the rebinding could have happened."""
    if root is None:
        import importlib.util

        spec = importlib.util.find_spec("sglang")
        root = Path(next(iter(spec.submodule_search_locations)))
    root = Path(root).resolve()
    files = _files(root)
    package = _Package(root, files, {name: path.read_text(encoding="utf-8", errors="replace")
                                     for name, (path, _) in files.items()}, _SummaryCache.load())
    rebound = _rebinding_sites(package)
    value_imports, reexport = _value_imports(package, rebound)
    package.cache.save()
    findings, harmless = _match(package, rebound, value_imports, reexport, BENIGN if benign is None else benign)
    rebindings = [(m, n, s) for (m, n), sites in sorted(rebound.items()) for s in sites]
    order = lambda f: (f.key, f.rebinding.line, f.by_value_import.line)  # noqa: E731
    return Findings(sorted(findings, key=order), sorted(harmless, key=order), len(rebindings), rebindings)


def _rebinding_sites(package: _Package) -> dict[tuple[str, str], list[Site]]:
    """(module, attribute) -> where another module assigns (or setattr's) it. Only files where a line assigns to
    an attribute of a name the file imports are summarised."""
    rebound: dict[tuple[str, str], list[Site]] = {}
    for name, text in package.texts.items():
        roots = {m.group(1) for m in _ASSIGN_ROOT.finditer(text)} | {m.group(1) for m in _SETATTR_ROOT.finditer(text)}
        roots -= {"self", "cls"}
        if not roots or not roots & _imported_words(text):
            continue
        info = package.summary(name)
        if info is None:
            continue
        aliases = info["aliases"]
        from_alias = {alias: f"{source}.{imported}" if source else imported
                      for source, imported, alias, _, _ in info["froms"]}
        for owner, attr, line, scope in info["assigns"]:
            head, _, rest = owner.partition(".")
            base = aliases.get(head) or from_alias.get(head)
            if base is None:
                continue
            target_module = f"{base}.{rest}" if rest else base
            if target_module == name or not package.is_module(target_module):
                continue
            rebound.setdefault((target_module, attr), []).append(package.site(name, line, scope))
    return rebound


def _value_imports(package: _Package, rebound: dict) -> tuple[dict[str, list], dict]:
    """The `from ... import` lines of every file that mentions a rebound name in an import, and the module-level
    ones as re-exports ((module, alias) -> (source, name))."""
    names = "|".join(sorted({re.escape(name) for _, name in rebound}))
    mentions = re.compile(rf"\bimport\b[^\n]*\b({names})\b|\bimport\s*\([^)]*\b({names})\b") if names else None
    value_imports: dict[str, list] = {}
    reexport: dict[tuple[str, str], tuple[str, str]] = {}
    for name, text in package.texts.items():
        if mentions is None or not mentions.search(text):
            continue
        info = package.summary(name)
        if info is None:
            continue
        value_imports[name] = info["froms"]
        for source, imported, alias, _, scope in info["froms"]:
            if scope == "module level":
                reexport[(name, alias)] = (source, imported)
    return value_imports, reexport


def _match(package: _Package, rebound: dict, value_imports: dict, reexport: dict,
           benign: dict) -> tuple[list[Finding], list[Finding]]:
    """Each by-value import (followed through re-exports) of a name some other module rebinds, whose alias the
    importing module reads: a finding, or harmless with the reason `benign` gives."""
    def origin(source: str, name: str) -> tuple[str, str]:
        seen = set()
        while (source, name) in reexport and (source, name) not in seen:
            seen.add((source, name))
            source, name = reexport[(source, name)]
        return source, name

    findings, harmless = [], []
    for name, values in value_imports.items():
        loads = package.summary(name)["loads"]
        for source, imported, alias, line, scope in values:
            for key in {(source, imported), origin(source, imported)}:
                for site in rebound.get(key, []):
                    if site.module == name or alias not in loads:
                        continue
                    finding = Finding(key[0], key[1], site, package.site(name, line, scope), alias, loads[alias])
                    reason = _benign_reason(finding, benign)
                    if reason:
                        harmless.append(dataclasses.replace(finding, benign_reason=reason))
                    else:
                        findings.append(finding)
    return findings, harmless


def _benign_reason(finding: Finding, benign: dict) -> str | None:
    if finding.key in benign:
        return benign[finding.key]
    if finding.by_value_import.scope != "module level" and not finding.by_value_import.scope.startswith("in "):
        return None
    if finding.by_value_import.scope.startswith("in "):
        return ("the by-value import runs inside a function, so it reads the module attribute each time that "
                "function runs (after a rebinding made earlier)")
    if _is_test_code(Path(finding.rebinding.path)):
        return "the rebinding is made by SGLang's own test code, not at serving time"
    return None


# Modules outside the scanned package that SGLang rebinds attributes of: a dotted name is treated as a module
# when it is importable; cached per process.
class _ExternalModules:
    def __init__(self) -> None:
        self.cache: dict[str, bool] = {}

    def __contains__(self, name: str) -> bool:
        if name not in self.cache:
            import importlib.util

            try:
                self.cache[name] = importlib.util.find_spec(name) is not None
            except (ImportError, ValueError, AttributeError):
                self.cache[name] = False
        return self.cache[name]


_EXTERNAL_MODULES = _ExternalModules()


def assert_no_by_value_imports_of_rebound_names(root: str | os.PathLike | None = None,
                                                 scope: tuple[str, ...] | None = CAPTURE_PATH) -> Findings:
    """Raise OracleFailure listing every finding in `scope` (rebinding site and by-value import site); return the
    scan, with the findings outside `scope` moved to `advisories`."""
    result = scan(root)
    if os.environ.get("HARNESS_REBINDING_SCOPE") == "all":
        scope = None
    result.advisories = [f for f in result.findings if not in_scope(f, scope)]
    result.findings = [f for f in result.findings if in_scope(f, scope)]
    if result.findings:
        raise OracleFailure(
            ORACLE,
            f"{len(result.findings)} module(s) import by value a name that another module rebinds at run time:\n"
            + "\n".join("  - " + f.describe() for f in result.findings),
            findings=[f.key for f in result.findings])
    return result


def main(argv: Iterable[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("root", nargs="?", help="package directory to scan (default: the installed sglang)")
    parser.add_argument("--list-rebindings", action="store_true", help="also list every rebinding site")
    args = parser.parse_args(list(argv) if argv is not None else None)
    result = scan(args.root)
    if args.list_rebindings:
        for module, name, site in result.rebindings:
            print(f"rebinding: {module}.{name} at {site}")
    for finding in result.benign:
        print(f"benign: {finding.describe()}\n    because {finding.benign_reason}")
    for finding in result.findings:
        label = "FINDING" if in_scope(finding, CAPTURE_PATH) else "FINDING (outside the capture/compile path)"
        print(f"{label}: {finding.describe()}")
    print(f"{result.rebinding_count} rebinding site(s), {len(result.findings)} finding(s), "
          f"{len(result.benign)} benign")
    return 1 if result.findings else 0


if __name__ == "__main__":
    raise SystemExit(main())
