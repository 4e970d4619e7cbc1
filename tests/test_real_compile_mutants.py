"""Real SGLang model code under torch.compile (`suites/test_real_models.py::test_real_model_compiled_replay_...`):
a model change Dynamo cannot trace, re-introduced into a scratch copy of SGLang's Llama (a thread query in its MLP's
forward, as a lock or a device query would be), must fail with `graph-break` naming the reason; the clean run is
the suite's own (its only breaks are SGLang's declared `torch.compiler.disable` and the findings of
`model_graph_breaks.FINDINGS`)."""
from __future__ import annotations

import pytest

from tests.mutant_runs import Mutant, assert_caught

pytestmark = pytest.mark.subprocess

COMPILED = "suites/test_real_models.py::test_real_model_compiled_replay_matches_eager"
LLAMA = "srt/models/llama.py"

MUTANTS = {
    "untraceable_call_in_mlp": Mutant(
        test=COMPILED,
        edits=[(LLAMA, "        x, _ = self.down_proj(x)\n        return x\n",
                "        x, _ = self.down_proj(x)\n        __import__(\"threading\").get_ident()\n        return x\n")],
        oracle="graph-break", texts=["where SGLang declares no break", "the dense model's forward"]),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(MUTANTS))
def test_mutant_fails_with_its_diagnosis(name, tmp_path):
    record = assert_caught(name, MUTANTS[name], tmp_path, extra=("-k", "dense"))
    assert record["details"]["breaks"], record
