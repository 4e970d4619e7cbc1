"""Capture legality on the virtual device: what CUDA refuses while a stream is capturing fails here the same way,
with CUDA's (or PyTorch's) own text, so a log from a GPU and a failure on the CPU read alike.

Enforced while a capture is open (`begin` .. `end`, both capture modes), each rule with the text a GPU gives:
- synchronisation: `synchronize()` of the device, a stream or an event, `Event.query()`, `Stream.query()`
  -> `NOT_PERMITTED` (cudaErrorStreamCaptureUnsupported under the default "global" capture mode);
- host reads of device values: `.item()`, `bool()` / `int()` / `float()` of a tensor, `if tensor:`
  (aten `_local_scalar_dense`), and ops whose output shape depends on the data (`nonzero`, `masked_select`, boolean
  indexing, `unique*`, `repeat_interleave` without `output_size`), which copy a count to the host and wait
  -> `NOT_PERMITTED`;
- `.tolist()` / `.numpy()` of a device tensor: a device-to-host copy into unpinned memory -> `PINNED_COPY`;
- the CUDA generator's seed and state: `torch.cuda.initial_seed` / `get_rng_state` (-> `current_seed`),
  `torch.cuda.manual_seed` and `torch.manual_seed` (-> `set_current_seed`), `seed` (-> `seed`), `set_rng_state`
  -> `generator_text(...)`;
- a capture begun on the default stream -> `DEFAULT_STREAM` (PyTorch's check in `CUDAGraph::capture_begin`).
A read of pinned host memory (`harness.devices.host_memory.is_pinned_host`) passes all of these: it is host memory
on a GPU too.
Not enforced, and why:
- CPU<->device copies of unpinned memory other than `.tolist()` / `.numpy()` (`.cpu()`, `.to("cpu")`,
  `copy_` from a host tensor): every tensor of the virtual device is a CPU tensor, so a host tensor and a device
  tensor cannot be told apart;
- methods of a `torch.Generator` object (a C type, not patchable) and the CPU generator (legal on a GPU too);
- waits on events recorded outside the capture, and memory allocation rules (cudaMalloc in "global" mode): the
  virtual device has no allocator of its own;
- ops the rules cannot classify (any op outside the `aten` / `prims` namespaces, e.g. a custom kernel): they run,
  and their names are kept in `ADVISORIES` for the record, never a crash.
Outside a capture (warm-up, eager, replay) nothing here applies.
"""
from __future__ import annotations

import dataclasses
import sys
import threading
from typing import Any

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from harness.devices.host_memory import is_pinned_host

NOT_PERMITTED = "CUDA error: operation not permitted when stream is capturing"
PINNED_COPY = ("Cannot copy between CPU and CUDA tensors during CUDA graph capture unless the CPU tensor is pinned. "
               "Please use tensor.pin_memory() or allocate the tensor with pin_memory=True.")
DEFAULT_STREAM = ("CUDA graphs must be captured on a non-default stream. (However, after capture, it's ok to replay "
                  "them on the default stream.)")


def generator_text(method: str) -> str:
    """`at::cuda::assertNotCapturing("Cannot call CUDAGeneratorImpl::<method>")`'s message."""
    return (f"Cannot call CUDAGeneratorImpl::{method} during CUDA graph capture. If you need this call to be "
            "captured, please file an issue. Current cudaStreamCaptureStatus: cudaStreamCaptureStatusActive")


class CaptureLegalityError(RuntimeError):
    """What CUDA raises for an operation it refuses during stream capture (the text is CUDA's)."""


@dataclasses.dataclass
class Violation:
    rule: str  # "synchronize", "host-read", "generator", "default-stream", "host-copy"
    operation: str  # what was called, e.g. "torch.cuda.synchronize", "aten.nonzero"
    message: str  # CUDA's text
    site: str  # the innermost caller outside torch and this package, "file:line in function"


VIOLATIONS: list[Violation] = []
ADVISORIES: list[str] = []  # ops inside a capture the rules could not classify, by name, each once
_capture = threading.local()  # .graph: what this thread is capturing into; .undo: patches made for the capture

_DATA_DEPENDENT = {"nonzero", "masked_select", "_unique", "_unique2", "unique_dim", "unique_consecutive",
                   "unique_dim_consecutive", "argwhere", "masked_scatter"}
_HOST_READ = {"_local_scalar_dense", "item"}
_CLASSIFIED_NAMESPACES = {"aten", "prims"}
_OWN_FILES = (__file__.rpartition("/")[0], torch.__file__.rpartition("/")[0], "<frozen", "contextlib")


def caller_site(skip: int = 2) -> str:
    """The innermost frame outside torch and the device layer: where the refused call was made."""
    frame = sys._getframe(skip)
    while frame is not None and frame.f_code.co_filename.startswith(_OWN_FILES):
        frame = frame.f_back
    if frame is None:
        return "?"
    return f"{frame.f_code.co_filename}:{frame.f_lineno} in {frame.f_code.co_name}"


def capturing() -> Any | None:
    """The graph this thread is capturing into, or None."""
    return getattr(_capture, "graph", None)


def refuse(rule: str, operation: str, message: str) -> None:
    """Record the violation and raise what CUDA raises."""
    VIOLATIONS.append(Violation(rule, operation, message, caller_site(3)))
    raise CaptureLegalityError(message)


def check_sync(operation: str) -> None:
    """A synchronisation or query: refused while capturing."""
    if capturing() is not None:
        refuse("synchronize", operation, NOT_PERMITTED)


def reset_log() -> None:
    VIOLATIONS.clear()
    ADVISORIES.clear()


def _bool_index(args) -> bool:
    indices = args[1] if len(args) > 1 else ()
    return any(isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8) for i in indices or ())


class LegalityMode(TorchDispatchMode):
    """Active only while a capture is open; sees every aten op (Dynamo keeps compiling: compiled code is not
    hidden by this mode, though inductor's fused kernels bypass the dispatcher and are not seen)."""

    @classmethod
    def ignore_compile_internals(cls) -> bool:
        return True

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = func.overloadpacket.__name__
        if func.namespace not in _CLASSIFIED_NAMESPACES:
            if f"{func.namespace}::{name}" not in ADVISORIES:
                ADVISORIES.append(f"{func.namespace}::{name}")
        elif name in _HOST_READ and not _host_tensor(args):
            refuse("host-read", f"aten.{name} (.item() / bool() / int() of a tensor)", NOT_PERMITTED)
        elif name in _DATA_DEPENDENT or (name == "index" and _bool_index(args)) or (
                name == "repeat_interleave" and isinstance(args[0] if args else None, torch.Tensor)
                and kwargs.get("output_size") is None and func._overloadname in ("Tensor", "self_Tensor")):
            refuse("host-read", f"aten.{name} (a data-dependent output shape)", NOT_PERMITTED)
        return func(*args, **kwargs)


def _host_tensor(args) -> bool:
    """Whether the op reads a tensor of pinned host memory (`harness.devices.host_memory`): host memory on a GPU
    too, so a read of it during a capture is legal there."""
    return bool(args) and isinstance(args[0], torch.Tensor) and is_pinned_host(args[0])


def _host_copy(name: str, original):
    def refused(self, *args, **kwargs):
        if capturing() is not None and not _host_tensor((self,)):
            refuse("host-copy", f"Tensor.{name}", PINNED_COPY)
        return original(self, *args, **kwargs)

    refused.__name__ = name
    return refused


def begin(graph: Any) -> None:
    """A capture into `graph` opens on this thread: the rules apply until `end()`."""
    _capture.graph = graph
    patches = pytest.MonkeyPatch()
    for name in ("tolist", "numpy"):
        patches.setattr(torch.Tensor, name, _host_copy(name, getattr(torch.Tensor, name)))
    mode = LegalityMode()
    mode.__enter__()
    _capture.undo = (patches, mode)


def end() -> None:
    """The capture closed (or was aborted): the rules stop applying."""
    undo = getattr(_capture, "undo", None)
    _capture.graph, _capture.undo = None, None
    if undo is not None:
        patches, mode = undo
        mode.__exit__(None, None, None)
        patches.undo()


# --------------------------------------------------------------------------------------------------------------
# The CUDA generator's seed and state: wrapped in `install_generator_rules` while the device is installed
# --------------------------------------------------------------------------------------------------------------
_CPU = torch.default_generator  # the virtual device's generator: torch.cuda's calls reach it outside a capture
_GENERATOR_CALLS = {  # (module, name): (the CUDAGeneratorImpl method the call reaches first, the call outside)
    ("torch.cuda", "initial_seed"): ("current_seed", lambda: _CPU.initial_seed()),
    ("torch.cuda", "get_rng_state"): ("current_seed", lambda device="cuda": _CPU.get_state()),
    ("torch.cuda", "get_rng_state_all"): ("current_seed", lambda: [_CPU.get_state()]),
    ("torch.cuda", "manual_seed"): ("set_current_seed", lambda seed: _CPU.manual_seed(seed) and None),
    ("torch.cuda", "manual_seed_all"): ("set_current_seed", lambda seed: _CPU.manual_seed(seed) and None),
    ("torch.cuda", "seed"): ("seed", lambda: _CPU.seed() and None),
    ("torch.cuda", "seed_all"): ("seed", lambda: _CPU.seed() and None),
    ("torch.cuda", "set_rng_state"): ("set_state", lambda state, device="cuda": _CPU.set_state(state) and None),
    ("torch", "manual_seed"): ("set_current_seed", None),  # seeds every device's generator; None: as it was
    ("torch", "seed"): ("seed", None),
    ("torch.random", "manual_seed"): ("set_current_seed", None),
    ("torch.random", "seed"): ("seed", None),
}


def _generator_call(qualified: str, method: str, original):
    message = (generator_text(method) if method != "set_state" else
               "Please ensure to utilize the CUDAGeneratorImpl::set_state_index method during capturing. "
               "Current cudaStreamCaptureStatus: cudaStreamCaptureStatusActive")

    def call(*args, **kwargs):
        if capturing() is not None:
            refuse("generator", qualified, message)
        return original(*args, **kwargs)

    call.__name__ = getattr(original, "__name__", qualified)
    call.__wrapped__ = original
    return call


def install_generator_rules(patches: pytest.MonkeyPatch) -> None:
    """Wrap the generator calls on `patches` (undone with the device)."""
    for (module_name, name), (method, outside) in _GENERATOR_CALLS.items():
        module = sys.modules[module_name]
        original = getattr(module, name, None)
        if original is not None:
            patches.setattr(module, name, _generator_call(f"{module_name}.{name}", method, outside or original))
