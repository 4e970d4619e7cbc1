"""Oracle `npu-graph-update`: each NPU graph replay first rebinds the graph's host-side KV lengths
(`NPUGraph.update(cpu_update_input=[{name: seq_lens}])`), with what the batch implies:

    name     = "actual_seq_kvlen" for the architectures SGLang updates the v2 way (`V2_SEQ_LEN_ARCHITECTURES`),
               else "actual_seq_lengths_kv"
    (none at all for DeepSeek V4 (`NO_UPDATE_ARCHITECTURES`), whose graphs SGLang replays without an update)
    seq_lens = per request: seq_len (+ draft tokens per request under TARGET_VERIFY), then 0 for every padded
               request up to the replayed size (the smallest captured size >= the batch's requests); a DFLASH
               verify, where the release reads it, takes the attention backend's list (`seq_lens_cpu_list`, the
               double's: padded rows at its seq_len fill value + draft tokens)

e.g. a TARGET_VERIFY batch of seq_lens [9, 4] with 3 draft tokens, replayed at size 4: [12, 7, 0, 0]. The EAGLE
draft worker's NPU runners update too (`expected_draft_updates`, `expected_extend_updates`): a part per draft step
that attends, each request's prefix plus the draft tokens the step reads; the extend's, each request's length past
its verify window; padded requests 0. Each update is made from the NPU its graph was captured on
(`check_update_devices`). A stale or
misnamed update leaves the NPU kernels reading the capture-time lengths, which the virtual device's graph (whose
static buffers already hold the values) would not show in the outputs: this check does."""
from __future__ import annotations

import inspect

from harness.oracles import OracleFailure
from harness.oracles.patch_contract import expected_sizes
from harness.versions import parse, sglang_version

ORACLE = "npu-graph-update"
V2_SEQ_LEN_ARCHITECTURES = ("MiMoV2ForCausalLM", "MiMoV2FlashForCausalLM", "Step3p5ForCausalLM")
# DeepSeek V4 (and DSA: V3 with an `index_topk`, which the tiny model's config lacks) plans its KV lengths itself:
# SGLang replays its graphs with no update where its replay knows V4; DeepseekV3 without the index updates as any other
NO_UPDATE_ARCHITECTURES = ("DeepseekV4ForCausalLM",)


def graph_updates(target) -> dict | None:
    """Each captured graph's updates so far, by shape key (evidence only); None where the runner keeps its graphs
    without SGLang's `NPUCudaGraphBackend` (releases before 0.5.14, whose NPU runner updates in `_update_inputs`)."""
    return runner_updates(target.runner)


def runner_updates(runner) -> dict | None:
    """`graph_updates` of one runner (a target may hold several: the EAGLE draft worker's decode and extend)."""
    graphs = getattr(getattr(runner, "backend", None), "_graphs", None)
    return None if graphs is None else {key: list(graph.updates) for key, graph in graphs.items()}


# The EAGLE draft worker's NPU runners update under this name whatever the architecture: the draft runner takes its
# `attr_name` map's MLA entry, the draft-extend runner names it literally
DRAFT_UPDATE_NAME = "actual_seq_lengths_kv"


def expected_draft_updates(seq_lens: list[int], padded: int, num_steps: int) -> list[list[dict]]:
    """One replay of the draft decode graph of a `num_steps` draft: one update, a part per draft step that attends
    (all but the last, which only samples), step i reading each request's prefix and its first i + 1 draft tokens
    (`draft_rails`' arithmetic), each padded request 0. E.g. seq_lens [5, 9] at size 3, 3 steps:
    [{name: [6, 10, 0]}, {name: [7, 11, 0]}]."""
    pad = [0] * (padded - len(seq_lens))
    return [[{DRAFT_UPDATE_NAME: [n + step + 1 for n in seq_lens] + pad} for step in range(num_steps - 1)]]


def expected_extend_updates(seq_lens: list[int], padded: int) -> list[list[dict]]:
    """One replay of the draft-extend graph: each request's length past its verify window, each padded request 0."""
    return [[{DRAFT_UPDATE_NAME: list(seq_lens) + [0] * (padded - len(seq_lens))}]]


def updates_since(before: dict, after: dict) -> list[list[dict]]:
    """The updates made between two `runner_updates`, as plain lists (tensors and arrays listed)."""
    new = [updates[len(before.get(key, [])):] for key, updates in after.items()]
    return [[{k: [int(x) for x in v] for k, v in part.items()} for part in update] for updates in new
            for update in updates]


def check_update_devices(runner, what: str) -> None:
    """Every update of each of `runner`'s graphs was made from the NPU the graph was captured on (the virtual
    device's `NPUGraph` records both): an update from a thread on another NPU rebinds nothing of this graph's,
    whose kernels then read the capture-time lengths. SGLang binds its update worker to the runner's device."""
    graphs = getattr(getattr(runner, "backend", None), "_graphs", None) or {}
    for key, graph in graphs.items():
        made = getattr(graph, "update_devices", [])
        wrong = [device for device in made if device != graph.device]
        if wrong:
            raise OracleFailure(ORACLE, f"{what}: the graph of size {getattr(key, 'size', key)} was captured on NPU "
                                f"{graph.device} and updated from a thread on NPU {wrong[0]} ({len(wrong)} of "
                                f"{len(made)} updates): the update worker is not bound to its runner's device",
                                captured_on=graph.device, updated_from=sorted(set(wrong)),
                                runner=type(runner).__name__)


def check_updates(got: list, expected: list, what: str, requests: int, **details) -> None:
    """`got` (`updates_since`) against `expected` for a batch of `requests`, naming each step and request (real or
    padded) whose length differs."""
    if got == expected:
        return
    where = ""
    if len(got) == len(expected) == 1 and len(got[0]) == len(expected[0]):
        rows = [f"step {step} {'request' if row < requests else 'padded request'} {row}: {g} where {e}"
                for step, (gp, ep) in enumerate(zip(got[0], expected[0]))
                for name in ep for row, (g, e) in enumerate(zip(gp.get(name, []), ep[name])) if g != e]
        where = f" ({'; '.join(rows[:4])})" if rows else ""
    elif len(got) == len(expected) == 1:
        where = f" ({len(got[0])} step(s) updated where {len(expected[0])} attend)"
    raise OracleFailure(ORACLE, f"{what}: expected graph updates {expected}, the graphs got {got}{where}",
                        expected=expected, got=got, **details)


def _knows_v4(target) -> bool:
    """Whether the release's NPU runner module knows DeepSeek V4 (imports `is_deepseek_v4`, asked of the module, not
    of the replay body a mutant may edit): trees that predate it update V4 as any other architecture."""
    return hasattr(inspect.getmodule(type(target.runner)), "is_deepseek_v4")


# A DFLASH verify's update from the attention backend's `seq_lens_cpu_list`: checked on the releases at hand,
# 0.5.23 reads it, 0.5.19 and earlier (and the June main trees) recompute from the batch, padded rows 0.
READS_BACKEND_LIST_FROM, RECOMPUTES_UP_TO = (0, 5, 23), (0, 5, 19)


def _reads_backend_list(target) -> bool:
    """By the release, not by the replay body a mutant may edit; only a release between the two checked ones, or
    a source tree (no version), is asked its NPU runner's replay source."""
    version = sglang_version()
    if version != "source tree":
        if parse(version) >= READS_BACKEND_LIST_FROM:
            return True
        if parse(version) <= RECOMPUTES_UP_TO:
            return False
    runner = type(target.runner)
    replay = getattr(runner, "execute", None) or runner.replay  # `replay` on trees before the runner refactor
    return "seq_lens_cpu_list" in inspect.getsource(replay)


def expected_updates(target, batch) -> list[list[dict]]:
    """The updates one replay of `batch` must make: none for `NO_UPDATE_ARCHITECTURES`, else one."""
    case = target.case
    if case.switches.architecture in NO_UPDATE_ARCHITECTURES and _knows_v4(target):
        return []
    name = "actual_seq_kvlen" if case.switches.architecture in V2_SEQ_LEN_ARCHITECTURES else "actual_seq_lengths_kv"
    padded = min(s for s in expected_sizes(case)[0] if s >= batch.batch_size)
    extra = case.tokens_per_request if batch.forward_mode == "TARGET_VERIFY" else 0
    dflash_list = extra and case.spec.algorithm == "DFLASH" and _reads_backend_list(target)
    pad = target.attn_backend.seq_len_fill_value + extra if dflash_list else 0
    return [[{name: [s + extra for s in batch.seq_lens] + [pad] * (padded - batch.batch_size)}]]


def check_npu_graph_update(target, batch, before: dict) -> None:
    """`before`: `graph_updates(target)` taken just before the replay of `batch` (None: not checked here)."""
    if before is None:
        return
    after = graph_updates(target)
    new = {key: updates[len(before.get(key, [])):] for key, updates in after.items()}
    new = {key: updates for key, updates in new.items() if updates}
    expected = expected_updates(target, batch)
    got = [[{k: list(v) for k, v in part.items()} for part in update] for updates in new.values()
           for update in updates]
    check_update_devices(target.runner, f"replay of a {batch.forward_mode} batch of seq_lens {batch.seq_lens}")
    if got != expected:
        raise OracleFailure(ORACLE, f"replay of a {batch.forward_mode} batch of seq_lens {batch.seq_lens} (host "
                            f"mirror: {batch.host_seq_lens}): expected graph updates {expected}, the graphs got {got}",
                            expected=expected, got=got, architecture=target.case.switches.architecture)
