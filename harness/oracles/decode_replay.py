"""Replay against eager, batch after batch, so stale values cannot hide.

Each drawn batch is replayed through the runner and compared with eager on its real rows; then the same batch with
every input id shifted by one is replayed at once (same graph, new inputs): a replay that returned the previous
replay's values, or read an input buffer that was not refilled, differs from eager there. Eager itself is held to
the model's closed form (`decode_model.expected_logits`), so a wrong reference cannot make both sides agree.
"""
from __future__ import annotations

import dataclasses
from typing import Callable

from harness.counter import counter
from harness.models.decode_model import LORA_SCALES, expected_logits
from harness.oracles import OracleFailure
from harness.oracles.eager import assert_matches_eager
from harness.oracles.graph_replay import check_graph_forward, replay_delta


def check_compiled_forwards_match_eager(target, batch_of_size: Callable, *, exact: bool) -> None:
    """Each compiled forward `patch_model` yielded, called outside capture on `batch_of_size(n, lora=...)`, equals
    eager. In record mode the graph holds the eager ops of a compiled forward (Dynamo does not run under the
    recording mode), so compiled numerics are checked here, outside capture, as well."""
    for entry in target.patch_model_seen:
        if not entry.enable_compile:
            continue
        n = entry.num_tokens
        batch = batch_of_size(n, lora=target.lora_manager is not None)
        compiled = target.eager(batch, forward=entry.forward).next_token_logits
        expected = target.eager(batch).next_token_logits
        try:
            assert_matches_eager(compiled, expected, exact=exact)
        except OracleFailure as failure:
            raise OracleFailure(failure.oracle, f"the compiled forward `{entry.name}` yielded for {n} token(s), "
                                f"called outside capture: {failure.diagnosis}", **failure.details) from None


def shifted(batch):
    return dataclasses.replace(batch, input_ids=[i + 1 for i in batch.input_ids])


def check_replays_match_eager(target, batches, *, exact: bool, count_replays: bool) -> None:
    """`count_replays` (a device the counter sees): each replay must also have replayed exactly one graph."""
    for index, drawn in enumerate(batches):
        for which, batch in (("drawn", drawn), ("shifted", shifted(drawn))):
            if not target.can_replay(batch):
                raise OracleFailure("eager-equality", f"the runner refused to replay batch size {batch.batch_size}"
                                    f" although it captured {target.capture_bs}", batch=batch)
            mark = counter.mark()
            output = target.replay(batch)
            delta = replay_delta(counter.since(mark))
            logits = output.next_token_logits.clone()
            expected = target.eager(batch).next_token_logits
            scales = [LORA_SCALES[i] for i in batch.lora_ids] if target.lora_manager and batch.lora_ids else None
            by_hand = expected_logits(batch.input_ids, batch.positions, batch.seq_lens,
                                      decode=batch.forward_mode == "DECODE", lora_scales=scales)
            try:
                assert_matches_eager(expected, by_hand.to(expected.dtype), exact=True)
            except OracleFailure as failure:
                raise OracleFailure(failure.oracle, f"eager itself differs from the model's closed form on {which} "
                                    f"batch {batch}: {failure.diagnosis}", **failure.details) from None
            try:
                assert_matches_eager(logits, expected, exact=exact)
            except OracleFailure as failure:
                failure.details.update(replay_index=index, batch=f"{which} {batch}",
                                       capture_bs=target.capture_bs)
                raise OracleFailure(failure.oracle, f"replay {index} ({which} batch of {batch.batch_size} "
                                    f"{batch.forward_mode} row(s)): {failure.diagnosis}", **failure.details) from None
            if count_replays:  # one graph per size and variant: a replay replays exactly one
                check_graph_forward(delta, 1, context=f"replay {index}, {which} batch of {batch.batch_size} "
                                                      f"{batch.forward_mode} row(s)")
