"""DeepSeek-V4.1's candidate-indexer graph variants and its early target verify metadata, on the virtual device.

SGLang builds the variants (`create_dsv41_candidate_graph_variants`, `layers/attention/graph_variants.py`) from the
model's text config when the model is DeepSeek-V4.1 with a candidate source layer on a Blackwell GPU: each captured
size gets one graph per variant label, and a replay takes the label its longest request selects. A DSPARK target
verify runner keeps only the unfiltered variant (requests up to the candidate span, counting the verify width) and
the filtered fallback. Under `SGLANG_OPT_DSV41_TARGET_METADATA_EARLY` that runner also stages a verify's inputs and
replays its metadata glue on a side stream right after the draft's launch (`stage_verify_metadata_early`, called
by SGLang's `dspark_worker_v2`), and the verify replay takes the staged work when its key and tensors are the
staged ones (`EarlyVerifyMetadata.take`).

The harness supplies the config fields (`text_config_fields`: a candidate span of `topk_blocks x block_size`
tokens, compress ratio 4 so no low-ratio variant is offered), the device facts SGLang asks before it enables
either (`on_blackwell`), and the draft worker's call (`stage_early`); the variants, their capture, selection,
staging and take are SGLang's."""
from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any
from unittest import mock

BLOCK_SIZE = 4  # candidate_block_size: a span is a whole number of blocks


def missing() -> str | None:
    """Why the installed release cannot build the variants or stage early metadata, or None."""
    from harness.versions import module_exists, sglang_version

    if not module_exists("sglang.srt.layers.attention.graph_variants"):
        return f"SGLang {sglang_version()} has no sglang.srt.layers.attention.graph_variants: no DSv4.1 variants"
    from sglang.srt.layers.attention import graph_variants

    if not hasattr(graph_variants, "create_dsv41_candidate_graph_variants"):
        return f"SGLang {sglang_version()} has no create_dsv41_candidate_graph_variants"
    if not module_exists("sglang.srt.model_executor.runner.early_verify_metadata"):
        return f"SGLang {sglang_version()} has no early_verify_metadata: no early target verify metadata"
    return None


def text_config_fields(span: int) -> dict[str, Any]:
    """A DeepSeek-V4.1 text config's candidate fields for a candidate span of `span` tokens (a multiple of
    `BLOCK_SIZE`)."""
    if span <= 0 or span % BLOCK_SIZE:
        raise ValueError(f"a candidate span is a positive multiple of {BLOCK_SIZE} tokens, not {span}")
    return dict(model_type="deepseek_v41", candidate_source_layer_id=0, candidate_topk_blocks=span // BLOCK_SIZE,
                candidate_block_size=BLOCK_SIZE, compress_ratios=[4], index_topk=span)


RUNNER_MODULE = "sglang.srt.model_executor.runner.decode_cuda_graph_runner"


@contextlib.contextmanager
def on_blackwell() -> Iterator[None]:
    """The device facts SGLang reads before it enables these features, answered as a CUDA Blackwell GPU would:
    compute capability 10.0, and the model runner's device read as "cuda" inside the two predicates that ask
    (`create_dsv41_candidate_graph_variants`, `DecodeCudaGraphRunner._wants_early_verify_metadata`), each of which
    runs SGLang's own code; the runner's buffers stay on the virtual device."""
    import importlib

    import torch

    module = importlib.import_module(RUNNER_MODULE)
    create = module.create_dsv41_candidate_graph_variants
    wants = module.DecodeCudaGraphRunner._wants_early_verify_metadata

    def create_on_cuda(model_runner, *args, **kwargs):
        with _device_reads_cuda(model_runner):
            return create(model_runner, *args, **kwargs)

    def wants_on_cuda(self):
        with _device_reads_cuda(self.model_runner):
            return wants(self)

    with mock.patch.object(torch.cuda, "get_device_capability", lambda device=None: (10, 0)), \
            mock.patch.object(module, "create_dsv41_candidate_graph_variants", create_on_cuda), \
            mock.patch.object(module.DecodeCudaGraphRunner, "_wants_early_verify_metadata", wants_on_cuda):
        yield


@contextlib.contextmanager
def _device_reads_cuda(model_runner) -> Iterator[None]:
    device = model_runner.device
    model_runner.device = "cuda"
    try:
        yield
    finally:
        model_runner.device = device


def stage_early(target, forward_batch, max_seq_len: int) -> bool:
    """What SGLang's DSPARK worker does right after launching the draft graph (`_stage_target_verify_metadata`):
    hand the verify batch's tensors to the target runner's `stage_verify_metadata_early`, after an event on the
    current stream. Returns the runner's answer (staged or not)."""
    import torch

    after = torch.cuda.Event()
    after.record()
    with target.replay_context():
        return target.runner.stage_verify_metadata_early(
            seq_lens=forward_batch.seq_lens, req_pool_indices=forward_batch.req_pool_indices,
            out_cache_loc=forward_batch.out_cache_loc, positions=forward_batch.positions,
            max_seq_len=max_seq_len, after=after)
