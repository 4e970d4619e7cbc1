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
plays that program on a new server."""
from __future__ import annotations

import pytest
from hypothesis import settings, strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, precondition, rule

from harness.devices import get_device
from harness.errors import PathMissing
from harness.models.real import FAMILIES
from harness.oracles.recompile import RecompileWatcher
from harness.profiles import suite_settings
from harness.record import example
from harness.targets.decode import real_model, scheduled, served
from harness.targets.decode.base import DecodeCase
from harness.targets.decode.scheduled import Admit, Decode, Finish, Mix, ProgramPlayer
from suites.real_common import served_program_to_drawn, start_served

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


@pytest.fixture(scope="module")
def served_device(device_name, personality):
    if device_name != "cpu" or personality != "cuda":
        pytest.skip(f"the served stack runs on the cpu virtual device under the cuda personality, not "
                    f"{device_name}/{personality}: its Triton kernels run by Triton's CPU interpreter")
    try:
        real_model.load()
    except PathMissing as missing:
        pytest.skip(str(missing))
    reason = served.missing() or scheduled.missing() or scheduled.mixing_missing()
    if reason:
        pytest.skip(reason)
    found = get_device(device_name)
    with found.install(personality):
        yield found


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
