"""Mutants of the decode runner's switches and of SGLang's NPU runner, each in a scratch copy of the installed
SGLang: the suite that drives the path must fail with the oracle and diagnosis named; clean SGLang passes.

- Capture profiling (`suites/test_decode_switches.py`): memory history left on after capture; the trace tag drops
  the LoRA variant (two captures, one trace name); the full backend stops stepping the profiler after a capture
  (the traces no longer fall one per shape); a draft worker's traces named as the target's; the replay log names
  the batch's size instead of the graph's, or ignores its switch.
- Metadata glue graph: a glued prep that re-installs the captured metadata without replaying the glue graph (stale
  seq_lens, the runner's view path); the skip-replay-view path does the same; a padded replay routed to the glue;
  a padded replay's eager prep left out of the glue's accounting.
- NPU runner (`suites/test_decode_npu.py`): the v2 architectures' KV lengths updated under the v1 name; padded
  requests left out of the update; draft tokens not added for TARGET_VERIFY; the capture profile with no trace
  handler; DeepSeek V4 graphs updated after all; the device-lengths fallback (a batch without the host mirror)
  without the draft tokens, or with them for DECODE;
  DFLASH's backend list (`seq_lens_cpu_list`) with its draft block added again, or ignored; under the overlap plan
  stream, a pre-planned batch's mRoPE positions not copied again.
- DSPARK target verify metadata glue (`SGLANG_OPT_DSV41_TARGET_VERIFY_METADATA_GLUE`): the draft's declaration read
  instead of the target verify's, a declined declaration ignored, the algorithm check inverted, a glued prep
  re-installing without replay.
  Pre-planned input skip (`SGLANG_OPT_DSV41_DSPARK_SKIP_PREFILLED_INPUTS`): a marked batch's fresh input_ids or
  positions left uncopied (the tensor identity check dropped), the plan-time record never cleared. A draft worker's
  glue: its static-verify or draft-worker check inverted, a glued prep re-installing without replay.
- DeepSeek-V4.1's candidate variants and early target verify metadata: the variant chosen without the verify's
  width, an early stage of a filtered-variant batch, a stage handing lengths and pool rows to each other's slots
  (SGLang's take then refuses every stage: the counts say so).
- Gathered DP buffers (`--moe-dense-tp-size 1`): the gathered length counting ranks, the token counts in
  requests, the capture's gather lengths left unpublished (`dp-gather`: outputs unchanged on one rank).
- PD-multiplexing (`--enable-pdmux`): the replay keyed to the first stream group's graph, the replay's metadata
  prepared on the prefill backend instead of the group's, every group captured on the first group's backend.
- Elastic EP's graph reset (`drop_elastic_cuda_graph_state`): the backend's cleanup skipped, the full backend's
  cleanup keeping its graphs, the shared graph pool kept.
"""
from __future__ import annotations

import pytest

from tests.mutant_runs import Mutant, assert_caught, run_suite_on_mutant, tiered

pytestmark = pytest.mark.subprocess  # every test here runs a suite in another process

SWITCHES = "suites/test_decode_switches.py"
NPU = "suites/test_decode_npu.py"
RUNNER = "srt/model_executor/runner/decode_cuda_graph_runner.py"
FULL = "srt/model_executor/runner_backend/full_cuda_graph_backend.py"
GLUE = "srt/model_executor/runner/metadata_glue_graph.py"
NPU_RUNNER = "srt/hardware_backend/npu/graph_runner/npu_graph_runner.py"
PROFILED = f"{SWITCHES}::test_profiled_capture_writes_one_trace_per_shape"
GLUED = f"{SWITCHES}::test_metadata_glue_replays_match_eager"
NPU_REPLAY = f"{NPU}::test_npu_replay_matches_eager_and_updates_graph"
DP_GATHER = f"{SWITCHES}::test_dp_gathered_buffers_replay_matches_eager"
DSPARK_GLUE = f"{SWITCHES}::test_dspark_verify_glue_replays_match_eager"
PREFILLED = f"{SWITCHES}::test_dspark_preplanned_verify_skips_prefilled_inputs"
DECLINED = f"{SWITCHES}::test_dspark_verify_glue_declined_by_backend"
EARLY = f"{SWITCHES}::test_dsv41_early_verify_metadata_at_its_bounds"
VARIANTS = "srt/layers/attention/graph_variants.py"
DRAFT_GLUE = f"{SWITCHES}::test_draft_glue_replays_match_eager"
NPU_MROPE = f"{NPU}::test_npu_mrope_planned_under_overlap_plan_stream"
ELASTIC = f"{SWITCHES}::test_elastic_drop_then_recapture_replays_match_eager"
PDMUX = f"{SWITCHES}::test_pdmux_stream_groups_replay_match_eager"
SETUP = "srt/model_executor/model_runner_components/cuda_graph_setup.py"

GLUE_REINSTALLS = [(GLUE, '                backend.forward_metadata = metadata\n            st["graph"].replay()\n',
                     "                backend.forward_metadata = metadata\n")]  # a glued prep without its replay
GLUE_NOT_SERVED = {"oracle": "graph-replay",
                   "texts": ["replayed no captured graph", "serve-time graphs the case implies"]}

# the gate's second pdmux example: replays on stream groups [0, 2, 2, 0, ...] of 3; the diagnosis names them
PDMUX_WRONG_GROUP = {"oracle": "eager-equality", "texts": ["not bit-equal to eager", "stream groups, in order: [0"]}

MUTANTS = {
    "pdmux_replay_keyed_to_first_group": Mutant(
        test=PDMUX,
        edits=[(RUNNER, "\n        stream_idx = get_current_stream_idx() if self.enable_pdmux else None\n"
                        "        self._replay_graph_key",
                "\n        stream_idx = 0 if self.enable_pdmux else None\n        self._replay_graph_key")],
        **PDMUX_WRONG_GROUP),
    "pdmux_replay_prepares_the_prefill_backend": Mutant(
        test=PDMUX,
        edits=[(RUNNER, "            return self.model_runner.decode_attn_backend_group[get_current_stream_idx()]\n",
                "            return self.attn_backend\n")],
        **PDMUX_WRONG_GROUP),
    "pdmux_capture_on_the_first_group_backend": Mutant(
        test=PDMUX,
        edits=[(RUNNER, "            attn_backend = self.model_runner.decode_attn_backend_group[stream_idx]\n",
                "            attn_backend = self.model_runner.decode_attn_backend_group[0]\n")],
        **PDMUX_WRONG_GROUP),
    "memory_history_left_on": Mutant(
        test=PROFILED,
        edits=[(RUNNER, "        torch.cuda.memory._record_memory_history(enabled=None)\n",
                "")],
        oracle="capture-profile",
        texts=["history was left on after capture"]),
    "trace_tag_drops_lora_variant": Mutant(
        test=PROFILED,
        edits=[(RUNNER, "            parts.append(variant_label)\n",
                "            pass\n")],
        oracle="capture-profile",
        texts=["capture traces (per_shape)", "missing", "_nolora_rank0"]),
    "draft_traces_lose_their_prefix": Mutant(
        test=f"{SWITCHES}::test_profiled_draft_worker_names_its_traces",
        edits=[(RUNNER, '            return f"Draft{name}"\n', "            return name\n")],
        oracle="capture-profile",
        texts=["capture traces (per_shape)", "missing", "DraftDecodeCudaGraphRunner_bs_"]),
    "profiler_not_stepped_after_capture": Mutant(
        test=PROFILED,
        edits=[(FULL, "        if profiler is not None:\n            profiler.step()\n\n"
                      "        self._graphs[shape_key] = graph", "\n        self._graphs[shape_key] = graph")],
        oracle="capture-profile",
        texts=["capture traces (per_shape)", "missing"]),
    "glue_reinstalls_without_replay": Mutant(
        test=GLUED,
        edits=GLUE_REINSTALLS,
        **GLUE_NOT_SERVED),
    "glue_routes_padded_batches": Mutant(
        test=GLUED,
        edits=[(RUNNER, "            and raw_bs == bs\n            and not self.enable_two_batch_overlap\n",
                "            and not self.enable_two_batch_overlap\n")],
        oracle="metadata-glue",
        texts=["eager prep(s)", "padded sizes not routed"]),
    "glue_padded_prep_not_counted": Mutant(
        test=GLUED,
        edits=[(RUNNER, "                self._metadata_glue.note_not_routed()\n", "                pass\n")],
        oracle="metadata-glue",
        texts=["eager prep(s)", "padded sizes not routed"]),
    "skipped_view_reinstalls_without_replay": Mutant(
        test=GLUED,
        edits=[(RUNNER, "            self._metadata_glue.replay(glue_key)\n",
                "            self._metadata_glue.reinstall(glue_key)\n")],
        **GLUE_NOT_SERVED),
    "replay_log_names_raw_size": Mutant(
        test=PROFILED,
        edits=[(RUNNER, "                    self._replay_graph_key.size,\n",
                "                    forward_batch.batch_size,\n")],
        oracle="replay-log",
        texts=["SGLANG_LOG_DECODE_GRAPH_KEY", "first difference"]),
    "replay_log_switch_ignored": Mutant(
        test=PROFILED,
        edits=[(RUNNER, "            if envs.SGLANG_LOG_DECODE_GRAPH_KEY.get():\n",
                "            if False:\n")],
        oracle="replay-log",
        texts=["0 replay line(s)"]),
    "npu_v2_update_under_v1_name": Mutant(
        test=f"{NPU}::test_npu_padded_batch_updates_graph[decode-v2-name]",
        edits=[(NPU_RUNNER, '        if self._uses_v2_seq_len_update():\n'
                            '            return self.attr_name["TARGET_VERIFY"]\n',
                '        if False:\n            return self.attr_name["TARGET_VERIFY"]\n')],
        oracle="npu-graph-update",
        texts=["expected graph updates [[{'actual_seq_kvlen'"]),
    "npu_update_drops_padding": Mutant(
        test=f"{NPU}::test_npu_padded_batch_updates_graph[decode]",
        edits=[(NPU_RUNNER, "                    seq_lens = forward_batch.seq_lens_cpu[: self.raw_bs].tolist() + [\n"
                            "                        0\n                    ] * (self.bs - self.raw_bs)\n",
                "                    seq_lens = forward_batch.seq_lens_cpu[: self.raw_bs].tolist()\n")],
        oracle="npu-graph-update",
        texts=["batch of seq_lens", "expected graph updates"]),
    "npu_verify_update_without_draft_tokens": Mutant(
        test=f"{NPU}::test_npu_padded_batch_updates_graph[eagle-verify]",
        edits=[(NPU_RUNNER, "                            forward_batch.seq_lens_cpu[: self.raw_bs]\n"
                            "                            + self.captured_req_width\n",
                "                            forward_batch.seq_lens_cpu[: self.raw_bs]\n")],
        oracle="npu-graph-update",
        texts=["TARGET_VERIFY batch", "expected graph updates"]),
    "npu_profile_without_trace_handler": Mutant(
        test=NPU_REPLAY,
        edits=[(NPU_RUNNER, "            on_trace_ready=torch_npu.profiler.tensorboard_trace_handler(\n"
                            "                output_dir, async_mode=True\n            ),\n", "")],
        oracle="capture-profile",
        texts=["the NPU runner's capture profile: expected one trace"]),
    "npu_v4_graph_updated": Mutant(
        test=f"{NPU}::test_npu_padded_batch_updates_graph[decode-deepseek-v4]",
        edits=[(NPU_RUNNER, "            or is_deepseek_v4(self.model_runner.model_config.hf_config)\n", "")],
        oracle="npu-graph-update",
        texts=["expected graph updates []"]),
    "npu_device_lens_without_draft_tokens": Mutant(
        test=f"{NPU}::test_npu_padded_batch_updates_graph[eagle-verify-device-lens]",
        edits=[(NPU_RUNNER, "forward_batch.seq_lens.cpu() + self.captured_req_width", "forward_batch.seq_lens.cpu()")],
        oracle="npu-graph-update",
        texts=["TARGET_VERIFY batch", "host mirror: False"]),
    "npu_device_lens_decode_adds_draft_width": Mutant(
        test=f"{NPU}::test_npu_padded_batch_updates_graph[decode-device-lens]",
        edits=[(NPU_RUNNER, "                    seq_lens = forward_batch.seq_lens.cpu().tolist() + [0] * (\n",
                "                    seq_lens = (forward_batch.seq_lens.cpu() + self.captured_req_width).tolist()"
                " + [0] * (\n")],
        oracle="npu-graph-update",
        texts=["DECODE batch", "host mirror: False"]),
    "npu_dflash_list_ignored": Mutant(
        test=f"{NPU}::test_npu_padded_batch_updates_graph[dflash-verify-device-lens]",
        edits=[(NPU_RUNNER, '                    _meta_list = getattr(_meta, "seq_lens_cpu_list", None)\n',
"                    _meta_list = None\n")],
        oracle="npu-graph-update",
        texts=["expected graph updates [[{'actual_seq_lengths_kv': [11, 3]}]]", "[11, 0]"]),
    "npu_dflash_list_double_adds_drafts": Mutant(
        test=NPU_REPLAY,
        edits=[(NPU_RUNNER, "                    seq_lens = list(_meta_list)\n",
                "                    seq_lens = [s + self.captured_req_width for s in _meta_list]\n")],
        oracle="npu-graph-update",
        texts=["TARGET_VERIFY batch", "expected graph updates"]),
    "dp_buffer_len_counts_ranks": Mutant(
        test=DP_GATHER,
        edits=[(RUNNER, "            global_dp_buffer_len = sum(global_num_tokens_cpu)\n",
                "            global_dp_buffer_len = len(global_num_tokens_cpu)\n")],
        oracle="eager-equality",
        texts=["not bit-equal to eager"]),
    "dp_tokens_in_requests": Mutant(
        test=DP_GATHER,
        edits=[(RUNNER, "        if self.require_attn_tp_gather:\n            return [num_tokens]\n",
                "        if self.require_attn_tp_gather:\n"
                "            return [num_tokens // self.captured_req_width]\n")],
        oracle="eager-equality",
        texts=["not bit-equal to eager"]),
    "dp_lengths_not_published": Mutant(  # the seed-7 survivor: one rank's outputs do not change
        test=DP_GATHER,
        edits=[(RUNNER, "        if self.require_attn_tp_gather:\n            return [num_tokens]\n",
                "        if self.require_attn_tp_gather:\n            return None\n")],
        oracle="dp-gather",
        texts=["global_num_tokens None and global_dp_buffer_len None", "gather [1] into 1 rows"]),
    "dspark_glue_asks_draft_declaration": Mutant(
        test=DSPARK_GLUE,
        edits=[(RUNNER, "        why = self.attn_backend.glue_target_verify_metadata()\n",
                "        why = self.attn_backend.glue_draft_metadata()\n")],
        **GLUE_NOT_SERVED),
    "dspark_glue_algorithm_check_inverted": Mutant(
        test=DSPARK_GLUE,
        edits=[(RUNNER, "            or not self.model_runner.spec_algorithm.is_dspark()\n        ):\n"
                        "            return False\n        why = self.attn_backend.glue_target_verify_metadata()",
                "            or self.model_runner.spec_algorithm.is_dspark()\n        ):\n"
                "            return False\n        why = self.attn_backend.glue_target_verify_metadata()")],
        **GLUE_NOT_SERVED),
    "dspark_glue_reinstalls_without_replay": Mutant(
        test=DSPARK_GLUE,
        edits=GLUE_REINSTALLS,
        oracle="graph-replay",
        texts=["replayed no captured graph", "TARGET_VERIFY"]),
    "dspark_glue_declaration_ignored": Mutant(
        test=DECLINED,
        edits=[(RUNNER, '            logger.info("Target verify metadata glue graph off: %s.", why)\n'
                        "            return False\n",
                '            logger.info("Target verify metadata glue graph off: %s.", why)\n')],
        oracle="graph-replay",
        texts=["new graph(s) at serve time", "TARGET_VERIFY"]),  # the glue's capture attempt
    "draft_glue_ragged_check_inverted": Mutant(
        test=DRAFT_GLUE,
        edits=[(RUNNER, '        if envs.SGLANG_RAGGED_VERIFY_MODE.get() != "static":\n'
                        '            why = "ragged verify"',
                '        if envs.SGLANG_RAGGED_VERIFY_MODE.get() == "static":\n            why = "ragged verify"')],
        **GLUE_NOT_SERVED),
    "draft_glue_worker_check_inverted": Mutant(
        test=DRAFT_GLUE,
        edits=[(RUNNER, "        if not self.model_runner.is_draft_worker:\n            return False\n"
                        "        if envs.SGLANG_RAGGED_VERIFY_MODE",
                "        if self.model_runner.is_draft_worker:\n            return False\n"
                "        if envs.SGLANG_RAGGED_VERIFY_MODE")],
        **GLUE_NOT_SERVED),
    "draft_glue_reinstalls_without_replay": Mutant(
        test=DRAFT_GLUE,
        edits=GLUE_REINSTALLS,
        oracle="graph-replay",
        texts=["replayed no captured graph", "TARGET_VERIFY"]),
    "npu_overlap_plan_mrope_not_recopied": Mutant(
        test=NPU_MROPE,
        edits=[(NPU_RUNNER, "                    self.buffers.mrope_positions[:, : self.raw_num_token].copy_(\n"
                            "                        forward_batch.mrope_positions\n                    )\n"
                            "            else:\n",
                "                    pass\n            else:\n")],
        oracle="eager-equality",
        texts=["not bit-equal to eager", "`mrope_positions[0]` holds"]),
    "prefilled_input_ids_skip_ignores_identity": Mutant(
        test=PREFILLED,
        edits=[(RUNNER, "        if prefilled is None or forward_batch.input_ids is not prefilled[0]:\n",
                "        if prefilled is None:\n")],
        oracle="eager-equality",
        texts=["not bit-equal to eager", "input_ids"]),
    "prefilled_positions_skip_ignores_identity": Mutant(
        test=PREFILLED,
        edits=[(RUNNER, "        if prefilled is None or forward_batch.positions is not prefilled[1]:\n",
                "        if prefilled is None:\n")],
        oracle="eager-equality",
        texts=["not bit-equal to eager", "positions"]),
    "prefilled_record_never_cleared": Mutant(
        test=PREFILLED,
        edits=[(RUNNER, "        self._prefilled_inputs = None\n        # The plan-time load",
                "        # The plan-time load")],
        oracle="prefilled-inputs",
        texts=["pre-planned input re-copy skip(s), the replays imply 2"]),
    # DeepSeek-V4.1's candidate variants and early target verify metadata (`dsv41.py`)
    "candidate_variant_without_verify_width": Mutant(
        test=EARLY,
        edits=[(VARIANTS, "            max_seq_len += self.verify_extra_tokens\n", "")],
        oracle="metadata-glue",
        texts=["replayed the 'candidate_unfiltered' graph, the batch implies 'candidate_filtered'", "longest 14"]),
    "early_stage_of_a_filtered_variant": Mutant(
        test=EARLY,
        edits=[(RUNNER, "            or variant not in DSV41_EARLY_VERIFY_VARIANTS\n", "")],
        oracle="metadata-glue",
        texts=["stage_verify_metadata_early answered True, the batch implies False", "longest 15"]),
    "early_stage_swaps_lengths_and_rows": Mutant(
        test=EARLY,
        edits=[(RUNNER, "                req_pool_indices=req_pool_indices,\n                seq_lens=seq_lens,\n",
                "                req_pool_indices=seq_lens,\n                seq_lens=req_pool_indices,\n")],
        oracle="metadata-glue",  # SGLang's take compares the staged views and refuses: the early path is lost
        texts=["staged, taken and rejected (1, 0, 1), the replay implies (1, 1, 0)"]),
    "elastic_drop_skips_backend_cleanup": Mutant(
        test=ELASTIC,
        edits=[(SETUP, "        decode_runner.backend.cleanup()\n", "        pass\n")],
        oracle="graph-replay",
        texts=["dropping the runner's graphs left", "alive and captured", "drop_elastic_cuda_graph_state"]),
    "full_backend_cleanup_keeps_graphs": Mutant(  # neither reset nor forgotten: held through the recapture
        test=ELASTIC,
        edits=[(FULL, "        for graph in self._graphs.values():\n            graph.reset()\n"
                      "        self._graphs.clear()\n", "")],
        oracle="graph-replay",
        texts=["dropping the runner's graphs left", "alive and captured"]),
    "elastic_drop_keeps_graph_pool": Mutant(
        test=ELASTIC,
        edits=[(SETUP, "        current_platform.synchronize()\n    set_global_graph_memory_pool(None)\n",
                "        current_platform.synchronize()\n")],
        oracle="process-state",
        texts=["graph_memory_pool", "drop_elastic_cuda_graph_state"]),
}


@pytest.mark.parametrize("name", tiered(MUTANTS))
def test_switch_mutant_fails_with_its_diagnosis(name, tmp_path):
    test = MUTANTS[name].test
    virtual = ("--device", "cpu") if test.startswith(NPU) else ()  # the NPU runner: virtual device only
    record = assert_caught(name, MUTANTS[name], tmp_path, extra=virtual)
    if test.startswith(NPU):  # the run's personality is cuda; the failure names the one its suite fixed
        assert "--personality npu" in record["replay"] and record["personality"] == "npu", record


@pytest.mark.parametrize("suite", [SWITCHES, NPU])
def test_clean_sglang_passes(suite, tmp_path):
    virtual = ("--device", "cpu") if suite == NPU else ()
    code, output = run_suite_on_mutant(suite, "clean", [], tmp_path, extra=virtual)
    assert code == 0, f"clean SGLang failed {suite}:\n{output[-3000:]}"
