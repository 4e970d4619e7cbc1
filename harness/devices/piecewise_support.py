"""Compatibility alias: `graph_ledger()` over `harness.counter` (graph counts are the counter's now).

Kept for `harness/targets/prefill_session.py` until it reads `counter.mark()` / `counter.since(mark)` itself
(`harness.oracles.graph_replay.replay_delta` turns a counter delta into that oracle's evidence); then delete.
"""
from __future__ import annotations

import contextlib
from typing import Iterator

from harness.counter import Counter, counter
from harness.devices.cpu import installed


class GraphLedger:
    """Graph counts since the ledger opened (`captured`), or since a `mark()` (`since`), in the old ledger's keys."""

    def __init__(self) -> None:
        self._opened = counter.mark()

    @property
    def captured(self) -> int:
        return counter.num_graphs_captured - self._opened.num_graphs_captured

    def mark(self) -> Counter:
        return counter.mark()

    def since(self, mark: Counter) -> dict:
        delta = counter.since(mark)
        return {"new_graphs": delta["num_graphs_created"], "replays": delta["num_graph_replays"],
                "new_captures": delta["num_graphs_captured"]}


@contextlib.contextmanager
def graph_ledger() -> Iterator[GraphLedger]:
    if not installed():
        raise RuntimeError("graph_ledger() must run inside harness.devices.cpu.install()")
    yield GraphLedger()
