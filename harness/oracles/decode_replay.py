"""Replay against eager, batch after batch, so stale values cannot hide.

Each drawn batch is replayed through the runner and compared with eager on its real rows; then the same batch with
every input id and position shifted by one is replayed at once (same graph, new inputs): a replay that returned the
previous replay's values, or read an input buffer that was not refilled, differs from eager there. Eager itself is
held to the model's closed form (`decode_model.expected_output`, logits and hidden states), so a wrong reference
cannot make both sides agree. Padded rows of the static inputs are held to SGLang's padding policy.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable

from harness.counter import counter
from harness.models.decode_model import LORA_SCALES, expected_output
from harness.oracles import OracleFailure, observed
from harness.oracles.eager import assert_matches_eager
from harness.oracles.graph_replay import check_graph_forward, replay_delta
from harness.oracles.patch_contract import expected_sizes
from harness.oracles.replay_target import ReplayTarget


def check_compiled_forwards_match_eager(target: ReplayTarget, batch_of_size: Callable, *, exact: bool) -> None:
    """Each compiled forward `patch_model` yielded, called outside capture on `batch_of_size(n, lora=...)`, equals
    eager. In record mode the graph holds the eager ops of a compiled forward (Dynamo does not run under the
    recording mode), so compiled numerics are checked here, outside capture, as well."""
    for entry in target.patch_model_seen:
        if not entry.enable_compile:
            continue
        n = entry.num_tokens
        batch = batch_of_size(n, lora=target.lora_manager is not None, width=target.case.tokens_per_request,
                              mrope=target.case.switches.mrope)
        compiled = target.eager(batch, forward=entry.forward).next_token_logits
        expected = target.eager(batch).next_token_logits
        try:
            assert_matches_eager(compiled, expected, exact=exact)
        except OracleFailure as failure:
            raise OracleFailure(failure.oracle, f"the compiled forward `{entry.name}` yielded for {n} token(s), "
                                f"called outside capture: {failure.diagnosis}", **failure.details) from None


def by_hand(target, batch):
    """(logits, hidden states) of the model's closed form for `batch`, from the drawn values alone."""
    scales = [LORA_SCALES[i] for i in batch.lora_ids] if target.lora_manager and batch.lora_ids else None
    return expected_output(batch.input_ids, batch.positions, batch.seq_lens, req_pool_indices=batch.pool_rows,
                           out_cache_loc=batch.cache_slots, visible_drafts=batch.visible_drafts(),
                           decode=batch.forward_mode == "DECODE", lora_scales=scales,
                           verify_lens=batch.verify_lens, input_embeds=batch.input_embeds,
                           preparation_state=batch.preparation_state,
                           mrope_positions=batch.mrope_positions)


TOKEN_INPUTS = ("input_ids", "positions", "out_cache_loc")
REQUEST_INPUTS = ("req_pool_indices", "seq_lens")


def _wanted(batch) -> dict:
    return {"input_ids": batch.input_ids, "positions": batch.positions, "out_cache_loc": batch.cache_slots,
            "req_pool_indices": batch.pool_rows, "seq_lens": batch.seq_lens}


def stale_inputs(target: ReplayTarget, batch) -> str:
    """Which static input (or attention metadata) the runner holds for the batch's real rows differs from the batch:
    a diagnosis only, read after a failure, never the expectation."""
    held = {name: (target.static_buffer(name), wanted) for name, wanted in _wanted(batch).items()}
    mrope = target.static_buffer("mrope_positions")
    for k, row in enumerate(batch.mrope_positions or []):  # an mRoPE model's sections, each held apart
        held[f"mrope_positions[{k}]"] = (None if mrope is None else mrope[k], row)
    metadata = target.replayed_backend().forward_metadata
    if metadata is not None:
        held["attention metadata seq_lens"] = (metadata.seq_lens, batch.seq_lens)
        held["attention metadata visible_drafts"] = (metadata.visible_drafts, batch.visible_drafts())
    wrong = [f"`{name}` holds {buffer[:len(wanted)].tolist()} where the batch has {list(wanted)}"
             for name, (buffer, wanted) in held.items()
             if buffer is not None and buffer[:len(wanted)].tolist() != list(wanted)]
    if metadata is None:
        wrong.append("the attention backend the replay reads was never given metadata")
    elif int(metadata.sum_gap) != 0:
        wrong.append(f"the attention backend was handed a seq_lens_sum {int(metadata.sum_gap)} away from the sum "
                     "of the seq_lens it was handed")
    return (("; static inputs: " + "; ".join(wrong)) if wrong else "") + target.stale_layout(batch) + \
        target.stale_embeddings(batch)


def ragged_note(batch) -> str:
    lens = batch.verify_lens
    return "" if lens is None else f" (ragged verify_lens {lens}, tier {batch.tier} of grid {list(batch.grid)})"


def check_padding_promises(target: ReplayTarget, batch, index: int) -> None:
    """Rows past the batch in the static buffers hold what SGLang's buffer registry promises (seq_lens the
    backend's fill value; pool rows, cache slots and positions 0), up to the padded size the case implies: the
    smallest captured size that holds the batch (`patch_contract.expected_sizes`); a ragged verify target's tier
    layout is the batch's verify_lens padded and capped as SGLang's `padded_to_bucket` promises (`ragged-layout`)."""
    if not target.promises_padding:
        return
    wrong = target.stale_layout(batch)  # a ragged verify target's tier layout, padded rows too
    if wrong:
        raise OracleFailure("ragged-layout", f"replay {index}: the layout the tier's graph read differs from the "
                            f"batch's padded to its tier (`padded_verify_lens`){wrong}", batch=batch)
    padded = min(s for s in expected_sizes(target.case)[0] if s >= batch.batch_size)
    width = target.case.tokens_per_request
    tokens = (batch.batch_size * width, padded * width)
    extent = target.padded_extent(batch)  # a ragged verify target: its tier's slots and tokens
    if extent is not None:
        padded, stop = extent
        tokens = (len(batch.input_ids), stop)
    promised = {"seq_lens": target.seq_len_fill_value(), "req_pool_indices": 0,
                "positions": 0, "out_cache_loc": 0}
    for name, value in promised.items():
        start, stop = (batch.batch_size, padded) if name in REQUEST_INPUTS else tokens
        rows = target.static_buffer(name)[start:stop].tolist()
        observed.observe("padded_rows", {name: rows})
        if any(v != value for v in rows):
            raise OracleFailure("eager-equality", f"replay {index}: padded rows {start}..{stop - 1} of `{name}` hold "
                                f"{rows}, SGLang's padding policy promises {value} (batch of {batch.batch_size} "
                                f"request(s) padded to {padded})", batch=batch)
    mrope = target.static_buffer("mrope_positions") if batch.mrope_positions else None
    if mrope is not None and mrope[:, tokens[0]:tokens[1]].any():
        raise OracleFailure("eager-equality", f"replay {index}: padded token columns {tokens[0]}..{tokens[1] - 1} of "
                            f"`mrope_positions` hold {mrope[:, tokens[0]:tokens[1]].tolist()}, SGLang's padding "
                            f"policy promises 0 (batch of {batch.batch_size} request(s) padded to {padded})",
                            batch=batch)


def check_replays_match_eager(target: ReplayTarget, batches, *, exact: bool, count_replays: bool,
                              replay: Callable | None = None, serve_graphs: Callable | None = None) -> None:
    """`count_replays` (a device the counter sees): each replay must also have replayed exactly one graph.
    `replay(batch, step)`: how each batch reaches the runner, returning (output, the batch whose closed form the
    output must equal); default `target.replay` and the batch itself. `serve_graphs(batch)`: the graphs the case
    implies SGLang creates and replays at serve time beside the captured one (the metadata glue graph's), as a
    `replay_delta`, taken off before the count is checked."""
    replay = replay or (lambda batch, step: (target.replay(batch), batch))
    for index, drawn in enumerate(batches):
        for which, batch in (("drawn", drawn), ("shifted", drawn.shifted())):
            servable = target.expected_servable(batch)
            if target.can_replay(batch) != servable:
                raise OracleFailure("eager-equality", f"the runner {'refused' if servable else 'accepted'} to "
                                    f"replay batch size {batch.batch_size} having captured {target.capture_bs}"
                                    f"{' with padding disabled' if target.case.disable_padding else ''}"
                                    f"{ragged_note(batch)}",
                                    batch=batch, refused_captured=servable)
            if not servable:
                continue  # padding disabled: SGLang runs this batch eagerly, outside the graphs
            mark = counter.mark()
            output, batch = replay(batch, 2 * index + (which == "shifted"))
            delta = replay_delta(counter.since(mark))
            extra = serve_graphs(batch) if serve_graphs is not None else {}
            delta = {key: value - extra.get(key, 0) for key, value in delta.items()}
            if count_replays:  # one graph per size and variant: a replay replays exactly one (checked first: the
                # most specific diagnosis of a skipped or doubled launch)
                beside = f"; counted beside the serve-time graphs the case implies, {extra}" if any(extra.values()) \
                    else ""
                check_graph_forward(delta, 1, context=f"replay {index}, {which} batch of {batch.batch_size} "
                                                      f"{batch.forward_mode} request(s){beside}")
            real = batch.real_tokens  # ragged verify: rows past the batch's tokens are the tier's
            returned = target.returned_logits(output, batch)  # a dLLM target: full_logits, held to its contract
            got = (returned[:real].clone(),
                   None if output.hidden_states is None else output.hidden_states[:real].clone())
            eager = target.eager(batch)
            eager = dataclasses.replace(eager, next_token_logits=eager.next_token_logits[:real], hidden_states=None
                                        if eager.hidden_states is None else eager.hidden_states[:real])
            logits, hidden = by_hand(target, batch)
            try:
                assert_matches_eager(eager.next_token_logits, logits.to(eager.next_token_logits.dtype), exact=True)
                if eager.hidden_states is not None:
                    assert_matches_eager(eager.hidden_states, hidden.to(eager.hidden_states.dtype), exact=True)
            except OracleFailure as failure:
                raise OracleFailure(failure.oracle, f"eager itself differs from the model's closed form on {which} "
                                    f"batch {batch}: {failure.diagnosis}", **failure.details) from None
            try:
                assert_matches_eager(got[0], eager.next_token_logits, exact=exact)
                if eager.hidden_states is not None or got[1] is not None:
                    assert_matches_eager(got[1], eager.hidden_states, exact=exact)
            except OracleFailure as failure:
                failure.details.update(replay_index=index, batch=f"{which} {batch}",
                                       capture_bs=target.capture_bs)
                raise OracleFailure(failure.oracle, f"replay {index} ({which} batch of {batch.batch_size} "
                                    f"{batch.forward_mode} request(s)): {failure.diagnosis}"
                                    f"{stale_inputs(target, batch)}", **failure.details) from None
            check_padding_promises(target, batch, index)
