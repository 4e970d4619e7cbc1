"""Between forwards, SGLang's process-wide capture/replay state is back to rest.

SGLang keeps graph state in module globals: the PCG capture stream (`compile_phase`), the torch.compile warm-up
flag, the piecewise and breakable "inside a graph" flags, the forward contexts, the DP "capturing prefill graph"
flag. A step that leaves one set changes what the next step does (a capture stream left set lets a serve-time
recompile capture silently; a mode flag left on sends an eager forward down the graph code). The probes (what
to read and its resting value) come from the target adapter, per installed layout.
"""
from __future__ import annotations

from collections.abc import Callable

from harness.oracles import OracleFailure

ORACLE = "process-state"


def check_at_rest(probes: dict[str, tuple[Callable[[], object], object]], *, context: str = "") -> None:
    left = {}
    for name, (read, resting) in probes.items():
        value = read()
        if value is not resting and value != resting:
            left[name] = repr(value)[:200]
    if left:
        raise OracleFailure(
            ORACLE, f"process-wide graph state left set after a forward{': ' + context if context else ''}: "
                    + ", ".join(sorted(left)), left=left)
