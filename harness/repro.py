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
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import random
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

from harness import known_findings, registry
from harness.errors import HarnessError
from harness.mutants import REPO_ROOT, run_pytest

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
    lowered = text.lower()
    if any(w in lowered for w in ("piecewise", "pcg", "prefill", "forward_mode", "extend")):
        return "prefill_pcg"
    if any(w in lowered for w in ("decode_cuda_graph", "cuda_graph_runner", "decode", "patch_model")):
        return "decode_capture"
    if any(w in lowered for w in ("build_torch_compile_kwargs", "get_compile_backend", "get_compile_options")):
        return "compile_kwargs"
    return default


def _capture_path(text: str) -> str:
    """The suite of the capture path the log names: SGLang's wrappers first, then the words around them."""
    if re.search(r"Piecewise CUDA Graph failed|piecewise|cuda_piecewise_backend|\bPCG\b|prefill_cuda_graph", text,
                 re.I):
        return "prefill_pcg"
    return "decode_capture"


def _graph_conditions(text: str) -> dict:
    conditions = {}
    if _modes(text):
        conditions["forward_mode"] = _modes(text)
    if _sizes(text):
        conditions["num_tokens" if "token" in text.lower() else "replay_bs"] = _sizes(text)
    if re.search(r"\bnpu\b|ascend|torchair|npugraph", text, re.I):
        conditions["personality"] = ["npu"]
    return conditions


@dataclasses.dataclass
class Signature:
    name: str
    pattern: re.Pattern
    describe: str
    suite: Callable[[str], str]
    conditions: Callable[[str], dict]
    oracles: frozenset = frozenset()  # the oracles whose failure is this signature (a known finding's must be one)


CAPTURE_GRAPH_FAILED = r"Capture (cuda|npu)? ?graph failed|Piecewise CUDA Graph failed with error"
SIGNATURES = [
    Signature("capture-stream-not-set", re.compile(r"capture stream is not set", re.I),
              "a piecewise graph tried to capture outside the capture session (a recompile at serve time)",
              lambda t: "prefill_pcg", _graph_conditions, frozenset({"capture-stream", "no-recompile"})),
    Signature("cuda-capture-refused",
              re.compile(r"operation not permitted when stream is capturing|Cannot call CUDAGeneratorImpl::\w+ "
                         r"during CUDA graph capture|Cannot copy between CPU and CUDA tensors during CUDA graph "
                         r"capture|must be captured on a non-default stream|cudaErrorStreamCapture\w*|"
                         r"set_state_index method during capturing", re.I),
              "CUDA refused an operation while the stream was capturing (a sync, host read or seed query inside "
              "captured code)", _capture_path, _graph_conditions, frozenset({"capture-legality"})),
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
              frozenset({"no-recompile", "capture-stream"})),
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
    Signature("wrong-output",
              re.compile(r"Mismatched elements|not close|wrong output|differs from eager|mismatch", re.I),
              "an output differs from eager execution",
              lambda t: _suite_by_words(t, "decode_capture"), _graph_conditions, frozenset({"eager-equality"})),
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


def classify(text: str) -> tuple[Signature, str, dict]:
    for signature in SIGNATURES:
        if signature.pattern.search(text):
            return signature, signature.suite(text), signature.conditions(text)
    known = "\n".join(f"  {s.name}: {s.describe} (matches /{s.pattern.pattern}/)" for s in SIGNATURES)
    raise HarnessError(f"no known signature in this log. The signatures the harness knows:\n{known}\n"
                       "or pass a failure record (a line of a run's failures.jsonl)")


def _agrees(drawn: dict, conditions: dict) -> bool:
    """A record's drawn values agree with every condition the log names that the record also has."""
    return all(drawn[key] in values for key, values in conditions.items() if key in (drawn or {}))


def known_finding(signature: Signature, suite: str, conditions: dict) -> tuple[dict, str] | None:
    """The first known finding or pinned regression of `suite` that fails with an oracle of `signature` under the
    log's conditions, and its reason; None when there is none."""
    known, failures = known_findings.run_known(suite)
    for record in failures:
        if record.get("oracle") in signature.oracles and _agrees(record.get("drawn") or {}, conditions):
            return record, known_findings.reason_of(known, record.get("test", ""))
    return None


def search(suite: str, conditions: dict, budget: float, work: Path) -> dict | None:
    """Run the suite narrowed to `conditions` until a failure or the budget; the first failing record."""
    seed = random.SystemRandom().randrange(2**32)
    run_pytest([registry.get(suite).paths[0], "-x", "-q", "--profile", "nightly", "--hypothesis-seed", str(seed),
                "--report-dir", str(work)], timeout=budget, env={"HARNESS_CONDITIONS": json.dumps(conditions)})
    for name in ("failures.jsonl", "examples.jsonl"):
        path = work / name
        if path.exists():
            for line in path.read_text().splitlines():
                try:
                    row = json.loads(line)
                except json.JSONDecodeError:
                    continue
                if name == "failures.jsonl" or row.get("verdict") in ("fail", "error"):
                    return row
    return None


def _suite_of(record: dict) -> str:
    suite = registry.suite_of(record)
    if suite is None:
        raise HarnessError(f"the record names test {record.get('test')!r}, which no suite of this harness has")
    return suite.name


SCRIPT = '''#!/usr/bin/env python
"""Replays a failure without Hypothesis: [{oracle}] {diagnosis}

Found by `python -m harness repro` on SGLang {sglang}, torch {torch}. Run it with the harness environment's
Python: .venv/bin/python {name}. Exit 1 and the oracle's message when it reproduces, 0 when it does not.
"""
import sys

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


def write_outputs(record: dict, suite: str, out: Path) -> tuple[Path, Path]:
    module = registry.get(suite).module
    digest = hashlib.sha256(json.dumps(record["drawn"], sort_keys=True).encode()).hexdigest()[:8]
    name = f"{suite}_{record.get('oracle', 'crash').replace('-', '_')}_{digest}"
    fields = dict(oracle=record.get("oracle"), diagnosis=str(record.get("diagnosis")).replace('"""', "'''")[:300],
                  sglang=record.get("sglang"), torch=record.get("torch"), module=module,
                  drawn=json.dumps(record["drawn"], indent=4).replace("null", "None").replace("true", "True")
                  .replace("false", "False"), root=str(REPO_ROOT))
    out.mkdir(parents=True, exist_ok=True)
    script = out / f"repro_{name}.py"
    script.write_text(SCRIPT.format(name=script.name, **fields))
    regression = REPO_ROOT / "suites" / "regressions" / f"test_{name}.py"
    regression.write_text(REGRESSION.format(name=name, **fields))
    return script, regression


def repro(path: str, budget: float, out: Path) -> int:
    text = read_report(path)
    record = failure_record(text)
    started = time.time()
    if record is not None:
        suite = _suite_of(record)
        print(f"[repro] a harness failure record of {record['test']} ({record.get('oracle')}); replaying it")
    else:
        signature, suite, conditions = classify(text)
        print(f"[repro] signature {signature.name}: {signature.describe}\n[repro] checking suite {suite}'s known "
              "findings and pinned regressions first")
        known = known_finding(signature, suite, conditions)
        if known is not None:
            record, reason = known
            print(f"[repro] a KNOWN FINDING of the installed SGLang {record.get('sglang')} (after "
                  f"{time.time() - started:.1f} s, no search): {record['test']} [{record.get('oracle')}] "
                  f"{record.get('diagnosis')}\n[repro] why it is kept: {reason}\n[repro] replay: {record['replay']}")
            return 0
        print(f"[repro] none matches; searching suite {suite} with conditions {json.dumps(conditions)} for up "
              f"to {budget:.0f} s")
        record = search(suite, conditions, budget, Path(tempfile.mkdtemp(prefix="harness-repro-")))
        if record is None:
            print(f"[repro] not reproduced within {budget:.0f} s; widen the budget with --budget, or run the "
                  f"nightly profile of {registry.get(suite).paths[0]}")
            return 1
        print(f"[repro] reproduced after {time.time() - started:.1f} s: [{record.get('oracle')}] "
              f"{record.get('diagnosis')}\n[repro] drawn: {json.dumps(record.get('drawn'))}")
    if not record.get("drawn"):
        print(f"[repro] the record carries no drawn values; replay it with:\n  {record.get('replay')}")
        return 1
    script, regression = write_outputs(record, suite, out)
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, cwd=REPO_ROOT)
    confirmed = done.returncode == 1
    print(f"[repro] standalone script: {script} ({'fails as reported' if confirmed else 'DID NOT fail on rerun'})"
          f"\n[repro] regression to pin: {regression}\n[repro] total {time.time() - started:.1f} s")
    if not confirmed:
        print(done.stdout[-2000:] + done.stderr[-2000:])
    return 0 if confirmed else 1
