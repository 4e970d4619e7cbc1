"""An ablation in the diagnosis: a failing example re-run with less machinery, each setting in a fresh process
(`harness.evidence.settings`), to name the smallest setting that still fails with the same oracle. Ordered from the
least machinery to the most: with compile off and the graphs re-run there is no Dynamo and no frozen graph left, so
a failure that stays is SGLang's eager code (or the harness's); one that goes away with the graphs re-run is the
frozen graph's; a backend that fails where `eager` passes points at AOTAutograd or Inductor (then PyTorch's
`CompilerBisector`: `python -m torch._inductor.compiler_bisector run <the replay command>`)."""
from __future__ import annotations

from pathlib import Path

from harness.evidence.rerun import Outcome, rerun
from harness.evidence.settings import ABLATE, BACKEND

SETTINGS: tuple[tuple[str, dict[str, str]], ...] = (
    ("compile off, graphs re-run", {ABLATE: "compile-off,graphs-rerun"}),
    ("compile off", {ABLATE: "compile-off"}),
    ("graphs re-run", {ABLATE: "graphs-rerun"}),
    ("backend eager", {BACKEND: "eager"}),
    ("backend aot_eager", {BACKEND: "aot_eager"}),
    ("backend inductor", {BACKEND: "inductor"}),
)
BISECT = "python -m torch._inductor.compiler_bisector run"


def ablate(failure: dict, folder: Path, timeout: float = 600) -> dict:
    """Every setting's outcome and the conclusion, as the failure record gains them."""
    outcomes: list[tuple[str, Outcome]] = []
    for index, (name, env) in enumerate(SETTINGS):
        outcomes.append((name, rerun(failure, folder / f"{index}-{name.replace(' ', '-').replace(',', '')}", env,
                                     timeout)))
    return {"ablation": [{"setting": name, "verdict": o.verdict, "oracle": o.oracle, "diagnosis": o.diagnosis[:200],
                          "seconds": round(o.seconds, 1)} for name, o in outcomes],
            "ablation_says": conclusion(failure, outcomes)}


def conclusion(failure: dict, outcomes: list[tuple[str, Outcome]]) -> str:
    """The smallest setting that still fails with the failure's oracle, and what that implies."""
    still = [name for name, outcome in outcomes if outcome.same_failure(failure)]
    if not still:
        return (f"no ablation fails with {failure.get('oracle')}: the failure needs the run's own settings (graphs "
                "recorded, its compile backend); replay it as it is")
    smallest = still[0]
    if smallest == "compile off, graphs re-run":
        return (f"fails with {failure.get('oracle')} even with compile off and the graphs re-run: no Dynamo and no "
                "frozen graph are needed (SGLang's eager path, or what the runner hands the model)")
    if smallest == "compile off":
        return "fails with compile off, passes with the graphs re-run: the frozen graph is needed, Dynamo is not"
    if smallest == "graphs re-run":
        return "fails with the graphs re-run, passes with compile off: Dynamo is needed, a frozen graph is not"
    passed = {name for name, outcome in outcomes if outcome.verdict == "pass"}
    if smallest != "backend eager" and "backend eager" in passed:
        return (f"{smallest} fails where backend eager passes: AOTAutograd or Inductor is needed; narrow it with "
                f"`{BISECT} <replay command>`")
    return f"the smallest setting that still fails is {smallest}"
