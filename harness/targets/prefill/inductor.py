"""Inductor pieces on the piecewise path, for real: SGLang's `InductorAdaptor` on the installed torch compiles every
piece into a harness-owned SGLang cache directory, and a second session over the same pieces loads each one back
from the handles SGLang saved there (`InductorPieces`, used by the prefill suite and tests/test_inductor_pieces.py).

What SGLang does, and the two places the harness steps in (read in 0.5.9 to 0.5.23 and the main trees of mid-2026):
- `CUDAPiecewiseBackend.__init__` assigns `self.compile_sizes = set([])`: no release's config offers the per-size
  specialised compile its `__call__` implements (`need_to_compile`: one more adaptor compile per runtime shape, tuned
  by `set_inductor_config`). `PiecewiseBackendPlug` installs, at `backend.CUDAPiecewiseBackend` (where
  `make_backend` looks), a subclass whose `compile_sizes` attribute takes the case's sizes when SGLang's constructor
  assigns it; the constructor's entries, `to_be_compiled_sizes` and `__call__` stay SGLang's. It also keeps each
  piece's last real arguments per token count, to run the piece again outside the graph.
- `CompilerManager.compile` never consults its cache ("TODO(Yuwei): support cache loading"), so the second session
  compiles again (Inductor's FX cache serves it) and the harness calls SGLang's own `CompilerManager.load` with the
  handles SGLang read back from `sglang_compile_cache.py` (`InductorAdaptor.load`, its `_lookup_graph` hijacks).

Cost: Inductor compiles each piece (NUM_LAYERS + 1 = 3) once for the general shape and once per compile size. Each
first session starts from empty SGLang and Inductor graph caches (a real compile: lowering, codegen, the cache save
with SGLang's `AlwaysHitShapeEnv`), but its C++ kernels are seeded from `$HARNESS_INDUCTOR_CACHE` (default
`~/.cache/sglang-harness/inductor`; `off`: no sharing, gcc every run) and kept there after, so gcc runs once per
machine for each kernel.
"""
from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import tempfile
from typing import Any
from unittest import mock

import torch

from harness.devices import get_device
from harness.errors import HarnessError

BACKEND_MODULE = "sglang.srt.compilation.backend"
KERNEL_CACHE_ENV = "HARNESS_INDUCTOR_CACHE"
# process state SGLang's InductorAdaptor.initialize_cache and CompilationConfig.configure_inductor leave behind
ENV_NAMES = ("SGLANG_CACHE_DIR", "TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR")
INDUCTOR_FLAGS = ("combo_kernels", "benchmark_combo_kernel", "fx_graph_cache")


INDUCTOR_SUBDIR = "inductor_cache"  # where InductorAdaptor.initialize_cache points Inductor, in SGLang's folder
GRAPH_CACHES = ("fxgraph", "aotautograd")  # Inductor's graph caches: never shared, so each first session misses


def kernel_cache_folder() -> str | None:
    """The shared folder of Inductor's compiled kernels (None: `$HARNESS_INDUCTOR_CACHE=off`, no sharing)."""
    value = os.environ.get(KERNEL_CACHE_ENV, os.path.expanduser("~/.cache/sglang-harness/inductor"))
    return None if value == "off" else value


def seed_kernels(inductor_cache: str) -> None:
    """Copy the shared compiled kernels (not the graph caches) into a fresh Inductor cache folder: Inductor's FX
    graph cache still misses (SGLang's first compile is a real one), its C++ kernel cache hits (no gcc)."""
    shared = kernel_cache_folder()
    if shared and os.path.isdir(shared) and not os.path.exists(inductor_cache):
        shutil.copytree(shared, inductor_cache, ignore=shutil.ignore_patterns(*GRAPH_CACHES, "*.lock"))


def keep_kernels(inductor_cache: str) -> None:
    """Copy the kernels a session compiled back into the shared folder (graph caches left out)."""
    shared = kernel_cache_folder()
    if shared and os.path.isdir(inductor_cache):
        shutil.copytree(inductor_cache, shared, dirs_exist_ok=True,
                        ignore=shutil.ignore_patterns(*GRAPH_CACHES, "*.lock"))


@dataclasses.dataclass
class CompileRecord:
    """One `CompilerManager.compile` call: the piece, the runtime shape (None: the general graph) and what the
    Inductor config in force inside `compile_fx_inner` held (the config SGLang built, patched in by `compile_fx`)."""
    index: int
    shape: int | None
    post_grad_pass: list = dataclasses.field(default_factory=list)  # post_grad_custom_post_pass per inner compile
    max_autotune: list = dataclasses.field(default_factory=list)
    coordinate_descent_tuning: list = dataclasses.field(default_factory=list)


class PiecewiseBackendPlug:
    """While active, SGLang's `make_backend` builds this subclass of `CUDAPiecewiseBackend` (see the module
    docstring); `pieces` lists the instances built, `assigned` what SGLang's constructor assigned to compile_sizes."""

    def __init__(self, compile_sizes: tuple[int, ...]):
        from sglang.srt.compilation import backend

        self.pieces: list = []
        self.assigned: list = []
        plug = self

        class HarnessPiecewiseBackend(backend.CUDAPiecewiseBackend):
            @property
            def compile_sizes(self):
                return self.__dict__["_harness_compile_sizes"]

            @compile_sizes.setter
            def compile_sizes(self, value):
                plug.assigned.append(set(value))
                self.__dict__["_harness_compile_sizes"] = set(compile_sizes)

            def __init__(self, *args, **kwargs):
                super().__init__(*args, **kwargs)
                self.seen_args: dict = {}  # token count -> this piece's last real arguments (cloned)
                plug.pieces.append(self)

            def __call__(self, *args):
                if self.sym_shape_indices and not any(isinstance(a, torch.SymInt) for a in args):
                    self.seen_args[int(args[self.sym_shape_indices[0]])] = _clone(args)
                return super().__call__(*args)

        self.backend_class = HarnessPiecewiseBackend
        self._patch = mock.patch.object(backend, "CUDAPiecewiseBackend", HarnessPiecewiseBackend)

    def __enter__(self) -> PiecewiseBackendPlug:
        self._patch.start()
        return self

    def __exit__(self, *exc) -> None:
        self._patch.stop()


EMPTY_TARGETS = ("empty", "empty_like", "empty_strided", "empty.memory_format")


def uninitialised_outputs(graph) -> tuple[int, ...]:
    """Indices of the piece's output leaves that are uninitialised buffers (`torch.empty_like` and friends, e.g. the
    attention output a split op fills next): their values are whatever memory held, so they are not compared."""
    output = next(node for node in graph.graph.nodes if node.op == "output")
    leaves = torch.utils._pytree.tree_leaves(output.args[0])
    return tuple(i for i, node in enumerate(leaves) if isinstance(node, torch.fx.Node)
                 and node.op == "call_function" and getattr(node.target, "__name__", str(node.target)) in EMPTY_TARGETS)


def _kept(output, skip: tuple[int, ...]) -> list:
    return [leaf for i, leaf in enumerate(torch.utils._pytree.tree_leaves(output)) if i not in skip]


def _clone(args) -> tuple:
    return tuple(a.detach().clone() if isinstance(a, torch.Tensor) else a for a in args)


class CompileRecorder:
    """Records every `CompilerManager.compile` (piece, shape, the Inductor config in force) and, per
    `initialize_cache`, the handles SGLang read back from its cache file; links the shared FX cache in first."""

    def __init__(self):
        self.compiles: list[CompileRecord] = []
        self.cache_read: list[dict] = []  # one per SGLangBackend: the handles SGLang read from its cache file
        self.cache_dirs: list[str] = []
        self.redirected: list[dict] = []  # per initialize_cache: its folders, and where Inductor and Triton now write
        self._stack = contextlib.ExitStack()

    def __enter__(self) -> CompileRecorder:
        import torch._inductor.compile_fx as compile_fx
        import torch._inductor.config as inductor_config
        from sglang.srt.compilation.backend import CompilerManager
        from sglang.srt.compilation.inductor_pass import get_pass_context

        recorder, current = self, []
        original_compile, original_init = CompilerManager.compile, CompilerManager.initialize_cache
        original_inner = compile_fx.compile_fx_inner

        def compile(manager, graph, example_inputs, inductor_config_, graph_index=0, num_graphs=1,
                    runtime_shape=None):
            current.append(CompileRecord(graph_index, runtime_shape))
            recorder.compiles.append(current[-1])
            try:
                return original_compile(manager, graph, example_inputs, inductor_config_, graph_index=graph_index,
                                        num_graphs=num_graphs, runtime_shape=runtime_shape)
            finally:
                current.pop()

        def compile_fx_inner(*args, **kwargs):
            if current and get_pass_context().runtime_shape == current[-1].shape:
                current[-1].post_grad_pass.append(inductor_config.post_grad_custom_post_pass)
                current[-1].max_autotune.append(inductor_config.max_autotune)
                current[-1].coordinate_descent_tuning.append(inductor_config.coordinate_descent_tuning)
            return original_inner(*args, **kwargs)

        def initialize_cache(manager, cache_dir, disable_cache=False, prefix=""):
            seed_kernels(os.path.join(cache_dir, INDUCTOR_SUBDIR))
            original_init(manager, cache_dir, disable_cache=disable_cache, prefix=prefix)
            recorder.cache_read.append(dict(manager.cache))
            recorder.cache_dirs.append(cache_dir)
            recorder.redirected.append({"cache_dir": cache_dir, "prefix": prefix, "disabled": disable_cache,
                                        "inductor": os.environ.get("TORCHINDUCTOR_CACHE_DIR"),
                                        "triton": os.environ.get("TRITON_CACHE_DIR")})

        self._stack.enter_context(mock.patch.object(CompilerManager, "compile", compile))
        self._stack.enter_context(mock.patch.object(CompilerManager, "initialize_cache", initialize_cache))
        self._stack.enter_context(mock.patch.object(compile_fx, "compile_fx_inner", compile_fx_inner))
        return self

    def __exit__(self, *exc) -> None:
        self._stack.close()


@contextlib.contextmanager
def sglang_cache_folder():
    """A fresh harness-owned SGLANG_CACHE_DIR for the block, removed after; the environment and Inductor flags SGLang
    set process-wide meanwhile (its adaptor's cache redirection, `configure_inductor`'s combo kernels) restored."""
    import torch._inductor.config as inductor_config

    saved_env = {name: os.environ.get(name) for name in ENV_NAMES}
    saved_flags = {name: getattr(inductor_config, name) for name in INDUCTOR_FLAGS}
    root = tempfile.mkdtemp(prefix="harness-sglang-cache-")
    os.environ["SGLANG_CACHE_DIR"] = root
    try:
        yield root
    finally:
        for name, value in saved_env.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        for name, value in saved_flags.items():
            setattr(inductor_config, name, value)
        shutil.rmtree(root, ignore_errors=True)


@dataclasses.dataclass
class SessionEvidence:
    """What one session's compile left: the compiles recorded, the pieces SGLang built (by index), the handles it
    read from its cache file, and what its constructor assigned to compile_sizes."""
    session: Any  # the PrefillSession
    compiles: list[CompileRecord]
    pieces: dict[int, Any]
    cache_read: dict
    assigned: list
    pass_managers: list  # each piece's SGLangBackend.post_grad_pass_manager (the one it configured)
    redirected: list = dataclasses.field(default_factory=list)  # CompileRecorder.redirected


class InductorPieces:
    """Two sessions of one inductor case over one fresh SGLang cache folder:

        with InductorPieces(case, compile_sizes=(8,)) as pieces:
            first = pieces.open()                # compiles (fresh cache), captures
            fresh = pieces.piece_outputs(first)  # (shape, index) -> (args, output) of the fresh pieces
            second = pieces.open()               # the same pieces again; SGLang reads its cache file back
            loaded = pieces.load(second, fresh)  # (shape, index) -> output of the piece loaded from that cache
    """

    def __init__(self, case, compile_sizes: tuple[int, ...] = ()):
        if case.backend != "tc_piecewise" or case.compiler != "inductor":
            raise HarnessError(f"InductorPieces drives tc_piecewise with inductor pieces, not {case.backend!r} "
                               f"with {case.compiler!r} pieces: use PrefillCase(backend='tc_piecewise', "
                               "compiler='inductor')")
        outside = sorted(set(compile_sizes) - set(case.capture_tokens))
        if outside:
            raise HarnessError(f"compile sizes {outside} are not among the captured token counts "
                               f"{sorted(case.capture_tokens)}: SGLang compiles a size when a piece first runs it, "
                               "and the compile pass runs only the captured ones (choose a subset)")
        self.case = case
        self.compile_sizes = tuple(sorted(set(compile_sizes)))
        self.cache_dirs: list[str] = []
        self.redirected: list[dict] = []  # per initialize_cache: its folders, and where Inductor and Triton now write
        self._stack = contextlib.ExitStack()

    def __enter__(self) -> InductorPieces:
        from harness.targets.prefill.session import PrefillSession

        PrefillSession.close_current()
        self._stack.enter_context(sglang_cache_folder())
        self._stack.callback(self._keep_kernels)  # before the folder goes
        # SGLang's compile backend imports only on a device (its weak_ref_tensor); sessions nest inside this install
        self._stack.enter_context(get_device(PrefillSession.device).install("cuda"))
        self._stack.callback(PrefillSession.close_current)
        return self

    def __exit__(self, *exc) -> None:
        self._stack.close()

    def _keep_kernels(self) -> None:
        for cache_dir in self.cache_dirs:
            keep_kernels(os.path.join(cache_dir, INDUCTOR_SUBDIR))

    def open(self) -> SessionEvidence:
        """A new session of the case (the current one closed): SGLang compiles and captures its pieces."""
        from harness.targets.prefill.session import PrefillSession

        PrefillSession.close_current()
        plug, recorder = PiecewiseBackendPlug(self.compile_sizes), CompileRecorder()
        with plug, recorder:
            session = PrefillSession.get(self.case)
        self.cache_dirs += recorder.cache_dirs
        pieces = {piece.piecewise_compile_index: piece for piece in plug.pieces}
        return SessionEvidence(session, recorder.compiles, pieces, recorder.cache_read[-1] if recorder.cache_read
                               else {}, plug.assigned,
                               [piece.sglang_backend.post_grad_pass_manager for piece in plug.pieces],
                               recorder.redirected)

    def piece_outputs(self, evidence: SessionEvidence) -> dict:
        """(shape, index) -> (args, output) for every shape SGLang keys a handle by (None: the general graph, run
        at a captured count outside the compile sizes where there is one; else each compile size), each piece run
        outside the graph on cloned real arguments it last saw at that count."""
        outputs = {}
        for index, piece in sorted(evidence.pieces.items()):
            seen = sorted(piece.seen_args)
            general = [n for n in seen if n not in self.compile_sizes] or seen
            for shape in (None, *self.compile_sizes):
                count = general[-1] if shape is None else shape
                if count not in piece.seen_args:
                    raise HarnessError(f"piece {index} never ran {count} tokens (ran {seen}); the case's captured "
                                       f"counts {sorted(self.case.capture_tokens)} should all run at compile time")
                args = piece.seen_args[count]
                runnable = (piece.compiled_graph_for_general_shape if shape is None
                            else piece.concrete_size_entries[shape].runnable)
                skip = uninitialised_outputs(piece.graph)
                outputs[(shape, index)] = (args, _kept(runnable(*_clone(args)), skip), skip)
        return outputs

    @staticmethod
    def load(evidence: SessionEvidence, fresh: dict, *, compile_event: bool = True) -> dict:
        """(shape, index) -> output of the piece SGLang's `CompilerManager.load` served from the handles it read from
        its cache file, on the arguments the fresh piece ran (the keys of `fresh` the cache file holds).

        `compile_event`: call it inside a `dynamo_timed` event, as a load inside Dynamo's compile of the forward
        (where vLLM, whose design this is, loads) runs. On torch 2.14.1 a bare call raises "No toplevel event
        active" (`LOAD_OUTSIDE_COMPILE_EVENT`): FxGraphCache's hit counter needs that event and SGLang's load
        enters only Dynamo's metrics context."""
        from torch._dynamo.utils import dynamo_timed

        loaded = {}
        for (shape, index), (args, _, skip) in sorted(fresh.items(), key=lambda item: (item[0][1], item[0][0] or 0)):
            piece = evidence.pieces.get(index)
            key = (shape, index, "inductor")
            if piece is None or key not in evidence.cache_read:
                continue
            manager = piece.sglang_backend.compiler_manager
            event = dynamo_timed("harness: SGLang compile-cache load") if compile_event else contextlib.nullcontext()
            with mock.patch.object(manager, "cache", dict(evidence.cache_read)), event:
                runnable = manager.load(piece.graph, list(_clone(args)), index, shape)
            loaded[(shape, index)] = _kept(runnable(*_clone(args)), skip)
        return loaded


# torch 2.14.1: what SGLang's InductorAdaptor.load raises when called outside a Dynamo compile event
LOAD_OUTSIDE_COMPILE_EVENT = "No toplevel event active"


def run_and_check(case, compile_sizes: tuple[int, ...], batch, ex=None) -> dict:
    """The whole contract for one case: session 1 compiles into a fresh SGLang cache folder, replays `batch`
    (every prefill oracle: replay == eager within `same`'s tolerance, graphs replayed...), and its compiles are
    judged (`check_compiles`); session 2 over the same pieces replays `batch` again, SGLang's cache file read back
    is judged (`check_cache_read`) and every piece loaded from it must compute what the fresh piece did."""
    from harness.oracles import inductor_pieces as oracle

    notes = {}
    with InductorPieces(case, compile_sizes) as pieces:
        for label in ("fresh cache", "cache read back"):
            evidence = pieces.open()
            what = f"tc_piecewise inductor pieces, {label}, compile sizes {pieces.compile_sizes}"
            evidence.session.check_capture()
            evidence.session.step(batch, ex)
            expected = dict(pieces=evidence.session.graphs_per_forward, compile_sizes=pieces.compile_sizes)
            notes[label] = oracle.check_compiles(evidence.compiles, pass_managers=evidence.pass_managers,
                                                 what=what, **expected)
            notes[label].update(oracle.check_cache_layout(evidence.redirected, what=what))
            if label == "fresh cache":
                fresh = pieces.piece_outputs(evidence)
            else:
                notes[label].update(oracle.check_cache_read(evidence.cache_read, what=what, **expected))
                notes[label].update(oracle.check_loaded(fresh, pieces.load(evidence, fresh), what=what))
    # what SGLang's own constructor assigned (set() in every release read): the per-size sizes are the harness's
    notes["compile_sizes_sglang_assigned"] = sorted({tuple(sorted(sizes)) for sizes in evidence.assigned})
    if ex is not None:
        ex.note("inductor_pieces", notes)
    return notes
