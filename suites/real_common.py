"""What the real-model suites share (drawn cases, the EAGLE draft worker's examples and run): a module, never a test
module imported by another, so each test is collected once, where it is written (`test_real_models.py`, and
`test_decode_npu.py` for the draft worker's NPU runners)."""
from __future__ import annotations

import dataclasses

import pytest
from hypothesis import Phase, example, settings, strategies as st

from harness.conditions import narrow
from harness.counter import counter
from harness.devices import get_device
from harness.errors import PathMissing
from harness.models.real import FAMILIES
from harness.oracles import OracleFailure, execution_context
from harness.targets.decode.base import DecodeBatch, DecodeCase, SpecSettings
from harness.targets.decode.real_model import StagedBatch

MAX_REQUESTS = 8  # pool rows 1..8 (row 0: SGLang's padding row)
TOP_K_ALL = 1 << 30  # SGLang's top_k for "no top-k" (sampling_params.TOP_K_ALL)
MAX_SEQ_LEN = 24

# The gate runs the explicit example only (its first generated one would be the minimal case: one size, one
# request of one token); nightly draws ten per family. Each example builds and captures a real model (seconds).
IN_GATE = settings.get_current_profile_name() == "gate"
GATE_EXPLICIT_ONLY = {"phases": [Phase.explicit]} if IN_GATE else {}


def beyond_gate(**drawn):
    """`hypothesis.example(**drawn)` in every profile but the gate, whose bar is 120 s at `-n 2`
    (`docs/scaling.md`): each use says what still reaches the example's path in the gate."""
    return (lambda test: test) if IN_GATE else example(**drawn)


def gate_families(families: list[str], kept: tuple[str, ...]) -> list[str]:
    """`families` in every profile but the gate, which keeps `kept` (each use says why those)."""
    return [name for name in families if name in kept] if IN_GATE else families


@st.composite
def real_cases(draw):
    """Capture sizes from a small grid (SGLang pads a batch to the next captured size)."""
    sizes = draw(st.lists(st.sampled_from([1, 2, 3, 4]), min_size=1, max_size=2, unique=True), label="capture_bs")
    return DecodeCase(capture_bs=tuple(sorted(sizes)), max_running_requests=MAX_REQUESTS)


def replay_sizes(capture_bs) -> st.SearchStrategy:
    """One or two replayed sizes up to the largest captured; half the time a captured size and then a smaller one
    that pads onto it, the moment a padded batch meets a wider batch's static metadata (its stale slots, rows and
    lengths in the padded rows), which a free draw of two sizes reaches about one time in five."""
    free = st.lists(st.integers(1, max(capture_bs)), min_size=1, max_size=2)
    below = dict(zip(capture_bs, (0, *capture_bs)))  # each captured size -> the captured size beneath it
    shrinks = [[bucket, size] for bucket in capture_bs for size in range(below[bucket] + 1, bucket)]
    return st.one_of(free, st.sampled_from(shrinks)) if shrinks else free


@st.composite
def draft_cases(draw):
    """An EAGLE, EAGLE3 or STANDALONE draft worker's settings: 2 or 3 steps, 1 or 2 branches a step (a tree's
    draft-token budget drawn within what its steps score), maybe rejection sampling (top-k 1), capture sizes, and
    maybe `--enable-deterministic-inference` (a split tile). Returns (case, tile)."""
    # narrowed by `python -m harness repro` to a launch command's --speculative-num-steps / -eagle-topk /
    # -num-draft-tokens where they fall in these ranges
    steps = draw(narrow("speculative_num_steps", st.integers(2, 3), domain=range(2, 4)), label="draft steps")
    topk = draw(narrow("speculative_eagle_topk", st.integers(1, 2), domain=range(1, 3)), label="topk")
    scored = topk + (steps - 1) * topk * topk  # what draft_forward's score list holds
    budget = range(2, min(scored, 6) + 2)
    drafts = steps + 1 if topk == 1 else draw(narrow("speculative_num_draft_tokens", st.sampled_from(budget),
                                                     domain=budget), label="draft tokens")
    # --speculative-draft-window-size (at least the draft tokens, SGLang's rule: often past the prefix, often
    # inside it) and its sink tokens: EAGLE's rails keep the sink and the recent window, EAGLE3's layers the window
    from harness.targets.decode.eagle_draft import draft_window_missing

    window = None if draft_window_missing() else draw(narrow(
        "speculative_draft_window_size", st.one_of(st.none(), st.integers(drafts, MAX_SEQ_LEN)),
        domain=[None, *range(drafts, MAX_SEQ_LEN + 1)]), label="draft window")
    sink = draw(st.one_of(st.none(), st.integers(0, 3)), label="draft sink") if window else None
    # EAGLE3: its head reads three target layers and drafts in a vocabulary of its own, mapped onto the target's;
    # STANDALONE: a vanilla model of its own, reading no hidden state (its batches and graphs carry none)
    algorithms = ["EAGLE", "EAGLE3", "STANDALONE"]
    algorithm = draw(narrow("speculative_algorithm", st.sampled_from(algorithms), domain=algorithms),
                     label="algorithm")
    # speculative_use_rejection_sampling (--speculative-use-rejection-sampling): SGLang allows it at top-k 1 only;
    # drawn where the proposal rows are the target vocabulary's (not EAGLE3's own)
    sampling = topk == 1 and algorithm != "EAGLE3" and draw(st.booleans(), label="rejection sampling")
    case = dataclasses.replace(draw(real_cases()), spec=SpecSettings(num_steps=steps, topk=topk,
                                                                     num_draft_tokens=drafts, algorithm=algorithm,
                                                                     rejection_sampling=sampling,
                                                                     draft_window=window, draft_sink=sink))
    # --enable-deterministic-inference's split tile; not beside rejection sampling, whose seeded proposal SGLang
    # refuses off CUDA (a hash kernel of sgl_kernel's)
    tile = None if sampling else draw(st.sampled_from([None, 16, 64]), label="split tile")
    return case, tile


def draft_vocabulary(case) -> int:
    """How many tokens the draft head scores: the target's top-k it is handed are ids of that vocabulary (EAGLE3's
    own, which `hot_token_id` maps onto the target's)."""
    from harness.models.real import DRAFT_FAMILIES, draft_family

    config = DRAFT_FAMILIES[draft_family(case.spec.algorithm)].config
    return config.get("draft_vocab_size") or config["vocab_size"]


@st.composite
def draft_batches(draw, case, size: int):
    """A draft batch of `size` requests: per request its committed prefix, pool row, the target's top-k tokens and
    probabilities, the seed of its cache and hidden state (and its sampling under rejection sampling)."""
    from harness.targets.decode.eagle_draft import DraftBatch

    topk, vocab = case.spec.topk, draft_vocabulary(case)
    probability = st.floats(0.01, 1.0, allow_nan=False)
    return DraftBatch(
        seq_lens=draw(st.lists(st.integers(1, MAX_SEQ_LEN), min_size=size, max_size=size)),
        pool_rows=list(draw(st.permutations(range(1, MAX_REQUESTS + 1)))[:size]),
        topk_index=[draw(st.lists(st.integers(0, vocab - 1), min_size=topk, max_size=topk, unique=True))
                    for _ in range(size)],
        topk_p=[sorted(draw(st.lists(probability, min_size=topk, max_size=topk)), reverse=True) for _ in range(size)],
        seed=draw(st.integers(0, 2 ** 16)), **(draw(sampling_params(size)) if case.spec.rejection_sampling else {}))


@st.composite
def extend_batches(draw, case, size: int):
    """The draft extend after a verify of `size` requests: per request its prefix before the verify window, the
    window's tokens, how many the verify accepted (at most the tree's depth plus the bonus token, never past its
    window)."""
    from harness.targets.decode.eagle_draft import DraftExtendBatch

    spec, vocab = case.spec, FAMILIES["dense"].config["vocab_size"]
    drafts = spec.num_draft_tokens
    return DraftExtendBatch(
        prefixes=draw(st.lists(st.integers(1, MAX_SEQ_LEN - drafts), min_size=size, max_size=size)),
        pool_rows=list(draw(st.permutations(range(1, MAX_REQUESTS + 1)))[:size]),
        tokens=[draw(st.lists(st.integers(0, vocab - 1), min_size=drafts, max_size=drafts)) for _ in range(size)],
        accepted=draw(st.lists(st.integers(1, min(spec.num_steps + 1, drafts)), min_size=size, max_size=size)),
        seed=draw(st.integers(0, 2 ** 16)))


@st.composite
def draft_examples(draw):
    """An EAGLE draft case (`draft_cases`) and replays of each size: two draft batches, then two draft extends."""
    case, tile = draw(draft_cases())
    groups = []
    for size in draw(replay_sizes(case.capture_bs), label="replay sizes"):
        groups.append([draw(draft_batches(case, size)) for _ in range(2)] +
                      [draw(extend_batches(case, size)) for _ in range(2)])
    return case, groups, tile


@st.composite
def sampling_params(draw, size: int) -> dict:
    """The requests' top_ks and temperatures under rejection sampling: greedy ones (top_k 1, temperatures 1.0, as
    SamplingParams rewrites a zero), a top-k or all tokens at drawn temperatures; all greedy at times (the greedy
    graph)."""
    greedy = draw(st.booleans(), label="all greedy")
    top_ks = [1] * size if greedy else draw(st.lists(st.sampled_from([1, 4, TOP_K_ALL]), min_size=size, max_size=size))
    temperatures = [1.0 if k == 1 else draw(st.sampled_from([0.5, 1.0, 1.5])) for k in top_ks]
    return {"top_ks": top_ks, "temperatures": temperatures}


def draft_batch(**fields):
    """A draft batch, or a draft extend's (`accepted` among its fields), from its recorded fields."""
    from harness.targets.decode.eagle_draft import DraftBatch, DraftExtendBatch

    return (DraftExtendBatch if "accepted" in fields else DraftBatch)(**fields)


# capture 1 and 3, a tree of 2 branches over 3 steps: three requests (a captured size), then two padded to 3 on
# the rows and slots the three held (a padded row's stale inputs would read or write live slots); then the draft
# extends of a 5-token verify window, three requests and two padded to 3, keeping 2, 4, 1 and 3, 1 tokens
PADDED_DRAFT = (DecodeCase(capture_bs=(1, 3), max_running_requests=MAX_REQUESTS,
                           spec=SpecSettings(num_steps=3, topk=2, num_draft_tokens=5, algorithm="EAGLE")),
                [[draft_batch(seq_lens=[5, 14, 2], pool_rows=[3, 1, 7], topk_index=[[4, 7], [1, 2], [5, 6]],
                               topk_p=[[0.6, 0.3], [0.5, 0.4], [0.9, 0.05]], seed=3),
                  draft_batch(seq_lens=[9, 6], pool_rows=[7, 2], topk_index=[[8, 9], [10, 11]],
                               topk_p=[[0.7, 0.2], [0.4, 0.35]], seed=4),
                  draft_batch(prefixes=[5, 14, 2], pool_rows=[3, 1, 7], accepted=[2, 4, 1], seed=5,
                               tokens=[[1, 2, 3, 4, 5], [6, 7, 8, 9, 10], [11, 12, 13, 14, 15]]),
                  draft_batch(prefixes=[9, 6], pool_rows=[7, 2], accepted=[3, 1], seed=6,
                               tokens=[[21, 22, 23, 24, 25], [26, 27, 28, 29, 30]])]], None)
# the same under --enable-deterministic-inference, split tile 16: each branch's KV splits ceil(seq_len / 16)
DETERMINISTIC_DRAFT = (*PADDED_DRAFT[:2], 16)
# the same tree drafted by an EAGLE3 head: top-k ids of its own 64-token vocabulary mapped onto the target's, its
# draft extends reading three target layers (192 wide), its layers attending a window of 6
# (--speculative-draft-window-size 6: the 14- and 9-token prefixes read through window rails of their last slots)
PADDED_EAGLE3_DRAFT = (dataclasses.replace(PADDED_DRAFT[0], spec=dataclasses.replace(
    PADDED_DRAFT[0].spec, algorithm="EAGLE3", draft_window=6)), *PADDED_DRAFT[1:])
# the same tree drafted by a STANDALONE draft: a vanilla Llama of its own weights, reading no hidden state of the
# target's (its batches carry none, its graphs capture none)
PADDED_STANDALONE_DRAFT = (dataclasses.replace(PADDED_DRAFT[0], spec=dataclasses.replace(
    PADDED_DRAFT[0].spec, algorithm="STANDALONE")), *PADDED_DRAFT[1:])
# under --speculative-use-rejection-sampling (top-k 1, three steps), capture 1 and 3: three greedy requests (the
# greedy graph of size 3), two of which one samples (the sampling graph, padded to 3: the first step's proposal
# held), three that sample at top-k 4 and all tokens (the sampling graph, at its size: the whole tree held, both
# runs drawing from one seeded stream); then the draft extends of a 4-token window. The draft attends 2 sink
# tokens and a window of 6 of its prefix (--speculative-draft-window-size 6 --speculative-draft-sink-size 2):
# the 14-, 9- and 11-token prefixes are clipped to 8 slots in its rails
REJECTION_SAMPLING_DRAFT = (
    DecodeCase(capture_bs=(1, 3), max_running_requests=MAX_REQUESTS,
               spec=SpecSettings(num_steps=3, topk=1, num_draft_tokens=4, algorithm="EAGLE", rejection_sampling=True,
                                 draft_window=6, draft_sink=2)),
    [[draft_batch(seq_lens=[5, 14, 2], pool_rows=[3, 1, 7], topk_index=[[4], [1], [5]], topk_p=[[0.6], [0.5], [0.9]],
                  seed=3, top_ks=[1, 1, 1], temperatures=[1.0, 1.0, 1.0]),
      draft_batch(seq_lens=[9, 6], pool_rows=[7, 2], topk_index=[[8], [10]], topk_p=[[0.7], [0.4]], seed=4,
                  top_ks=[1, TOP_K_ALL], temperatures=[1.0, 0.5]),
      draft_batch(seq_lens=[4, 7, 11], pool_rows=[1, 2, 3], topk_index=[[8], [10], [3]],
                  topk_p=[[0.7], [0.4], [0.5]], seed=9, top_ks=[4, TOP_K_ALL, 1], temperatures=[1.5, 1.0, 1.0]),
      draft_batch(prefixes=[5, 14, 2], pool_rows=[3, 1, 7], accepted=[2, 4, 1], seed=5,
                  tokens=[[1, 2, 3, 4], [6, 7, 8, 9], [11, 12, 13, 14]])]], None)


def capture_draft(ex, case, split_tile=None, personality="cuda"):
    """The draft worker of `case` (SGLang's runner classes for `personality`), its graphs captured: a draft decode
    (two under rejection sampling: greedy and sampling) and a draft extend graph a size, with grad off throughout."""
    from harness.targets.decode.eagle_draft import EagleDraftTarget

    get_device("cpu").reset()
    mark = counter.mark()
    with execution_context.watching(f"the EAGLE draft worker's capture of {list(case.capture_bs)}") as grad:
        try:
            target = EagleDraftTarget(case, split_tile=split_tile, personality=personality)
        except PathMissing as missing:  # a setting the release lacks (a draft window before 0.5.2x): said, skipped
            pytest.skip(str(missing))
    grad.check(target.model)
    captured = counter.since(mark)["num_graphs_captured"]
    decodes = 2 if case.spec.rejection_sampling else 1
    expected = (decodes + 1) * len(target.capture_bs)
    if captured != expected:
        raise OracleFailure("graph-replay", f"the draft worker's runners captured {captured} graph(s) for sizes "
                            f"{target.capture_bs}; {decodes} draft decode and a draft extend graph a size is "
                            f"{expected}", captured=captured, capture_bs=target.capture_bs)
    ex.note("capture_bs", target.capture_bs)
    ex.note("capture_seconds", round(target.capture_seconds, 3))
    return target


def check_draft_item(target, batch, where: str) -> None:
    """One draft or draft-extend batch replayed on `target`'s graphs and held to eager (`check_draft_replay`,
    `check_extend_replay`); `where`: its place in the run."""
    from harness.targets.decode.eagle_draft import DraftExtendBatch, check_draft_replay, check_extend_replay

    if isinstance(batch, DraftExtendBatch):
        check_extend_replay(target, batch, f"draft extend replay {where} (batch of {batch.batch_size}, prefixes "
                            f"{batch.prefixes}, accepted {batch.accepted})")
    else:
        check_draft_replay(target, batch, f"draft replay {where} (batch of {batch.batch_size}, seq_lens "
                           f"{batch.seq_lens}, pool rows {batch.pool_rows})")


def run_draft(ex, case, groups, split_tile=None, personality="cuda"):
    """Capture the draft worker's graphs, then check each drawn batch; each replay is watched for compiles
    (`eagle_draft._no_compile`), the eager references are not."""
    target = capture_draft(ex, case, split_tile, personality)
    ex.note("replayed", [(mode, group[0].batch_size) for group in groups for mode in ("DRAFT_DECODE",
                                                                                      "DRAFT_EXTEND_V2")])
    for step, group in enumerate(groups):
        for which, batch in enumerate(group):
            check_draft_item(target, batch, f"{step}.{which}")


def draft_to_drawn(case, groups, tile) -> dict:
    return {"capture_bs": list(case.capture_bs), "spec": dataclasses.asdict(case.spec),
            "draft_groups": [[dataclasses.asdict(batch) for batch in group] for group in groups],
            **({"split_tile": tile} if tile is not None else {})}


def program_to_drawn(case, program) -> dict:
    """A scheduler program (`harness.targets.decode.scheduled`) and its case as a record's drawn values."""
    from harness.targets.decode.scheduled import Admit, Finish, Mix

    steps = [{"admit": [list(p) for p in step.prompts]} if isinstance(step, Admit) else
             {"mix": [list(p) for p in step.prompts]} if isinstance(step, Mix) else
             {"finish": list(step.positions)} if isinstance(step, Finish) else {"decode": True} for step in program]
    return {"capture_bs": list(case.capture_bs), "program": steps}


def program_from_drawn(steps: list[dict]) -> list:
    from harness.targets.decode.scheduled import Admit, Decode, Finish, Mix

    return [Admit(tuple(tuple(p) for p in step["admit"])) if "admit" in step else
            Mix(tuple(tuple(p) for p in step["mix"])) if "mix" in step else
            Finish(tuple(step["finish"])) if "finish" in step else Decode() for step in steps]


def served_program_to_drawn(case, program) -> dict:
    """A served server's capacity and the steps played on it (`test_server_lifetime.py`)."""
    return {**program_to_drawn(case, program), "max_running_requests": case.max_running_requests, "served": True}


def start_served(ex, case, family):
    """A new server at `case`'s capacity (`harness.targets.decode.served`), its capture list and `patch_model`
    contract held to what the capacity implies (`expected_sizes`)."""
    from harness.oracles.hooks import HookRecorder
    from harness.oracles.patch_contract import check_patch_model_contract
    from harness.targets.decode.served import ServedTarget

    get_device("cpu").reset()
    hooks = HookRecorder()
    mark = counter.mark()
    with execution_context.watching(f"the start of a {family} server (eager runner warm-up, capture of "
                                    f"{list(case.capture_bs)})") as grad:
        target = ServedTarget(case, family=family, hooks=hooks)
    grad.check(target.model)
    check_patch_model_contract(target, hooks, target.layout, graphs_captured=counter.since(mark)["num_graphs_captured"])
    ex.note("capture_bs", target.capture_bs)
    return target


def run_served_program(ex, case, family, program) -> None:
    """A recorded server lifetime played again on a new server, each step checked as the state machine checks
    it."""
    from harness.oracles.recompile import RecompileWatcher
    from harness.targets.decode.scheduled import run_program

    with RecompileWatcher("served real model") as watcher:
        target = start_served(ex, case, family)
        watcher.arm()
        run_program(target, program, note=ex.note)
        watcher.check("a step of the served program compiled a frame")


@st.composite
def staged_batch(draw, batch_size: int):
    """A decode batch: per request its seq_len (prefix in the cache plus this token), pool row, next input id; the
    seed of the cached prefix."""
    vocab = min(f.config["vocab_size"] for f in FAMILIES.values())
    seq_lens = draw(st.lists(st.integers(1, MAX_SEQ_LEN), min_size=batch_size, max_size=batch_size))
    rows = draw(st.permutations(range(1, MAX_REQUESTS + 1)))[:batch_size]
    ids = draw(st.lists(st.integers(0, vocab - 1), min_size=batch_size, max_size=batch_size))
    batch = DecodeBatch(input_ids=ids, positions=[n - 1 for n in seq_lens], seq_lens=seq_lens,
                        req_pool_indices=list(rows))
    deltas = [draw(st.integers(1 - n, 0)) for n in seq_lens]  # an mRoPE family's: earlier image tokens' shift
    return StagedBatch(batch, draw(st.integers(0, 2 ** 16)), deltas)


# drawn beside the pool
LORA_SERVER_SETTINGS = ("embeddings", "max_lora_rank", "all_targets", "overlap_loading", "tied")


def lora_serving(drawn: dict):
    """The `real_lora.Serving` a LoRA record's drawn values describe."""
    from harness.targets.decode.real_lora import Serving

    return Serving(drawn["lora_backend"], drawn["max_loras_per_batch"], **drawn.get("lora_server", {}))


def lora_program_to_drawn(case, serving, program) -> dict:
    """A LoRA server's lifetime (`harness.targets.decode.lora_lifetime`) as a record's drawn values."""
    from harness.targets.decode.lora_lifetime import Load, Unload

    def step(s):
        if isinstance(s, Load):
            return {"load": dataclasses.asdict(s)}
        if isinstance(s, Unload):
            return {"unload": s.name}
        b = s.staged.batch
        return {"serve": {"lora_ids": list(b.lora_ids), "seq_lens": list(b.seq_lens),
                          "pool_rows": list(b.pool_rows), "input_ids": list(b.input_ids), "seed": s.staged.seed}}
    return {"capture_bs": list(case.capture_bs), "lora_backend": serving.backend,
            "max_loras_per_batch": serving.max_loras_per_batch,
            "lora_server": {name: getattr(serving, name) for name in LORA_SERVER_SETTINGS},
            "lora_program": [step(s) for s in program]}


def lora_program_from_drawn(steps: list[dict]) -> list:
    from harness.targets.decode.lora_lifetime import Load, Serve, Unload

    def batch(b):
        return StagedBatch(DecodeBatch(input_ids=b["input_ids"], positions=[n - 1 for n in b["seq_lens"]],
                                       seq_lens=b["seq_lens"], req_pool_indices=b["pool_rows"],
                                       lora_ids=b["lora_ids"]), b["seed"])
    return [Load(**s["load"]) if "load" in s else Unload(s["unload"]) if "unload" in s else Serve(batch(s["serve"]))
            for s in steps]


def start_lora_server(ex, case, serving):
    """A new LoRA server (`lora_lifetime.LoRAServer`), its capture held to the `patch_model` contract."""
    from harness.oracles.hooks import HookRecorder
    from harness.oracles.patch_contract import check_patch_model_contract
    from harness.targets.decode.lora_lifetime import LoRAServer

    get_device("cpu").reset()
    hooks = HookRecorder()
    mark = counter.mark()
    server = LoRAServer(case, serving, hooks=hooks, note=ex.note)
    check_patch_model_contract(server.target, hooks, server.target.layout,
                               graphs_captured=counter.since(mark)["num_graphs_captured"])
    ex.note("capture_bs", server.target.capture_bs)
    return server


def run_lora_program(ex, case, serving, program) -> None:
    """A recorded LoRA server lifetime played again on a new server, each step checked as the machine checks it."""
    from harness.oracles.recompile import RecompileWatcher

    with RecompileWatcher("LoRA server") as watcher:
        server = start_lora_server(ex, case, serving)
        try:
            watcher.arm()
            for index, step in enumerate(program):
                server.play(index, step)
            watcher.check("a step of the LoRA server's lifetime compiled a frame")
        finally:
            server.stop()
