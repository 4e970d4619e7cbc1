"""`python -m harness axes`: the configuration space the targeted files read, derived from SGLang's source, beside
what the harness does with each setting.

For every targeted file of every suite (`registry.SUITES`' coverage rows), read from the installed SGLang by AST:
- the server settings it reads: `get_<namespace>().<...>.<field>` (SGLang 0.5.2x's runtime context:
  `get_spec().speculative_num_steps`, `get_exec().graph.disable_cuda_graph_padding`), and `server_args.<field>`
  (also `get_global_server_args().<field>`), each named by its last attribute (the `ServerArgs` field);
- the batch fields it reads: `forward_batch.<field>` / `batch.<field>` (ForwardBatch and ScheduleBatch).

Each is then classed by where the harness names it: **drawn** (a strategy or a suite draws it: the name appears in
`strategies/` or `suites/`), **fixed** (only a target sets it: `harness/targets/`, `harness/worlds/`), or **not
driven**, with the reason `NOT_DRIVEN` gives where one is known (a GPU-only kernel, another device). A name is a
name: a setting drawn under the same name in another suite counts as drawn (the table is a map, not a proof).
"""
from __future__ import annotations

import ast
import dataclasses
import re
from pathlib import Path

from harness import registry
from harness.mutants import REPO_ROOT

# Why a setting is not driven, where that is known (the rest say "no reason recorded": a gap to look at)
NOT_DRIVEN = {
    "enable_two_batch_overlap": "two-batch overlap splits a batch over two CUDA streams' kernels (DeepEP); not "
                                "served off a GPU",
    "enable_memory_saver": "torch_memory_saver pauses GPU memory; no equivalent on the virtual device",
    "enable_cudagraph_gc": "a GC policy around capture: the virtual device's graphs hold no device memory",
    "debug_cuda_graph": "a debugging switch that replays eagerly (the breakable backend's debug_eager)",
    "tp_group": "a process group, not a setting: the parallel-worlds suite builds real ones",
    "tp_rank": "a rank, not a setting: the parallel-worlds suite runs two",
    **{name: "a DP-attention field: SGLang's own DP code fills it where the parallel-worlds suite serves DP "
             "attention; the single-rank suites leave it unset"
       for name in ("dp_padding_mode", "dp_local_start_pos", "dp_local_num_tokens", "original_global_num_tokens_cpu",
                    "global_num_token_non_padded_cpu", "can_run_dp_prefill_cuda_graph", "can_run_dp_draft_cuda_graph",
                    "dp_prefill_cuda_graph_max_prefix_len", "enable_dp_lm_head", "attn_tp_group",
                    "use_world_group_for_gather")},
    **{name: "two-batch overlap (DeepEP's two-stream split): not served off a GPU"
       for name in ("can_run_tbo", "tbo_split_seq_index", "tbo_event_pool")},
    **{name: "MoE expert parallelism (DeepEP and other all-to-all kernels, GPU-only): the MoE family runs SGLang's "
             "native path without EP"
       for name in ("moe_a2a_backend", "speculative_moe_a2a_backend", "max_ep_size", "ep_num_redundant_experts",
                    "elastic_ep_backend", "moe_tp_size", "moe_tp_rank", "moe_dp_group")},
    **{name: "a GPU architecture or kernel-library switch (SM100, Marlin, FlashInfer TRT-LLM / MXFP4): the virtual "
             "device runs SGLang's Triton and native paths"
       for name in ("is_sm100", "is_marlin", "is_flashinfer_trtllm", "is_flashinfer_mxfp4",
                    "flashinfer_trtllm_bypass")},
    **{name: "MoE expert parallelism's joiner and dispatch (GPU all-to-all kernels): not served off a GPU"
       for name in ("is_ep_joiner", "is_ep_scale_joiner", "joiner_skip_all_gather", "ep_dispatch_algorithm")},
    **{name: "a LoRA server setting not drawn yet: LoRA serving draws the backend, max_loras_per_batch and the "
             "adapters (issue 36 item 1)"
       for name in ("lora_eviction_policy", "lora_strict_loading", "max_lora_chunk_size", "lora_use_virtual_experts",
                    "lora_batch_layout", "experts_shared_outer_loras")},
    **{name: "a hybrid model's prefill-side Mamba track: the hybrid family is served by the decode runner only "
             "(its extend's chunked gated-delta kernels not yet run; issue 31 item 4)"
       for name in ("mamba_track_seqlens_cpu", "mamba_prefill_track_mask_cpu")},
}
SETTING_CALL = re.compile(r"get_[a-z_]+$")
BATCH_NAMES = ("forward_batch", "batch", "fb")
DRAWING = ("strategies", "suites")
SETTING = ("harness/targets", "harness/worlds", "harness/models")


@dataclasses.dataclass
class Axis:
    file: str  # targeted file, relative to the sglang package
    kind: str  # "setting" or "batch field"
    name: str
    lines: list[int]
    status: str = ""  # drawn / fixed / not driven
    reason: str = ""


NAMESPACES = {"graph", "overlap", "mamba", "capture", "kernel", "features", "lora", "sched", "spec", "dp", "moe"}


def _chain(node: ast.Attribute) -> tuple[ast.AST, list[str]]:
    """The root of an attribute chain and its attribute names, root outward: `get_exec().graph.x.y` ->
    (the call, ["graph", "x", "y"])."""
    names = []
    while isinstance(node, ast.Attribute):
        names.append(node.attr)
        node = node.value
    return node, names[::-1]


def reads(source: str) -> dict[tuple[str, str], list[int]]:
    """(kind, name) -> the lines a file reads it on (see the module docstring). The setting a chain names is its
    first attribute past the runtime context's namespaces (`get_exec().graph.disable_cuda_graph_padding`); a batch
    field, the first attribute past the batch (`forward_batch.forward_mode.is_decode()` reads `forward_mode`)."""
    tree = ast.parse(source)
    inner = {id(node.value) for node in ast.walk(tree) if isinstance(node, ast.Attribute)}
    found: dict[tuple[str, str], list[int]] = {}
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute) or id(node) in inner:
            continue  # only whole chains
        root, names = _chain(node)
        kind, name = None, None
        if isinstance(root, ast.Call) and isinstance(root.func, ast.Name) and SETTING_CALL.match(root.func.id):
            past = [n for n in names if n not in NAMESPACES]
            kind, name = "setting", past[0] if past else None
        elif isinstance(root, ast.Name) and root.id == "server_args":
            kind, name = "setting", names[0]
        elif isinstance(root, ast.Name) and root.id == "self" and names[:1] == ["server_args"] and len(names) > 1:
            kind, name = "setting", names[1]
        elif isinstance(root, ast.Name) and root.id in BATCH_NAMES:
            kind, name = "batch field", names[0]
        if kind and name and not name.startswith("__"):
            found.setdefault((kind, name), []).append(node.lineno)
    return {key: sorted(set(lines)) for key, lines in found.items()}


def _harness_text(folders: tuple[str, ...]) -> str:
    parts = []
    for folder in folders:
        for path in sorted((REPO_ROOT / folder).rglob("*.py")):
            parts.append(path.read_text())
    return "\n".join(parts)


def classify(axes: list[Axis]) -> list[Axis]:
    drawing, setting = _harness_text(DRAWING), _harness_text(SETTING)
    for axis in axes:
        word = re.compile(rf"\b{re.escape(axis.name)}\b")
        if word.search(drawing):
            axis.status = "drawn"
        elif word.search(setting):
            axis.status = "fixed"
        else:
            axis.status = "not driven"
            axis.reason = NOT_DRIVEN.get(axis.name, "no reason recorded")
    return axes


def axes(sglang_dir: Path) -> list[Axis]:
    """Every targeted file's settings and batch fields, classed."""
    rows, seen = [], set()
    for suite in registry.SUITES:
        for entry in (*suite.coverage, *[f for files in suite.personality_coverage.values() for f in files]):
            relative = entry.split("::")[0]
            if relative in seen:
                continue
            seen.add(relative)
            path = sglang_dir / relative
            if not path.exists():
                continue
            for (kind, name), lines in sorted(reads(path.read_text()).items()):
                rows.append(Axis(relative, kind, name, lines))
    return classify(rows)


def table(rows: list[Axis]) -> str:
    """Markdown: per file, its settings and batch fields with their status, then the counts."""
    out, current = [], None
    for axis in rows:
        if axis.file != current:
            current = axis.file
            out += ["", f"### {axis.file}", "", "| kind | name | lines | harness |", "|---|---|---|---|"]
        status = axis.status + (f": {axis.reason}" if axis.reason else "")
        lines = ", ".join(map(str, axis.lines[:6])) + (" ..." if len(axis.lines) > 6 else "")
        out.append(f"| {axis.kind} | `{axis.name}` | {lines} | {status} |")
    counts = {status: sum(1 for a in rows if a.status == status) for status in ("drawn", "fixed", "not driven")}
    head = f"{len(rows)} settings and batch fields read by the targeted files: " + ", ".join(
        f"{n} {status}" for status, n in counts.items())
    return head + "\n" + "\n".join(out) + "\n"
