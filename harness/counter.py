"""One counter for everything the harness counts in the compile and graph stack (after vLLM's
`vllm/compilation/counter.py`): the virtual device bumps its graph counts, the NPU personality's compile
backends their compiles, Dynamo's compile-start callback the frames compiled; oracles and tests read deltas.

    with counter.expect(num_graphs_captured=3, num_graph_replays=0):   # exact deltas over the block
        ...
    mark = counter.mark(); ...; counter.since(mark)["num_graph_replays"]

A failed `expect` is a plain AssertionError: it is a statement about the harness's instruments (self-tests use
it); an oracle that checks one of SGLang's contracts reads `since()` and raises its own `OracleFailure`, naming
that contract. Dynamo's callbacks are dropped by `torch._dynamo.reset()`, so `mark()` (re)registers the counting
callback: compiles after a reset inside a measured block are not seen.
"""
from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator


@dataclasses.dataclass
class Counter:
    # Dynamo frame compiles (compile-start callbacks with trigger DYNAMO; a compile nested in one counts once)
    num_dynamo_frames_compiled: int = 0
    # the virtual device's graphs (`harness.devices.cpu.VirtualGraph`): objects created, captures ended, replays
    num_graphs_created: int = 0
    num_graphs_captured: int = 0
    num_graph_replays: int = 0
    # FX graphs compiled by the npu personality's compile backends (the platform's npugraph_ex hook, torchair's)
    num_platform_backend_compiles: int = 0

    def clone(self) -> Counter:
        return dataclasses.replace(self)

    def mark(self) -> Counter:
        """A snapshot to pass to `since()` later."""
        count_dynamo_compiles()
        return self.clone()

    def since(self, mark: Counter) -> dict[str, int]:
        """Each count's growth since `mark`."""
        return {f.name: getattr(self, f.name) - getattr(mark, f.name) for f in dataclasses.fields(self)}

    @contextlib.contextmanager
    def expect(self, **deltas: int) -> Iterator[None]:
        """The block must grow each named count by exactly its delta (unnamed counts are not checked)."""
        names = {f.name for f in dataclasses.fields(self)}
        unknown = sorted(set(deltas) - names)
        if unknown:
            raise TypeError(f"counter.expect: no count named {', '.join(unknown)}; counts: {', '.join(sorted(names))}")
        before = self.mark()
        yield
        after = self.clone()
        wrong = [f"    {name}: before {getattr(before, name)}, after {getattr(after, name)}, expected +{want} "
                 f"(got +{getattr(after, name) - getattr(before, name)})"
                 for name, want in deltas.items() if getattr(after, name) - getattr(before, name) != want]
        if wrong:
            raise AssertionError(f"counter.expect: {len(wrong)} count(s) not as expected\n" + "\n".join(wrong))


counter = Counter()


def _on_compile_start(args) -> None:
    if getattr(getattr(args, "callback_trigger", None), "name", "DYNAMO") == "DYNAMO":
        counter.num_dynamo_frames_compiled += 1


def count_dynamo_compiles() -> None:
    """Register the Dynamo compile-start callback that bumps `num_dynamo_frames_compiled`, unless it is."""
    from torch._dynamo.callback import callback_handler

    if _on_compile_start not in callback_handler.start_callbacks:
        callback_handler.register_start_callback(_on_compile_start)
