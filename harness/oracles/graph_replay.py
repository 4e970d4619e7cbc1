"""A forward that took the graph path must have replayed its captured graphs, and created none.

Known bug 2 on SGLang 0.5.16+ is numerically silent: after the Dynamo recompile the new pieces have no capture
stream and run eagerly. The runner still reports the graph path (`can_run_graph` was true, `execute` ran), so
only a count of what the device replayed shows that the captured graphs were bypassed. The evidence is a delta
of `harness.counter`: `mark = counter.mark()` before the forward, `replay_delta(counter.since(mark))` after.
"""
from __future__ import annotations

from harness.oracles import OracleFailure

ORACLE = "graph-replay"


def replay_delta(since: dict) -> dict:
    """This oracle's evidence from a `counter.since(mark)` over one forward."""
    return {"replays": since["num_graph_replays"], "new_graphs": since["num_graphs_created"],
            "new_captures": since["num_graphs_captured"]}


def check_graph_forward(delta: dict, expected_replays: int, *, context: str = "") -> None:
    """The graph path replayed exactly `expected_replays` captured graphs and captured nothing new."""
    where = f" ({context})" if context else ""
    if delta["replays"] == 0:
        raise OracleFailure(
            ORACLE, f"the forward took the graph path but replayed no captured graph: it ran eagerly{where}",
            expected_replays=expected_replays, **delta)
    if delta["new_graphs"] or delta["new_captures"]:
        raise OracleFailure(
            ORACLE, f"the forward created {delta['new_graphs']} new graph(s) at serve time{where}",
            expected_replays=expected_replays, **delta)
    if delta["replays"] != expected_replays:
        raise OracleFailure(
            ORACLE, f"the forward replayed {delta['replays']} graph(s), the capture recorded {expected_replays} "
                    f"per shape{where}: part of the forward ran outside its captured graphs",
            expected_replays=expected_replays, **delta)


def check_eager_forward(delta: dict, *, context: str = "") -> None:
    """SGLang's eager path ran: it must neither replay nor create graphs."""
    if delta["replays"] or delta["new_graphs"]:
        raise OracleFailure(
            ORACLE, f"the eager path replayed {delta['replays']} graph(s) and created {delta['new_graphs']}"
                    + (f" ({context})" if context else ""), **delta)




def check_dropped(captured: set[int], held: set[int], since: dict, *, context: str = "") -> None:
    """SGLang dropped a runner's graphs (elastic EP's reset) while the runner is still referenced, as the model
    runner holds it until the recapture replaces it: every graph its capture made (`captured`, the device's ids)
    must be released, reset or out of the runner's reach (`held`: the captured graphs the runner still reaches),
    and nothing captured or replayed meanwhile (`since`: the counter's growth over the drop)."""
    where = f" ({context})" if context else ""
    kept = sorted(captured & held)
    if kept:
        raise OracleFailure(
            ORACLE, f"dropping the runner's graphs left {len(kept)} of the {len(captured)} graph(s) its capture made "
                    f"alive and captured{where}: their memory stays held through the recapture", kept=kept,
            captured=sorted(captured))
    if since["num_graph_replays"] or since["num_graphs_captured"]:
        raise OracleFailure(ORACLE, f"dropping the runner's graphs replayed or captured graphs{where}", **since)
