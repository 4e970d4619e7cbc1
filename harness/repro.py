"""`python -m harness repro FILE`: from a user's crash log (or a harness failure record) to a reproduction.

1. Read FILE, refusing what cannot be a log: missing, empty, binary, enormous.
2. Classify it by signature (below); each names the suite to search (for capture failures, the capture path the
   log names: SGLang's "Piecewise CUDA Graph failed" wrapper or piecewise frames -> the prefill suite, "Capture
   cuda graph failed" -> the decode suite) and the conditions it reports (forward mode, sizes, platform), which
   narrow the suite's strategies through HARNESS_CONDITIONS.
3. Known first: run the suite's strict expected failures and pinned regressions (`harness.known_findings`, seconds);
   one that fails with an oracle of the signature, under the log's conditions, is named as a known finding of the
   installed release, and the search is skipped.
4. Search: run that suite in a fresh process with a random seed, the nightly budget of examples, and a time
   limit; the first failing example's record is the reproduction (kept even if the limit kills the search).
5. Write a standalone script that replays it without Hypothesis, and the explicit example to pin in
   suites/regressions/, then run the script once to confirm it fails the same way.

Compile-time failures of model code (untraceable-call, missing-fake-impl, fake-script-object, and a dynamo-recompile
that names its guard) skip the search: `harness.repro_compile` writes a script that re-creates the failure on the
CPU with PyTorch's own tools, and runs it. A known finding answers such a log only when it declares the log's
guard, frame or op (`harness.known_findings`).
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import random
import re
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from collections.abc import Callable

from harness import known_findings, registry, repro_compile
from harness.errors import HarnessError
from harness.mutants import REPO_ROOT, pytest_command
from harness.evidence.trace import script_prologue

RECORD_FORMAT = 1
MAX_BYTES = 20 * 1024 * 1024
MODES = ("EXTEND", "DECODE", "MIXED", "IDLE", "TARGET_VERIFY", "DRAFT_EXTEND", "DRAFT_EXTEND_V2", "PREBUILT",
         "SPLIT_PREFILL", "DLLM_EXTEND")


def _modes(text: str) -> list[str]:
    """Forward-mode names the log mentions as whole words (ForwardMode.MIXED, forward_mode=MIXED, MIXED)."""
    return sorted(set(re.findall(r"\b(" + "|".join(MODES) + r")\b", text)))


def _sizes(text: str) -> list[int]:
    return sorted({int(n) for n in re.findall(r"(?:num_tokens|bs|batch_size|raw_bs)\s*[=:]\s*(\d+)", text)})


def _suite_by_words(text: str, default: str) -> str:
    """The suite the log's words name (outside the launch command), else its launch flags, else `default`."""
    lowered = without_launch(text).lower()
    if any(w in lowered for w in ("piecewise", "pcg", "prefill", "forward_mode", "extend")):
        return "prefill_pcg"
    if any(w in lowered for w in ("decode_cuda_graph", "cuda_graph_runner", "decode", "patch_model")):
        return "decode_capture"
    if any(w in lowered for w in ("build_torch_compile_kwargs", "get_compile_backend", "get_compile_options")):
        return "compile_kwargs"
    return launch_suite(text) or default


def _capture_path(text: str) -> str:
    """The suite of the capture path the log names: SGLang's wrappers first, then the words around them (outside
    the launch command), then the launch command's flags."""
    body = without_launch(text)
    if re.search(r"Piecewise CUDA Graph failed|Capture prefill CUDA graph failed|piecewise|cuda_piecewise_backend|"
                 r"\bPCG\b|prefill_cuda_graph", body, re.I):
        return "prefill_pcg"
    if re.search(CAPTURE_GRAPH_FAILED, body, re.I):
        return "decode_capture"
    return launch_suite(text) or "decode_capture"


# The fullgraph compile of the piecewise prefill path, and decode's torch.compile (`patch_model`), by the frames
# and wrappers a log shows.
PREFILL_COMPILE = (r"piecewise|\bPCG\b|tc_piecewise|install_torch_compiled|prefill_cuda_graph|cuda_piecewise_backend|"
                   r"Capture prefill CUDA graph failed|compilation/backend\.py|compilation/compile\.py")
DECODE_COMPILE = (r"patch_model|torch_compile_decoration|decode_cuda_graph_runner|\bcuda_graph_runner\.py|"
                  r"capture_one_batch_size|capture_one_shape|Capture (cuda|npu)? ?graph failed")


def _compile_path(text: str) -> str:
    """The suite of the compile path a Dynamo failure names: piecewise/fullgraph prefill frames -> prefill_pcg,
    decode's patch_model/torch.compile frames -> decode_capture; else the launch command's flags; else prefill,
    where SGLang compiles with fullgraph=True (a graph break elsewhere is no error)."""
    body = without_launch(text)
    if re.search(PREFILL_COMPILE, body, re.I):
        return "prefill_pcg"
    if re.search(DECODE_COMPILE, body, re.I):
        return "decode_capture"
    return launch_suite(text) or "prefill_pcg"


def _wrong_output_suite(text: str) -> str:
    """Decode, unless prefill or piecewise words appear (outside the launch command, whose `--chunked-prefill-size`
    says nothing) or the launch command turns the piecewise graphs on."""
    if re.search(r"piecewise|\bPCG\b|prefill", without_launch(text), re.I):
        return "prefill_pcg"
    return launch_suite(text) or "decode_capture"


# The EAGLE draft worker's graph runners (CUDA and NPU), by the frames and log lines a server writes around them.
DRAFT_RUNNER = (r"eagle_draft(?:_extend)?(?:_npu)?_(?:cuda_)?graph_runner|EAGLEDraft(?:Extend)?(?:Npu|Cuda)GraphRunner|"
                r"Capture draft(?: extend)? (?:decode )?(?:CUDA|NPU) graph|draft_forward\b|_draft_extend_for_decode")
# A device fault or a shape disagreement: what a draft runner that reads past its buffers or pads to the wrong
# width raises on a GPU (the virtual device: an oracle naming the rail, slot or row, or the same error).
DEVICE_FAULT = (r"illegal memory access|illegal instruction|index out of bounds|out of range|device-side assert|"
                r"The size of tensor a \(\d+\) must match the size of tensor b|shape '\[[^]]*\]' is invalid|"
                r"size mismatch|Expected size \d+ but got size")


def _draft_test(text: str) -> tuple[str, str]:
    """Where a draft runner's failure is searched: its NPU test under NPU words, else the CUDA one: the draft
    worker's decode test only (the draft prefill runs through the prefill runner, not these runners, and its
    examples would spend the budget elsewhere)."""
    if re.search(r"\bnpu\b|ascend|_npu_graph_runner|NpuGraphRunner", text, re.I):
        return "suites/test_decode_npu.py", "eagle_draft_replays"
    return "suites/test_real_models.py", "eagle_draft_replays"


def _draft_or(path: Callable[[str], str]) -> Callable[[str], str]:
    """A suite chooser that sends a log naming a draft runner's frames to the real-model suite (the draft worker's
    graphs are driven there; its NPU test replays through that suite's `replay_case` too)."""
    return lambda t: "real_models" if re.search(DRAFT_RUNNER, without_launch(t)) else path(t)


def draft_evidence(text: str) -> dict:
    """The innermost draft-runner frame the log shows ("file:line in function"), as the frame a known finding must
    share to answer it; and the fault's own line."""
    frames = re.findall(r'File "([^"]*(?:eagle_draft|draft_extend)[^"]*)", line (\d+), in (\w+)', text)
    fault = re.search(r"^[^\n]*(?:" + DEVICE_FAULT + r")[^\n]*$", text, re.M | re.I)
    evidence = {"frame": f"{frames[-1][0]}:{frames[-1][1]} in {frames[-1][2]}"} if frames else {}
    return {**evidence, **({"fault": fault.group(0).strip()} if fault else {})}


# A LoRA adapter's load, unload, pin or placement in the memory pool failing or refused, in SGLang's words.
LORA_LIFECYCLE = (r"No available buffer slots found|incompatible with the current LoRA memory pool|"
                  r"Cannot find target module name for|not found in lora_refs|Number of pinned LoRA adapters|"
                  r"Failed to load LoRA adapter|\b(?:un)?load_lora_adapter(?:_from_tensors)?\b|"
                  r"LoRA adapter \S+ is already loaded")


def lora_evidence(text: str) -> dict:
    """The innermost frame of SGLang's LoRA code the log shows ("file:line in function"), as the frame a known
    finding must share to answer it; and the module SGLang could not place, where it says which."""
    frames = re.findall(r'File "([^"]*/lora/[^"]*)", line (\d+), in (\w+)', text)
    module = re.search(r"Cannot find target module name for (\S+)", text)
    evidence = {"frame": f"{frames[-1][0]}:{frames[-1][1]} in {frames[-1][2]}"} if frames else {}
    return {**evidence, **({"module": module.group(1)} if module else {})}


def _draft_select(text: str) -> tuple[str, str] | None:
    return _draft_test(text) if re.search(DRAFT_RUNNER, without_launch(text)) else None


def _graph_conditions(text: str) -> dict:
    conditions = {}
    if _modes(text):
        conditions["forward_mode"] = _modes(text)
    if _sizes(text):
        conditions["num_tokens" if "token" in text.lower() else "replay_bs"] = _sizes(text)
    if re.search(r"\bnpu\b|ascend|torchair|npugraph", text, re.I):
        conditions["personality"] = ["npu"]
    return conditions


# -- the launch command a user pastes -------------------------------------------------------------------------------
LAUNCH = re.compile(r"(?:python3?\s+-m\s+sglang\.(?:launch_server|bench_one_batch|bench_offline_throughput)|"
                    r"\bsglang\s+(?:serve|generate))\b")
SERVER_ARGS = re.compile(r"server_args=ServerArgs\((.*)\)")


def _launch_lines(text: str) -> list[tuple[int, int]]:
    """(start, end) of each launch command in `text` (continuation lines included) and of each printed ServerArgs."""
    spans = []
    for match in LAUNCH.finditer(text):
        position = match.end()
        while True:
            newline = text.find("\n", position)
            if newline < 0:
                end = len(text)
                break
            if not text[position:newline].rstrip().endswith("\\"):
                end = newline
                break
            position = newline + 1
        spans.append((match.start(), end))
    spans += [m.span() for m in SERVER_ARGS.finditer(text)]
    return spans


def without_launch(text: str) -> str:
    """`text` without its launch commands and printed ServerArgs: their flag names (`--chunked-prefill-size`) are
    no words about where the failure happened."""
    for start, end in sorted(_launch_lines(text), reverse=True):
        text = text[:start] + text[end:]
    return text


def launch_flags(text: str) -> dict[str, list[str]]:
    """--flag -> its values, from the launch commands (`python -m sglang.launch_server ...`, `sglang serve ...`)
    and a printed `server_args=ServerArgs(...)` (fields as flags: True -> present, False/None -> absent)."""
    flags: dict[str, list[str]] = {}
    for start, end in _launch_lines(text):
        command = re.sub(r"\\[ \t]*\n", " ", text[start:end])
        if command.startswith("server_args="):
            fields = command[len("server_args="):]
            for name, value in re.findall(r"(\w+)=(\[[^\]]*\]|'[^']*'|\"[^\"]*\"|[^,()]+)", fields):
                value = value.strip()
                if value in ("False", "None", "[]", "''"):
                    continue
                flag = "--" + name.replace("_", "-")
                flags.setdefault(flag, [] if value == "True" else re.findall(r"[\w./=:-]+", value))
            continue
        try:
            tokens = shlex.split(command, comments=False)
        except ValueError:
            tokens = command.split()
        flag = None
        for token in tokens:
            if token.startswith("--"):
                flag, _, value = token.partition("=")
                flags.setdefault(flag, [])
                if value:
                    flags[flag].append(value)
            elif flag is not None:
                flags[flag].append(token)
    return flags


def launch_suite(text: str) -> str | None:
    """The suite the launch command's flags point at, or None: the piecewise prefill graphs, else decode's
    torch.compile."""
    flags = launch_flags(text)
    if "--enable-piecewise-cuda-graph" in flags or "tc_piecewise" in flags.get("--cuda-graph-backend-prefill", []):
        return "prefill_pcg"
    if "--enable-torch-compile" in flags:
        return "decode_capture"
    return None


def _number(values: list[str]) -> int | None:
    return int(values[0]) if values and values[0].isdigit() else None


# flag (and its aliases) -> (condition name, values from the flag's values): the names are the drawn values of the
# suites' cases (DecodeCase, PrefillCase, ForwardMode); whether a suite's strategies narrow by one is read from them.
LAUNCH_CONDITIONS: tuple[tuple[tuple[str, ...], str, Callable[[list[str]], list | None]], ...] = (
    (("--lora-paths", "--enable-lora"), "lora", lambda v: [True]),
    (("--max-loras-per-batch",), "max_loras_per_batch", lambda v: [_number(v)] if _number(v) else None),
    (("--lora-backend",), "lora_backend", lambda v: v[:1] or None),
    (("--cuda-graph-max-bs",), "default_max_bs", lambda v: [_number(v)] if _number(v) else None),
    (("--cuda-graph-bs",), "capture_bs", lambda v: [[int(n) for n in v if n.isdigit()]] if v else None),
    (("--disable-cuda-graph-padding",), "disable_padding", lambda v: [True]),
    (("--speculative-algorithm", "--speculative-algo"), "speculative_algorithm", lambda v: v[:1] or None),
    (("--speculative-num-steps",), "speculative_num_steps", lambda v: [_number(v)] if _number(v) else None),
    (("--speculative-eagle-topk",), "speculative_eagle_topk", lambda v: [_number(v)] if _number(v) else None),
    (("--speculative-num-draft-tokens",), "speculative_num_draft_tokens",
     lambda v: [_number(v)] if _number(v) else None),
    (("--speculative-draft-window-size",), "speculative_draft_window_size",
     lambda v: [_number(v)] if _number(v) else None),
    (("--tp", "--tp-size", "--tensor-parallel-size"), "tp_size", lambda v: [_number(v)] if _number(v) else None),
    (("--pp", "--pp-size", "--pipeline-parallel-size"), "pp_size", lambda v: [_number(v)] if _number(v) else None),
    (("--dp", "--dp-size", "--data-parallel-size"), "dp_size", lambda v: [_number(v)] if _number(v) else None),
    (("--enable-dp-attention",), "enable_dp_attention", lambda v: [True]),
    (("--moe-dense-tp-size",), "moe_dense_tp_size", lambda v: [_number(v)] if _number(v) else None),
    (("--ep", "--ep-size", "--expert-parallel-size"), "ep_size", lambda v: [_number(v)] if _number(v) else None),
    (("--cuda-graph-backend-prefill",), "prefill_graphs", lambda v: [v[0] == "breakable"] if v else None),
    (("--enable-torch-compile",), "enable_torch_compile", lambda v: [True]),
    (("--torch-compile-max-bs",), "torch_compile_max_bs", lambda v: [_number(v)] if _number(v) else None),
    (("--chunked-prefill-size",), "chunked_prefill_size", lambda v: [_number(v)] if _number(v) else None),
    (("--enable-mixed-chunk",), "enable_mixed_chunk", lambda v: [True]),
)
# Flags whose absence from a speculative server's launch command is itself a value, SGLang's default:
# (aliases, condition name, the default as drawn values).
SPECULATIVE_DEFAULTS = ((("--speculative-draft-window-size",), "speculative_draft_window_size", [None]),)
# Why a condition no strategy reads cannot narrow the search here, where there is more to say than that.
UNMODELLED = {
    "tp_size": "a world's size is its test's (2 ranks in the gate, 4 in the nightly; the single-rank suites run "
               "one): the layout flags (--dp, --enable-dp-attention, --moe-dense-tp-size, --ep-size) carry the world",
    "architecture": "the harness's tiny models stand in for every architecture",
    "chunked_prefill_size": "a bound on a batch's tokens, not a size the prefill strategies draw",
}


def strategy_names(suite: str, path: str | None = None) -> set[str]:
    """The drawn names the suite's searched file (`path`, default its first) narrows by: `narrow("name", ...)` in
    the strategy modules it imports and in the suite helper modules it imports (`suites/real_common.py`), plus the
    ones `search` passes as options (personality, decode only)."""
    names = set(SEARCH_OPTIONS.get(suite, {}))
    source = REPO_ROOT / (path or registry.get(suite).paths[0])
    if not source.exists():
        return names
    texts = [source.read_text()]
    texts += [(REPO_ROOT / "suites" / f"{helper}.py").read_text()
              for helper in re.findall(r"^from suites\.(\w+) import", texts[0], re.M)
              if (REPO_ROOT / "suites" / f"{helper}.py").exists()]
    modules = set()
    for text in texts:
        names |= set(re.findall(r'narrow\(\s*"(\w+)"', text))
        modules |= set(re.findall(r"^from strategies\.(\w+) import", text, re.M))
        for imported in re.findall(r"^from strategies import ([\w, ]+?)(?: as \w+)?$", text, re.M):
            modules |= {name.strip() for name in imported.split(",")}
    for module in modules:
        module_path = REPO_ROOT / "strategies" / f"{module}.py"
        if module_path.exists():
            names |= set(re.findall(r'narrow\(\s*"(\w+)"', module_path.read_text()))
    return names


SEARCH_OPTIONS = {"decode_capture": {"personality": "--personality"}}  # conditions search hands pytest as options


def architecture(text: str) -> str | None:
    """The model architecture the log names (`architectures=['Qwen2MoeForCausalLM']`, a printed class name)."""
    found = re.search(r"architectures=\[\s*['\"](\w+)['\"]", text) or re.search(
        r"\b([A-Z]\w+For(?:CausalLM|ConditionalGeneration))\b", text)
    return found.group(1) if found else None


def launch_conditions(text: str, suite: str, logged: dict, path: str | None = None) -> tuple[dict, list[str]]:
    """The conditions the launch command (and the architecture the log names) add for `suite` (searched in `path`,
    default its first file), beside `logged` (the log's own, which win), and one note per derived value: narrows
    the search, or ignored and why."""
    flags, names = launch_flags(text), strategy_names(suite, path)
    derived, notes = {}, []

    def offer(name: str, values: list, source: str, why: str | None = None) -> None:
        if name in logged:
            notes.append(f"{source} -> {name}={values}: ignored, the log itself names {name}={logged[name]}")
        elif why is None and name in names:
            derived[name] = values
            notes.append(f"{source} -> {name}={values}: narrows the search")
        else:
            why = why or UNMODELLED.get(name) or f"no strategy of suite {suite} narrows by {name!r}"
            notes.append(f"{source} -> {name}={values}: ignored, {why}")

    if "--enable-piecewise-cuda-graph" in flags:
        notes.append(f"--enable-piecewise-cuda-graph -> the piecewise prefill graphs (suite prefill_pcg; "
                     f"searching {suite})")
    used = set()
    for aliases, name, convert in LAUNCH_CONDITIONS:
        flag = next((a for a in aliases if a in flags), None)
        if flag is None:
            continue
        used.add(flag)
        values = convert(flags[flag])
        if values is None:
            notes.append(f"{flag} {' '.join(flags[flag])}: ignored, not a value the harness can read")
            continue
        offer(name, values, f"{flag} {' '.join(flags[flag])}".strip())
        if name == "enable_mixed_chunk":
            offer("forward_mode", ["MIXED"], flag,
                  None if suite == "prefill_pcg" else "mixed chunks are prefill batches; the decode graphs never "
                  "see one")
        if name == "speculative_algorithm":
            offer("forward_mode", ["TARGET_VERIFY"], flag,
                  "the prefill runner refuses TARGET_VERIFY batches (they run eagerly); the verify graphs are the "
                  "decode suite's" if suite == "prefill_pcg" else None)
    if used & {"--speculative-algorithm", "--speculative-algo"}:
        for aliases, name, values in SPECULATIVE_DEFAULTS:
            if not any(a in flags for a in aliases):
                offer(name, values, f"no {aliases[0]} (SGLang's default)")
    arch = architecture(text)
    if arch:
        offer("architecture", [arch], f"architecture {arch}")
    other = sorted(set(flags) - used - {"--enable-piecewise-cuda-graph"})
    if other:
        notes.append(f"other flags, ignored (no bearing on the capture and compile paths the suites drive): "
                     f"{' '.join(other)}")
    return derived, notes


def unread_conditions(suite: str, conditions: dict, path: str | None = None) -> list[str]:
    """Notes on the log's own conditions that no strategy of `suite` narrows by (kept: they still decide which
    known finding matches)."""
    names = strategy_names(suite, path)
    return [f"{name}={values}: from the log; no strategy of suite {suite} narrows by it (it still has to agree with "
            "a known finding's drawn values)" for name, values in conditions.items() if name not in names]


# -- what a graph break's log says ----------------------------------------------------------------------------
def graph_break_evidence(text: str) -> dict:
    """The break's reason and site (file:line) as the log gives them: torch's graph-break log ("Graph break in
    user code at F:N" / "Graph Break Reason: ..."), an Unsupported/UserError line and its "from user code:" frame,
    or an AssertionError and the last frame before it."""
    reason = site = None
    if found := re.search(r"Graph Break Reason: ([^\n]+)", text):
        reason = found.group(1).strip()
    elif found := re.search(r"torch\._dynamo\.exc\.(Unsupported|UserError): ([^\n]+)", text):
        reason = f"{found.group(1)}: {found.group(2).strip()}"
    elif found := list(re.finditer(r"^[^\n]*?((?:[\w.]+: )?AssertionError\b:?[^\n]*)$", text, re.M)):
        reason = found[0].group(1).strip().rstrip(":") or "AssertionError"
    frames = r'File "([^"]+)", line (\d+), in (\w+)'
    if found := re.search(r"Graph break in user code at (\S+?):(\d+)", text):
        site = f"{found.group(1)}:{found.group(2)}"
    elif "from user code:" in text:
        user = re.findall(frames, text.split("from user code:", 1)[1].split("\n\n", 1)[0])
        site = f"{user[-1][0]}:{user[-1][1]} in {user[-1][2]}" if user else None
    if site is None and reason and "AssertionError" in reason:
        before = text[:text.find("AssertionError")]
        last = re.findall(frames, before)
        site = f"{last[-1][0]}:{last[-1][1]} in {last[-1][2]}" if last else None
    return {"reason": reason or "not stated in the log", "site": site or "not stated in the log"}


def _with_model(text: str, evidence: dict) -> dict:
    """A compile-time failure's evidence and the architecture the log names."""
    arch = architecture(text)
    return {**evidence, "architecture": arch} if arch else evidence


@dataclasses.dataclass
class Signature:
    name: str
    pattern: re.Pattern
    describe: str
    suite: Callable[[str], str]
    conditions: Callable[[str], dict]
    oracles: frozenset = frozenset()  # the oracles whose failure is this signature (a known finding's must be one)
    evidence: Callable[[str], dict] | None = None  # what the log says beyond the conditions (a break's site)
    # (file, -k expression) the search runs, where the suite's first file with all its tests is not the place
    select: Callable[[str], tuple[str, str]] | None = None


CAPTURE_GRAPH_FAILED = (r"Capture (cuda|npu)? ?graph failed|Piecewise CUDA Graph failed with error|"
                        r"Capture prefill CUDA graph failed")
# An AssertionError raised inside Dynamo's frames: a torch/_dynamo frame in the traceback, then the AssertionError
# (bare, or wrapped as InternalTorchDynamoError: AssertionError).
DYNAMO_ASSERT = r'(?ms:File "[^"\n]*torch/_dynamo/[^"\n]*".*?^[^\n]*?(?:[\w.]+: )?AssertionError\b)'
GRAPH_BREAK = (r"torch\._dynamo\.exc\.(?:Unsupported|UserError)\b|\bGraph break\b|graph_break|" + DYNAMO_ASSERT)
# A custom op reached by fake tensor propagation without a fake implementation, in the words torch releases use.
MISSING_FAKE = (r"no fake impl|has no fake|no abstract impl|UnsupportedOperatorException|"
                r"does not support running with fake tensors")
# A call Dynamo refuses to trace: a function it skips, a context manager (a lock) it cannot enter, an lru_cache.
UNTRACEABLE = (r"Attempted to call function marked as skipped|skip function \w+ in file|Unsupported context manager|"
               r"does not know how to enter an? `|inline in skipfiles|lru_cache[\w-]*(?:-wrapped|_wrapper)|"
               r"Unsupported[^\n]*threading\.R?Lock")
# What a user writes when the outputs are wrong and nothing crashed (a report with no traceback).
WRONG_WORDS = "|".join((
    r"garbled|gibberish|nonsense|incoherent|garbage (outputs?|text|tokens?|results?|characters)",
    r"repeated [`'\"]?\S*[`'\"]? ?(tokens?|text|words?|output)",  # repeated `!` tokens, repeated text
    r"(output|generated) (token )?(length|count|tokens?)\b.{0,40}(drift|increas|grow|unstable|chang|abnormal)",
    r"wrong (answers?|outputs?|results?|tokens?)|(outputs?|answers?|results?) (are|were|is) [\w() ]{0,20}wrong",
    r"incorrect (answers?|outputs?|results?)",
    r"accura\w*.{0,40}(drop|degrad|collaps|lower|decreas)|(drop|degrad|collaps|lower|decreas)\w*.{0,30}accura",
    r"(outputs?|results?|answers?) (differ|are different)|\bNaN\b",
))
NO_TRACEBACK = r"(?s:\A(?!.*Traceback \(most recent call last\)).*?(?i:" + WRONG_WORDS + r"))"
# The ranks of a server ran different collectives: a size mismatch gloo or NCCL noticed, a collective that never
# completed (NCCL's watchdog), or a DP replay without the per-rank counts its bucket is derived from.
COLLECTIVE_MISMATCH = (r"collective mismatch|Received data size doesn't match|Watchdog caught collective operation "
                       r"timeout|collective operation timeout|requires raw per-rank request counts|"
                       r"does not belong to a DP gather")

SIGNATURES = [
    Signature("collective-mismatch", re.compile(COLLECTIVE_MISMATCH, re.I),
              "the ranks of a server ran different collectives (a mismatch, or one that never completed: a rank "
              "decided otherwise, padded to another bucket, or left)",
              lambda t: "parallel_worlds", _graph_conditions, frozenset({"world-agreement", "world-rank"})),
    Signature("capture-stream-not-set", re.compile(r"capture stream is not set", re.I),
              "a piecewise graph tried to capture outside the capture session (a recompile at serve time)",
              lambda t: "prefill_pcg", _graph_conditions, frozenset({"capture-stream", "no-recompile"})),
    Signature("cuda-capture-refused",
              re.compile(r"operation not permitted when stream is capturing|Cannot call CUDAGeneratorImpl::\w+ "
                         r"during CUDA graph capture|Cannot copy between CPU and CUDA tensors during CUDA graph "
                         r"capture|must be captured on a non-default stream|cudaErrorStreamCapture\w*|"
                         r"set_state_index method during capturing", re.I),
              "CUDA refused an operation while the stream was capturing (a sync, host read or seed query inside "
              "captured code)", _draft_or(_capture_path), _graph_conditions, frozenset({"capture-legality"}),
              select=_draft_select),
    Signature("draft-runner-fault",
              re.compile(r"(?s)(?=.*(?:" + DRAFT_RUNNER + r")).*(?:" + DEVICE_FAULT + r")"),
              "an EAGLE draft runner read or wrote past what its batch holds, or disagreed on a size, at capture "
              "or replay (an illegal memory access, an index out of bounds, a size mismatch)",
              lambda t: "real_models", _graph_conditions,
              frozenset({"draft-rails", "eager-equality", "npu-graph-update", "graph-replay", "crash"}),
              evidence=draft_evidence, select=_draft_test),
    Signature("fake-script-object", re.compile(r"FakeScriptObject"),
              "an op was handed a FakeScriptObject while torch.compile traced it (a torchbind argument, e.g. a "
              "quantised kernel's weight type, with no fake the op accepts)",
              _compile_path, _graph_conditions, frozenset({"graph-break", "crash"}),
              evidence=lambda t: _with_model(t, repro_compile.fake_script_object_evidence(t))),
    Signature("missing-fake-impl", re.compile(MISSING_FAKE, re.I),
              "a custom op without a fake implementation was reached by a compiled region",
              _compile_path, _graph_conditions, frozenset({"graph-break", "crash"}),
              evidence=lambda t: _with_model(t, repro_compile.missing_fake_evidence(t))),
    Signature("untraceable-call", re.compile(UNTRACEABLE),
              "Dynamo met a call it cannot trace (a lock entered, a function it skips, an lru_cache-wrapped "
              "function)", _compile_path, _graph_conditions, frozenset({"graph-break"}),
              evidence=lambda t: _with_model(t, repro_compile.untraceable_evidence(t))),
    Signature("graph-break", re.compile(GRAPH_BREAK),
              "Dynamo could not trace the model where SGLang compiles it (a graph break under fullgraph, a Dynamo "
              "UserError, or an AssertionError inside Dynamo during capture)",
              _compile_path, _graph_conditions, frozenset({"graph-break"}), evidence=graph_break_evidence),
    Signature("capture-crash",
              re.compile(r"(?s)(" + CAPTURE_GRAPH_FAILED + r").*?\b(AttributeError|TypeError)\b|"
                         r"\b(AttributeError|TypeError)\b.*?(" + CAPTURE_GRAPH_FAILED + r")", re.I),
              "an attribute or type error raised during graph capture",
              _capture_path, _graph_conditions, frozenset({"crash"})),
    Signature("dynamo-recompile",
              re.compile(r"RecompileError|Recompiling function|guard failure|FailOnRecompileLimitHit|"
                         r"recompile_limit", re.I),
              "Dynamo recompiled after capture (a guard failed on a runtime value)",
              lambda t: _suite_by_words(t, "prefill_pcg"), _graph_conditions,
              frozenset({"no-recompile", "capture-stream", "dynamo-contract"}),
              evidence=lambda t: _with_model(t, repro_compile.recompile_evidence(t))),
    Signature("compile-kwargs-rejected",
              re.compile(r"Either mode or options can be specified|Unexpected optimization option|"
                         r"Invalid backend|Unrecognized mode=", re.I),
              "torch.compile rejected the kwargs SGLang built for a platform",
              lambda t: "compile_kwargs",
              lambda t: {"platform": ["oot"], **({"options": [{"epilogue_fusion": True, "max_autotune": False}],
                                                  "backend": ["inductor"]}
                                                 if "mode or options" in t else {})},
              frozenset({"kwargs-validity", "compiles"})),
    Signature("graph-capture-failed", re.compile(CAPTURE_GRAPH_FAILED + r"|patch_model", re.I),
              "graph capture failed (the compiler the platform installed did not run)",
              _capture_path, _graph_conditions, frozenset({"hook-contract", "rebinding-by-value-import", "crash"})),
    Signature("lora-adapter-lifecycle", re.compile(LORA_LIFECYCLE),
              "a LoRA adapter's load, unload or pin, or its placement in the memory pool, failed or was refused "
              "where it should not have been (or the other way round)",
              lambda t: "real_models", _graph_conditions,
              frozenset({"lora-lifecycle", "lora-reference", "eager-equality", "crash"}), evidence=lora_evidence,
              select=lambda t: ("suites/test_server_lifetime.py", "LoRA")),
    Signature("wrong-output",
              re.compile(r"(?i:Mismatched elements|not close|wrong output|differs from eager|mismatch)|"
                         + NO_TRACEBACK),
              "an output differs from eager execution (or, with no traceback, the report says the outputs are wrong: "
              "garbled or repeated text, wrong answers, output length drifting, an accuracy drop, NaN)",
              _wrong_output_suite, _graph_conditions, frozenset({"eager-equality"})),
]


def read_report(path: str) -> str:
    """The text of FILE, or a HarnessError saying why it cannot be a crash report."""
    file = Path(path)
    if not file.exists():
        raise HarnessError(f"{path}: no such file; pass the log, traceback or failure record to reproduce")
    if file.is_dir():
        raise HarnessError(f"{path} is a directory; pass one log file or failures.jsonl")
    size = file.stat().st_size
    if size == 0:
        raise HarnessError(f"{path} is empty; paste the traceback or log into it")
    if size > MAX_BYTES:
        raise HarnessError(f"{path} is {size // (1024 * 1024)} MiB; the limit is {MAX_BYTES // (1024 * 1024)} MiB: "
                           "cut it down to the traceback and the lines around it")
    data = file.read_bytes()
    if b"\0" in data:
        raise HarnessError(f"{path} is binary (it holds NUL bytes); pass a text log")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise HarnessError(f"{path} is not UTF-8 text ({error.reason} at byte {error.start})") from None


def failure_record(text: str) -> dict | None:
    """A harness failure record (a failures.jsonl line), checked to come from this record format."""
    first = text.strip().splitlines()[0] if text.strip() else ""
    try:
        record = json.loads(first)
    except json.JSONDecodeError:
        return None
    if not isinstance(record, dict) or "test" not in record or "replay" not in record:
        return None
    if record.get("record_format") != RECORD_FORMAT:
        raise HarnessError(f"this failure record has format {record.get('record_format', 'unknown')}, this harness "
                           f"reads format {RECORD_FORMAT}: rerun its `replay` command with the harness version "
                           f"that wrote it:\n  {record['replay']}")
    return record


@dataclasses.dataclass
class Reading:
    """What a log says: its signature, the suite to search, the conditions that narrow it, the signature's evidence
    (a graph break's reason and site) and a note per value derived from the launch command or left unused."""
    signature: Signature
    suite: str
    conditions: dict
    evidence: dict
    notes: list
    select: tuple[str, str] | None = None  # (file, -k expression) the search runs; None: the suite's first file


def read(text: str) -> Reading:
    for signature in SIGNATURES:
        if signature.pattern.search(text):
            suite, conditions = signature.suite(text), signature.conditions(text)
            select = signature.select(text) if signature.select else None
            path = select[0] if select else None
            derived, notes = launch_conditions(text, suite, conditions, path)
            notes += unread_conditions(suite, conditions, path)
            if select:
                notes.append(f"searching {select[0]} -k {select[1]!r}: where the harness drives that runner")
            return Reading(signature, suite, {**conditions, **derived},
                           signature.evidence(text) if signature.evidence else {}, notes, select)
    known = "\n".join(f"  {s.name}: {s.describe} (matches /{_short(s.pattern.pattern)}/)" for s in SIGNATURES)
    raise HarnessError(f"no known signature in this log. The signatures the harness knows:\n{known}\n"
                       "or pass a failure record (a line of a run's failures.jsonl)")


def _short(pattern: str, limit: int = 160) -> str:
    return pattern if len(pattern) <= limit else pattern[:limit] + "..."


def classify(text: str) -> tuple[Signature, str, dict]:
    reading = read(text)
    return reading.signature, reading.suite, reading.conditions


def _agrees(drawn: dict, conditions: dict) -> bool:
    """A record's drawn values agree with every condition the log names that the record also has."""
    return all(drawn[key] in values for key, values in conditions.items() if key in (drawn or {}))


def known_finding(signature: Signature, suite: str, conditions: dict,
                  evidence: dict | None = None) -> tuple[dict, str] | None:
    """The first known finding or pinned regression of `suite` that fails with an oracle of `signature` under the
    log's conditions, and its reason; None when there is none. Only findings that declare the guard, frame or op
    the log names run (the others are told apart, and why, without running)."""
    named = {key: value for key, value in (evidence or {}).items() if value != repro_compile.NOT_STATED}
    eligible, notes = known_findings.answering(known_findings.known_tests(suite), named)
    for note in notes:
        print(f"[repro] {note}")
    if not eligible:
        return None
    known, failures = known_findings.run_known(suite, known=eligible)
    for record in failures:
        if record.get("oracle") in signature.oracles and _agrees(record.get("drawn") or {}, conditions):
            return record, known_findings.reason_of(known, record.get("test", ""))
    return None


SHRINK_GRACE = 60.0  # seconds a search lets Hypothesis shrink after its first failure (a real model's example: ~7 s)


def _failures(work: Path) -> list[dict]:
    """The failing records a search has written so far (failures.jsonl, else failing rows of examples.jsonl)."""
    for name in ("failures.jsonl", "examples.jsonl"):
        path = work / name
        if not path.exists():
            continue
        rows = []
        for line in path.read_text().splitlines():
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                continue  # a line the run is still writing
            if name == "failures.jsonl" or row.get("verdict") in ("fail", "error"):
                rows.append(row)
        if rows:
            return rows
    return []


def _ran_examples(work: Path) -> bool:
    path = work / "examples.jsonl"
    return path.exists() and any('"verdict": "pass"' in line or '"verdict":"pass"' in line
                                 for line in path.read_text().splitlines())


def search(suite: str, conditions: dict, budget: float, work: Path,
           select: tuple[str, str] | None = None) -> dict | None:
    """Run the suite narrowed to `conditions` (its first file, or `select`'s file and -k expression) until a
    failure or the budget, a fresh seed each time the profile's examples run out; once a failure is recorded,
    Hypothesis shrinks it for `SHRINK_GRACE` seconds at most (a real model's example costs seconds each). The last
    failing record: the smallest found."""
    options = [part for name, option in SEARCH_OPTIONS.get(suite, {}).items() if conditions.get(name)
               for part in (option, str(conditions[name][0]))]
    where = [select[0], "-k", select[1]] if select else [registry.get(suite).paths[0]]
    deadline, first, runs = time.time() + budget, None, 0
    while time.time() < deadline and not _failures(work):  # a run draws the profile's examples; then another seed
        runs += 1
        seed = random.SystemRandom().randrange(2**32)
        command, environment = pytest_command(
            [*where, "-x", "-q", "--profile", "nightly", "--hypothesis-seed", str(seed), "--report-dir",
             str(work), *options], env={"HARNESS_CONDITIONS": json.dumps(conditions)})
        log = work / f"search.{runs}.log"
        work.mkdir(parents=True, exist_ok=True)
        with open(log, "w") as out:
            process = subprocess.Popen(command, cwd=REPO_ROOT, env=environment, stdout=out,
                                       stderr=subprocess.STDOUT, start_new_session=True)
            while process.poll() is None and time.time() < deadline:
                time.sleep(1.0)
                if first is None and _failures(work):
                    first = time.time()
                    deadline = min(deadline, first + SHRINK_GRACE)
            if process.poll() is None:
                process.kill()  # the records are written as each example ends: nothing found so far is lost
                process.wait()
        if process.returncode not in (0, 1, -9) and not _failures(work):  # pytest itself failed: say so, stop
            print(f"[repro] the search's pytest exited {process.returncode}:\n" +
                  "\n".join(log.read_text().splitlines()[-15:]))
            return None
        if process.returncode == 0 and not _ran_examples(work):  # all skipped: another seed finds nothing more
            print(f"[repro] the search ran no example (every test skipped); see {log}")
            return None
    found = _failures(work)
    return found[-1] if found else None


def _suite_of(record: dict) -> str:
    suite = registry.suite_of(record)
    if suite is None:
        raise HarnessError(f"the record names test {record.get('test')!r}, which no suite of this harness has")
    return suite.name


SCRIPT = '''#!/usr/bin/env python
"""Replays a failure without Hypothesis: [{oracle}] {diagnosis}

Found by `python -m harness repro` on SGLang {sglang}, torch {torch}. Run it with the harness environment's
Python: .venv/bin/python {name}. Exit 1 and the oracle's message when it reproduces, 0 when it does not.
`--torch-trace DIR`: under TORCH_TRACE (DIR/raw), rendered by tlparse into DIR/tlparse/index.html.
"""
{prologue}import sys

sys.path.insert(0, {root!r})
from harness.compat import prepare_torchvision  # noqa: E402

prepare_torchvision()
from {module} import replay_case  # noqa: E402

DRAWN = {drawn}

try:
    replay_case(DRAWN)
except AssertionError as failure:
    print(f"reproduced: {{failure}}")
    sys.exit(1)
print("did not reproduce: every oracle passed")
'''

REGRESSION = '''"""Pinned by `python -m harness repro`: [{oracle}] {diagnosis}"""
from {module} import replay_case  # the plugin has prepared the environment before collection

DRAWN = {drawn}


def test_{name}():
    replay_case(DRAWN)
'''


# where a reproduced failure's regression test goes by default: the pinned regressions `known_findings` runs first
PINS = REPO_ROOT / "suites" / "regressions"


def write_outputs(record: dict, suite: str, out: Path, pins: Path = PINS) -> tuple[Path, Path]:
    module = registry.get(suite).module
    digest = hashlib.sha256(json.dumps(record["drawn"], sort_keys=True).encode()).hexdigest()[:8]
    name = f"{suite}_{record.get('oracle', 'crash').replace('-', '_')}_{digest}"
    fields = dict(oracle=record.get("oracle"), diagnosis=str(record.get("diagnosis")).replace('"""', "'''")[:300],
                  sglang=record.get("sglang"), torch=record.get("torch"), module=module,
                  drawn=json.dumps(record["drawn"], indent=4).replace("null", "None").replace("true", "True")
                  .replace("false", "False"), root=str(REPO_ROOT))
    out.mkdir(parents=True, exist_ok=True)
    script = out / f"repro_{name}.py"
    script.write_text(SCRIPT.format(name=script.name, prologue=script_prologue(str(REPO_ROOT)), **fields))
    pins.mkdir(parents=True, exist_ok=True)
    regression = pins / f"test_{name}.py"
    regression.write_text(REGRESSION.format(name=name, **fields))
    return script, regression


def repro(path: str, budget: float, out: Path, pins: Path = PINS) -> int:
    text = read_report(path)
    record = failure_record(text)
    started = time.time()
    if record is not None:
        suite = _suite_of(record)
        print(f"[repro] a harness failure record of {record['test']} ({record.get('oracle')}); replaying it")
    else:
        reading = read(text)
        signature, suite, conditions = reading.signature, reading.suite, reading.conditions
        print(f"[repro] signature {signature.name}: {signature.describe}")
        for name, value in reading.evidence.items():
            print(f"[repro]   {name}: {value}")
        for note in reading.notes:
            print(f"[repro] derived: {note}")
        print(f"[repro] checking suite {suite}'s known findings and pinned regressions first")
        known = known_finding(signature, suite, conditions, reading.evidence)
        if known is not None:
            record, reason = known
            print(f"[repro] a KNOWN FINDING of the installed SGLang {record.get('sglang')} (after "
                  f"{time.time() - started:.1f} s, no search): {record['test']} [{record.get('oracle')}] "
                  f"{record.get('diagnosis')}\n[repro] why it is kept: {reason}\n[repro] replay: {record['replay']}")
            return 0
        plan = repro_compile.plan(signature.name, text)
        if plan is not None:
            return run_plan(plan, out, budget, started)
        print(f"[repro] none matches; searching suite {suite} with conditions {json.dumps(conditions)} for up "
              f"to {budget:.0f} s")
        record = search(suite, conditions, budget, Path(tempfile.mkdtemp(prefix="harness-repro-")), reading.select)
        if record is None:
            print(f"[repro] not reproduced within {budget:.0f} s; widen the budget with --budget, or run the "
                  f"nightly profile of {registry.get(suite).paths[0]}")
            return 1
        print(f"[repro] reproduced after {time.time() - started:.1f} s: [{record.get('oracle')}] "
              f"{record.get('diagnosis')}\n[repro] drawn: {json.dumps(record.get('drawn'))}")
    if not record.get("drawn"):
        print(f"[repro] the record carries no drawn values; replay it with:\n  {record.get('replay')}")
        return 1
    script, regression = write_outputs(record, suite, out, pins)
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, cwd=REPO_ROOT)
    confirmed = done.returncode == 1
    print(f"[repro] standalone script: {script} ({'fails as reported' if confirmed else 'DID NOT fail on rerun'})"
          f"\n[repro] regression to pin: {regression}\n[repro] total {time.time() - started:.1f} s")
    if not confirmed:
        print(done.stdout[-2000:] + done.stderr[-2000:])
    return 0 if confirmed else 1


# What a compile-time failure's script said, by its exit status (harness.repro_compile's convention).
PLAN_OUTCOMES = {1: "fails as reported", 0: "DID NOT fail on this machine", 3: "cannot run on this machine"}


def run_plan(plan: repro_compile.Plan, out: Path, budget: float, started: float) -> int:
    """Write the script that re-creates a compile-time failure and run it once; 0 when it fails as reported."""
    out.mkdir(parents=True, exist_ok=True)
    script = out / f"repro_{plan.name}.py"
    script.write_text(plan.script)
    print(f"[repro] no search: a standalone script re-creates {plan.what}")
    try:
        done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, cwd=REPO_ROOT,
                              timeout=budget)
    except subprocess.TimeoutExpired:
        print(f"[repro] standalone script: {script} (ran past {budget:.0f} s)")
        return 1
    said = [line for line in done.stdout.splitlines() if re.match(r"(reproduced|did not reproduce|cannot run)", line)]
    outcome = PLAN_OUTCOMES.get(done.returncode) if said else None
    print(f"[repro] standalone script: {script} ({outcome or f'crashed, exit {done.returncode}'})")
    for line in said or (done.stdout[-1500:] + done.stderr[-1500:]).splitlines():
        print(f"[repro]   {line}")
    print(f"[repro] total {time.time() - started:.1f} s")
    return 0 if done.returncode == 1 and said and said[-1].startswith("reproduced") else 1
