"""Each mutant re-introduces known bug 2 (or its cause) into a scratch copy of the installed SGLang; the prefill
suite must fail with a diagnosis naming the mode and the guard (or the missing capture stream). Clean SGLang
must pass."""
from __future__ import annotations

import json

import pytest

from harness.record import read_records
from tests.mutant_tables import BUG2_MIXED_NOT_NORMALISED, GLOBAL_NORMALISED
from tests.mutant_runs import Mutant, failure_records, run_suite_on_mutant, tiered

pytestmark = pytest.mark.subprocess  # every test here runs a suite in another process

SUITE = "suites/test_prefill_pcg.py"
RUNNER = "srt/model_executor/runner/prefill_cuda_graph_runner.py"
TC_BACKEND = "srt/model_executor/runner_backend/tc_piecewise_cuda_graph_backend.py"

MUTANTS = {
    # (a) Known bug 2 as released up to 0.5.9: load_batch passes MIXED through in both fields.
    "mixed_not_normalised": Mutant(
        edits=BUG2_MIXED_NOT_NORMALISED,
        oracle="no-recompile",
        texts=["after capture", "forward_mode=MIXED"],
        details=["forward_mode"]),
    # (b) Half a fix: forward_mode normalised, global_forward_mode not.
    "global_mode_not_normalised": Mutant(
        edits=[(RUNNER, GLOBAL_NORMALISED, "        pcg_global_forward_mode = forward_batch.global_forward_mode\n")],
        oracle="no-recompile",
        texts=["after capture", "global_forward_mode=MIXED"],
        details=["global_forward_mode"]),
    # (c) The capture session never publishes the capture stream (compile_phase.set_pcg_capture_stream).
    "capture_stream_not_set": Mutant(
        edits=[(TC_BACKEND, "                with set_pcg_capture_stream(stream):",
                "                with set_pcg_capture_stream(None):")],
        oracle="capture-stream",
        texts=["pcg-capture-stream-not-set", "capture"],
        details=["capture stream is not set"]),
    # (d) The capture loop skips the smallest token count: its batches still run (padded to the next size), so
    # only the capture counted against the case's arithmetic (sizes x pieces) can fail.
    "smallest_shape_not_captured": Mutant(
        edits=[(RUNNER, "        capture_shapes = list(reversed(self.capture_num_tokens))\n",
                "        capture_shapes = list(reversed(self.capture_num_tokens))[:-1]\n")],
        oracle="graph-replay",
        texts=["the capture recorded 6 graph(s), expected 9", "3 token counts x 3 graph(s)"]),
}


COMPILE_PHASE = "srt/compilation/compile_phase.py"
PIECEWISE_CONTEXT = "srt/model_executor/runner_backend_utils/tc_piecewise_cuda_graph/context_manager.py"

# State carried across steps, for the stateful machine alone (`-k PrefillMachine`): name -> as MUTANTS.
STATEFUL_MUTANTS = {
    # The capture stream outlives the capture session: a later serve-time recompile would capture silently.
    "capture_stream_left_set": Mutant(
        edits=[(COMPILE_PHASE, "    finally:\n        _pcg_capture_stream = None", "    finally:\n        pass")],
        oracle="process-state",
        texts=["compile_phase.pcg_capture_stream"]),
    # The piecewise "inside a graph" flag outlives a replay: later eager forwards take the compiled trampoline.
    "piecewise_flag_left_set": Mutant(
        edits=[(PIECEWISE_CONTEXT, "    finally:\n        _in_tc_piecewise_cuda_graph = False",
                "    finally:\n        pass")],
        oracle="process-state",
        texts=["tc_piecewise.in_cuda_graph"]),
    # Known bug 2 reached by a sequence of steps: the machine's MIXED step recompiles.
    "mixed_not_normalised": MUTANTS["mixed_not_normalised"],
}


REGISTRY = "srt/model_executor/cuda_graph_buffer_registry.py"
COMPILE = "srt/compilation/compile.py"
MULTIMODAL = "test_multimodal_inputs"
CONTEXT_LIMITS = "test_context_limits"
BACKEND_ADMISSION = "test_attention_backend_refusal_honoured"
CAPTURE_FAILURE = "test_compile_pass_failure_names_backend_and_way_out"
PIPELINE = "test_pipeline_stage_body"
CAPTURED_METADATA = "test_breakable_captured_attn_metadata"
WRAPPER = "test_vlm_wrapper_layer_model"
MHA_COMPANION = "test_breakable_mha_companion_prefix"
CHUNK_SOURCES = "test_prefix_chunk_capacity_sources"
POOLED = "test_embedding_model_pooled_output"
LORA = "test_breakable_lora"
LORA_ADMISSION = """            lora_ineligible=self.enable_lora
            and not (
                self._capture_lora
                and self.model_runner.lora_manager.can_use_prefill_cuda_graph(
                    forward_batch
                )
            ),
"""
LAYERLESS = "test_refused_at_construction and layerless"
MROPE_SLOT = """                "mrope_positions",
                lambda _bs2, mt: (3, mt),
                torch.int64,
                axis="tokens",
                padding_policy=PaddingPolicy.ZERO,
"""
OUT_CACHE_LOC_SLOT = ('            "out_cache_loc",\n            _tokens,\n            cache_loc_dtype,\n'
                      '            axis="tokens",\n')
FILL_EMBEDS = '        """A text-only batch would otherwise replay the captured input_embeds."""\n'

# Regressions on the paths a VLM batch takes (mRoPE, input_embeds), in the runner's admission and in the dynamic
# dimensions SGLang marks, each run on the test that drives the path (`-k` its `select`).
PATH_MUTANTS = {
    # mRoPE: the static mRoPE slot is never refreshed from the batch (copy_from_fb=False, as for input_embeds), so
    # every replay computes with the positions left by an earlier batch.
    "mrope_slot_not_copied": Mutant(
        select=MULTIMODAL,
        edits=[(REGISTRY, MROPE_SLOT, MROPE_SLOT + "                copy_from_fb=False,\n")],
        oracle="eager-equality",
        texts=["not bit-equal to eager"]),
    # mRoPE: the body-capture backends hand the captured body 1-D positions although the model runs mRoPE.
    "layer_positions_ignore_mrope": Mutant(
        select=MULTIMODAL,
        edits=[(RUNNER, '        if getattr(model, "is_mrope_enabled", False):\n'
                        "            return forward_batch.mrope_positions\n", "")],
        oracle="eager-equality",
        texts=["not bit-equal to eager"]),
    # input_embeds: a text batch on a VLM replays stale embeddings (the static slot is never filled).
    "input_embeds_slot_not_filled": Mutant(
        select=MULTIMODAL,
        edits=[(RUNNER, FILL_EMBEDS, FILL_EMBEDS + "        return\n")],
        oracle="eager-equality",
        texts=["not bit-equal to eager"]),
    # input_embeds: a text-only batch (no embeddings handed to the body) skips the refill from
    # get_input_embeddings(), so the graph reads the embeddings the capture or an earlier batch left.
    "text_batch_slot_not_refilled": Mutant(
        select=MULTIMODAL,
        edits=[(RUNNER, "        if ie is None:\n            input_ids = layer_kwargs.get(\"input_ids\")\n",
                "        if ie is None:\n            return\n")],
        oracle="eager-equality",
        texts=["not bit-equal to eager"]),
    # input_embeds: the slot refilled only when the live batch carries embeddings (image batches, which admission
    # sends eager anyway), never for text-only ones.
    "slot_refilled_only_with_batch_embeds": Mutant(
        select=MULTIMODAL,
        edits=[(RUNNER, '                and self.buffer_registry.has_slot("input_embeds")\n'
                        "            ):\n                self._fill_input_embeds_slot(",
                "                and forward_batch.input_embeds is not None\n"
                "            ):\n                self._fill_input_embeds_slot(")],
        oracle="eager-equality",
        texts=["not bit-equal to eager"]),
    # admission: a batch carrying its own embeddings is let into the graphs, which embed token ids.
    "input_embeds_admitted": Mutant(
        select=MULTIMODAL,
        edits=[(RUNNER, "        if input_embeds is not None:\n            return False\n", "")],
        oracle="admission",
        texts=["input_embeds"],
        details=['"input_embeds": true']),
    # admission: the hidden-state comparison is skipped, so LAST/FULL batches replay a NULL capture.
    "hidden_mode_admitted": Mutant(
        select=MULTIMODAL,
        edits=[(RUNNER, "            capture_hidden_mode is not None\n"
                        "            and self.capture_hidden_mode < capture_hidden_mode",
                "            capture_hidden_mode is None\n"
                "            and self.capture_hidden_mode < capture_hidden_mode")],
        oracle="admission",
        texts=["capture_hidden_mode="],
        details=["capture_hidden_mode"]),
    # admission: return_logprob admitted on tc_piecewise, which has no eager logits tail.
    "logprob_admitted_without_tail": Mutant(
        select=MULTIMODAL,
        edits=[(RUNNER, "        if return_logprob and not self._uses_eager_prefill_tail():",
                "        if return_logprob and self._uses_eager_prefill_tail() is None:")],
        oracle="admission",
        texts=["return_logprob"],
        details=['"return_logprob": true']),
    # captured attention metadata: the replay skips the in-place refresh, so the attention reads the tables the
    # capture (or an earlier replay) left for that bucket.
    "captured_metadata_not_refreshed": Mutant(
        select=CAPTURED_METADATA,
        edits=[(RUNNER, "            attn_backend.prepare_forward_metadata_for_breakable_cuda_graph_replay(\n"
                        "                metadata,\n                forward_batch,\n"
                        "                static_forward_batch=static_forward_batch,\n            )\n", "")],
        oracle="eager-equality",
        texts=["not bit-equal to eager"]),
    # captured attention metadata: the runner ignores the backend's request cap on it
    # (prefill_cuda_graph_max_batch_size), so a batch of more requests replays and the backend refreshes tables sized
    # for fewer.
    "captured_metadata_cap_ignored": Mutant(
        select=CAPTURED_METADATA,
        edits=[(RUNNER, "        if (\n            self._captured_attn_metadata_max_bs is not None\n"
                        "            and batch_size > self._captured_attn_metadata_max_bs\n        ):\n"
                        "            return False\n", "")],
        oracle="admission",
        texts=["3 requests exceed the 2", "prefill_cuda_graph_max_batch_size"]),
    # captured attention metadata: the capture takes the generic eager init, so no bucket's metadata is stashed
    # for the replay to refresh.
    "captured_metadata_not_stashed": Mutant(
        select=CAPTURED_METADATA,
        edits=[(RUNNER, "            if not self.use_captured_attn_metadata:\n"
                        "                attn_backend.init_forward_metadata(forward_batch)\n                return\n",
                "            if True:\n                attn_backend.init_forward_metadata(forward_batch)\n"
                "                return\n")],
        oracle="crash",
        texts=["ShapeKey"]),
    # chunked prefix: an off-by-one in the chunk lengths, so every full chunk drops its last cached token.
    "prefix_chunk_len_off_by_one": Mutant(
        select="test_full_chunked_prefix",
        edits=[(RUNNER, "            min=0, max=self._prefix_chunk_len\n",
                "            min=0, max=self._prefix_chunk_len - 1\n")],
        oracle="eager-equality",
        texts=["not bit-equal to eager"]),
    # chunked prefix: the replay reuses the chunk buffers the capture (or the previous replay) left.
    "prefix_buffers_not_refreshed": Mutant(
        select="test_full_chunked_prefix",
        edits=[(RUNNER, "            if shape_key.variant_label is not None:\n"
                        "                self._prepare_chunked_prefix_replay(shape_key, forward_batch)\n", "")],
        oracle="eager-equality",
        texts=["of the prefill static input `prefix chunk seq_lens`"]),
    # chunk capacity fallbacks: with no chunk budget the largest captured token count stands in for max_bs, so
    # the chunks are smaller and the capture records other variants.
    "prefix_capacity_max_bs_from_grid": Mutant(
        select=CHUNK_SOURCES + " and max_bs",
        edits=[(RUNNER, "                requested_capacity = prefix_config.max_bs\n",
                "                requested_capacity = max(prefix_config.bs)\n")],
        oracle="graph-replay",
        texts=["recorded 18 graph(s), expected 12"]),
    # chunk capacity fallbacks: the scheduler's chunk budget is skipped, straight to max_bs (unset there).
    "prefix_capacity_skips_chunk_budget": Mutant(
        select=CHUNK_SOURCES + " and chunked_prefill_size",
        edits=[(RUNNER, "            requested_capacity = get_schedule().chunked_prefill_size\n",
                "            requested_capacity = None\n")],
        oracle="crash",
        texts=["full_prefill_prefix_chunk_tokens must be positive"]),
    # pooled outputs: the runner knows logits and pipeline proxies only, so an embedding model's output is
    # taken for a proxy.
    "pooled_output_taken_for_proxy": Mutant(
        select=POOLED,
        edits=[(RUNNER, "        if isinstance(output, EmbeddingPoolerOutput):\n            return output\n", "")],
        oracle="crash",
        texts=["AssertionError"]),
    # pooled outputs: trimmed as logits are (their padded rows cut), which an EmbeddingPoolerOutput has none of.
    "pooled_output_trimmed_as_logits": Mutant(
        select=POOLED,
        edits=[(RUNNER, "        if isinstance(output, LogitsProcessorOutput):\n"
                        "            return self._trim_logits_output",
                "        if isinstance(output, (LogitsProcessorOutput, EmbeddingPoolerOutput)):\n"
                "            return self._trim_logits_output")],
        oracle="crash",
        texts=["EmbeddingPoolerOutput"]),
    # LoRA: admission asks only whether LoRA was captured, not whether the batch fits the static batch info, so a
    # batch of more requests than its rows replays reading scales prepare_lora_batch never wrote there.
    "lora_capacity_not_admitted": Mutant(
        select=LORA,
        edits=[(RUNNER, LORA_ADMISSION, "            lora_ineligible=self.enable_lora and not self._capture_lora,\n")],
        oracle="admission",
        texts=["LoRA backend's 3 static", "can_use_prefill_cuda_graph"]),
    # LoRA: the capture skips prepare_lora_batch, so the captured kernels read batch info no one prepared.
    "lora_capture_not_prepared": Mutant(
        select=LORA,
        edits=[(RUNNER, "            lora_manager.prepare_lora_batch(forward_batch)\n", "")],
        oracle="crash",
        texts=["before prepare_lora_batch ran"]),
    # token-embedding overrides: admission forgets replace_embeds, so the graph replays without the overrides.
    "replace_embeds_not_admitted": Mutant(
        select="test_token_embedding_overrides_run_eager",
        edits=[(RUNNER, "        if replace_embeds is not None:\n            return False\n", "")],
        oracle="admission",
        texts=["replace_embeds"]),
    # dynamic dimensions: the ForwardBatch's tensors are left static, so each token count traces again.
    "forward_batch_not_marked_dynamic": Mutant(
        select="test_piecewise_forward_modes",
        edits=[(COMPILE, '        _mark_dynamic_forward_batch(ba.arguments.get("forward_batch"))', "        pass")],
        oracle="dynamo-contract",
        texts=["`L['forward_batch'].out_cache_loc`", "SGLang marked axes [] dynamic where SGLang promises axes [0]"]),
    # dynamic dimensions: only multi-dimensional ForwardBatch tensors marked (1-D ones such as out_cache_loc kept).
    "forward_batch_vectors_left_static": Mutant(
        select="test_piecewise_forward_modes",
        edits=[(COMPILE, "        if not isinstance(value, torch.Tensor) or value.ndim == 0:",
                "        if not isinstance(value, torch.Tensor) or value.ndim <= 1:")],
        oracle="dynamo-contract",
        texts=["`L['forward_batch'].out_cache_loc`", "SGLang marked axes [] dynamic where SGLang promises axes [0]"]),
    # out_cache_loc: the static slot's padded tail is kept, not zeroed, so padding tokens write KV into slots an
    # earlier, larger batch used (another request's cache).
    "out_cache_loc_padding_kept": Mutant(
        select="test_piecewise_forward_modes",
        edits=[(REGISTRY, OUT_CACHE_LOC_SLOT + "            padding_policy=PaddingPolicy.ZERO,\n        ),\n    ]\n"
                          "    if register_input_embeds is None:",
                OUT_CACHE_LOC_SLOT + "            padding_policy=PaddingPolicy.KEEP_PAD,\n        ),\n    ]\n"
                                     "    if register_input_embeds is None:")],
        oracle="eager-equality",
        texts=["not bit-equal to eager"]),
    # context limits: the fixed max_context_size dropped from admission; the batch replays past the graphs'
    # extent (load_batch's own check raises, or the attention reads fewer cached tokens).
    "context_limit_not_admitted": Mutant(
        select=CONTEXT_LIMITS,
        edits=[(RUNNER, "        for context_limit in (self.max_context_size, self.max_seq_len):",
                "        for context_limit in (self.max_seq_len,):")],
        oracle="admission",
        texts=["longest context", "context limit (32"],
        details=["num_tokens"]),
    # context limits: a batch's context measured by its new tokens, not its sequence (prefix left out).
    "context_measured_without_prefix": Mutant(
        select=CONTEXT_LIMITS,
        edits=[(RUNNER, "        seq_lens_cpu = forward_batch.seq_lens_cpu\n",
                "        seq_lens_cpu = forward_batch.extend_seq_lens_cpu\n")],
        oracle="admission",
        texts=["longest context"]),
    # admission owned by the attention backend: its can_run_prefill_cuda_graph never consulted, so a batch it
    # refuses replays the graphs.
    "backend_refusal_ignored": Mutant(
        select=BACKEND_ADMISSION,
        edits=[(RUNNER, "        if backend_can_run is not None and not backend_can_run(forward_batch):\n",
                "        if False:\n")],
        oracle="admission",
        texts=["the attention backend admits at most"]),
    # ... or looked up under another name on the backend, so no backend's refusal is ever found.
    "backend_refusal_misnamed": Mutant(
        select=BACKEND_ADMISSION,
        edits=[(RUNNER, 'else getattr(model_runner.attn_backend, "can_run_prefill_cuda_graph", None)',
                'else getattr(model_runner.attn_backend, "can_run_cuda_graph", None)')],
        oracle="admission",
        texts=["its own can_run_prefill_cuda_graph"]),
    # context limits: the attention backend's own max_seq_len default is not picked up.
    "backend_max_seq_len_ignored": Mutant(
        select=CONTEXT_LIMITS + " and breakable",
        edits=[(RUNNER, "                model_runner.attn_backend.prefill_cuda_graph_default_max_seq_len\n",
                "                None\n")],
        oracle="admission",
        texts=["longest context", "context limit (24"]),
    # admission too strict (a silent fallback to eager): with only the attention backend's max_seq_len set, the
    # batch's context is never measured, so can_replay_locally refuses every batch, servable ones included
    # (mutate's seed-8821 survivor).
    "context_unmeasured_without_max_context_size": Mutant(
        select=CONTEXT_LIMITS + " and breakable-cap",
        edits=[(RUNNER, "            if self.max_context_size is not None or self.max_seq_len is not None\n",
                "            if self.max_context_size is not None or self.max_seq_len is None\n")],
        oracle="admission",
        texts=["ran eager, but the graphs serve it", "can_run_graph sent a servable batch to eager"]),
    # context limits: tc_piecewise keeps a limit it cannot honour, so longer contexts stop replaying.
    "tc_piecewise_keeps_context_limit": Mutant(
        select="test_context_limit_ignored_by_tc_piecewise",
        edits=[(RUNNER, '            self._ignore_max_context_size("tc_piecewise prefill CUDA graph")',
                "            pass")],
        oracle="admission",
        texts=["ran eager, but the graphs serve it", "longest context 24"]),
    # construction: a limit wider than req_to_token is accepted.
    "context_capacity_unchecked": Mutant(
        select="test_refused_at_construction and beyond",
        edits=[(RUNNER, "        if max_context_size is not None and max_context_size > table_width:",
                "        if max_context_size is not None and max_context_size > 2 * table_width:")],
        oracle="admission",
        texts=["built the runner", "80"]),
    # construction: a limit accepted with an attention backend that plans no fixed-extent metadata.
    "context_support_unchecked": Mutant(
        select="test_refused_at_construction and no-fixed",
        edits=[(RUNNER, "        if self.max_context_size is not None and not (\n",
                "        if self.max_context_size is None and not (\n")],
        oracle="admission",
        texts=["built the runner", "fixed-context"]),
    # execute's own hidden-state guard compares the wrong way round.
    "execute_hidden_mode_reversed": Mutant(
        select="test_execute_refuses_hidden_mode_above_capture",
        edits=[(RUNNER, "        if self.capture_hidden_mode < forward_batch.capture_hidden_mode:",
                "        if self.capture_hidden_mode > forward_batch.capture_hidden_mode:")],
        oracle="admission",
        texts=["execute replayed"]),
    # execute's guard removed (only can_run_graph refuses).
    "execute_hidden_mode_unchecked": Mutant(
        select="test_execute_refuses_hidden_mode_above_capture",
        edits=[(RUNNER, "        self._validate_capture_hidden_mode(forward_batch)\n        with self.model_context()",
                "        with self.model_context()")],
        oracle="admission",
        texts=["execute replayed"]),
    # capture failure: the compile pass's RuntimeError escapes without SGLang's message.
    "compile_failure_unwrapped": Mutant(
        select=CAPTURE_FAILURE,
        edits=[(RUNNER, "            if self.prefill_backend_name != Backend.TC_PIECEWISE:\n                raise",
                "            if True:\n                raise")],
        oracle="capture-failure",
        texts=["Capture prefill CUDA graph failed"]),
    # capture failure: tc_piecewise is given the breakable backend's suggestions (no way out to breakable).
    "compile_failure_wrong_hint": Mutant(
        select=CAPTURE_FAILURE,
        edits=[(RUNNER, "    if backend_name == Backend.BREAKABLE:", "    if backend_name != Backend.BREAKABLE:")],
        oracle="capture-failure",
        texts=["--cuda-graph-backend-prefill=breakable"]),
    # annotation inference: a body with nothing to infer compiles anyway (every dimension left to Dynamo).
    "annotation_inference_never_refuses": Mutant(
        select="test_refused_at_construction and unannotated",
        edits=[(COMPILE, "    if not dyn:\n        raise ValueError(", "    if False:\n        raise ValueError(")],
        oracle="admission",
        texts=["built the runner", "annotations"]),
    # annotation inference: only string annotations recognised (as if every model file had the future import),
    # so a body annotated with torch.Tensor objects has no dynamic dimension and the runner cannot be built.
    "object_annotations_ignored": Mutant(
        select="test_piecewise_forward_modes",
        edits=[(COMPILE, '            ann is torch.Tensor\n            or getattr(getattr(ann, "__args__", [None])[0], '
                         '"__name__", "") == "Tensor"\n', "            False\n")],
        oracle="crash",
        texts=["No dynamic dims inferred"]),
    # annotation inference: only a bare IntermediateTensors annotation recognised, not Optional[...] (as vLLM-ported
    # bodies spell it), so the previous stage's hidden states keep the token count of the first trace.
    "optional_intermediate_tensors_ignored": Mutant(
        select=PIPELINE,
        edits=[(COMPILE, '        elif getattr(ann, "__name__", "") in ("IntermediateTensors",) or any(\n'
                         '            getattr(a, "__name__", "") == "IntermediateTensors"\n'
                         '            for a in getattr(ann, "__args__", [])\n        ):',
                '        elif getattr(ann, "__name__", "") in ("IntermediateTensors",):')],
        oracle="dynamo-contract",
        texts=["`L['intermediate_tensors']", "SGLang marked axes [] dynamic"]),
    # dynamic dimensions: the duck-typed check misses SGLang's IntermediateTensors (a dict of tensors), so its
    # tensors are never marked dynamic although the annotation names them.
    "intermediate_tensors_not_marked": Mutant(
        select=PIPELINE,
        edits=[(COMPILE, '            getattr(obj, "tensors"), dict\n',
                '            getattr(obj, "tensors"), (list, tuple)\n')],
        oracle="dynamo-contract",
        texts=["`L['intermediate_tensors']", "SGLang marked axes [] dynamic"]),
    # layer-model resolution: the resolver hands back whatever module it reached, layers or not, so a body without
    # `layers` is captured by breakable/full (or fails later, far from the cause).
    "layer_model_unchecked": Mutant(
        select=LAYERLESS,
        edits=[(RUNNER, '    if not hasattr(layer_model, "layers"):\n        raise RuntimeError(',
                '    if False:\n        raise RuntimeError(')],
        oracle="admission",
        texts=["built the runner", "layers under `h`"],
        details=["blocks"]),
    # layer-model resolution: any module with a forward taken as the layer model (the wrapper walk stops at once).
    "layer_model_any_module": Mutant(
        select=LAYERLESS,
        edits=[(RUNNER, '    while not hasattr(layer_model, "layers") and hasattr(layer_model, "model"):\n',
                '    while not hasattr(layer_model, "forward") and hasattr(layer_model, "model"):\n'),
               (RUNNER, '    if not hasattr(layer_model, "layers"):\n        raise RuntimeError(',
                '    if not hasattr(layer_model, "forward"):\n        raise RuntimeError(')],
        oracle="admission",
        texts=["built the runner", "layers under `h`"],
        details=["blocks"]),
    # layer-model resolution: the wrapper walk is gone, so a VLM wrapper's causal LM (no `layers` of its own)
    # cannot be captured by breakable/full.
    "layer_model_wrapper_not_walked": Mutant(
        select=WRAPPER,
        edits=[(RUNNER, '    while not hasattr(layer_model, "layers") and hasattr(layer_model, "model"):\n',
                "    while False:\n")],
        oracle="crash",
        texts=["without layers"]),
    # layer-model resolution: the walk follows `language_model`, not `.model`, and stops at the causal LM.
    "layer_model_walks_language_model": Mutant(
        select=WRAPPER,
        edits=[(RUNNER, '    while not hasattr(layer_model, "layers") and hasattr(layer_model, "model"):\n'
                        "        obj_id = id(layer_model)\n        if obj_id in seen:\n            break\n"
                        "        seen.add(obj_id)\n        layer_model = layer_model.model\n",
                '    while not hasattr(layer_model, "layers") and hasattr(layer_model, "language_model"):\n'
                "        obj_id = id(layer_model)\n        if obj_id in seen:\n            break\n"
                "        seen.add(obj_id)\n        layer_model = layer_model.language_model\n")],
        oracle="crash",
        texts=["without layers"]),
    # MHA companion: only batches whose every request has a cached prefix refused, so a fresh request beside a
    # chunk replays the uncapturable prefix path.
    "mha_companion_all_prefixes": Mutant(
        select=MHA_COMPANION,
        edits=[(RUNNER, "            and prefix_lens is not None\n            and any(prefix_lens)\n",
                "            and prefix_lens is not None\n            and all(prefix_lens)\n")],
        oracle="admission",
        texts=["cached prefix", "can_run_graph must send it to eager"]),
    # MHA companion: the check reads the device the wrong way round (off CUDA treated as CUDA).
    "mha_companion_device_reversed": Mutant(
        select=MHA_COMPANION,
        edits=[(RUNNER, "            and self.has_mha_companion_layers\n            and not is_cuda()\n"
                        "            and prefix_lens is not None\n",
                "            and self.has_mha_companion_layers\n            and is_cuda()\n"
                        "            and prefix_lens is not None\n")],
        oracle="admission",
        texts=["cached prefix", "MHA companion"]),
    # mixed chunks: tc_piecewise (unpadded) accepted as a mixed-chunk backend.
    "mixed_chunk_accepts_tc_piecewise": Mutant(
        select="test_refused_at_construction and mixed",
        edits=[(RUNNER, "            assert backend in (Backend.BREAKABLE, Backend.FULL), (",
                "            assert backend in (Backend.BREAKABLE, Backend.FULL, Backend.TC_PIECEWISE), (")],
        oracle="admission",
        texts=["built the runner", "mixed-chunk"]),
    # mixed chunks: the check reads the decode phase's backend, so a padded prefill backend is refused.
    "mixed_chunk_reads_decode_phase": Mutant(
        select=CONTEXT_LIMITS + " and full",
        edits=[(RUNNER, "            backend = get_exec().graph.cuda_graph_config.prefill.backend\n            assert",
                "            backend = get_exec().graph.cuda_graph_config.decode.backend\n            assert")],
        oracle="crash",
        texts=["Mixed chunk prefill requires", "disabled"]),
}


def _first_failure(report_dir) -> dict:
    failures = failure_records(report_dir)
    assert failures, "the suite failed without writing a failure record"
    return failures[0]


@pytest.mark.parametrize("name", tiered(MUTANTS))
def test_mutant_fails_the_suite_with_its_diagnosis(name, tmp_path):
    failure = _detected(name, MUTANTS[name], tmp_path, ())
    _check_diagnosis(failure, MUTANTS[name])
    assert failure["sglang_mutant"] == name and failure["test"] in failure["replay"]


@pytest.mark.parametrize("name", tiered(PATH_MUTANTS))
def test_path_mutant_fails_its_test_with_its_diagnosis(name, tmp_path):
    mutant = PATH_MUTANTS[name]
    failure = _detected(name, mutant, tmp_path, ("-k", mutant.select))
    assert mutant.select.split()[0] in failure["test"], failure  # the test the -k expression names first
    _check_diagnosis(failure, mutant)


def _detected(name: str, mutant: Mutant, tmp_path, extra: tuple) -> dict:
    """The first failure of the suite on mutant `name` (which must fail it)."""
    code, output = run_suite_on_mutant(SUITE, name, mutant.edits, tmp_path, extra=extra, timeout=900)
    assert code == 1, f"mutant {name} was not detected (exit {code}):\n{output[-3000:]}"
    return _first_failure(tmp_path)


def _check_diagnosis(failure: dict, mutant: Mutant) -> None:
    assert failure["oracle"] == mutant.oracle, failure
    for text in mutant.texts:
        assert text in failure["diagnosis"], (text, failure)
    details = json.dumps(failure["details"])
    for text in mutant.details:
        assert text in details, (text, failure)


@pytest.mark.parametrize("name", sorted(STATEFUL_MUTANTS))
def test_stateful_machine_finds_carried_state(name, tmp_path):
    failure = _detected(name, STATEFUL_MUTANTS[name], tmp_path, ("-k", "PrefillMachine"))
    assert "PrefillMachine" in failure["test"], failure
    _check_diagnosis(failure, STATEFUL_MUTANTS[name])


def test_clean_sglang_passes(tmp_path):
    code, output = run_suite_on_mutant(SUITE, "clean", [], tmp_path, timeout=900)
    assert code == 0, output[-3000:]
    rows = read_records(tmp_path / "examples.jsonl")
    strict = [r for r in rows if r["suite"] != "prefill_pcg_findings"]  # strict xfails: known findings
    assert len(strict) >= 100 and not [r for r in strict if r["verdict"] in ("fail", "error")]
    assert {r["notes"].get("path") for r in strict} >= {"graph", "eager"}


# SGLang fixed where the deepstack finding says: the warm-up reads the body class's own signature. The strict
# expected failure must then pass (XPASS fails the run), so the finding shows when SGLang changes.
DEEPSTACK_FIX = [(RUNNER, '            not in inspect.signature(language_model.forward).parameters',
                  '            not in inspect.signature(type(language_model).forward).parameters')]


def test_deepstack_finding_tracks_the_fix(tmp_path):
    code, output = run_suite_on_mutant(SUITE, "deepstack_warmup_fixed", DEEPSTACK_FIX, tmp_path,
                                       extra=("-k", "deepstack", "-rX"), timeout=600)
    assert code == 1 and "XPASS" in output and "test_findings_deepstack_warmup_skipped" in output, output[-3000:]
