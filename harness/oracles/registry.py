"""Every oracle the harness has, in one table: its name (what failure records and the report call it), the
contract it checks, the module that checks it and the self-tests that show it firing on a mutant of SGLang and
quiet on clean SGLang. `OracleFailure` refuses a name that is not here; `tests/test_oracle_registry.py` checks that
every name the code raises is here and that docs/oracles.md's table is `markdown_table()`.

Regenerate that table after an edit: `python -m harness oracles --write-docs`.
"""
from __future__ import annotations

import dataclasses

from harness.checkout import REPO_ROOT

DOCS = REPO_ROOT / "docs" / "oracles.md"
BEGIN, END = "<!-- oracle-table:begin -->", "<!-- oracle-table:end -->"


@dataclasses.dataclass(frozen=True)
class Oracle:
    name: str
    contract: str  # one sentence: what SGLang must do
    module: str  # the file that raises it (others may too; the test lists them)
    self_tests: tuple[str, ...]  # tests/ files with a mutant it must catch and a clean run it must pass


ORACLES: dict[str, Oracle] = {oracle.name: oracle for oracle in (
    Oracle("execution-context", "every decoder-layer forward SGLang makes while building a server (warm-up, "
           "capture) runs with autograd off",
           "harness/oracles/execution_context.py", ("test_execution_context_mutants.py",)),
    Oracle("eager-equality", "a compiled or replayed output equals eager, and eager the model's closed form; "
           "padded rows hold what SGLang's registry promises",
           "harness/oracles/eager.py",
           ("test_decode_mutants.py", "test_prefill_mutants.py", "test_prefill_padding.py",
            "test_real_model_mutants.py", "test_decode_ragged_mutants.py", "test_decode_dllm_mutants.py",
            "test_vit_mutants.py",
            "test_eagle_draft_mutants.py")),
    Oracle("world-agreement", "the ranks of a world act as one server: each rank's placement, capture list, DP "
           "gather, vote, graph-or-eager decision and bucket are the world's arithmetic and the same on every rank",
           "harness/oracles/world_agreement.py", ("test_world_mutants.py",)),
    Oracle("world-rank", "no rank of a world crashes, hangs or raises: each is recorded with its rank and the world",
           "harness/oracles/world_agreement.py", ("test_world_mutants.py", "test_worlds.py")),
    Oracle("batch-invariance", "each request of a scheduler-built batch gets the next-token logits its own token "
           "history gives it prefilled alone, whatever joined or left the batch; under deterministic inference "
           "its KV splits follow its own length", "harness/oracles/batch_invariance.py",
           ("test_scheduled_batches.py", "test_real_model_mutants.py", "test_eagle_draft_mutants.py")),
    Oracle("no-recompile", "after capture or warm-up Dynamo compiles nothing more (the failing guard reported)",
           "harness/oracles/recompile.py", ("test_prefill_mutants.py", "test_oracles.py")),
    Oracle("dynamo-contract", "what Dynamo records of SGLang's compile glue (dynamic axes and their marks, "
           "recompile limits, Inductor pieces and passes) is what the case implies",
           "harness/oracles/dynamo_evidence.py", ("test_dynamo_evidence.py", "test_inductor_pieces.py")),
    Oracle("hook-contract", "a hook the platform overrides is the one that ran, as often and with the arguments "
           "and sizes derived from the case", "harness/oracles/patch_contract.py",
           ("test_decode_mutants.py", "test_compile_kwargs_mutants.py", "test_oracles.py")),
    Oracle("kwargs-validity", "`build_torch_compile_kwargs` never passes `mode` with `options`; NPU gets its "
           "backend with `dynamic=False`; built-in platforms keep `mode`", "harness/oracles/compile_contract.py",
           ("test_compile_kwargs_mutants.py",)),
    Oracle("custom-op-contract", "every custom op SGLang's modules register at import exists and has a fake "
           "implementation, and where its own implementation runs here it passes `torch.library.opcheck` (schema, "
           "fake, autograd, AOT dispatch)",
           "harness/oracles/custom_op_contract.py", ("test_custom_op_mutants.py",)),
    Oracle("compiles", "the kwargs SGLang built are accepted by a real `torch.compile` of a real module",
           "harness/oracles/compiles.py", ("test_oracles.py", "test_expected_errors.py")),
    Oracle("capture-stream", "no \"capture stream is not set\" in any form, nor other out-of-capture signatures",
           "harness/oracles/capture_stream.py", ("test_prefill_mutants.py", "test_prefill_oracles.py")),
    Oracle("admission", "a batch the graphs cannot serve takes the eager path, a configuration SGLang must refuse "
           "fails at construction, and every refusal is one a rule (`harness/targets/prefill/admission.py`) "
           "predicted from the case", "harness/targets/prefill/session.py",
           ("test_prefill_mutants.py", "test_decode_ragged_mutants.py", "test_expected_errors.py",
            "test_real_model_mutants.py")),
    Oracle("ragged-layout", "SGLang's compact ragged verify layouts (tier, prefix sums, capture rows, the geometry an "
           "attention backend reads, the padded layout each replay's tier graph reads) are the drawn requests' "
           "arithmetic, and a malformed one is refused",
           "harness/oracles/ragged_layout.py", ("test_decode_ragged_mutants.py",)),
    Oracle("draft-rails", "each EAGLE draft step's attention reads its request's prefix then its branch's draft "
           "slots through that step (`seq_len + step + 1` slots, branch-major), in the graph and eagerly; a padded "
           "branch reads only the padding slot; under a draft window, the prefix's sink and recent window (EAGLE) "
           "or a window rail of the last W slots beside the full one (EAGLE3)",
           "harness/oracles/draft_rails.py", ("test_eagle_draft_mutants.py",)),
    Oracle("draft-token-map", "every token of an EAGLE3 draft tree is a target token id its head's map "
           "(`hot_token_id`, from the checkpoint's d2t) holds, in the graph and eagerly",
           "harness/oracles/draft_token_map.py", ("test_eagle_draft_mutants.py",)),
    Oracle("transformers-reference", "SGLang's model class, loaded by its own loader from a checkpoint transformers "
           "saved, gives each request the next-token logits transformers' implementation gives its tokens, after a "
           "prefill (chunked or not) and after each decode step", "harness/oracles/transformers_reference.py",
           ("test_real_model_mutants.py",)),
    Oracle("lora-reference", "a request served with a LoRA adapter gets the logits of the model with that adapter "
           "merged into its weights (W + alpha/r * B @ A, loaded by SGLang's loader into its plain class), one with "
           "no adapter the base model's, whatever shares its batch or graph", "harness/oracles/lora_reference.py",
           ("test_real_lora_mutants.py",)),
    Oracle("lora-lifecycle", "over a LoRA server's lifetime SGLang loads exactly the adapters the pool's rank, "
           "targets and pinned slots admit, lists what is served, frees and zeroes an unloaded adapter's slot, "
           "admits a batch exactly when its unpinned adapters fit the slots pins leave, and never moves a pinned "
           "adapter", "harness/targets/decode/lora_lifetime.py", ("test_lora_lifetime_mutants.py",)),
    Oracle("capture-failure", "a failing piecewise compile pass surfaces as SGLang's message: cause, backend, "
           "the way out", "harness/oracles/capture_failure.py", ("test_prefill_mutants.py", "test_oracles.py")),
    Oracle("graph-break", "where SGLang compiles with `fullgraph=True` Dynamo traces the body whole; a break is "
           "reported with Dynamo's reason and the user-code site; a real model's compiled forward breaks only where "
           "SGLang declares it", "harness/oracles/graph_break.py",
           ("test_graph_break.py", "test_repro.py", "test_real_compile_mutants.py")),
    Oracle("graph-replay", "the capture made the graphs the case implies and each forward replays exactly those",
           "harness/oracles/graph_replay.py",
           ("test_decode_mutants.py", "test_prefill_mutants.py", "test_decode_glue_mutants.py",
            "test_vit_mutants.py")),
    Oracle("graph-key", "a replay replays exactly the graph keyed by the batch's padded size and the variant its "
           "requests imply (LoRA: \"nolora\" when none names an adapter; an EAGLE draft under rejection sampling: "
           "\"greedy\" when every request is greedy)", "harness/oracles/graph_key.py",
           ("test_real_lora_mutants.py", "test_eagle_draft_mutants.py")),
    Oracle("capture-legality", "nothing CUDA refuses during stream capture runs inside a capture on the virtual "
           "device", "harness/oracles/capture_legality.py", ("test_capture_legality.py", "test_legality_mutants.py")),
    Oracle("stream-order", "no access on one stream to a storage last touched on another without a "
           "happens-before edge; read-done events cover the reads the backend declares",
           "harness/oracles/stream_order.py",
           ("test_capture_legality.py", "test_legality_mutants.py", "test_overlap_barrier.py")),
    Oracle("batch-consistency", "every batch a runner hands an attention backend agrees with itself: per-request "
           "rows, seq_lens_sum, the host mirror, token and extend counts; a padded batch comes back raw",
           "harness/oracles/batch_consistency.py", ("test_batch_consistency.py", "test_eagle_draft_mutants.py")),
    Oracle("capture-context", "a layer is told it is capturing exactly while the device captures, where the path "
           "promises it, and never while the harness serves; a fused op is in torch.compile mode whenever a "
           "non-eager compile traces it, and never while the harness serves", "harness/oracles/capture_context.py",
           ("test_capture_context.py",)),
    Oracle("logits-buffer", "a prefill replay asks for a shared logits buffer as long as the logits its tail "
           "computes (one row a request; with logprobs, each request's extend from its logprob start)",
           "harness/oracles/logits_buffer.py", ("test_real_model_mutants.py",)),
    Oracle("process-state", "SGLang's process-wide capture state is back at rest after every step",
           "harness/oracles/process_state.py", ("test_prefill_mutants.py",)),
    Oracle("state-at-rest", "a runner's capture (and its compile pass) leaves every module's dispatch state, the TP "
           "group's custom all-reduce and torch's grad, inference and dtype state as it found them",
           "harness/oracles/state_at_rest.py", ("test_state_at_rest_mutants.py", "test_capture_context.py")),
    Oracle("npu-graph-update", "each NPU replay first rebinds its graph's KV lengths, under the architecture's name, "
           "with the batch's lengths and 0 per padded request (the EAGLE draft runners': a part per draft step), "
           "from the NPU the graph was captured on", "harness/oracles/npu_graph_update.py",
           ("test_decode_glue_mutants.py", "test_eagle_draft_mutants.py")),
    Oracle("npu-standin-contract", "the npu personality's stand-in has the real torch_npu's signatures and every "
           "name SGLang's NPU capture path uses", "harness/personalities/npu_contract.py", ("test_npu_contract.py",)),
    Oracle("capture-profile", "`--enable-profile-cuda-graph` writes one trace per captured size and LoRA variant "
           "(or none) and leaves allocator history off", "harness/oracles/capture_profile.py",
           ("test_decode_glue_mutants.py",)),
    Oracle("metadata-glue", "the metadata glue graph warms, captures and replays as often as the batches imply, "
           "never for a padded replay", "harness/oracles/metadata_glue.py", ("test_decode_glue_mutants.py",)),
    Oracle("prefilled-inputs", "a pre-planned DSPARK verify replay skips its inputs' copy once per load",
           "harness/oracles/prefilled_inputs.py", ("test_decode_glue_mutants.py",)),
    Oracle("dp-gather", "a decode runner that gathers DP buffers publishes, for each graph it captures, the gathered "
           "lengths its rows imply (one rank of n rows: [n], n buffer rows)", "harness/oracles/dp_gather.py",
           ("test_decode_glue_mutants.py",)),
    Oracle("replay-log", "`SGLANG_LOG_DECODE_GRAPH_KEY` logs one line per replay with the size, mode and request "
           "count the batch implies", "harness/oracles/replay_log.py", ("test_decode_glue_mutants.py",)),
    Oracle("rebinding-by-value-import", "no module on the capture/compile path imports by value a name SGLang "
           "rebinds at run time elsewhere", "harness/oracles/rebinding.py",
           ("test_decode_mutants.py", "test_rebinding_scan.py")),
)}


def require(name: str) -> str:
    """`name` if it is a registered oracle; else a ValueError saying where oracles are registered."""
    if name not in ORACLES:
        raise ValueError(f"unknown oracle {name!r}: register it in harness/oracles/registry.py "
                         f"(known: {', '.join(sorted(ORACLES))})")
    return name


def markdown_table() -> str:
    """The docs' table: one row per oracle, in the registry's order."""
    rows = ["| oracle | contract | checked in | self-tests |", "| --- | --- | --- | --- |"]
    for oracle in ORACLES.values():
        tests = ", ".join(f"`tests/{test}`" for test in oracle.self_tests)
        rows.append(f"| [`{oracle.name}`](#{oracle.name}) | {oracle.contract} | `{oracle.module}` | {tests} |")
    return "\n".join(rows)


def docs_table(text: str) -> str:
    """The table between docs/oracles.md's markers (ValueError when they are missing)."""
    if BEGIN not in text or END not in text:
        raise ValueError(f"{DOCS} lacks the markers {BEGIN} ... {END}")
    return text.split(BEGIN, 1)[1].split(END, 1)[0].strip()


def write_docs() -> None:
    text = DOCS.read_text()
    docs_table(text)
    head, rest = text.split(BEGIN, 1)
    DOCS.write_text(f"{head}{BEGIN}\n{markdown_table()}\n{END}{rest.split(END, 1)[1]}")

