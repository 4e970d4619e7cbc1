"""Devices: where graph capture runs. One interface, `get_device(name)`:

- `cpu`  -- the virtual device (`harness.devices.cpu`): CUDA-graph semantics on the CPU, two capture modes
            ("record", "rerun"), personalities "cuda" and "npu" (`harness.personalities.ascend`, added to the
            device's patch set). Always available.
- `cuda` -- a real GPU with real CUDA graphs; skipped with a reason when `torch.cuda.is_available()` is False.
- `npu`  -- a real Ascend NPU through torch_npu; skipped with a reason when torch_npu does not import or sees no NPU.

A `Device` gives: `name`, `torch_device` (the string SGLang's model runner holds as `device`), `skip_reason`
(None when usable), `install(personality)` (a context manager plugging the device in where SGLang looks, undone
on exit; a no-op for real hardware), `capture_mode(mode)` (a context manager choosing the virtual device's capture
mode; a no-op on real hardware), and `capture_modes_used()` (the mode of each capture since `reset()`:
"record"/"rerun" on the virtual device, "cuda-graph"/"npu-graph" on hardware, where it is not observed per capture).
Graphs created, captured and replayed are counted on `harness.counter.counter` (`counts_graphs`): by the virtual
device itself, and on a real GPU by `torch.cuda.CUDAGraph`'s own methods, wrapped while the device is installed.
"""
from __future__ import annotations

import contextlib
import dataclasses
import importlib
import os
from collections.abc import Callable, Iterator

DEVICES = ("cpu", "cuda", "npu")
PERSONALITIES = ("cuda", "npu")


@dataclasses.dataclass
class Device:
    name: str
    torch_device: str
    skip_reason: str | None
    _install: Callable[[str], contextlib.AbstractContextManager]
    _capture_mode: Callable[[str], contextlib.AbstractContextManager]
    _modes_used: Callable[[], list]
    _reset: Callable[[], None]
    counts_graphs: bool = False  # whether `harness.counter` sees its graph captures and replays while installed

    @property
    def available(self) -> bool:
        return self.skip_reason is None

    def install(self, personality: str = "cuda") -> contextlib.AbstractContextManager:
        if self.skip_reason:
            raise RuntimeError(self.skip_reason)
        return self._install(personality)

    def capture_mode(self, mode: str) -> contextlib.AbstractContextManager:
        return self._capture_mode(mode)

    def capture_modes_used(self) -> list:
        return self._modes_used()

    def reset(self) -> None:
        self._reset()


@contextlib.contextmanager
def _virtual_install(personality: str) -> Iterator[None]:
    """The virtual device, and on its patch set the personality's stand-ins: one unit, undone together."""
    if personality not in PERSONALITIES:
        raise ValueError(f"personality {personality!r} is not one of {PERSONALITIES}")
    from harness.devices import cpu

    with cpu.install() as patches:
        if personality == "npu":
            from harness.personalities import ascend

            ascend.install_on_virtual_device(patches)
        yield


def _cpu() -> Device:
    from harness.devices import cpu

    return Device("cpu", "cpu", None, _virtual_install, cpu.capture_mode, lambda: [c.mode for c in cpu.CAPTURES],
                  cpu.reset_log, counts_graphs=True)  # the virtual device bumps the counter itself


@contextlib.contextmanager
def _nothing(*args) -> Iterator[None]:
    yield


def _real_hardware_install(native: str, refusal: str) -> Callable[[str], contextlib.AbstractContextManager]:
    """Real hardware needs no plugging in; it runs only its own personality (`refusal` says why another won't)."""

    @contextlib.contextmanager
    def install(personality: str) -> Iterator[None]:
        if personality != native:
            raise RuntimeError(f"personality {personality!r} {refusal}")
        yield

    return install


@contextlib.contextmanager
def counting_cuda_graphs() -> Iterator[None]:
    """The hardware counterpart of the virtual device's counts: `torch.cuda.CUDAGraph`'s capture_begin (a graph
    made), capture_end (captured) and replay bump `harness.counter`, whoever calls them (SGLang's full, breakable
    and piecewise backends all capture through that class); undone on exit."""
    import pytest
    import torch

    from harness.counter import counter

    graph_class = torch.cuda.CUDAGraph

    def counted(method: str, count: str):
        original = getattr(graph_class, method)

        def call(self, *args, **kwargs):
            result = original(self, *args, **kwargs)
            setattr(counter, count, getattr(counter, count) + 1)
            return result

        return call

    with pytest.MonkeyPatch.context() as patches:
        for method, count in (("capture_begin", "num_graphs_created"), ("capture_end", "num_graphs_captured"),
                              ("replay", "num_graph_replays")):
            patches.setattr(graph_class, method, counted(method, count))
        yield


def _cuda() -> Device:
    import torch

    reason = None if torch.cuda.is_available() else "no CUDA GPU visible (torch.cuda.is_available() is False)"
    only_cuda = _real_hardware_install("cuda", "needs the cpu virtual device; real CUDA runs as cuda")

    @contextlib.contextmanager
    def install(personality: str) -> Iterator[None]:
        with only_cuda(personality), counting_cuda_graphs():
            yield

    return Device("cuda", "cuda", reason, install, _nothing, lambda: ["cuda-graph"], lambda: None,
                  counts_graphs=True)  # through counting_cuda_graphs


def _npu() -> Device:
    reason = None
    try:
        os.environ.setdefault("TORCH_DEVICE_BACKEND_AUTOLOAD", "0")
        torch_npu = importlib.import_module("torch_npu")  # noqa: F841 - registers torch.npu
        import torch

        if not torch.npu.is_available():
            reason = "torch_npu imported but sees no Ascend NPU (torch.npu.is_available() is False)"
    except Exception as error:  # noqa: BLE001 - any import failure is a reason to skip, stated
        reason = f"torch_npu is not importable ({type(error).__name__}: {error}); real NPU runs need Ascend CANN"

    install = _real_hardware_install("npu", "on a real NPU: use --personality npu")
    return Device("npu", "npu", reason, install, _nothing, lambda: ["npu-graph"], lambda: None)


_FACTORIES = {"cpu": _cpu, "cuda": _cuda, "npu": _npu}


def prepare(name: str) -> str:
    """Process-wide preparation before anything imports SGLang; returns what the run's records should say about
    `sgl_kernel`. On a GPU without the real package (the nightly image carries torch, not sgl_kernel's kernels),
    SGLang's kernel names come from the stand-in, whose kernels raise if called."""
    if name != "cuda":
        return "not needed"
    import torch

    if not torch.cuda.is_available():
        return "not needed (no GPU)"
    from harness.devices import sgl_kernel_standin

    reason = sgl_kernel_standin.ensure("cuda")
    return "real" if reason is None else f"import-time stand-in ({reason})"


def get_device(name: str) -> Device:
    """The device called `name`; an unknown name raises ValueError listing the choices."""
    if name not in _FACTORIES:
        raise ValueError(f"unknown device {name!r}: choose one of {', '.join(DEVICES)} "
                         "(cpu = virtual device on the CPU, cuda = real GPU, npu = real Ascend via torch_npu)")
    return _FACTORIES[name]()
