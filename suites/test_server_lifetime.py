"""A served real model over a server's lifetime: a Hypothesis state machine over one server.

Each machine starts a server at a drawn capacity (`--max-running-requests` 2-8, a decode capture list of up to
three sizes 1-8, so a requested size may exceed the request pool: SGLang then captures the pool instead and drops
what lies above it) and builds what SGLang's `ModelRunner` builds, in its startup order: the eager runner, then the
decode runner capturing every size, around one attention backend (`harness.targets.decode.served`). Then it plays
drawn iterations of SGLang's own scheduler code (`harness.targets.decode.scheduled.ProgramPlayer`): a prefill of
admitted prompts (through the server's dispatch: its eager runner, on the backend and buffers the graphs read), or
a decode step of every running request (replayed where a captured size holds the batch, else refused and served
eager) after which some requests may finish (rows and KV slots go back and are handed out again). So one capture
buys many steps, and a batch meets what every earlier step left: a wider batch's rows before a narrower one, a
prefill's writes to the shared static buffers and backend metadata before a replay.

Checked after every step: the capture list against `expected_sizes` (at start), each replay against eager of the
same batch on a fresh backend and the KV cache it leaves (`real_model.check_replay`), eager against SGLang's
torch-native attention, the server's dispatch against what the capacity says (graph or eager), and every running
request against itself decoded alone (`batch-invariance`), so an effect of an earlier step on a later one fails the
step that shows it. A failing step's record holds the case and the whole program up to it; the replay command
plays that program on a new server.

The LoRA machine (`TestLoRAServerLifetime`) does the same for a LoRA server (`harness.targets.decode.lora_lifetime`):
one capture, then adapters loaded (by folder or from tensors, pinned or not), unloaded and loaded again between
decode batches on whatever is served, each step held to `lora-lifecycle` and each admitted batch to eager and to
its adapters' merged models. The gate always plays `pinned_lifetime` beside it (the machine's first draws are the
simplest).

The draft machine (`TestDraftWorkerLifetime`, beyond the gate) does the same for an EAGLE draft worker
(`harness.targets.decode.eagle_draft`): its draft decode and draft extend graphs captured once at drawn speculative
settings, then draft steps and draft extends after verifies that accepted drawn lengths, at sizes growing and
shrinking, each held to eager on the worker every earlier step left (`check_draft_replay`, `check_extend_replay`)."""
from __future__ import annotations

import dataclasses

import pytest
from hypothesis import settings, strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, precondition, rule

from harness.conditions import narrow
from harness.devices import get_device
from harness.errors import PathMissing
from harness.models.real import FAMILIES
from harness.oracles.recompile import RecompileWatcher
from harness.profiles import suite_settings
from harness.record import example
from harness.targets.decode import real_model, scheduled, served
from harness.targets.decode.base import DecodeCase
from harness.targets.decode.real_lora import LORA_BACKENDS, lora_missing
from harness.targets.decode.scheduled import Admit, Decode, Finish, Mix, ProgramPlayer
from suites.real_common import capture_draft, check_draft_item, draft_batches, draft_cases, draft_to_drawn, \
    extend_batches, lora_program_to_drawn, real_cases, run_lora_program, served_program_to_drawn, staged_batch, \
    start_lora_server, start_served

MAX_PROMPT = 12
PROMPT = st.lists(st.integers(0, min(f.config["vocab_size"] for f in FAMILIES.values()) - 1), min_size=1,
                  max_size=MAX_PROMPT).map(tuple)
# the gate serves the dense family (one capture a machine, seconds); nightly every family SGLang captures
GATE_FAMILIES = ["dense"]
CAPTURED = sorted(name for name, family in FAMILIES.items() if family.capture_refusal is None)


@st.composite
def capacities(draw) -> DecodeCase:
    """`--max-running-requests` and a decode capture list: each size may fall below, on or past the pool."""
    pool = draw(st.integers(2, 8), label="max_running_requests")
    sizes = draw(st.lists(st.integers(1, 8), min_size=1, max_size=3, unique=True), label="capture_bs")
    return DecodeCase(capture_bs=tuple(sorted(sizes)), max_running_requests=pool)


def _stack_device(device_name: str, personality: str, stack: str, missing):
    """The cpu virtual device under the cuda personality for a served `stack` (its Triton kernels run by Triton's
    CPU interpreter), installed while the machines run; skips where the release lacks the real-model target or
    `missing()` names what the stack needs."""
    if device_name != "cpu" or personality != "cuda":
        pytest.skip(f"{stack} runs on the cpu virtual device under the cuda personality, not "
                    f"{device_name}/{personality}: its Triton kernels run by Triton's CPU interpreter")
    try:
        real_model.load()
    except PathMissing as missing_path:
        pytest.skip(str(missing_path))
    reason = missing()
    if reason:
        pytest.skip(reason)
    found = get_device(device_name)
    with found.install(personality):
        yield found


@pytest.fixture(scope="module")
def served_device(device_name, personality):
    yield from _stack_device(device_name, personality, "the served stack",
                             lambda: served.missing() or scheduled.missing() or scheduled.mixing_missing())


class ServerLifetime(RuleBasedStateMachine):
    """See the module docstring."""

    families = GATE_FAMILIES if settings.get_current_profile_name() == "gate" else CAPTURED

    def __init__(self):
        super().__init__()
        self.case, self.family, self.player, self.program = None, None, None, []
        self.watcher = None

    def _example(self, rule: str):
        return example("real_models_served", family=self.family, rule=rule,
                       **served_program_to_drawn(self.case, self.program))

    @initialize(case=capacities(), data=st.data())
    def start(self, case, data):
        self.case, self.family = case, data.draw(st.sampled_from(self.families), label="family")
        with self._example("start") as ex:
            self.watcher = RecompileWatcher("served real model")
            self.watcher.__enter__()
            self.player = ProgramPlayer(start_served(ex, case, self.family))
            self.watcher.arm()

    def _play(self, step, rule: str) -> None:
        self.program.append(step)
        with self._example(rule) as ex:
            self.player.play(len(self.program) - 1, step)
            self.watcher.check(f"step {len(self.program) - 1} ({rule}) compiled a frame")
            ex.note("decode_steps", self.player.steps)

    def teardown(self):
        if self.watcher is not None:
            self.watcher.__exit__(None, None, None)

    @precondition(lambda self: self.player is not None and self.player.running < self.case.max_running_requests)
    @rule(data=st.data())
    def prefill(self, data):
        """An iteration that admits new prompts (as many as free request rows allow, three at most): their prefill
        through the server."""
        room = min(3, self.case.max_running_requests - self.player.running)
        self._play(Admit(tuple(data.draw(st.lists(PROMPT, min_size=1, max_size=room), label="prompts"))), "prefill")

    @precondition(lambda self: self.player is not None and 0 < self.player.running < self.case.max_running_requests)
    @rule(data=st.data())
    def mixed_prefill(self, data):
        """An iteration of mixed chunked prefill (`--enable-mixed-chunk`): new prompts prefilled in one MIXED batch
        with every running request's decode step, through the server's eager path."""
        room = min(2, self.case.max_running_requests - self.player.running)
        self._play(Mix(tuple(data.draw(st.lists(PROMPT, min_size=1, max_size=room), label="prompts"))), "mixed")

    @precondition(lambda self: self.player is not None and self.player.running > 0)
    @rule(data=st.data())
    def decode(self, data):
        """An iteration that decodes every running request; after it some may finish (one keeps running)."""
        self._play(Decode(), "decode")
        running = self.player.running
        if running > 1:
            leaving = data.draw(st.sets(st.integers(0, running - 1), max_size=running - 1), label="finish")
            if leaving:
                self._play(Finish(tuple(sorted(leaving))), "finish")


# the gate: two machines of the dense family, up to 12 steps each; nightly a machine class per family, 10 machines
# of up to 40 steps each (about 35 steps a machine: past 200 steps a family). One class drawing the family saw
# Hypothesis favour the first families (nightly of 2026-12-07: dense 731 steps, VLM 578, MLA 60, sliding-window 51)
NIGHTLY = settings.get_current_profile_name() == "nightly"
MACHINE_SETTINGS = settings(suite_settings(gate_examples=2, shrink_in_gate=False), deadline=None,
                            **({"stateful_step_count": 40, "max_examples": 10} if NIGHTLY else
                               {"stateful_step_count": 12}))


def _family_machine(family: str, name: str) -> type:
    """The test class `name` running machines of `family` alone."""
    machine = type(f"ServerLifetime{family.title()}", (ServerLifetime,), {"families": [family]})
    test = type(name, (machine.TestCase,), {"settings": MACHINE_SETTINGS})
    return pytest.mark.usefixtures("served_device")(test)


TestServerLifetime = _family_machine("dense", "TestServerLifetime")
for _family in ServerLifetime.families:
    if _family != "dense":
        _name = f"TestServerLifetime{_family.title()}"
        globals()[_name] = _family_machine(_family, _name)


# -- a LoRA server's lifetime: adapters loaded, unloaded and loaded again under the graphs captured at its start --
# a served name and the adapter weights a load under it may bring ("a" again, or "a" retrained: "a2"; "wide": a
# rank past the pool's, refused; "e": embed_tokens and lm_head, refused unless the server started with it)
LOADS = [("a", "a"), ("a", "a2"), ("b", "b"), ("c", "c"), ("e", "e"), ("wide", "wide")]


@pytest.fixture(scope="module")
def lora_device(device_name, personality):
    yield from _stack_device(device_name, personality, "the LoRA server", lambda: lora_missing("triton"))


@st.composite
def lora_servings(draw):
    """A LoRA server's settings: `--lora-backend` and `--max-loras-per-batch` (narrowed by `python -m harness repro`
    to a log's where they fall here), whether "e" (the token embedding and the LM head) is among `--lora-paths`,
    `--max-lora-rank` (inferred, or 8: past "wide"'s), `--lora-target-modules all`,
    `--enable-lora-overlap-loading`, and a checkpoint whose LM head is tied to its embedding."""
    from harness.targets.decode.real_lora import Serving

    backend = draw(narrow("lora_backend", st.sampled_from(LORA_BACKENDS), domain=LORA_BACKENDS).filter(
        lambda b: lora_missing(b) is None), label="lora_backend")
    max_loras = draw(narrow("max_loras_per_batch", st.sampled_from([2, 3, 4]), domain=[2, 3, 4]),
                     label="max_loras_per_batch")
    return Serving(backend, max_loras, embeddings=draw(st.booleans(), label="embeddings"),
                   max_lora_rank=draw(st.sampled_from([None, 8]), label="max_lora_rank"),
                   all_targets=draw(st.booleans(), label="all_targets"),
                   overlap_loading=draw(st.booleans(), label="overlap_loading"),
                   tied=draw(st.booleans(), label="tied"))


class LoRAServerLifetime(RuleBasedStateMachine):
    """A LoRA server (`harness.targets.decode.lora_lifetime`): one capture at drawn `lora_servings` settings and
    capture list, then drawn loads (by path or from tensors, pinned or not, a fresh or the stable id), unloads and
    decode batches on whatever is served, each checked by `lora-lifecycle`, and each admitted batch by
    `eager-equality` and `lora-reference` against its adapters' merged models."""

    def __init__(self):
        super().__init__()
        self.server, self.drawn, self.program = None, None, []

    def _example(self, rule: str):
        case, serving = self.drawn
        return example("real_models_lora_served", family="dense", rule=rule,
                       **lora_program_to_drawn(case, serving, self.program))

    @initialize(case=real_cases(), serving=lora_servings())
    def start(self, case, serving):
        self.drawn = case, serving
        with self._example("start") as ex:
            self.server = start_lora_server(ex, case, serving)

    def _play(self, step, rule: str) -> None:
        self.program.append(step)
        with self._example(rule):
            self.server.play(len(self.program) - 1, step)

    def teardown(self):
        if self.server is not None:
            self.server.stop()

    # the tokenizer manager refuses a load past --max-loaded-loras before SGLang's LoRA manager sees it
    @precondition(lambda self: self.server is not None and len(self.server.served) < (
        self.server.target.serving.max_loaded_loras() or len(LOADS) + 3))
    @rule(load=st.sampled_from(LOADS), pinned=st.booleans(), source=st.sampled_from(["path", "tensors"]),
          stable_id=st.booleans())
    def load(self, load, pinned, source, stable_id):
        from harness.targets.decode.lora_lifetime import Load

        # the --lora-paths id is reused only once its name is free: a name still served keeps that id in the
        # manager, and the tokenizer manager never sends a held id to the backend (SGLang asserts it)
        stable_id = stable_id and load[0] not in self.server.served
        self._play(Load(load[0], load[1], pinned, source, stable_id), "load")

    @precondition(lambda self: self.server is not None and self.server.served)
    @rule(data=st.data())
    def unload(self, data):
        from harness.targets.decode.lora_lifetime import Unload

        self._play(Unload(data.draw(st.sampled_from(sorted(self.server.served)), label="adapter")), "unload")

    @precondition(lambda self: self.server is not None)
    @rule(data=st.data())
    def serve(self, data):
        """A decode batch of a drawn size on drawn served adapters: at most one more distinct than the pool's
        slots, so admission is probed past them."""
        from harness.targets.decode.lora_lifetime import Serve

        case, serving = self.drawn
        max_loras = serving.max_loras_per_batch
        size = data.draw(st.integers(1, max(case.capture_bs)), label="batch size")
        names = [None, *sorted(self.server.served)]
        allowed = sorted(data.draw(st.sets(st.sampled_from(names), min_size=1, max_size=max_loras + 1),
                                   label="adapters served"), key=str)
        ids = data.draw(st.lists(st.sampled_from(allowed), min_size=size, max_size=size), label="adapters")
        item = data.draw(staged_batch(size), label="batch")
        self._play(Serve(dataclasses.replace(item, batch=dataclasses.replace(item.batch, lora_ids=ids))), "serve")


LORA_MACHINE_SETTINGS = settings(suite_settings(gate_examples=2, shrink_in_gate=False), deadline=None,
                                 **({"stateful_step_count": 40, "max_examples": 6} if NIGHTLY else
                                    {"stateful_step_count": 8}))
TestLoRAServerLifetime = pytest.mark.usefixtures("lora_device")(
    type("TestLoRAServerLifetime", (LoRAServerLifetime.TestCase,), {"settings": LORA_MACHINE_SETTINGS}))


def _serve(ids, seq_lens, rows, seed):
    from harness.targets.decode.base import DecodeBatch
    from harness.targets.decode.lora_lifetime import Serve
    from harness.targets.decode.real_model import StagedBatch

    return Serve(StagedBatch(DecodeBatch(input_ids=[(7 * seed + 13 * i) % 100 for i in range(len(ids))],
                                         positions=[n - 1 for n in seq_lens], seq_lens=seq_lens,
                                         req_pool_indices=rows, lora_ids=ids), seed))


def pinned_lifetime():
    """A lifetime the gate always plays (its machine's first draws are the simplest): "c" pinned from tensors
    beside "a"; "a" unloaded and "a" retrained (`a2`) loaded under its name and stable id, then served where "a"'s
    weights were; "b" pinned again as "b2", and a batch past the slots the two pins leave, refused; "wide"
    refused; "c" unloaded, and a batch on the pinned "b2", the base model and "a" served in its place."""
    from harness.targets.decode.lora_lifetime import Load, Unload

    return [Load("c", "c", pinned=True, source="tensors"), _serve(["a", "c", None], [9, 14, 3], [2, 5, 7], 1),
            Unload("a"), Load("a", "a2", stable_id=True), _serve(["a", "c"], [6, 11], [4, 1], 2),
            Load("b2", "b", pinned=True), _serve(["a", "b", "c"], [4, 5, 6], [1, 2, 3], 3), Load("wide", "wide"),
            Unload("c"), _serve(["b2", None, "a"], [12, 2, 8], [3, 6, 8], 4)]


def test_lora_server_pinned_lifetime(lora_device):
    """`pinned_lifetime` on a Triton LoRA server of three slots capturing 1 and 3, with overlap loading (each
    adapter copied into the pool on SGLang's load stream, the stream-order checker watching): every step checked as
    the machine checks it (`lora-lifecycle`, `eager-equality`, `lora-reference`, `stream-order`)."""
    from harness.targets.decode.real_lora import Serving

    case, program = DecodeCase(capture_bs=(1, 3), max_running_requests=8), pinned_lifetime()
    serving = Serving("triton", 3, overlap_loading=True)
    with example("real_models_lora_served", family="dense", rule="pinned",
                 **lora_program_to_drawn(case, serving, program)) as ex:
        run_lora_program(ex, case, serving, program)


# -- an EAGLE draft worker's lifetime: draft steps and draft extends on the graphs captured at its start ----------
@pytest.fixture(scope="module")
def draft_device(device_name, personality):
    """The draft worker on the cpu virtual device, beyond the gate: its capture (about 8 s) is the gate's explicit
    draft example's, which holds the same checks on four batches (`test_eagle_draft_replays_match_eager`)."""
    if settings.get_current_profile_name() == "gate":
        pytest.skip("the draft worker's lifetime runs in the nightly profile (--profile nightly)")
    from harness.targets.decode.eagle_draft import draft_missing

    yield from _stack_device(device_name, personality, "the draft worker", draft_missing)


class DraftWorkerLifetime(RuleBasedStateMachine):
    """See the module docstring: one capture at `draft_cases` settings, then drawn steps."""

    def __init__(self):
        super().__init__()
        self.case, self.tile, self.target, self.program = None, None, None, []

    def _example(self, rule: str):
        from harness.models.real import draft_family

        return example("real_models_draft", family=draft_family(self.case.spec.algorithm), rule=rule,
                       **draft_to_drawn(self.case, [self.program], self.tile))

    @initialize(drawn=draft_cases())
    def start(self, drawn):
        self.case, self.tile = drawn
        with self._example("start") as ex:
            self.target = capture_draft(ex, self.case, self.tile)

    def _play(self, batch, rule: str) -> None:
        self.program.append(batch)
        with self._example(rule):
            check_draft_item(self.target, batch, f"step {len(self.program) - 1}")

    @precondition(lambda self: self.target is not None)
    @rule(data=st.data())
    def draft(self, data):
        """A draft step of a drawn batch size (the next may be wider or narrower)."""
        size = data.draw(st.integers(1, max(self.case.capture_bs)), label="batch size")
        self._play(data.draw(draft_batches(self.case, size), label="draft batch"), "draft")

    @precondition(lambda self: self.target is not None)
    @rule(data=st.data())
    def extend(self, data):
        """The draft extend after a verify of a drawn batch size, each request accepting a drawn length."""
        size = data.draw(st.integers(1, max(self.case.capture_bs)), label="batch size")
        self._play(data.draw(extend_batches(self.case, size), label="extend batch"), "extend")


# nightly: 7 machines of up to 30 steps (past the 200 steps a served stack the issue asks for)
DRAFT_MACHINE_SETTINGS = settings(suite_settings(gate_examples=1, shrink_in_gate=False), deadline=None,
                                  **({"stateful_step_count": 30, "max_examples": 7} if NIGHTLY else
                                     {"stateful_step_count": 8}))
TestDraftWorkerLifetime = pytest.mark.usefixtures("draft_device")(
    type("TestDraftWorkerLifetime", (DraftWorkerLifetime.TestCase,), {"settings": DRAFT_MACHINE_SETTINGS}))
