"""Cases for `build_torch_compile_kwargs`: platform kind, hook return values, compile mode, module."""
from __future__ import annotations

import dataclasses
from typing import Any

from hypothesis import strategies as st

from harness.conditions import narrow
from harness.models.small import DTYPES, KINDS, ModuleSpec
from harness.targets.compile_kwargs import PLATFORM_KINDS

# Every mode torch.compile accepts (torch 2.14 adds "lite"), and None.
MODES = (None, "default", "reduce-overhead", "max-autotune-no-cudagraphs", "max-autotune", "lite")
UNKNOWN_BACKEND = "harness_no_such_backend"


def recording_backend(graph_module, example_inputs):
    """A callable backend as an out-of-tree platform might return: runs the traced graph as it is."""
    recording_backend.graphs += 1
    return graph_module.forward


recording_backend.graphs = 0

BACKENDS = ("inductor", "eager", "aot_eager", recording_backend, UNKNOWN_BACKEND)

# Realistic inductor option dicts an out-of-tree platform returns for a module (all valid on a CPU).
OPTIONS = (
    None,
    {},
    {"epilogue_fusion": True, "max_autotune": False},
    {"freezing": False, "shape_padding": True},
    {"triton.cudagraphs": False, "coordinate_descent_tuning": False},
)


@dataclasses.dataclass(frozen=True)
class CompileCase:
    platform: str
    backend: Any
    options: Any
    mode: str | None
    entry: str          # "build": build_torch_compile_kwargs; "resolve": resolve_torch_compile_kwargs
    pass_module: bool   # whether the caller hands the module in
    module: ModuleSpec
    comm_overlap: bool = False  # enable_inductor_compute_comm_overlap, as the denoising stage passes it

    @classmethod
    def from_drawn(cls, drawn: dict) -> CompileCase:
        """Rebuild a case from its record (the callable backend is recorded by name)."""
        backend = recording_backend if drawn["backend"] == recording_backend.__name__ else drawn["backend"]
        return cls(**{**drawn, "backend": backend, "module": ModuleSpec(**drawn["module"])})

    def drawn(self) -> dict:
        backend = getattr(self.backend, "__name__", self.backend)
        return {"platform": self.platform, "backend": backend, "options": self.options, "mode": self.mode,
                "entry": self.entry, "pass_module": self.pass_module, "module": dataclasses.asdict(self.module),
                "comm_overlap": self.comm_overlap}


modules = st.builds(ModuleSpec, kind=st.sampled_from(KINDS), batch=st.integers(1, 4),
                    features=st.sampled_from((8, 16)), dtype=st.sampled_from(tuple(DTYPES)),
                    seed=st.integers(0, 3))


# The out-of-tree branch holds most of the contract: half the draws go there.
_PLATFORM_WEIGHTS = ("oot", "oot", "oot", "cpu", "cuda", "npu")


@st.composite
def compile_cases(draw, platforms=PLATFORM_KINDS, entries=("build", "resolve"), comm_overlap=True) -> CompileCase:
    """`entries` and `comm_overlap`: what the installed release has (see targets.compile_kwargs.capabilities)."""
    platform = draw(narrow("platform", st.sampled_from([p for p in _PLATFORM_WEIGHTS if p in platforms]),
                           platforms))
    entry = draw(st.sampled_from(entries))
    out_of_tree = platform == "oot"  # only an out-of-tree platform's hooks are asked
    return CompileCase(
        platform=platform,
        backend=draw(narrow("backend", st.sampled_from(BACKENDS), BACKENDS)) if out_of_tree else "inductor",
        options=draw(narrow("options", st.sampled_from(OPTIONS))) if out_of_tree else None,
        mode=draw(narrow("mode", st.sampled_from(MODES), MODES)),
        entry=entry,
        pass_module=True if entry == "resolve" else draw(st.booleans()),
        module=draw(modules),
        comm_overlap=draw(st.booleans()) if comm_overlap else False,
    )
