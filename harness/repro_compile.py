"""Compile-time failures SGLang users report for real model code under torch.compile, for `python -m harness repro`:
what such a log names, and the standalone script that re-creates the failure on the CPU with PyTorch's own tools
(`torch.compile(backend="eager"/"aot_eager", fullgraph=True)`, `torch.compiler.set_stance("fail_on_recompile")`).

- untraceable-call: a call Dynamo cannot trace (a `threading.Lock` entered, a function it skips such as
  `torch.cuda.get_device_name`, an `lru_cache`-wrapped function);
- missing-fake-impl: a custom op without a fake implementation reached by a compiled region;
- fake-script-object: an op handed a FakeScriptObject (a torchbind object, e.g. a quantised kernel's weight type);
- dynamo-recompile, when the log gives its guard: a recompile after capture, re-created with a guard of that kind.

The `*_evidence(text)` functions narrow a log to what it names (frame, function, call, op, guard); `plan(family,
text)` writes the script, or returns None where there is none to write (repro then searches the suite). Written
scripts exit 1 and print "reproduced: ..." when the failure happens, 0 when it does not, 3 when this machine cannot
make the call at all (a GPU-only kernel), saying which and why; `bisect --repro` reads them the same way.
"""
from __future__ import annotations

import ast
import dataclasses
import re
import textwrap
from pathlib import Path

from harness.mutants import REPO_ROOT
from harness.evidence.trace import script_prologue
from harness.versions import _dist_version, sglang_version

FRAME = re.compile(r'File "([^"]+)", line (\d+), in ([\w<>.]+)')
NOT_STATED = "not stated in the log"


# -- where a log says it failed ---------------------------------------------------------------------------------
def user_frame(text: str) -> tuple[str, int, str] | None:
    """(file, line, function) the failure happened in: the last frame of Dynamo's "from user code:" block, else
    the last frame outside torch (a frame inside torch is where torch noticed, not where the model called)."""
    if "from user code:" in text:
        block = re.split(r"\n\s*\n", text.split("from user code:", 1)[1].lstrip("\n"), maxsplit=1)[0]
        frames = FRAME.findall(block)
        if frames:
            return frames[-1][0], int(frames[-1][1]), frames[-1][2]
    frames = [f for f in FRAME.findall(text) if "/torch/" not in f[0] and "/functools.py" not in f[0]]
    return (frames[-1][0], int(frames[-1][1]), frames[-1][2]) if frames else None


def model_family(text: str) -> str | None:
    """The SGLang model file a traceback runs through (sglang/srt/models/deepseek_v2.py -> deepseek_v2)."""
    found = re.search(r"sglang/srt/models/(\w+)\.py", text)
    return found.group(1) if found else None


def installed_at(path: str, line: int, function: str) -> str | None:
    """What the installed SGLang has where the log's frame is (the line's text, where `function` is defined), or
    None for a frame outside SGLang."""
    relative = re.search(r"(?:^|.*/)(sglang/[\w/]+\.py)$", path)  # the last sglang/ of the path
    if relative is None:
        return None
    from harness.versions import require_sglang

    file = Path(require_sglang()).parent / relative.group(1)
    if not file.exists():
        return f"SGLang {sglang_version()} has no {relative.group(1)}"
    lines = file.read_text(errors="replace").splitlines()
    here = f"`{lines[line - 1].strip()}`" if 0 < line <= len(lines) else "past the file's end"
    defined = next((n for n, text in enumerate(lines, 1) if re.match(rf"\s*(?:async\s+)?def {re.escape(function)}\(",
                                                                      text)), None)
    where = f"defines {function} at line {defined}" if defined else f"defines no function {function}"
    return f"SGLang {sglang_version()}: {relative.group(1)}:{line} is {here}; the file {where}"


def site_evidence(text: str) -> dict:
    """The frame, the model file and what the installed SGLang has there."""
    frame = user_frame(text)
    evidence = {"frame": f"{frame[0]}:{frame[1]} in {frame[2]}" if frame else NOT_STATED}
    if model_family(text):
        evidence["model"] = model_family(text)
    installed = installed_at(*frame) if frame else None
    if installed:
        evidence["installed"] = installed
    return evidence


def _reason(text: str) -> str:
    """Dynamo's own words: the exception line and its Explanation."""
    found = re.search(r"torch\._dynamo\.exc\.\w+: ([^\n]+)", text) or re.search(r"Graph Break Reason: ([^\n]+)", text)
    reason = found.group(1).strip() if found else NOT_STATED
    explanation = re.search(r"Explanation: ([^\n]+)", text)
    return f"{reason} ({explanation.group(1).strip()})" if explanation else reason


# -- untraceable-call ---------------------------------------------------------------------------------------------
def called(text: str) -> tuple[str, str] | None:
    """(kind, dotted name) of the call Dynamo refused: ("lru_cache", name), ("context-manager", "threading.Lock"),
    ("skipped", "torch.cuda.get_device_name"); None when the log does not say."""
    dotted = None
    if found := re.search(r"module: ([\w.]+), qualname: ([\w.]+)", text):  # Dynamo's debug context
        dotted = f"{found.group(1)}.{found.group(2)}"
    elif found := (re.search(r"function `(\w+)` in file `([^`]+)`", text)
                   or re.search(r"skip function (\w+) in file (\S+?)['\"]?(?:\s|$)", text)):  # older releases
        dotted = f"{_module_of(found.group(2))}.{found.group(1)}"
    if re.search(r"lru_cache", text):
        return "lru_cache", dotted or "cached"
    lock = re.search(r"threading\.(R?Lock)\b|enter an? `(r?lock)` context manager|Variable\((R?[Ll]ock)\)", text)
    if lock:
        name = next(g for g in lock.groups() if g)
        return "context-manager", "threading." + ("RLock" if name.lower() == "rlock" else "Lock")
    return ("skipped", dotted) if dotted else None


def _module_of(path: str) -> str:
    """torch/cuda/__init__.py (anywhere under site-packages or a source tree) -> torch.cuda."""
    path = re.sub(r"^.*?/(?:site-packages|dist-packages|python)/", "", path.replace("\\", "/"))
    return re.sub(r"(?:/__init__)?\.py$", "", path).strip("/").replace("/", ".")


def untraceable_evidence(text: str) -> dict:
    kind, name = called(text) or ("unknown", NOT_STATED)
    return {"call": f"{name} ({kind})", "reason": _reason(text), **site_evidence(text)}


# -- missing-fake-impl and fake-script-object ------------------------------------------------------------------
# The forms torch prints a custom op in, most specific first.
OP_FORMS = (r"<OpOverload\(op='(\w+)\.(\w+)'", r"<CustomOpDef\((\w+)::(\w+)\)>",
            r"unsupported operator: (\w+)\.(\w+)\b", r"UnsupportedOperatorException: (\w+)\.(\w+)\b",
            r"call_function (\w+)\.(\w+)\(", r"\b(\w+)::(\w+)\(\)", r"torch\.ops\.(\w+)\.(\w+)\b",
            r"\b(sglang|sgl_kernel|_C)::(\w+)\b")


def op_named(text: str) -> tuple[str, str] | None:
    """(namespace, name) of the custom op the log names, in any of the forms torch prints it."""
    for form in OP_FORMS:
        found = re.search(form, text)
        if found and found.group(1) not in ("aten", "prim", "prims"):
            return found.group(1), found.group(2)
    return None


def missing_fake_evidence(text: str) -> dict:
    op = op_named(text)
    evidence = {"op": f"{op[0]}::{op[1]}" if op else NOT_STATED, **site_evidence(text)}
    if op and op[0] == "sglang":
        module = registering_module(op[1])
        evidence["registered"] = (f"SGLang {sglang_version()} registers sglang::{op[1]} in {module}" if module else
                                  f"SGLang {sglang_version()} registers no op sglang::{op[1]}")
    return evidence


def script_class(text: str) -> tuple[str | None, str | None]:
    """(torchbind class, argument) a FakeScriptObject stood in for, as the log's schema check names them."""
    found = re.search(r"Expected a value of type '([^']+)' for argument '(\w+)'", text)
    return (found.group(1), found.group(2)) if found else (None, None)


def fake_script_object_evidence(text: str) -> dict:
    op = op_named(text)
    cls, argument = script_class(text)
    attribute = re.search(r"attr '(\w+)' on a FakeScriptObject", text)
    evidence = {"op": f"{op[0]}::{op[1]}" if op else NOT_STATED, "class": cls or NOT_STATED}
    if argument:
        evidence["argument"] = argument
    if attribute:
        evidence["attribute"] = attribute.group(1)
    return {**evidence, **site_evidence(text)}


def registering_module(name: str) -> str | None:
    """The installed SGLang module that registers the custom op sglang::`name` (register_custom_op or
    direct_register_custom_op), found by reading the sources, not importing them."""
    from harness.versions import require_sglang

    package = Path(require_sglang())
    forms = re.compile(rf"op_name\s*=\s*[\"']{name}[\"']|direct_register_custom_op\(\s*(?:op_name\s*=\s*)?"
                       rf"[\"']{name}[\"']|register_custom_op\b[^\n]*\n(?:[^\n]*\n){{0,6}}?\s*def {name}\(")
    for file in sorted(package.rglob("*.py")):
        source = file.read_text(errors="replace")
        if "register_custom_op" in source and forms.search(source):
            return ".".join(file.relative_to(package.parent).with_suffix("").parts)
    return None


# -- dynamo-recompile's guard -----------------------------------------------------------------------------------
@dataclasses.dataclass
class Guard:
    """A failed guard by kind, alike across torch releases (`L['n'] == 3` in one is `n == 3` in another)."""
    kind: str  # global-state, tensor-size, tensor-dtype, tensor-requires_grad, global, local, or other
    subject: str  # the state item, or the guarded value's path (flag, self.flag, x)
    value: object = None  # what the guard held: the constant, or (expected, actual) of a tensor
    text: str = ""

    def describe(self) -> str:
        return f"{self.kind} ({self.subject})"


def _path(source: str) -> str:
    return re.sub(r"[LG]\['(\w+)'\]", r"\1", source)


def guard_kind(guard: str) -> Guard:
    """The kind of a failed guard's text (Dynamo's source comment after it dropped)."""
    text = re.split(r"\s{2,}#", guard)[0].strip()
    if found := re.match(r"GLOBAL_STATE changed: (\w+)", text):
        return Guard("global-state", found.group(1), text=text)
    if found := re.match(r"tensor '(.+?)' (size|dtype|requires_grad)\b[^\n]*?mismatch.*?expected (\S+?),? "
                         r"actual (\S+)", text):
        return Guard(f"tensor-{found.group(2)}", _path(found.group(1)), (found.group(3), found.group(4)), text)
    found = re.match(r"(?:___check_obj_id\()?((G|L)\['(\w+)'\]|(\w+))((?:\.\w+)*)(?:,.*|\s*(?:==|is)\s*(.+))$", text)
    if found is None or text.startswith("___check_type_id"):
        return Guard("other", text, text=text)
    scope = "global" if found.group(2) == "G" else "local"
    try:
        value = ast.literal_eval(found.group(6).strip()) if found.group(6) else None
    except (ValueError, SyntaxError):
        value = None
    return Guard(scope, (found.group(3) or found.group(4)) + found.group(5), value, text)


def failed_guard(text: str) -> str | None:
    """The first failed guard the log prints: "triggered by the following guard failure(s): - 0/0: ...", or a
    recompile limit's "last reason: 0/7: ..."."""
    if "guard failure(s):" in text:  # the next " - " item, whatever log prefix its line carries
        found = re.search(r"\s-\s+(?:\d+/\d+:\s*)?(\S[^\n]*)", text.split("guard failure(s):", 1)[1])
    else:
        found = re.search(r"last reason:\s*(?:\d+/\d+:\s*)?([^\n]+)", text)
    return found.group(1).strip() if found else None


def recompiled(text: str) -> tuple[str, str, int] | None:
    """(function, file, line) of the recompiled frame, in the forms torch prints it."""
    forms = (r"Recompiling function (\S+) in (\S+?):(\d+)", r"function name: '(\S+?)', line number: (\d+)",
             r"function: '(\S+?)' \((\S+?):(\d+)\)")
    if found := re.search(forms[0], text) or re.search(forms[2], text):
        return found.group(1), found.group(2), int(found.group(3))
    if found := re.search(r"filename: '([^']+)', " + forms[1], text):
        return found.group(2), found.group(1), int(found.group(3))
    return None


def recompile_evidence(text: str) -> dict:
    """The failed guard and its kind, the recompiled function and frame, and what the installed SGLang has there;
    only what the log states (a guard-less recompile log keeps the suite search)."""
    evidence = {}
    guard = failed_guard(text)
    if guard:
        evidence["guard"] = re.split(r"\s{2,}#", guard)[0].strip()
        evidence["guard kind"] = guard_kind(guard).describe()
    frame = recompiled(text)
    if frame:
        evidence["function"] = frame[0]
        evidence["frame"] = f"{frame[1]}:{frame[2]} in {frame[0]}"
        installed = installed_at(frame[1], frame[2], frame[0])
        if installed:
            evidence["installed"] = installed
    if model_family(text):
        evidence["model"] = model_family(text)
    return evidence


# -- the scripts ------------------------------------------------------------------------------------------------
@dataclasses.dataclass
class Plan:
    """A standalone script for one log: its file stem and text, and a line on what it re-creates."""
    name: str
    script: str
    what: str


def _doc(text: object) -> str:
    """Text safe inside the script's docstring."""
    return str(text).replace("\\", "/").replace('"""', "'''")[:400]


def _header(summary: str, details: str, exits: str) -> str:
    """The script's shebang and docstring: what it re-creates, from which log, how to read its exit status."""
    origin = f"Written by `python -m harness repro` on SGLang {sglang_version()}, torch {_dist_version('torch')}."
    body = " ".join(part for part in (origin, _doc(details), "Run it with the harness environment's Python.", exits)
                    if part)
    fill = dict(width=116, break_on_hyphens=False, break_long_words=False)
    trace = "`--torch-trace DIR`: under TORCH_TRACE, rendered by tlparse into DIR/tlparse/index.html."
    return (f'#!/usr/bin/env python\n"""{textwrap.fill(_doc(summary), **fill)}\n\n{textwrap.fill(body, **fill)}\n'
            f'{trace}\n"""\n{script_prologue(str(REPO_ROOT))}')


SGLANG_IMPORTS = f'''sys.path.insert(0, {str(REPO_ROOT)!r})
from harness.compat import prepare_torchvision  # noqa: E402  (SGLang imports torchvision through transformers)

prepare_torchvision()
'''


def plan(family: str, text: str) -> Plan | None:
    """The script that re-creates a log of `family` on the CPU, or None (no script of its own: search instead)."""
    writer = {"untraceable-call": untraceable_plan, "missing-fake-impl": missing_fake_plan,
              "fake-script-object": fake_script_object_plan, "dynamo-recompile": recompile_plan}.get(family)
    return writer(text) if writer else None


def _identifier(name: str | None, default: str) -> str:
    return name if name and name.isidentifier() and not name.startswith("__") else default


# -- untraceable-call's script --
UNTRACEABLE = r'''import re
import sys

import torch
{definitions}


def {function}(x):
{body}


CALL = {call!r}
NEEDS_GPU = r"NVIDIA driver|Torch not compiled with CUDA|no CUDA GPUs|CUDA driver|cudaGetDevice"
try:
    torch.compile({function}, backend="eager", fullgraph=True)(torch.ones(4))
except Exception as error:  # Dynamo refused the call (Unsupported), or the call failed while Dynamo ran it
    message = f"{{type(error).__name__}}: {{str(error).strip().splitlines()[0]}}"
    needs = re.search(r"[^'\"(\n]*(?:" + NEEDS_GPU + r")[^'\".\n]*", str(error))
    if needs:
        print(f"cannot run on this machine: Dynamo ran {{CALL}} to trace it, and it needs a GPU ({{needs.group(0)}})")
        sys.exit(3)
    print(f"reproduced: torch {{torch.__version__}} cannot trace {{CALL}} (fullgraph): {{message}}")
    sys.exit(1)
print(f"did not reproduce: torch {{torch.__version__}} traces {{CALL}} in one graph (the log's torch refused it)")
'''


def _call_parts(kind: str, name: str) -> tuple[str, str] | None:
    """(definitions, body) of a minimal function making the call the log names."""
    if kind == "context-manager":
        return f"import threading\n\nLOCK = {name}()  # held by the model code, as in the log\n", \
            "    with LOCK:\n        return x + 1"
    if kind == "lru_cache":
        short = _identifier(name.rsplit(".", 1)[-1], "cached")
        return (f"import functools\n\n\n@functools.lru_cache\ndef {short}():\n    return 1\n",
                f"    return x + {short}()")
    module, _, attribute = name.rpartition(".")
    if not module:
        return None
    return (f"import importlib\n\nCALLED = importlib.import_module({module!r}).{attribute}\n",
            "    CALLED()\n    return x + 1")


def untraceable_plan(text: str) -> Plan | None:
    call = called(text)
    parts = _call_parts(*call) if call else None
    if parts is None:
        return None
    kind, name = call
    frame = user_frame(text)
    function = _identifier(frame[2] if frame else None, "model_step")
    header = _header(f"Reproduces a call Dynamo cannot trace: {name} ({kind}).",
                     f"The log's compiled region made the call at {site_evidence(text)['frame']}; a minimal "
                     f"function named {function} makes it under torch.compile(fullgraph=True, backend=\"eager\").",
                     "Exit 1 when Dynamo refuses the call, 0 when it traces it, 3 when this machine cannot make it.")
    script = header + UNTRACEABLE.format(definitions=parts[0].rstrip("\n"), function=function, body=parts[1],
                                         call=name)
    return Plan(f"untraceable_{_identifier(name.replace('.', '_'), 'call')}", script,
                f"a call to {name} ({kind}) under torch.compile(fullgraph=True)")


# -- missing-fake-impl's script --
MISSING_FAKE = r'''import importlib
import re
import sys

import torch

{sglang_imports}NAMESPACE, NAME, MODULE = {namespace!r}, {name!r}, {module!r}
KEEP = []  # the scratch library lives as long as the script
TRACED = "harness_repro: the compiled graph ran the op's kernel, so tracing passed"


def installed_op():
    """The op as this machine registers it, or exit saying why there is none."""
    try:
        importlib.import_module(MODULE)
    except ImportError as error:
        print(f"cannot run on this machine: {{MODULE}}, which registers {{NAMESPACE}}::{{NAME}}, does not import "
              f"here ({{error}}; CUDA available: {{torch.cuda.is_available()}})")
        sys.exit(3)
    packet = getattr(getattr(torch.ops, NAMESPACE), NAME, None)
    if packet is None:
        print(f"did not reproduce: {{MODULE}} registers no op {{NAMESPACE}}::{{NAME}} here")
        sys.exit(0)
    return packet.default


def has_fake(op) -> bool:
    entry = torch._library.simple_registry.singleton.find(op.name())
    return entry.fake_impl.kernel is not None or torch._C._dispatch_has_kernel_for_dispatch_key(op.name(), "Meta")


def without_fake(op):
    """A copy of `op`, its schema and no fake impl (the log's state), in a scratch namespace."""
    library = torch.library.Library("harness_repro", "FRAGMENT")
    library.define(str(op._schema).split("::", 1)[1])
    library.impl(NAME, lambda *args, **kwargs: (_ for _ in ()).throw(RuntimeError(TRACED)), "CPU")
    KEEP.append(library)
    return getattr(torch.ops.harness_repro, NAME).default


def example(argument):
    """A value of the argument's type (fake propagation fails before any shape matters)."""
    kind = str(argument.type)
    if argument.has_default_value():
        return argument.default_value
    values = {{"Tensor": torch.randn(4, 8), "int": 1, "SymInt": 1, "float": 1.0, "bool": False, "str": "",
              "ScalarType": torch.float32, "List[int]": [1], "List[SymInt]": [1]}}
    return None if kind.startswith("Optional") else values.get(kind)


def reproduce(op):
    args = [example(a) for a in op._schema.arguments if not a.kwarg_only]
    kwargs = {{a.name: example(a) for a in op._schema.arguments if a.kwarg_only}}

    class CallsOp(torch.nn.Module):
        def forward(self, *args, **kwargs):
            return op(*args, **kwargs)

    try:
        torch.compile(CallsOp(), backend="aot_eager", fullgraph=True)(*args, **kwargs)
    except Exception as error:
        text = f"{{type(error).__name__}}: {{error}}"
        if TRACED not in text and NAME in text and re.search(r"fake (impl|tensor)|UnsupportedOperator", text, re.I):
            named = next((line.strip() for line in text.splitlines() if NAME in line), "")
            print(f"reproduced: compiling a call of {{op.name()}} fails for want of a fake impl: "
                  f"{{text.strip().splitlines()[0]}} ({{named}})")
            sys.exit(1)
        if TRACED not in text:
            raise
    trivial = torch._library.utils.can_generate_trivial_fake_impl(op)
    print(f"did not reproduce: torch {{torch.__version__}} traced a call of {{op.name()}}"
          + (": it returns nothing, and torch generates a trivial fake impl for such an op" if trivial else ""))


op = installed_op()
if has_fake(op):
    print(f"{{op.name()}} has a fake impl in this SGLang; a copy without one (harness_repro::{{NAME}}) stands in, "
          "as the log states")
    op = without_fake(op)
else:
    print(f"{{op.name()}} has no fake impl nor Meta kernel in this SGLang: calling it as the log did")
reproduce(op)
'''


def missing_fake_plan(text: str) -> Plan | None:
    op = op_named(text)
    if op is None:
        return None
    namespace, name = op
    module = registering_module(name) if namespace == "sglang" else namespace
    if module is None:
        said = (f"did not reproduce: SGLang {sglang_version()} registers no op sglang::{name} (no register_custom_op "
                "/ direct_register_custom_op of that name)")
        header = _header(f"The log's op sglang::{name} does not exist in the installed SGLang.", "",
                         "Exit 0: nothing to run.")
        return Plan(f"missing_fake_{name}", f"{header}print(\n    {said!r}\n)\n",
                    f"sglang::{name}, which SGLang {sglang_version()} does not have")
    header = _header(f"Reproduces a missing fake implementation: {namespace}::{name} reached by a compiled region.",
                     f"The log failed at {site_evidence(text)['frame']}. The script imports {module} (which "
                     "registers the op), reads the op's schema and whether it has a fake impl, and compiles "
                     "(backend \"aot_eager\", fullgraph) a module calling it; where the installed op has a fake "
                     "impl, a scratch copy with its schema and none stands in, as the log states.",
                     "Exit 1 when tracing fails for want of a fake impl, 0 when it traces, 3 when the op's module "
                     "does not import here.")
    script = header + MISSING_FAKE.format(sglang_imports=SGLANG_IMPORTS if namespace == "sglang" else "",
                                          namespace=namespace, name=name, module=module)
    return Plan(f"missing_fake_{name}", script, f"{namespace}::{name} without a fake impl under torch.compile")


# -- fake-script-object's script --
FAKE_SCRIPT_OBJECT = r'''import importlib
import sys

import torch

NAMESPACE, NAME, CLASS = {namespace!r}, {name!r}, {cls!r}


def missing() -> list[str]:
    """What this machine lacks to call the op with its torchbind object: the package, the op, the class."""
    lacks = []
    try:
        importlib.import_module(NAMESPACE)
    except ImportError as error:
        lacks.append(f"the package {{NAMESPACE}} that registers the op does not import ({{error}})")
    if getattr(getattr(torch.ops, NAMESPACE), NAME, None) is None:
        lacks.append(f"no op {{NAMESPACE}}::{{NAME}} is registered")
    if CLASS and "." in CLASS:
        namespace, cls = CLASS.split(".")[-2:]  # __torch__.torch.classes.NAMESPACE.CLASS
        try:
            getattr(getattr(torch.classes, namespace), cls)
        except (AttributeError, RuntimeError):
            lacks.append(f"no torchbind class {{CLASS}}")
    return lacks


lacks = missing()
if lacks:
    print(f"cannot run on this machine: {{'; '.join(lacks)}}. {{NAMESPACE}}::{{NAME}} is a GPU kernel (CUDA "
          f"available here: {{torch.cuda.is_available()}}); the FakeScriptObject failure happens where torch.compile "
          "traces it with its torchbind argument, so it needs a machine with that package and a GPU")
    sys.exit(3)
print(f"did not reproduce: {{NAMESPACE}}::{{NAME}} and its class are registered here, but the harness has no inputs "
      "for them: run the log's launch command on this machine")
'''


def fake_script_object_plan(text: str) -> Plan | None:
    op = op_named(text)
    if op is None:
        return None
    cls, argument = script_class(text)
    header = _header(f"Checks whether this machine can run {op[0]}::{op[1]}, which was handed a FakeScriptObject"
                     f"{f' for its argument {argument}' if argument else ''} under torch.compile.",
                     f"The log failed at {site_evidence(text)['frame']}: torch.compile's fake tensor propagation "
                     f"handed the op a FakeScriptObject in place of its torchbind object ({cls or 'class not named'}).",
                     "Exit 3 (and what is missing) when this machine cannot call the op, 0 when it can.")
    script = header + FAKE_SCRIPT_OBJECT.format(namespace=op[0], name=op[1], cls=cls)
    return Plan(f"fake_script_object_{op[1]}", script, f"{op[0]}::{op[1]} handed a FakeScriptObject")


# -- dynamo-recompile's script --
RECOMPILE = r'''import re
import sys

import torch

{definitions}
NAME = {function!r}
LOG_GUARD = {guard!r}
KIND = {kind!r}
EXPECTED = {expected!r}  # a guard of the log's kind, as any torch release prints it

compiled = torch.compile({target}, backend="eager", dynamic={dynamic})
{first}
compiled({args})
{second}
try:
    with torch.compiler.set_stance("fail_on_recompile"):
        compiled({args2})
except RuntimeError as error:
    guards = [g.strip() for g in re.findall(r"^\s*- \d+/\d+: (.+?)(?:\s{{2,}}#.*)?$", str(error), re.M)]
    if not guards:
        raise
    if any(re.search(EXPECTED, guard) for guard in guards):
        print(f"reproduced: torch {{torch.__version__}} recompiled {{NAME}} on the guard {{guards[0]!r}} "
              f"(the log's: {{LOG_GUARD!r}}, kind {{KIND}})")
        sys.exit(1)
    print(f"did not reproduce: it recompiled on {{guards}}, no guard of kind {{KIND}}")
    sys.exit(0)
print("did not reproduce: no recompile")
'''
# Global state Dynamo guards (GLOBAL_STATE changed: ITEM): the statement before the first call, before the second.
GLOBAL_STATE = {
    "grad_mode": ("torch.set_grad_enabled(False)", "torch.set_grad_enabled(True)"),
    "deterministic_algorithms": ("torch.use_deterministic_algorithms(False)",
                                 "torch.use_deterministic_algorithms(True)"),
    "num_threads": ("torch.set_num_threads(1)", "torch.set_num_threads(2)"),
    "default_dtype": ("torch.set_default_dtype(torch.float32)", "torch.set_default_dtype(torch.float64)"),
    "allow_tf32": ("torch.backends.cuda.matmul.allow_tf32 = False", "torch.backends.cuda.matmul.allow_tf32 = True"),
}
# In-model helpers SGLang wraps in torch.compile, with arguments that run on the CPU: a recompile of one of them
# is re-created on SGLang's own function (the others on a minimal function of the same name).
HELPERS = {
    "grouped_topk_gpu": ("sglang.srt.layers.moe.topk", "torch.randn(4, 16), torch.randn(4, 8), 2, True, 4, 2"),
    "kimi_k2_biased_topk_impl": ("sglang.srt.layers.moe.topk",
                                 "torch.randn(4, 16), torch.randn(4, 8), torch.zeros(8), 2, True"),
    "apply_rotary_pos_emb_native": ("sglang.srt.layers.rotary_embedding.utils",
                                    "torch.randn(4, 2, 8), torch.randn(4, 2, 8), torch.randn(4, 8), torch.randn(4, 8)"),
}


def _other(value: object) -> object:
    """A value the guard on `value` rejects."""
    if isinstance(value, bool) or value is None:
        return not value
    return value + 1 if isinstance(value, (int, float)) else f"{value}_other"


def _holder(attributes: list[str], value: object) -> str:
    """An expression whose attribute path `attributes` holds `value` (SimpleNamespace(flag=True))."""
    expression = repr(value)
    for attribute in reversed(attributes):
        expression = f"SimpleNamespace({attribute}={expression})"
    return expression


def _helper(function: str) -> tuple[str, str] | None:
    """(module, arguments) of the SGLang helper the log names, when the installed SGLang defines it."""
    from harness.versions import require_sglang

    if function not in HELPERS:
        return None
    module, arguments = HELPERS[function]
    file = Path(require_sglang()).parent.joinpath(*module.split(".")).with_suffix(".py")
    defined = file.exists() and re.search(rf"^def {function}\(", file.read_text(errors="replace"), re.M)
    return (module, arguments) if defined else None


def _state_parts(guard: Guard, function: str) -> dict | None:
    """A GLOBAL_STATE guard: SGLang's own helper when the log names one, else a minimal function."""
    if guard.subject not in GLOBAL_STATE:
        return None
    first, second = GLOBAL_STATE[guard.subject]
    helper = _helper(function)
    if helper:
        definitions = (f"{SGLANG_IMPORTS}from {helper[0]} import {function} as helper  # noqa: E402\n\n"
                       f"FUNCTION = getattr(helper, \"_torchdynamo_orig_callable\", helper)  # the function SGLang "
                       f"wraps in torch.compile\nARGS = ({helper[1]})\n\n")
        return dict(definitions=definitions, target="FUNCTION", dynamic=True, first=first, second=second,
                    args="*ARGS", args2="*ARGS", how=f"The function is SGLang's own {function} ({helper[0]}).")
    definitions = f"\ndef {function}(x):\n    return torch.softmax(x, dim=-1) * 2\n\n\nARGS = (torch.randn(4, 8),)\n\n"
    return dict(definitions=definitions, target=function, dynamic=None, first=first, second=second, args="*ARGS",
                args2="*ARGS", how=f"A minimal function named {function} stands in.")


def _value_parts(guard: Guard, function: str) -> dict:
    """A guard on a global's or an argument's value (flag == True, ___check_obj_id(G['flag'], ...), n == 3)."""
    root, *attributes = guard.subject.split(".")
    value = True if guard.value is None else guard.value
    read = f"{root}{''.join('.' + a for a in attributes)}"
    test = (read if value else f"not {read}") if isinstance(value, bool) else f"{read} == {value!r}"
    x = "y" if root == "x" else "x"  # the tensor argument, named apart from the guarded one
    body = f"    return {x} + 1 if {test} else {x} - 1\n\n\n"
    imports = "from types import SimpleNamespace\n\n" if attributes else ""
    if guard.kind == "global":
        definitions = f"{imports}{root} = {_holder(attributes, value)}\n\n\ndef {function}({x}):\n{body}"
        second = f"{read} = {_other(value)!r}" if attributes else f"{root} = {_other(value)!r}"
        return dict(definitions=definitions, target=function, dynamic=False, first="", second=second,
                    args="torch.ones(4)", args2="torch.ones(4)", how="A minimal function reads the global.")
    definitions = f"{imports}\ndef {function}({x}, {root}):\n{body}"
    return dict(definitions=definitions, target=function, dynamic=False, first="", second="",
                args=f"torch.ones(4), {_holder(attributes, value)}",
                args2=f"torch.ones(4), {_holder(attributes, _other(value))}",
                how=f"A minimal function takes {root} as the log's frame did.")


DTYPES = {"Float": "float32", "Half": "float16", "BFloat16": "bfloat16", "Double": "float64", "Long": "int64",
          "Int": "int32", "Bool": "bool"}  # as a tensor guard names them


def _tensor_parts(guard: Guard, function: str) -> dict | None:
    """A guard on a tensor argument's size, dtype or requires_grad, with the log's expected and actual values."""
    expected, actual = guard.value
    make = {"tensor-size": lambda v: f"torch.ones({int(v)})" if v.isdigit() else None,
            "tensor-dtype": lambda v: f"torch.ones(4, dtype=torch.{DTYPES[v]})" if v in DTYPES else None,
            "tensor-requires_grad": lambda v: f"torch.ones(4, requires_grad={v == 'True'})"}[guard.kind]
    first, second = make(expected), make(actual)
    if first is None or second is None:
        return None
    name = _identifier(guard.subject, "x")
    definitions = f"\ndef {function}({name}):\n    return {name} * 2\n\n\n"
    return dict(definitions=definitions, target=function, dynamic=False, first="", second="", args=first,
                args2=second, how=f"A minimal function takes the tensor {name}.")


def _value_pattern(guard: Guard) -> str:
    """A guard on the same global or argument path, in any release's spelling (G['flag'], L['n'] or n)."""
    root, *attributes = guard.subject.split(".")
    pattern = rf"G\['{root}'\]" if guard.kind == "global" else rf"(?:L\['{root}'\]|(?<![\w.'\]]){root}\b)"
    return pattern + "".join(rf"\.{a}\b" for a in attributes)


def recompile_plan(text: str) -> Plan | None:
    """A recompile with the log's guard kind, or None for a kind the harness cannot re-create (the search then)."""
    guard_text = failed_guard(text)
    if guard_text is None:
        return None
    guard = guard_kind(guard_text)
    frame = recompiled(text)
    function = _identifier(frame[0] if frame else None, "compiled_function")
    if guard.kind == "global-state":
        parts = _state_parts(guard, function)
        expected = rf"GLOBAL_STATE changed: .*\b{guard.subject}\b"
    elif guard.kind in ("global", "local"):
        parts = _value_parts(guard, function) if guard.subject.split(".")[0].isidentifier() else None
        expected = _value_pattern(guard)
    elif guard.kind.startswith("tensor-"):
        parts = _tensor_parts(guard, function)
        expected = rf"tensor '.+?' {guard.kind.split('-', 1)[1]} mismatch"
    else:
        parts = None
    if parts is None:
        return None
    where = f"{frame[1]}:{frame[2]}" if frame else NOT_STATED
    header = _header(f"Reproduces a recompile after capture on a guard of the log's kind, {guard.describe()}.",
                     f"The log's Dynamo recompiled {function} ({where}) on `{guard.text}`. {parts.pop('how')} "
                     "It is compiled (backend \"eager\"), called once, what the guard checks is changed, and it is "
                     "called again under torch.compiler.set_stance(\"fail_on_recompile\").",
                     "Exit 1 when it recompiles on a guard of the log's kind, 0 when it does not.")
    script = header + RECOMPILE.format(expected=expected, function=function, guard=guard.text, kind=guard.describe(),
                                       **parts)
    return Plan(f"recompile_{function}_{guard.kind.replace('-', '_')}", script,
                f"a recompile of {function} on a {guard.describe()} guard")
