"""A world of ranks, served: one process per rank, SGLang's decode path driven by SGLang's scheduler code in each.

The parent (`launcher.run_world`) starts one process per rank; each (`rank.main`) builds SGLang's parallel state
through SGLang's own `init_parallel_runtime` on gloo, loads the model by SGLang's loader from a transformers
checkpoint (its shard of it), captures the decode runner's graphs and plays the program through SGLang's
scheduler code: `prepare_mlp_sync_batch_raw` (the DP group's gather and vote), `ForwardBatch.init_new`,
`ModelRunner._forward_raw` (graph or eager) (`serving.RankServer`). Each rank returns a `RankRecord`; the parent
judges the world (`harness.oracles.world_agreement`). A rank that crashes or hangs is recorded with its rank, and
every rank is reaped.
"""
from __future__ import annotations

# what the ranks call of SGLang, as (module, attribute): a release without one gets a skip naming it
SGLANG_WORLD_API = (("sglang.srt.distributed.bootstrap", "init_parallel_runtime"),
                    ("sglang.srt.distributed.bootstrap", "init_layer_runtime"),
                    ("sglang.srt.managers.scheduler_components.dp_attn", "prepare_mlp_sync_batch_raw"),
                    ("sglang.srt.model_executor.model_runner", "ModelRunner"),
                    ("sglang.srt.model_executor.runner.eager_runner", "EagerRunner"))


def load():
    """The real-model decode layout the ranks serve (`harness.targets.decode.real_model.load`), or PathMissing
    naming the first of SGLang's functions a world needs that the installed release lacks."""
    import importlib

    from harness.errors import PathMissing
    from harness.targets.decode import real_model
    from harness.versions import module_exists, sglang_version

    layout = real_model.load()
    for module, name in SGLANG_WORLD_API:
        if not module_exists(module) or not hasattr(importlib.import_module(module), name):
            raise PathMissing(f"SGLang {sglang_version()} has no {module}.{name}: its parallel worlds are brought "
                              "up another way, which the harness does not drive")
    return layout
