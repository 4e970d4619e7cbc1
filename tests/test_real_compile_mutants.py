"""Real SGLang model code under torch.compile (`suites/test_real_models.py::test_real_model_compiled_replay_...`),
each mutant on a scratch copy of SGLang, the clean run the suite's own (its only breaks are SGLang's declared
`torch.compiler.disable` and the findings of `model_graph_breaks.FINDINGS`; nothing compiles inside a capture):

- untraceable_call_in_mlp: a thread query in Llama's MLP forward (as a lock or a device query would be) fails
  with `graph-break` naming the reason.
- warmup_grad_mode_differs: the runner's warm-ups run without autograd, its capture with it; Dynamo's guard on
  the grad mode fails on the capture's call, which compiles inside the capture (`no-recompile`, naming the capture
  site and the guard `GLOBAL_STATE changed: grad_mode`).

Counters, floats and tuples kept in module globals were tried as the global-guard mutant and are not bugs at
serve time: Dynamo recompiles once and then makes the value dynamic (automatic dynamic), so the capture's call
hits the cache.
"""
from __future__ import annotations

import pytest

from tests.mutant_runs import Mutant, assert_caught

pytestmark = pytest.mark.subprocess

COMPILED = "suites/test_real_models.py::test_real_model_compiled_replay_matches_eager"
LLAMA = "srt/models/llama.py"
FULL_BACKEND = "srt/model_executor/runner_backend/full_cuda_graph_backend.py"

MUTANTS = {
    "untraceable_call_in_mlp": Mutant(
        test=COMPILED,
        edits=[(LLAMA, "        x, _ = self.down_proj(x)\n        return x\n",
                "        x, _ = self.down_proj(x)\n        __import__(\"threading\").get_ident()\n        return x\n")],
        oracle="graph-break", texts=["where SGLang declares no break", "the dense model's forward"]),
    # the runner's warm-ups run without autograd (as a change to save their memory might) while the capture runs
    # with it: Dynamo guards the compiled forward on the grad mode it was entered in, so the capture's call, after
    # two warm-ups on the same inputs, fails that guard and compiles inside the capture (the `GLOBAL_STATE changed:
    # grad_mode` recompiles users report)
    "warmup_grad_mode_differs": Mutant(
        test=COMPILED,
        edits=[(FULL_BACKEND, "            with self._precarve.measure():\n                output = forward_fn()\n",
                "            with self._precarve.measure(), torch.no_grad():\n"
                "                output = forward_fn()\n")],
        oracle="no-recompile", texts=["inside a graph capture", "full_cuda_graph_backend.py"],
        details=["grad_mode"]),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(MUTANTS))
def test_mutant_fails_with_its_diagnosis(name, tmp_path):
    record = assert_caught(name, MUTANTS[name], tmp_path, extra=("-k", "dense"))
    assert record["details"].get("breaks") or record["details"].get("failing_guard"), record
