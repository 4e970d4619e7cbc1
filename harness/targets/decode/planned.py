"""Batches planned ahead, as SGLang's speculative and dLLM workers hand them over: the worker calls the runner's
`load_batch` before the forward and marks the batch with `ForwardBatch.mark_forward_metadata_ready`, so `execute`
takes the runner's pre-planned branch (`needs_forward_metadata_init()` false: inputs staged, metadata reused, only
input_ids and positions copied again by `_copy_replay_inputs`).

How each batch reaches the runner (drawn per batch, `KINDS`):
- `execute`: unmarked; execute plans it.
- `planned`: load_batch, mark, execute (the EAGLE verify path).
- `replanned`: the batch was planned and marked (re-plan allowed) at another size, then grew or shrank before the
  forward (as DP padding does); SGLang must see the stale mark and plan it again.
- `stale_mark`: marked without a plan (re-plan allowed, same shapes as the batch planned last): SGLang keeps the
  last plan, so the replay sees that batch's per-request inputs and metadata with this batch's input_ids and
  positions (and its LoRA scales, which the worker prepares per batch; its embeddings or dLLM preparation state, as a
  dLLM worker's next denoising step of the same block hands over). The expectation says so, derived from the
  two drawn batches.
- `early` (not drawn from `KINDS`; suites name it): a DSPARK target verify under DeepSeek-V4.1's early metadata
  (`dsv41.py`): the draft worker's `stage_verify_metadata_early` with the batch's tensors, then `execute` of the
  same forward batch, unmarked; `target.early_staged` keeps each stage's answer, None for other kinds.
- `planned_ahead` (not drawn from `KINDS`; suites name it): the batch planned and marked, then the next step of
  the same requests (`step_ahead`: seq_lens, ids and positions one further) planned before the batch executes, as
  a worker that plans k + 1 before executing k does: the runner's staged plan is k + 1's, so the replay is that
  plan with the batch's re-copied inputs, as for a stale mark.
"""
from __future__ import annotations

import dataclasses

KINDS = ("execute", "planned", "replanned", "stale_mark")
# what a marked batch's replay takes from that batch, not the plan: the per-step inputs the pre-planned branch copies
# again (input_ids, positions; a dLLM's or draft worker's embeddings or preparation state) and the LoRA scales
RESTAGED = ("input_ids", "positions", "lora_ids", "input_embeds", "preparation_state")


class PlannedReplays:
    """`replay(batch, kind)` -> (output, the batch whose closed form the output must equal)."""

    def __init__(self, target) -> None:
        self.target = target
        self.last_plan: object | None = None  # the batch the runner's staged plan belongs to
        self.taken: list[str] = []  # the kind each replay really took
        target.kinds_taken = self.taken  # read by checks around each replay (`capture_and_check`'s `checked`)
        target.early_staged = []  # per replay: the runner's answer to an early stage, None without one

    def plan(self, batch, *, replan_equivalent: bool = False):
        fb = self.target.forward_batch(batch)
        with self.target.replay_context():
            self.target.runner.load_batch(fb)
        fb.mark_forward_metadata_ready(replan_equivalent=replan_equivalent)
        self.last_plan = batch
        return fb

    def execute(self, fb):
        with self.target.replay_context():
            return self.target.runner.execute(fb)

    def replay(self, batch, kind: str):
        kind = self._feasible(batch, kind)
        self.taken.append(kind)
        self.target.early_staged.append(None)
        if kind == "early":
            from harness.targets.decode.dsv41 import stage_early

            fb = self.target.forward_batch(batch)
            self.target.early_staged[-1] = stage_early(self.target, fb, max(batch.seq_lens))
            self.last_plan = batch
            return self.execute(fb), batch
        if kind == "execute":
            self.last_plan = batch
            return self.target.replay(batch), batch
        if kind == "planned":
            return self.execute(self.plan(batch)), batch
        if kind == "replanned":
            other = resized(batch)
            marked = self.plan(other, replan_equivalent=True)
            fb = self.target.forward_batch(batch)
            for field in ("forward_metadata_ready", "forward_metadata_planned_bs",
                          "forward_metadata_planned_num_tokens", "forward_metadata_replan_equivalent"):
                setattr(fb, field, getattr(marked, field))
            self.last_plan = batch
            return self.execute(fb), batch
        if kind == "planned_ahead":
            fb = self.plan(batch)
            self.plan(step_ahead(batch))
            return self.execute(fb), self._restaged_onto(self.last_plan, batch)
        fb = self.target.forward_batch(batch)  # stale_mark
        fb.mark_forward_metadata_ready(replan_equivalent=True)
        return self.execute(fb), self._restaged_onto(self.last_plan, batch)

    def _restaged_onto(self, planned, batch):
        """The batch a replay of marked `batch` over the staged plan of `planned` computes."""
        carried = {field.name for field in dataclasses.fields(batch)}  # what hasattr meant before the ClassVars
        restaged = {name: getattr(batch, name) for name in self.restaged() if name in carried}
        return dataclasses.replace(planned, **restaged)

    def restaged(self) -> tuple[str, ...]:
        """`RESTAGED`, and the mRoPE positions where the NPU runner's pre-planned (non-DFLASH) branch copies them
        again: under the overlap plan stream (`SGLANG_ENABLE_OVERLAP_PLAN_STREAM`); the decode runner's
        `_copy_replay_inputs` never does."""
        switches = self.target.case.switches
        again = self.target.personality == "npu" and switches.overlap_plan_stream
        return RESTAGED + (("mrope_positions",) if again else ())

    def _feasible(self, batch, kind: str) -> str:
        """A stale mark needs a last plan of the same shapes and mode (else SGLang's copies would not fit); a resize
        needs a batch to resize. The NPU runner's pre-planned DFLASH branch crashes on 0.5.23 (pinned by the suite's
        `test_findings_npu_dflash_preplanned_verify_crashes`), so there every batch reaches it unmarked."""
        spec = self.target.case.spec
        if self.target.personality == "npu" and spec is not None and spec.algorithm == "DFLASH":
            return "execute"
        if kind == "early" and (not self.target.case.switches.early_verify or batch.forward_mode != "TARGET_VERIFY"):
            return "execute"
        if kind == "stale_mark":
            last = self.last_plan
            if last is None or last.forward_mode != batch.forward_mode or \
                    len(last.input_ids) != len(batch.input_ids) or last.batch_size != batch.batch_size:
                return "planned"
        if kind == "replanned" and batch.batch_size < 2:
            return "planned"
        return kind


def resized(batch):
    """The batch less its last request: what was planned before it grew by one."""
    width = len(batch.input_ids) // batch.batch_size
    keep, tokens = batch.batch_size - 1, (batch.batch_size - 1) * width

    def cut(values, n):
        return None if values is None else list(values[:n])

    return dataclasses.replace(
        batch, input_ids=cut(batch.input_ids, tokens), positions=cut(batch.positions, tokens),
        seq_lens=cut(batch.seq_lens, keep), lora_ids=cut(batch.lora_ids, keep),
        req_pool_indices=cut(batch.req_pool_indices, keep), out_cache_loc=cut(batch.out_cache_loc, tokens),
        draft_visibility=cut(batch.draft_visibility, keep),
        mrope_positions=None if batch.mrope_positions is None else [row[:tokens] for row in batch.mrope_positions])


def step_ahead(batch):
    """The next decode step of the same requests: one more token each (seq_lens one further, and the ids and
    positions as `DecodeBatch.shifted` moves them)."""
    return dataclasses.replace(batch.shifted(), seq_lens=[s + 1 for s in batch.seq_lens])
