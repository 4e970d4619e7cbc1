"""Mutants for the capture-legality and stream-order oracles, each put into a scratch copy of the installed SGLang:
the suite must fail with the oracle's name and CUDA's own text (or both streams); clean SGLang passes both
(tests/test_decode_mutants.py and tests/test_prefill_mutants.py run the clean suites, which carry both checks).

- sync_inside_decode_capture: the full-graph backend synchronises the device inside its capture block
  (`operation not permitted when stream is capturing` on a GPU).
- item_inside_decode_forward: the decode runner's captured forward reads a device value with `.item()`
  (the host read of SGLang issue 7918's family).
- seed_query_inside_decode_forward: the captured forward asks the CUDA generator for its seed (SGLang issue 6033).
- sync_inside_piecewise_capture: the piecewise backend synchronises inside each piece's capture.
- capture_stream_not_ordered: `graph_capture` no longer makes its capture stream wait for the current stream, so
  the capture stream reads buffers the default stream has just written, with nothing ordering the two.
- wait_moved_after_the_read: the same wait, moved to after the capture-stream work it should order.
"""
from __future__ import annotations

import pytest

from harness.devices import legality
from tests.mutant_runs import Mutant, assert_caught

pytestmark = pytest.mark.subprocess  # every test here runs a suite in another process

DECODE = "suites/test_decode_capture.py::test_replay_matches_eager_and_patch_model_contract"
PREFILL = "suites/test_prefill_pcg.py::test_piecewise_forward_modes"
FULL_BACKEND = "srt/model_executor/runner_backend/full_cuda_graph_backend.py"
RUNNER = "srt/model_executor/runner/decode_cuda_graph_runner.py"
PIECEWISE = "srt/compilation/cuda_piecewise_backend.py"
PARALLEL = "srt/distributed/parallel_state.py"
IN_FORWARD = "                    self._run_in_graph_metadata_prep(attn_backend, forward_batch)\n"


def _in_forward(line: str) -> list:
    return [(RUNNER, IN_FORWARD, IN_FORWARD + f"                    {line}\n")]


WAIT = "        if curr_stream != stream:\n            stream.wait_stream(curr_stream)\n"
MUTANTS = {
    "sync_inside_decode_capture": Mutant(
        test=DECODE,
        edits=[(FULL_BACKEND, "            self._precarve.mint()\n            out = forward_fn()\n",
                "            self._precarve.mint()\n            self._device_module.synchronize()\n"
                "            out = forward_fn()\n")],
        oracle="capture-legality",
        texts=["synchronize inside a graph capture", legality.NOT_PERMITTED]),
    "item_inside_decode_forward": Mutant(
        test=DECODE,
        edits=_in_forward("forward_batch.seq_lens.max().item()"),
        oracle="capture-legality",
        texts=["aten._local_scalar_dense", legality.NOT_PERMITTED]),
    "seed_query_inside_decode_forward": Mutant(
        test=DECODE,
        edits=_in_forward("torch.cuda.initial_seed()"),
        oracle="capture-legality",
        texts=["torch.cuda.initial_seed", "Cannot call CUDAGeneratorImpl::current_seed during CUDA graph capture"]),
    "sync_inside_piecewise_capture": Mutant(
        test=PREFILL,
        edits=[(PIECEWISE, "                    # `output` is managed by pytorch's cudagraph pool\n",
                "                    torch.cuda.synchronize()\n")],
        oracle="capture-legality",
        texts=["torch.cuda.synchronize inside a graph capture", legality.NOT_PERMITTED]),
    "capture_stream_not_ordered": Mutant(
        test=DECODE,
        edits=[(PARALLEL, WAIT, "        pass\n")],
        oracle="stream-order",
        texts=["unordered access across streams", "stream 1"]),
    "wait_moved_after_the_read": Mutant(
        test=DECODE,
        edits=[(PARALLEL, WAIT, "        pass\n"),
               (PARALLEL, "            with maybe_pynccl_context, maybe_pymscclpp_context:\n"
                          "                yield graph_capture_context\n",
                "            with maybe_pynccl_context, maybe_pymscclpp_context:\n"
                "                yield graph_capture_context\n"
                "            if curr_stream != stream:\n                stream.wait_stream(curr_stream)\n")],
        oracle="stream-order",
        texts=["unordered access across streams", "stream 1"]),
}


@pytest.mark.parametrize("name", sorted(MUTANTS))
def test_legality_mutant_fails_with_cuda_text(name, tmp_path):
    assert_caught(name, MUTANTS[name], tmp_path)
