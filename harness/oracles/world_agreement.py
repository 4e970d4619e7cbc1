"""`world-agreement` and `world-rank`: what every rank of a world must do, derived from the drawn world and program.

A world's ranks must act as one server. From the world's flags and each attention-DP rank's load, the arithmetic of
what SGLang should do at each iteration is written out here (`expected_iterations`) and each rank's record is held
to it:
- placement: world rank w is TP rank r = w % tp of pipeline stage w // tp, and attention-DP rank r // (tp / dp
  ranks), in a group of that width;
- capture list: `World.capture_list` (the requested sizes, the request pool aligned to the attention-TP width when
  the runner gathers, sizes off the alignment dropped);
- the DP sync: each rank gathers every attention-DP rank's token count (a decode step: its running requests; a
  prefill: its prompt tokens; idle: 0) when the MLP input is all-gathered, its own count otherwise; the group
  votes for the decode graph unless some rank runs a prefill;
- graph or eager: a decode (or idle) iteration replays when the vote holds and the largest count, over the DP
  group when the MLP gathers (over the rank's own batch otherwise), fits the largest captured size; the bucket is
  the smallest captured size that holds that count, the same on every rank;
- prefill graphs (`--cuda-graph-backend-prefill breakable`, CUDA's default; drawn): the captured token counts
  are the asked ones aligned up to the capture alignment; each attention-DP rank votes for the prefill graph (idle:
  yes; a prefill: its tokens fit, at most the largest count and padded at most twice; a decode: its one-token-extend
  view fits) and the group takes the minimum; when some rank prefills and the vote holds, every rank pads to one
  bucket (the smallest count holding the largest, aligned to the attention-TP width), every decoding rank converts
  its batch to one-token extends (unless a DP rank is idle, which runs a dummy extend) and every rank replays the
  prefill graph, else every extend runs eager;
- the pad mask (with MoE expert parallelism, `World.non_padded`): a replay publishes the real token count, split
  over the attention-TP ranks by the padded bucket when the batch is sharded (a trailing rank may own none);
- numbers: each replay equals its eager twin (checked in the rank), and every request's next-token logits equal
  transformers' for its tokens (`transformers-reference`, the checkpoint the ranks loaded their shards of).
`world-rank` is a rank that crashed, hung or raised (SGLang's own error, with the rank and the drawn world).
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable

import torch

from harness.oracles import OracleFailure
from harness.worlds.world import Admit, Decode, Finish, WorldCase

AGREEMENT = "world-agreement"
RANK = "world-rank"
ITERATION_MARK = "[harness-world] iteration"  # what a rank prints into its log as it begins an iteration


@dataclasses.dataclass(frozen=True)
class Expected:
    """One iteration, as the case implies it for every rank."""

    counts: list[int]  # per attention-DP rank: tokens this iteration (0: idle)
    any_work: bool
    vote: bool
    graph: bool
    bucket: int | None  # for an MLP-gathering world; None: per rank (`own_bucket`)
    batch_sizes: list[int]  # per attention-DP rank: requests in its batch (0: idle)
    # with prefill graphs (`WorldCase.prefill_tokens`): the group's prefill vote (None: no DP sync), per attention-DP
    # rank whether its batch is an extend that replays the prefill graph, and whether SGLang converts its decode
    # batch to one-token extends; the arithmetic, for the diagnosis
    prefill_vote: bool | None = None
    prefill_graph: list[bool] | None = None
    converted: list[bool] | None = None
    prefill_arithmetic: str = ""
    prefill_bucket: list[int | None] | None = None  # per attention-DP rank: the token bucket a replay pads to


def prefill_capture_list(case: WorldCase) -> list[int]:
    """The prefill runner's token counts: each asked count aligned up to the capture alignment, deduplicated, sorted
    (`get_prefill_num_tokens_to_capture`: capture and replay shards of equal width)."""
    return sorted({case.world.aligned(n) for n in case.prefill_tokens})


def prefill_fits(tokens: int, capture: list[int]) -> bool:
    """The prefill runner's token rule (`can_replay_locally`): at most the largest captured count, and the smallest
    count holding it at most twice the tokens (`_MAX_PREFILL_CUDA_GRAPH_PADDING_FACTOR`)."""
    bucket = own_bucket(tokens, capture)
    return tokens > 0 and bucket is not None and bucket <= 2 * tokens


def _prefill_expectation(world, case: WorldCase, works, counts: list[int], extend: bool) -> dict:
    """The prefill graphs' share of an iteration (module docstring): each attention-DP rank votes (idle: yes; a
    prefill: its tokens fit; a decode: its one-token-extend view fits), the group takes the minimum; when a rank
    prefills and the vote holds, every rank replays the prefill graph at one bucket (a decode converted to extends
    when no DP rank is idle; an idle rank a dummy extend); without a DP sync a prefill replays when its own tokens
    fit, at its own bucket."""
    capture = prefill_capture_list(case)
    if not world.mlp_sync:
        graph = [isinstance(w, Admit) and prefill_fits(n, capture) for w, n in zip(works, counts)]
        return dict(prefill_graph=graph, converted=[False] * len(works),
                    prefill_bucket=[own_bucket(n, capture) if g else None for n, g in zip(counts, graph)],
                    prefill_arithmetic=f"tokens {counts} against captured {capture}")
    votes = [n == 0 or prefill_fits(n, capture) for n in counts]
    vote = all(votes)
    gathered = counts if world.mlp_tp_gather else counts[:1]
    idle = len(gathered) > 1 and min(gathered) == 0
    together = extend and vote
    # SGLang converts a decode only when no DP rank is idle; with the vote every rank pads to one bucket (MAX_LEN:
    # the largest count aligned to the attention-TP width) and an idle rank runs a dummy extend of it
    converted = [together and not idle and not isinstance(w, Admit) and n > 0 for w, n in zip(works, counts)]
    graph = [together and (isinstance(w, Admit) or c or n == 0) for w, n, c in zip(works, counts, converted)]
    widest = max(world.aligned(n, world.attn_tp) for n in gathered)
    bucket = own_bucket(widest, capture) if together else None
    arithmetic = (f"per-rank votes {votes} for tokens {counts} against captured {capture} (at most the largest, "
                  f"padded at most 2x), group vote {vote}; a rank prefills: {extend}; an idle DP rank: {idle}; "
                  f"the bucket: the smallest captured count holding {widest}, the largest aligned to "
                  f"{world.attn_tp}")
    return dict(prefill_vote=vote, prefill_graph=graph, converted=converted, prefill_arithmetic=arithmetic,
                prefill_bucket=[bucket if g else None for g in graph])


def expected_iterations(case: WorldCase, capture: list[int]) -> list[Expected]:
    """The arithmetic of each iteration (module docstring), from the program alone."""
    world = case.world
    running = [0] * world.dp_ranks
    out = []
    for row in case.program:
        works = list(row) if len(row) > 1 else [row[0]] * world.dp_ranks
        counts, sizes, extend = [], [], False
        for dp_rank, work in enumerate(works):
            if isinstance(work, Admit):
                counts.append(sum(len(p) for p in work.prompts))
                sizes.append(len(work.prompts))
                extend = True
                continue
            if isinstance(work, Finish):
                running[dp_rank] -= len(work.positions)
            decoding = running[dp_rank] if isinstance(work, (Decode, Finish)) else 0
            counts.append(decoding)
            sizes.append(decoding)
        vote = not extend
        widest = max(sizes) if world.mlp_tp_gather else None
        graph = vote and max(counts) > 0 and (widest is None or widest <= max(capture))
        bucket = min(s for s in capture if s >= widest) if graph and widest is not None else None
        prefill = _prefill_expectation(world, case, works, counts, extend) if case.prefill_tokens else {}
        out.append(Expected(counts, max(counts) > 0, vote, graph, bucket, sizes, **prefill))
        for dp_rank, work in enumerate(works):
            if isinstance(work, Admit):
                running[dp_rank] += len(work.prompts)
    return out


def own_bucket(size: int, capture: list[int]) -> int | None:
    """The bucket of a rank that pads its own batch: the smallest captured size holding it (None: none does)."""
    return min((s for s in capture if s >= size), default=None)


# A finding on 0.5.23 (`tests/test_worlds.py::test_findings_capture_past_the_request_pool`, strict xfail): when the
# runner gathers over an attention-TP group wider than one, it appends the request pool aligned up to that width to
# its capture list (`get_batch_sizes_to_capture`), but SGLang's Triton backend sized its `kv_indptr` by the pool
# (`req_to_token_pool.size + 1`), so the capture of the aligned size overflows it and startup fails. Such cases are
# held to that failure (an expected error under the finding's name) unless this is off (the finding's test).
HOLD_CAPTURE_PAST_POOL = True


def refusal_rule(case: WorldCase) -> tuple[str, str] | None:
    """The rule that predicts SGLang refuses the case at construction, as (name, why), or None: the world's
    capture list is empty (no requested size is a multiple of the alignment, and the pool is not appended); or it
    holds a size past the rank's request pool (the finding above)."""
    world = case.world
    if world.layout_error():
        return ("parallel-layout", world.layout_error())
    capture = world.capture_list(case.capture_bs, case.max_running_requests)
    pool = world.requests_per_rank(case.max_running_requests)
    if not capture:
        return ("capture-list-empty", f"no size of {list(case.capture_bs)} is a multiple of the capture alignment "
                f"{world.capture_alignment()} and none exceeds the pool of {pool}")
    if HOLD_CAPTURE_PAST_POOL and max(capture) > pool:
        return ("finding-capture-past-request-pool", f"the capture list {capture} holds {max(capture)}, the request "
                f"pool of {pool} aligned up to {world.capture_alignment()}, past the Triton backend's kv_indptr "
                f"({pool} + 1 rows)")
    return None


def construction_refusal(outcome) -> str | None:
    """SGLang's own error, when every rank stopped before its runner captured (a configuration it refuses), else
    None; a rank's own error before those its peers got because it left."""
    records = outcome.records
    if outcome.complete and records and all(r.failure and not r.capture_bs for r in records.values()):
        ordered = sorted(records.items(), key=lambda item: (_peer_error(item[1].failure), item[0]))
        return "; ".join(f"rank {rank}: {r.failure['diagnosis']}" for rank, r in ordered)
    return None


def _peer_error(failure: dict) -> bool:
    return any(text in failure["diagnosis"] for text in PEER_ERRORS)


# what gloo raises in a rank whose peer died or left a collective: an effect, never the cause
PEER_ERRORS = ("Connection reset by peer", "Connection closed by peer", "remote worker")


def check_outcome(case: WorldCase, outcome) -> None:
    """The cause first: a rank's own failure (SGLang's error, an oracle the rank checked), then a rank that died
    without a record, then a rank that failed only because a peer went away, then ranks that hung. Every rank's fate
    is named beside it: a peer that waits in a collective the failing rank never joins hangs, as its effect."""
    label = f"world {case.world.label()} ({case.world.ranks} ranks)"
    others = _fates(outcome)
    failed = sorted((rank, r.failure) for rank, r in outcome.records.items() if r.failure)
    own = [(rank, f) for rank, f in failed if not _peer_error(f)]
    for rank, failure in own:
        raise OracleFailure(failure["oracle"], f"rank {rank} of {label}: {failure['diagnosis']}{others}",
                            **failure.get("details", {}), traceback=failure.get("traceback", "")[-3000:])
    for rank, text in sorted(outcome.crashed.items()):
        raise OracleFailure(RANK, f"rank {rank} of {label} died without a record ({_last_words(text)}){others}",
                            log=text[-3000:])
    for rank, failure in failed:
        raise OracleFailure(failure["oracle"], f"rank {rank} of {label}: {failure['diagnosis']}{others}",
                            **failure.get("details", {}), traceback=failure.get("traceback", "")[-3000:])
    for rank, text in sorted(outcome.hung.items()):
        raise OracleFailure(RANK, f"rank {rank} of {label} hung: it sent no record within the world's time limit "
                            f"and was killed{others} (its threads' stacks are in details)", stacks=text[-3000:])


def _fates(outcome) -> str:
    fates = [f"rank {rank} hung and was killed" for rank in sorted(outcome.hung)] + \
        [f"rank {rank} died" for rank in sorted(outcome.crashed)]
    return f" ({'; '.join(fates)})" if fates else ""


def _last_words(log: str) -> str:
    """Where a dead rank was (the last iteration it began, as its log marks them) and what it said last that names
    an error (a C++ abort prints `what():`), else its exit code line."""
    lines = [line.strip() for line in log.splitlines() if line.strip()]
    marks = [line.removeprefix(ITERATION_MARK).strip() for line in lines if line.startswith(ITERATION_MARK)]
    words = [line for line in lines if "what():" in line or "Error" in line or "error" in line]
    said = (words[-1] if words else lines[0] if lines else "no output")[:400]
    return f"in iteration {marks[-1]}: {said}" if marks else said


def check_placement(case: WorldCase, records: dict) -> None:
    world = case.world
    for rank, record in sorted(records.items()):
        expected = {"tp_rank": world.tp_rank_of(rank), "tp_size": world.tp, "attn_tp_size": world.attn_tp,
                    "attn_dp_rank": world.dp_rank_of(rank), "num_dp_ranks": world.dp_ranks,
                    "pp_rank": world.pp_rank_of(rank), "pp_size": world.pp}
        wrong = {k: (record.placement.get(k), v) for k, v in expected.items() if record.placement.get(k) != v}
        if wrong:
            raise OracleFailure(AGREEMENT, f"rank {rank} of world {world.label()}: SGLang published "
                                + ", ".join(f"{k} {got} where the world implies {want}" for k, (got, want) in
                                            wrong.items()) + f" (attention-TP width {world.tp} / {world.dp_ranks} "
                                f"DP ranks = {world.attn_tp}; TP rank = {rank} % {world.tp}, stage = "
                                f"{rank} // {world.tp}, DP rank = TP rank // {world.attn_tp})")


def check_capture(case: WorldCase, records: dict) -> list[int]:
    world = case.world
    expected = world.capture_list(case.capture_bs, case.max_running_requests)
    for rank, record in sorted(records.items()):
        if record.capture_bs != expected:
            raise OracleFailure(AGREEMENT, f"rank {rank} of world {world.label()} captured {record.capture_bs} for "
                                f"--cuda-graph-bs {list(case.capture_bs)} and --max-running-requests "
                                f"{case.max_running_requests}, where the world implies {expected} (alignment "
                                f"{world.capture_alignment()}: the pool {case.max_running_requests} aligned up "
                                "joins a list whose sizes exceed it; sizes off the alignment or above the pool go)")
    return expected


def check_prefill_capture(case: WorldCase, records: dict) -> None:
    if not case.prefill_tokens:
        return
    expected = prefill_capture_list(case)
    for rank, record in sorted(records.items()):
        if record.prefill_capture != expected:
            raise OracleFailure(AGREEMENT, f"rank {rank} of world {case.world.label()}: the prefill runner captured "
                                f"{record.prefill_capture} token counts for {list(case.prefill_tokens)}, where the "
                                f"world implies {expected} (each aligned up to {case.world.capture_alignment()})")


def check_iterations(case: WorldCase, records: dict, capture: list[int]) -> None:
    world = case.world
    for index, want in enumerate(expected_iterations(case, capture)):
        seen = {rank: record.iterations[index] for rank, record in records.items()}
        for rank, row in sorted(seen.items()):
            dp_rank = world.dp_rank_of(rank)
            where = f"iteration {index} on rank {rank} (attention-DP rank {dp_rank}: {row.work}) of world " \
                    f"{world.label()}, DP loads {want.counts}"
            _check_row(world, want, row, dp_rank, capture, where)
            _check_pad_mask(world, row, rank, where)
        decisions = {rank: (row.graph, row.bucket) for rank, row in seen.items()}
        if world.mlp_tp_gather and len(set(decisions.values())) > 1:
            raise OracleFailure(AGREEMENT, f"iteration {index} of world {world.label()}: the ranks replayed "
                                f"differently: {decisions} (graph, bucket) per rank")


def _check_row(world, want: Expected, row, dp_rank: int, capture: list[int], where: str) -> None:
    if not want.any_work:
        if row.forward_mode is not None:
            raise OracleFailure(AGREEMENT, f"{where}: no rank has work, yet this rank ran a {row.forward_mode} batch")
        return
    gathered = want.counts if world.mlp_tp_gather else [want.counts[dp_rank]]
    if world.mlp_sync and row.global_num_tokens != gathered:
        raise OracleFailure(AGREEMENT, f"{where}: the DP sync gathered global_num_tokens {row.global_num_tokens} "
                            f"where the loads imply {gathered}")
    if world.mlp_sync and row.vote != want.vote:
        raise OracleFailure(AGREEMENT, f"{where}: the group voted {row.vote} for the decode graph, where it must vote "
                            f"{want.vote} ({'a rank prefills' if not want.vote else 'every rank decodes or idles'})")
    if want.prefill_graph is not None and _check_prefill_row(world, want, row, dp_rank, where):
        return
    own = want.batch_sizes[dp_rank]
    graph = want.graph if world.mlp_tp_gather else (want.vote and own > 0 and own <= max(capture))
    if row.graph != graph:
        widest = max(want.batch_sizes) if world.mlp_tp_gather else own
        raise OracleFailure(AGREEMENT, f"{where}: the rank {'replayed a graph' if row.graph else 'ran eager'} where "
                            f"the case implies {'a replay' if graph else 'eager'} (vote {want.vote}; "
                            f"{'largest DP batch' if world.mlp_tp_gather else 'its batch'} {widest}, captured "
                            f"{capture})")
    if graph:
        bucket = want.bucket if world.mlp_tp_gather else own_bucket(own, capture)
        if row.bucket != bucket or row.raw_bs != own:
            raise OracleFailure(AGREEMENT, f"{where}: the runner padded a batch of {row.raw_bs} to {row.bucket}, "
                                f"where the rank's batch is {own} and the bucket is {bucket} (the smallest of "
                                f"{capture} holding {max(want.batch_sizes) if world.mlp_tp_gather else own}"
                                f"{', the DP group' + chr(39) + 's largest batch' if world.mlp_tp_gather else ''})")
    if row.replay_vs_eager:
        raise OracleFailure("eager-equality", f"{where}: the replay differs from the same batch run eager: "
                            f"{row.replay_vs_eager}")


def _check_prefill_row(world, want: Expected, row, dp_rank: int, where: str) -> bool:
    """The prefill graphs' checks of a row: the group's vote, the conversion, and, for an extend batch (a prefill
    or a converted decode), graph or eager. True when the row was an extend (the decode checks do not apply)."""
    if world.mlp_sync and row.prefill_vote != want.prefill_vote:
        raise OracleFailure(AGREEMENT, f"{where}: the group voted {row.prefill_vote} for the prefill graph, where "
                            f"it must vote {want.prefill_vote} ({want.prefill_arithmetic})")
    if row.converted != want.converted[dp_rank]:
        raise OracleFailure(AGREEMENT, f"{where}: SGLang {'converted' if row.converted else 'kept'} the rank's decode "
                            f"batch {'to' if row.converted else 'as'} {'extends' if row.converted else 'a decode'}, "
                            f"where the case implies {'conversion' if want.converted[dp_rank] else 'none'} "
                            f"({want.prefill_arithmetic})")
    if row.forward_mode != "EXTEND" and not (row.forward_mode == "IDLE" and want.prefill_graph[dp_rank]):
        return False
    if row.graph != want.prefill_graph[dp_rank] or row.graph != row.prefill_graph:
        implied = "a prefill-graph replay" if want.prefill_graph[dp_rank] else "eager"
        raise OracleFailure(AGREEMENT, f"{where}: the rank's extend batch {'replayed' if row.graph else 'ran eager'}"
                            f"{'' if row.graph == row.prefill_graph else ' (not through the prefill runner)'}, "
                            f"where the case implies {implied} ({want.prefill_arithmetic})")
    if row.graph and row.bucket != want.prefill_bucket[dp_rank]:
        raise OracleFailure(AGREEMENT, f"{where}: the prefill runner padded to {row.bucket} tokens, where the case "
                            f"implies {want.prefill_bucket[dp_rank]} ({want.prefill_arithmetic})")
    if row.replay_vs_eager:
        raise OracleFailure("eager-equality", f"{where}: the prefill replay differs from the same batch run eager: "
                            f"{row.replay_vs_eager}")
    return True


def _check_pad_mask(world, row, rank: int, where: str) -> None:
    """The count a replay published for the model to mask pad rows by (`World.non_padded`), decode: a token a
    request."""
    if not row.graph or row.prefill_graph:
        return
    if not world.masks_pad_rows:
        if row.non_padded is not None:
            raise OracleFailure(AGREEMENT, f"{where}: the runner holds a pad mask ({row.non_padded}) in a world "
                                "without expert parallelism, which publishes none")
        return
    want = world.non_padded(rank, row.raw_bs, row.bucket)
    if row.non_padded != want:
        chunk = row.bucket // world.attn_tp if world.attn_tp_sharded else None
        how = (f"sharded over attention-TP width {world.attn_tp}: chunk {row.bucket} // {world.attn_tp} = {chunk}, "
               f"clamp({row.raw_bs} - {chunk} x {rank % world.attn_tp}, 0, {chunk})" if chunk is not None
               else "replicated: the real count")
        raise OracleFailure(AGREEMENT, f"{where}: the replay published num_token_non_padded {row.non_padded} for "
                            f"{row.raw_bs} real token(s) padded to {row.bucket}, where the rank holds {want} ({how})")


def check_references(case: WorldCase, records: dict, reference: Callable[[list[int]], torch.Tensor]) -> None:
    """Every request's logits, at every iteration, against `reference(history)` (transformers')."""
    from harness.oracles import transformers_reference

    for rank, record in sorted(records.items()):
        for row in record.iterations:
            for request in row.requests:
                where = f"rank {rank} of world {case.world.label()}, iteration {row.index} ({row.work}, " \
                        f"{'replayed' if row.graph else 'eager'}), request {request.rid}"
                transformers_reference.check(torch.tensor(request.logits), reference(request.history),
                                             history=request.history, where=where)


def check_world(case: WorldCase, outcome, reference: Callable[[list[int]], torch.Tensor]) -> None:
    """Every check of the module docstring, in the order that makes the first failure the cause."""
    check_outcome(case, outcome)
    records = outcome.records
    check_placement(case, records)
    capture = check_capture(case, records)
    check_prefill_capture(case, records)
    check_iterations(case, records, capture)
    check_references(case, records, reference)
