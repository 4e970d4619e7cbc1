"""The settings an ablation re-run imposes on a test process, read from its environment in `pytest_configure`
(before any suite imports SGLang):

- `TORCH_COMPILE_BACKEND=eager|aot_eager|inductor|...`: every `torch.compile` call compiles with that backend (the
  variable PyTorch's `CompilerBisector` sets for the command it bisects, so `python -m
  torch._inductor.compiler_bisector run <replay command>` works on a harness replay); `mode` and `options`, which
  only Inductor reads, are dropped for another backend;
- `HARNESS_ABLATE=compile-off`: `torch.compiler.set_stance("force_eager")`: compiled functions run eagerly;
- `HARNESS_ABLATE=graphs-rerun`: the virtual device's captures re-run their Python at each replay instead of
  replaying the recorded ops (no frozen graph: the nearest the CPU device has to graphs off);
- both, comma-separated."""
from __future__ import annotations

import functools
import os

BACKEND = "TORCH_COMPILE_BACKEND"
ABLATE = "HARNESS_ABLATE"
KNOWN = ("compile-off", "graphs-rerun")


def requested() -> dict[str, str]:
    """The settings this process's environment asks for (empty: none)."""
    found = {name: "on" for name in os.environ.get(ABLATE, "").split(",") if name}
    unknown = set(found) - set(KNOWN)
    if unknown:
        from harness.errors import HarnessError

        raise HarnessError(f"{ABLATE}={os.environ[ABLATE]}: unknown setting(s) {sorted(unknown)}; known: {KNOWN}")
    if os.environ.get(BACKEND):
        found["backend"] = os.environ[BACKEND]
    return found


def apply(patch) -> dict[str, str]:
    """Apply the requested settings through `patch` (a pytest MonkeyPatch, undone with it); returns them."""
    found = requested()
    if "backend" in found:
        import torch

        patch.setattr(torch, "compile", _with_backend(torch.compile, found["backend"]))
    if "compile-off" in found:
        import torch

        torch.compiler.set_stance("force_eager")
    if "graphs-rerun" in found:
        from harness.devices import cpu

        patch.setattr(cpu, "current_capture_mode", lambda: "rerun")
    return found


def _with_backend(compile_fn, backend: str):
    @functools.wraps(compile_fn)
    def compile_with(model=None, **kwargs):
        kwargs["backend"] = backend
        if backend != "inductor":
            kwargs.pop("mode", None)
            kwargs.pop("options", None)
        return compile_fn(model, **kwargs)
    return compile_with
