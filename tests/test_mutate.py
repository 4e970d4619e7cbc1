"""`python -m harness mutate`: its mutants (each operator, never in docstrings, logging calls or annotations,
the same for a seed), its targets (the registry's coverage list), its verdicts on real SGLang (a mutant of
`build_torch_compile_kwargs` killed by the kwargs oracle, a run past its time judged timed out), unreached from the
campaign's coverage data without a run, a rerun skipping what is judged, and bad input (exit 2, a clear message)."""
from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

from harness.mutants import REPO_ROOT
from harness.mutate import operators, targets
from harness.mutate.judge import KILLED, TIMED_OUT, UNREACHED, judge
from harness.mutate.reach import DATA
from harness.registry import SUITES
from harness.versions import require_sglang

SOURCE = '''
import logging
logger = logging.getLogger(__name__)


def sizes(capture_bs: list[int], limit: int = 4) -> list[int]:
    """Docstring: 1 < 2 and True."""
    logger.info("sizes %s", [1, 2])
    kept = [bs for bs in capture_bs if bs <= limit and bs > 0]
    if not kept:
        return []
    return sorted(kept, key=int)[: min(len(kept), 8)]
'''
EXPECTED_OPERATORS = {"flip-comparison", "negate-condition", "swap-and-or", "constant-plus-one", "constant-minus-one",
                      "swap-true-false", "remove-statement", "drop-return-value", "swap-call-args", "swap-min-max"}


def _mutants(source: str = SOURCE) -> list[operators.Mutant]:
    tree = ast.parse(source)
    return [m for name, node in operators.functions(tree)
            for m in operators.function_mutants("x.py", source, name, node)]


def test_every_operator_fires_and_none_touches_docstrings_logging_or_annotations():
    found = _mutants(SOURCE + "\n\ndef flag():\n    return True\n")
    assert {m.operator for m in found} == EXPECTED_OPERATORS
    for mutant in found:
        changed = mutant.apply(SOURCE + "\n\ndef flag():\n    return True\n")
        assert '"""Docstring: 1 < 2 and True."""' in changed, mutant
        assert 'logger.info("sizes %s", [1, 2])' in changed, mutant
        assert "def sizes(capture_bs: list[int], limit: int = " in changed, mutant
    by_operator = {m.operator: m for m in found}
    assert by_operator["swap-min-max"].mutated == "return sorted(kept, key=int)[: (max(len(kept), 8))]"
    assert by_operator["swap-and-or"].mutated == "kept = [bs for bs in capture_bs if (bs <= limit or bs > 0)]"


def test_the_draw_is_the_same_for_a_seed_and_ids_are_stable():
    found = targets.targeted_functions(Path(require_sglang()))
    texts = {t.file: t.text for t in found}
    every = targets.mutants(found)
    first = [m.id for m in targets.sample(every, texts, 12, 3)]
    again = targets.mutants(targets.targeted_functions(Path(require_sglang())))
    assert first == [m.id for m in targets.sample(again, texts, 12, 3)]
    assert first != [m.id for m in targets.sample(every, texts, 12, 4)]


def test_targets_are_the_registry_coverage_list():
    found = targets.targeted_functions(Path(require_sglang()))
    files = {t.file for t in found}
    listed = {entry.split("::")[0] for suite in SUITES for entry in suite.coverage}
    assert files == {f for f in listed if (Path(require_sglang()) / f).exists()}
    kwargs_file = "multimodal_gen/runtime/utils/torch_compile.py"
    assert {t.function for t in found if t.file == kwargs_file} == {"build_torch_compile_kwargs",
                                                                    "resolve_torch_compile_kwargs"}
    assert all(t.suites[0].name == "compile_kwargs" for t in found if t.file == kwargs_file)


def _kwargs_mutant(text_of: str) -> tuple[operators.Mutant, targets.Target]:
    target = next(t for t in targets.targeted_functions(Path(require_sglang()))
                  if t.function == "build_torch_compile_kwargs")
    mutant = next(m for m in operators.function_mutants(target.file, target.text, target.function, target.node)
                  if m.operator == "flip-comparison" and text_of in m.original)
    return mutant, target


def test_a_mutant_the_kwargs_oracle_catches_is_killed_with_its_diagnosis(tmp_path):
    # `"options" not in compile_kwargs` flipped: mode goes to torch.compile with options (known bug 3's class)
    mutant, target = _kwargs_mutant('"options" not in compile_kwargs')
    row = judge(mutant, target.text, Path(require_sglang()), target.suites, tmp_path, timeout=600)
    assert row["verdict"] == KILLED, row
    assert row["oracle"] in ("kwargs-validity", "compiles", "eager-equality"), row
    assert row["diagnosis"] and row["test"].startswith("suites/test_compile_kwargs.py"), row


def test_a_mutant_run_past_its_time_is_timed_out(tmp_path):
    mutant, target = _kwargs_mutant("options is not None")
    row = judge(mutant, target.text, Path(require_sglang()), target.suites, tmp_path, timeout=1)
    assert row["verdict"] == TIMED_OUT, row


def _mutate(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "harness", "mutate", *args], cwd=REPO_ROOT, capture_output=True,
                          text=True, timeout=600)


KWARGS_FILE = "multimodal_gen/runtime/utils/torch_compile.py"


def _campaign(report_dir: Path, lines: list[int]) -> None:
    """What a gate campaign leaves for `mutate`: its records and its coverage data (`lines` of the kwargs file)."""
    import coverage

    sglang = Path(require_sglang())
    (report_dir / "examples.jsonl").write_text(json.dumps({"sglang_path": str(sglang), "run_id": "r1",
                                                           "suite": "x"}) + "\n")
    data = coverage.CoverageData(basename=str(report_dir / DATA))
    data.add_lines({str(sglang / KWARGS_FILE): lines})
    data.write()


def test_unreached_mutants_are_judged_without_a_run_and_a_rerun_skips_them(tmp_path):
    _campaign(tmp_path, [1])  # nothing inside the function ran
    args = ("--functions", "build_torch_compile_kwargs", "--count", "5", "--seed", "1", "--report-dir", str(tmp_path))
    done = _mutate(*args)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    rows = [json.loads(line) for line in (tmp_path / "mutants.jsonl").read_text().splitlines()]
    assert len(rows) == 5 and {r["verdict"] for r in rows} == {UNREACHED}, rows
    assert "kill ratio" in (tmp_path / "mutate.md").read_text()
    assert "<h2>Mutants</h2>" in (tmp_path / "report.html").read_text()
    again = _mutate(*args)
    assert "5 judged before, 0 to judge" in again.stdout, again.stdout
    assert len((tmp_path / "mutants.jsonl").read_text().splitlines()) == 5


def test_no_mutant_starts_once_the_budget_is_spent(tmp_path):
    _campaign(tmp_path, list(range(1, 1 + len((Path(require_sglang()) / KWARGS_FILE).read_text().splitlines()))))
    done = _mutate("--functions", "build_torch_compile_kwargs", "--count", "3", "--budget", "0",
                   "--report-dir", str(tmp_path))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "budget of 0 s spent" in done.stdout, done.stdout
    assert not (tmp_path / "mutants.jsonl").exists()


@pytest.mark.parametrize("args, message", [
    (("--functions", "no_such_function"), "no targeted function named no_such_function"),
    (("--tree", "/"), "is not an SGLang source tree"),
    (("--seed", "seven"), "the seed must be a whole number"),
])
def test_bad_input_is_a_clear_message_and_exit_2(args, message, tmp_path):
    done = _mutate(*args, "--report-dir", str(tmp_path))
    assert done.returncode == 2, done.stdout + done.stderr
    assert message in done.stderr, done.stderr
    assert "Traceback" not in done.stderr
