"""Inductor pieces on the piecewise path (`harness/targets/prefill/inductor.py`, `harness/oracles/inductor_pieces.py`)
on SGLang's real `InductorAdaptor` and torch 2.14.1, in process, on the virtual device.

Clean: a first session compiles 3 pieces x (1 general + compile size 8) into a fresh SGLang cache folder, a second
reads SGLang's cache file back and loads every piece through `CompilerManager.load`; all checks pass, and the bare
load's torch-2.14 failure is pinned. Mutants (monkeypatching the real SGLang module, undone after each test):
- post_grad_dropped: `SGLangBackend.configure_post_pass` installs nothing (SGLang's pass manager never reaches
  Inductor's `post_grad_custom_post_pass`);
- inductor_cache_in_sglangs_own_folder: `initialize_cache` points Inductor at SGLang's cache folder itself (seed
  3119's swapped `os.path.join`);
- specialised_compile_skipped: `ConcreteSizeEntry` never flags a compile size (`need_to_compile` False), so every
  size is served by the general graph, outputs unchanged.
Cost: Inductor's FX cache is shared (`$HARNESS_INDUCTOR_CACHE`): warm, about 10 s of CPU for the file; on a machine's
first run, gcc compiles the 6 + 3 kernels once (about a minute more).
"""
from __future__ import annotations

import dataclasses
import os
import re

import pytest

from tests.prefill_sessions import cpu_prefill_layout

from harness.devices import get_device
from harness.errors import HarnessError
from harness.oracles import OracleFailure
from harness.oracles import inductor_pieces as oracle
from harness.targets.prefill import Batch, PrefillCase, Request
from harness.targets.prefill.inductor import (
    LOAD_OUTSIDE_COMPILE_EVENT, CompileRecorder, InductorPieces, PiecewiseBackendPlug, run_and_check,
    sglang_cache_folder,
)
from harness.targets.prefill.session import PrefillSession

pytestmark = pytest.mark.slow  # drives SGLang's compile or capture in this process: seconds a test

CASE = PrefillCase(backend="tc_piecewise", capture_tokens=(4, 8), compiler="inductor")
SIZES = (8,)
PIECES = 3  # NUM_LAYERS (2) attention split ops cut the body into 3 pieces


def batch():
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    # 3 + 5 = 8 tokens: a compile size, so the replay runs the specialised pieces
    return Batch((Request(1, (3, 5, 7)), Request(2, (1, 2, 3, 4, 5))), ForwardMode.EXTEND, ForwardMode.EXTEND)


@pytest.fixture()
def cpu_prefill():
    cpu_prefill_layout()
    yield
    PrefillSession.close_current()


def test_clean_sglang_compiles_caches_and_loads(cpu_prefill):
    notes = run_and_check(CASE, SIZES, batch())
    assert notes["fresh cache"] == {"adaptor_compiles": 6, "pieces": PIECES, "compile_sizes": [8],
                                    "cache_folders": 1}, notes
    assert notes["cache read back"]["cache_handles"] == 6 and notes["cache read back"]["loaded_pieces"] == 6, notes
    assert notes["compile_sizes_sglang_assigned"] == [()], notes


def test_bare_load_raises_on_torch_2_14(cpu_prefill):
    """Finding, pinned: SGLang's InductorAdaptor.load outside a Dynamo compile event fails on torch 2.14.1."""
    import torch

    if torch.__version__.split("+")[0] != "2.14.1":
        pytest.skip(f"pinned on torch 2.14.1, this is {torch.__version__}")
    with InductorPieces(CASE, ()) as pieces:
        fresh = pieces.piece_outputs(pieces.open())
        second = pieces.open()
        one = dict([next(iter(fresh.items()))])
        with pytest.raises(RuntimeError, match=LOAD_OUTSIDE_COMPILE_EVENT):
            pieces.load(second, one, compile_event=False)


def test_post_grad_pass_dropped_fires(cpu_prefill, monkeypatch):
    from sglang.srt.compilation.backend import SGLangBackend

    monkeypatch.setattr(SGLangBackend, "configure_post_pass", lambda self: None)
    with InductorPieces(CASE, ()) as pieces:
        evidence = pieces.open()
        with pytest.raises(OracleFailure) as failure:
            oracle.check_compiles(evidence.compiles, pieces=PIECES, compile_sizes=(),
                                  pass_managers=evidence.pass_managers, what="post_grad_dropped")
    assert failure.value.oracle == "dynamo-contract"
    assert "post_grad_custom_post_pass in the Inductor config that ran is None" in failure.value.diagnosis
    assert "PostGradPassManager" in failure.value.diagnosis


def test_specialised_compile_skipped_fires(cpu_prefill, monkeypatch):
    from sglang.srt.compilation import cuda_piecewise_backend as module

    @dataclasses.dataclass
    class NeverCompiled(module.ConcreteSizeEntry):
        def __post_init__(self):
            self.need_to_compile = False

    monkeypatch.setattr(module, "ConcreteSizeEntry", NeverCompiled)
    with InductorPieces(CASE, SIZES) as pieces:
        evidence = pieces.open()
        evidence.session.step(batch())  # outputs unchanged: replay == eager still passes
        with pytest.raises(OracleFailure) as failure:
            oracle.check_compiles(evidence.compiles, pieces=PIECES, compile_sizes=SIZES,
                                  pass_managers=evidence.pass_managers, what="specialised_compile_skipped")
    assert failure.value.oracle == "dynamo-contract"
    assert "3 adaptor compile(s), expected 6" in failure.value.diagnosis
    assert "no specialised compile of piece 0 for token count 8" in failure.value.diagnosis


def test_inductor_cache_in_sglangs_own_folder_fires(cpu_prefill, monkeypatch):
    """Seed 3119's survivor: `os.path.join("inductor_cache", base)` (arguments swapped) is `base` itself for an
    absolute base, so Inductor writes among SGLang's own cache files."""
    from sglang.srt.compilation.compiler_interface import InductorAdaptor

    original = InductorAdaptor.initialize_cache

    def swapped(self, cache_dir, disable_cache=False, prefix=""):
        original(self, cache_dir, disable_cache=disable_cache, prefix=prefix)
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.join("inductor_cache", self.base_cache_dir)

    monkeypatch.setattr(InductorAdaptor, "initialize_cache", swapped)
    with pytest.raises(OracleFailure) as failure:
        run_and_check(CASE, (), batch())
    assert failure.value.oracle == "dynamo-contract"
    assert "Inductor's cache is" in failure.value.diagnosis and "not strictly inside" in failure.value.diagnosis


@pytest.mark.parametrize("case, sizes, words", [
    (dataclasses.replace(CASE, compiler="eager"), (), "with 'eager' pieces"),
    (CASE, (16,), "compile sizes [16] are not among the captured token counts"),
])
def test_bad_input_is_refused(case, sizes, words):
    with pytest.raises(HarnessError, match=re.escape(words)):
        InductorPieces(case, sizes)


# -- SGLang's compiler-interface contracts its own inductor path does not reach (cheap, no Inductor compile) --------
def test_eager_pieces_store_no_handles(cpu_prefill):
    """Eager pieces (EagerAdapter, CompilerInterface's default cache hooks): no handle stored, no cache file
    written, and the adaptor refuses a load."""
    eager = dataclasses.replace(CASE, compiler="eager")
    with sglang_cache_folder(), get_device("cpu").install("cuda"):
        with PiecewiseBackendPlug(()) as plug, CompileRecorder() as recorder:
            PrefillSession.get(eager)
        PrefillSession.close_current()
        manager = plug.pieces[0].sglang_backend.compiler_manager
        assert len(plug.pieces) == PIECES and [c.shape for c in recorder.compiles] == [None] * PIECES
        assert manager.cache == {} and not os.path.exists(manager.cache_file_path)
        with pytest.raises(NotImplementedError, match="eager compilation is not supported"):
            manager.compiler.load(None, plug.pieces[0].graph, [], 0)


def test_disabled_cache_reads_and_redirects_nothing(cpu_prefill):
    """`initialize_cache(disable_cache=True)`: the cache file is not read, Inductor's cache not redirected, nothing
    saved; a compiler on CompilerInterface's defaults (no graph, no caching) is refused by CompilerManager."""
    with sglang_cache_folder() as root, get_device("cpu").install("cuda"):
        from sglang.srt.compilation.backend import CompilerManager
        from sglang.srt.compilation.compilation_config import CompilationConfig
        from sglang.srt.compilation.compiler_interface import CompilerInterface

        folder = os.path.join(root, "disabled")
        os.makedirs(folder)
        cache_file = os.path.join(folder, "sglang_compile_cache.py")
        with open(cache_file, "w") as f:
            f.write("{(None, 0, 'inductor'): ('hash', 'file')}")
        redirected = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
        manager = CompilerManager(CompilationConfig([4], "inductor"))
        manager.initialize_cache(folder, disable_cache=True)
        assert manager.cache == {} and os.environ.get("TORCHINDUCTOR_CACHE_DIR") == redirected
        manager.is_cache_updated = True
        manager.save_to_file()
        assert open(cache_file).read() == "{(None, 0, 'inductor'): ('hash', 'file')}"
        manager.compiler = CompilerInterface()
        assert manager.compute_hash() == ""
        with pytest.raises(AssertionError, match="Failed to compile the graph"):
            manager.compile(None, [], {}, graph_index=0, num_graphs=1)
        with pytest.raises(NotImplementedError, match="caching is not supported"):
            manager.compiler.load(("hash", "file"), None, [], 0)
