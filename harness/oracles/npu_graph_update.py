"""Oracle `npu-graph-update`: each NPU graph replay first rebinds the graph's host-side KV lengths
(`NPUGraph.update(cpu_update_input=[{name: seq_lens}])`), with what the batch implies:

    name     = "actual_seq_kvlen" for the architectures SGLang updates the v2 way (`V2_SEQ_LEN_ARCHITECTURES`),
               else "actual_seq_lengths_kv"
    (none at all for DeepSeek V4 (`NO_UPDATE_ARCHITECTURES`), whose graphs SGLang replays without an update)
    seq_lens = per request: seq_len (+ draft tokens per request under TARGET_VERIFY), then 0 for every padded
               request up to the replayed size (the smallest captured size >= the batch's requests); a DFLASH
               verify, where the release reads it, takes the attention backend's list (`seq_lens_cpu_list`, the
               double's: padded rows at its seq_len fill value + draft tokens)

e.g. a TARGET_VERIFY batch of seq_lens [9, 4] with 3 draft tokens, replayed at size 4: [12, 7, 0, 0]. A stale or
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
    graphs = getattr(getattr(target.runner, "backend", None), "_graphs", None)
    return None if graphs is None else {key: list(graph.updates) for key, graph in graphs.items()}


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
    if got != expected:
        raise OracleFailure(ORACLE, f"replay of a {batch.forward_mode} batch of seq_lens {batch.seq_lens} (host "
                            f"mirror: {batch.host_seq_lens}): expected graph updates {expected}, the graphs got {got}",
                            expected=expected, got=got, architecture=target.case.switches.architecture)
