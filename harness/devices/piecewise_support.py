"""A ledger of the virtual device's graphs: which were created, how often each was replayed.

`harness.devices.cpu` counts replays per graph (`VirtualGraph.replays`) and logs captures (`CAPTURES`), but keeps
no handle on the graph objects, which SGLang's backends own (`CUDAPiecewiseBackend`'s per-size entries,
the breakable/full backends' tables). The graph-replay oracle needs "how many captured graphs ran during this
forward": `graph_ledger()` swaps the graph class that `cpu.install()` put in `torch.cuda` / `torch.cpu` for a
subclass that registers each instance, for the duration of the block (nested inside `cpu.install()`).

Candidate for `harness/devices/cpu.py` (a global replay log next to `CAPTURES`); kept here so that file stays
its owner's.
"""
from __future__ import annotations

import contextlib
from typing import Iterator

import torch

from harness.devices import cpu


class GraphLedger:
    def __init__(self) -> None:
        self.graphs: list[cpu.VirtualGraph] = []

    @property
    def captured(self) -> int:
        return sum(1 for g in self.graphs if g._captured)

    @property
    def replays(self) -> int:
        return sum(g.replays for g in self.graphs)

    def mark(self) -> tuple[int, int]:
        """(graphs created so far, replays so far): pass to `since()` after a forward."""
        return len(self.graphs), self.replays

    def since(self, mark: tuple[int, int]) -> dict:
        created, replays = mark
        return {"new_graphs": len(self.graphs) - created, "replays": self.replays - replays,
                "new_captures": sum(1 for g in self.graphs[created:] if g._captured)}


@contextlib.contextmanager
def graph_ledger() -> Iterator[GraphLedger]:
    if not cpu.installed():
        raise RuntimeError("graph_ledger() must run inside harness.devices.cpu.install()")
    ledger = GraphLedger()

    class LedgerGraph(cpu.VirtualGraph):
        def __init__(self, *args, **kwargs) -> None:
            super().__init__(*args, **kwargs)
            ledger.graphs.append(self)

    saved = [(module, getattr(module, "CUDAGraph")) for module in (torch.cuda, torch.cpu)]
    for module, _ in saved:
        module.CUDAGraph = LedgerGraph
    try:
        yield ledger
    finally:
        for module, original in saved:
            module.CUDAGraph = original
