"""`python -m harness mutate`: its mutants (each operator, never in docstrings, logging calls or annotations,
the same for a seed), its targets (the registry's coverage list), its verdicts on real SGLang (a mutant of
`build_torch_compile_kwargs` killed by the kwargs oracle, a run past its time judged timed out), unreached from the
campaign's coverage data without a run, a rerun skipping what is judged, and bad input (exit 2, a clear message).
The fast mode: the campaign's per-item line map (built across workers, read back, stale when the targeted text
changes), a mutant no item reaches judged unreached without a run, the items reaching a line run fastest first;
`--edits`: bad input exit 2 with the message, and the reverse of known bug 2's fix caught by one test item; a warm
worker judging a killing mutant, then a clean copy, with nothing of the first run leaking into the second."""
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


EXTRA = "\n\ndef flag():\n    return True\n\n\ndef power(a, b):\n    return pow(a, b)\n"


def test_every_operator_fires_and_none_touches_docstrings_logging_or_annotations():
    found = _mutants(SOURCE + EXTRA)
    assert {m.operator for m in found} == EXPECTED_OPERATORS
    for mutant in found:
        changed = mutant.apply(SOURCE + EXTRA)
        assert '"""Docstring: 1 < 2 and True."""' in changed, mutant
        assert 'logger.info("sizes %s", [1, 2])' in changed, mutant
        assert "def sizes(capture_bs: list[int], limit: int = " in changed, mutant
    by_operator = {m.operator: m for m in found}
    assert by_operator["swap-min-max"].mutated == "return sorted(kept, key=int)[: (max(len(kept), 8))]"
    assert by_operator["swap-and-or"].mutated == "kept = [bs for bs in capture_bs if (bs <= limit or bs > 0)]"
    # arguments of a commutative call are never swapped (an equivalent mutant); of any other call they are
    assert [m.mutated for m in found if m.operator == "swap-call-args"] == ["return (pow(b, a))"]


LOGGING_IF = '''
def capture(flags, sizes):
    if flags.gathered and flags.width > 1:
        logger.info("gathered %s", sizes)
    else:
        logger.debug("local")
    if flags.check(sizes):
        logger.info("checked")
    return sizes
'''


def test_an_if_that_only_logs_is_never_mutated():
    """Its removal, or a flip of its test, changes only what is logged (equivalent mutants); an `if` whose test
    calls something may act through that call, and is mutated as usual."""
    found = _mutants(LOGGING_IF)
    assert {m.line for m in found} == {7, 9}, [(m.line, m.operator, m.mutated) for m in found]
    assert any(m.operator == "remove-statement" and m.line == 7 for m in found)


@pytest.mark.slow
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


def test_coverage_rows_tell_files_of_one_name_apart():
    """The real-model row holds two `triton_backend.py` (attention and LoRA): each keeps a row of its own."""
    from harness.registry import get
    from harness.sglang_coverage import row_labels

    labels = row_labels(get("real_models").coverage)
    assert labels["srt/layers/attention/triton_backend.py"] == "attention/triton_backend.py"
    assert labels["srt/lora/backend/triton_backend.py"] == "backend/triton_backend.py"
    assert labels["srt/models/llama.py"] == "llama.py"
    assert len(set(labels.values())) == len(labels)
    assert row_labels(["a/f.py::one", "a/f.py::two"]) == {"a/f.py::one": "f.py::one", "a/f.py::two": "f.py::two"}


def _kwargs_mutant(text_of: str) -> tuple[operators.Mutant, targets.Target]:
    target = next(t for t in targets.targeted_functions(Path(require_sglang()))
                  if t.function == "build_torch_compile_kwargs")
    mutant = next(m for m in operators.function_mutants(target.file, target.text, target.function, target.node)
                  if m.operator == "flip-comparison" and text_of in m.original)
    return mutant, target


@pytest.mark.slow
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


@pytest.mark.subprocess
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


@pytest.mark.subprocess
def test_no_mutant_starts_once_the_budget_is_spent(tmp_path):
    _campaign(tmp_path, list(range(1, 1 + len((Path(require_sglang()) / KWARGS_FILE).read_text().splitlines()))))
    done = _mutate("--functions", "build_torch_compile_kwargs", "--count", "3", "--budget", "0",
                   "--report-dir", str(tmp_path))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "budget of 0 s spent" in done.stdout, done.stdout
    assert not (tmp_path / "mutants.jsonl").exists()


@pytest.mark.subprocess
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


# -- the fast mode: the campaign's line map ---------------------------------------------------------------------
FAKE_TARGET = '''def pick(flag):
    if flag:
        return 1
    return 2
'''


def _fake_sglang(tmp_path: Path) -> Path:
    """A package at one targeted path holding FAKE_TARGET (lines 1-4), with a release's dist-info beside it."""
    package = tmp_path / "site" / "sglang"
    (package / KWARGS_FILE).parent.mkdir(parents=True)
    (package / KWARGS_FILE).write_text(FAKE_TARGET)
    (tmp_path / "site" / "sglang-0.5.23.dist-info").mkdir()
    return package


def test_the_line_map_names_the_items_of_each_line_across_workers_and_goes_stale_with_the_text(tmp_path):
    import importlib.util

    from harness.mutate import reach
    from harness.pytest_plugin import ItemDurations
    from harness.sglang_coverage import LINE_TESTS, SGLangCoverage

    package, report = _fake_sglang(tmp_path), tmp_path / "report"
    report.mkdir()
    for worker, (nodeid, flag) in enumerate([("t.py::test_true", True), ("t.py::test_false", False)]):
        measuring = SGLangCoverage(str(package), report)  # one per xdist worker, each its own data file
        measuring.start()
        spec = importlib.util.spec_from_file_location(f"fake_target_{worker}", package / KWARGS_FILE)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)  # outside any item: the def line maps to no item
        measuring.switch(nodeid)
        module.pick(flag)
        measuring.switch("")
        measuring.stop()
    controller = SGLangCoverage(str(package), report)
    durations = ItemDurations(controller.durations)
    for nodeid, seconds in [("t.py::test_true", 3.0), ("t.py::test_false", 0.5), ("t.py::test_false", 0.25)]:
        durations.pytest_runtest_logreport(type("Report", (), {"nodeid": nodeid, "duration": seconds}))
    controller.results()
    controller.write_line_tests("r1")
    written = json.loads((report / LINE_TESTS).read_text())
    assert written["durations"] == {"t.py::test_true": 3.0, "t.py::test_false": 0.75}
    assert written["files"][KWARGS_FILE] == {"1": [], "2": ["t.py::test_false", "t.py::test_true"],
                                             "3": ["t.py::test_true"], "4": ["t.py::test_false"]}
    line_map, problem = reach.line_map(report, package)
    assert problem == "" and line_map is not None
    assert line_map.tests(KWARGS_FILE, [2]) == ["t.py::test_false", "t.py::test_true"]  # fastest first
    assert line_map.tests(KWARGS_FILE, [3]) == ["t.py::test_true"]
    assert line_map.tests(KWARGS_FILE, [1]) == [] and line_map.tests(KWARGS_FILE, [9]) is None
    (package / KWARGS_FILE).write_text(FAKE_TARGET.replace("return 2", "return 3"))
    line_map, problem = reach.line_map(report, package)
    assert line_map is None and "stale: its targets_digest" in problem, problem


def test_coverage_rows_carry_branch_figures_beside_statements(tmp_path):
    """coverage.py's branch mode: a function run one way misses one statement and half its branches."""
    import importlib.util

    from harness.sglang_coverage import SGLangCoverage

    package, report = _fake_sglang(tmp_path), tmp_path / "report"
    report.mkdir()
    (package / KWARGS_FILE).write_text(FAKE_TARGET.replace("def pick", "def build_torch_compile_kwargs"))
    measuring = SGLangCoverage(str(package), report)
    measuring.start()
    spec = importlib.util.spec_from_file_location("fake_branches", package / KWARGS_FILE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.build_torch_compile_kwargs(True)
    measuring.stop()
    row, = [r for r in SGLangCoverage(str(package), report).results() if r["suite"] == "compile_kwargs"]
    assert (row["covered"], row["statements"]) == (3, 4)  # the def line counts
    assert (row["branches_taken"], row["branches"], row["branch_percent"]) == (1, 2, 50.0)
    assert row["branch_files"] == {"torch_compile.py::build_torch_compile_kwargs": 50.0}


def _line_map(report_dir: Path, lines: dict[int, list[str]], durations: dict[str, float]) -> None:
    """A campaign's records, coverage data and a fresh line map of the installed SGLang's kwargs file."""
    from harness.sglang_coverage import LINE_TESTS, LINE_TESTS_FORMAT, harness_commit, package_version, \
        targets_digest

    sglang = Path(require_sglang())
    _campaign(report_dir, sorted(lines))
    (report_dir / LINE_TESTS).write_text(json.dumps({
        "format": LINE_TESTS_FORMAT, "run_id": "r1", "sglang": package_version(sglang), "sglang_path": str(sglang),
        "targets_digest": targets_digest(sglang), "harness_commit": harness_commit(), "durations": durations,
        "files": {KWARGS_FILE: {str(line): items for line, items in lines.items()}}}))


def _kwargs_lines() -> range:
    target = next(t for t in targets.targeted_functions(Path(require_sglang()))
                  if t.function == "build_torch_compile_kwargs")
    return range(target.node.lineno, target.node.end_lineno + 1)


def _request(report_dir: Path, **fields):
    """A mutate request whose judging the test replaces (no warm parents to start)."""
    from harness.mutate import Request

    fields = {"count": 4, "budget": None, "warm": False, **fields}
    return Request(Path(require_sglang()), None, report_dir, seed=1, functions=("build_torch_compile_kwargs",),
                   workers=1, timeout=60.0, **fields)


@pytest.mark.subprocess
def test_fast_mode_judges_a_line_no_item_reaches_unreached_without_a_run(tmp_path, monkeypatch):
    import harness.mutate as mutate

    def no_run(*args, **kwargs):
        raise AssertionError("a mutant no item reaches was run")

    monkeypatch.setattr(mutate, "judge_tests", no_run)
    monkeypatch.setattr(mutate, "judge", no_run)
    # executed, but only outside every item (at import), and no item executed anything else of the file
    _line_map(tmp_path, {line: [] for line in _kwargs_lines()}, {})
    rows = mutate.mutate(_request(tmp_path))
    assert len(rows) == 4 and {(r["verdict"], r["mode"]) for r in rows} == {(UNREACHED, "fast")}, rows
    assert "mode: fast" in (tmp_path / "mutate.md").read_text()


def test_fast_mode_runs_the_items_reaching_the_line_fastest_first(tmp_path, monkeypatch):
    import harness.mutate as mutate

    given = []

    def recorded(mutant, text, sglang_dir, tests, work, timeout, python=None):
        given.append(list(tests))
        return judge_record(mutant, KILLED, mode="fast", tests=list(tests), ran=1, test=tests[0], oracle="x")

    from harness.mutate.judge import record as judge_record

    monkeypatch.setattr(mutate, "judge_tests", recorded)
    slow, fast = "suites/test_compile_kwargs.py::slow_item", "suites/test_compile_kwargs.py::fast_item"
    _line_map(tmp_path, {line: [slow, fast] for line in _kwargs_lines()}, {slow: 40.0, fast: 2.0})
    rows = mutate.mutate(_request(tmp_path, count=2))
    assert given == [[fast, slow], [fast, slow]], given
    text = (tmp_path / "mutate.md").read_text()
    assert f"1 of 2 item(s) ran; killed by {fast}" in text, text
    thorough = mutate.mutate(_request(tmp_path, count=2, thorough=True, budget=0))  # another mode: judged anew
    assert thorough == [] and len(rows) == 2


def _edits_main(tmp_path: Path, capsys, edits) -> tuple[int, str]:
    from harness.__main__ import main

    path = tmp_path / "edits.json"
    path.write_text(edits if isinstance(edits, str) else json.dumps(edits))
    code = main(["mutate", "--edits", str(path), "--report-dir", str(tmp_path / "report")])
    return code, capsys.readouterr().err


RUNNER_FILE = "srt/model_executor/runner/prefill_cuda_graph_runner.py"


@pytest.mark.parametrize("edits, message", [
    ("[{nope", "not valid JSON (Expecting property name enclosed in double quotes at line 1 column 3)"),
    ({"file": RUNNER_FILE}, "expected a non-empty JSON list"),
    ([{"file": RUNNER_FILE, "old": "x"}], 'edit 0: needs the string fields "file", "old" and "new"'),
    ([{"file": RUNNER_FILE, "old": "ForwardMode.EXTEND", "new": "x"}], "edit 0: its old text occurs"),
    ([{"file": RUNNER_FILE, "old": "no such text anywhere", "new": "x"}], "occurs 0 times"),
    ([{"file": "../torch/version.py", "old": "a", "new": "b"}], "../torch/version.py is outside the SGLang package"),
    ([{"file": "srt/no_such_module.py", "old": "a", "new": "b"}], "srt/no_such_module.py does not exist"),
])
def test_bad_edits_are_a_clear_message_and_exit_2(edits, message, tmp_path, capsys):
    code, err = _edits_main(tmp_path, capsys, edits)
    assert code == 2 and message in err, err
    assert not (tmp_path / "report" / "mutants.jsonl").exists()


@pytest.mark.subprocess  # one prefill test item on a mutant: ~40 s of CPU
def test_the_reverse_of_bug_2s_fix_is_caught_by_the_one_item_reaching_it(tmp_path):
    from harness.mutate import edits as given_edits
    from harness.sglang_coverage import LINE_TESTS, LINE_TESTS_FORMAT, harness_commit, package_version, \
        targets_digest
    from tests.mutant_tables import BUG2_MIXED_NOT_NORMALISED

    sglang = Path(require_sglang())
    (file, old, new), = BUG2_MIXED_NOT_NORMALISED  # load_batch passes MIXED through in both fields
    path = tmp_path / "reverse-of-fix.json"
    path.write_text(json.dumps([{"file": file, "old": old, "new": new}]))
    edit, = given_edits.load(path, sglang)
    item = "suites/test_prefill_pcg.py::test_piecewise_forward_modes"  # its explicit example is bug 2's trigger
    (tmp_path / "examples.jsonl").write_text(json.dumps({"sglang_path": str(sglang), "run_id": "r1",
                                                         "suite": "prefill_pcg"}) + "\n")
    import coverage

    data = coverage.CoverageData(basename=str(tmp_path / DATA))
    data.add_lines({str(sglang / file): list(edit.lines)})
    data.write()
    (tmp_path / LINE_TESTS).write_text(json.dumps({
        "format": LINE_TESTS_FORMAT, "run_id": "r1", "sglang": package_version(sglang), "sglang_path": str(sglang),
        "targets_digest": targets_digest(sglang), "harness_commit": harness_commit(), "durations": {item: 9.0},
        "files": {file: {str(line): [item] for line in edit.lines}}}))
    done = _mutate("--edits", str(path), "--report-dir", str(tmp_path))
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    row, = [json.loads(line) for line in (tmp_path / "mutants.jsonl").read_text().splitlines()]
    assert (row["verdict"], row["mode"], row["test"], row["ran"]) == (KILLED, "fast", item, 1), row
    assert row["oracle"] == "no-recompile" and "forward_mode=MIXED" in row["diagnosis"], row
    assert row["function"] == "PrefillCudaGraphRunner.load_batch", row


@pytest.mark.subprocess  # a warm parent and two forked pytest runs importing SGLang: ~30 s of CPU
def test_a_warm_worker_judges_a_killing_mutant_then_a_clean_copy_without_leaking_state(tmp_path):
    from harness.mutants import scratch_sglang
    from harness.mutate.warm import WarmWorker

    edit = ("srt/compilation/compile_phase.py", "    _pcg_capture_stream = stream\n",
            "    _pcg_capture_stream = None\n")
    mutated = scratch_sglang([edit])
    worker = WarmWorker()
    try:
        args = ["tests/warm_target.py", "-x", "-q", "-s", "--report-dir"]
        code, output = worker.run([*args, str(tmp_path / "mutant")], sglang_root=mutated, timeout=600,
                                  mutant="capture_stream_never_set", output=tmp_path / "mutant.out")
        assert code == 1 and "the capture stream is not set inside the session" in output, output[-3000:]
        assert f"compile_phase imported from {mutated}/sglang/" in output, output[-3000:]
        code, output = worker.run([*args, str(tmp_path / "clean")], sglang_root=None, timeout=600, mutant="",
                                  output=tmp_path / "clean.out")
        assert code == 0, output[-3000:]  # the same parent: no module, flag or stream of the mutant's run left
        assert f"compile_phase imported from {require_sglang()}/" in output, output[-3000:]
    finally:
        worker.close()


@pytest.mark.subprocess  # a warm parent importing what SGLang imports, and an Inductor compile in its child
def test_a_warm_child_compiles_a_bmm_with_inductor(tmp_path, monkeypatch):
    """The warm parent imports the probed modules in the order their imports began (`warm._probe`): in alphabetical
    order `torch._inductor.codegen.cpp_gemm_template` came first, hit a circular import, and left Inductor without
    its `bmm` lowering, so a compile_kwargs mutant run failed on clean SGLang with "both a fallback and a decomp"
    (seen in a selftest on a cold Inductor cache). Caches off here, so the compile really lowers."""
    from harness.mutate.warm import WarmWorker

    monkeypatch.setenv("TORCHINDUCTOR_FORCE_DISABLE_CACHES", "1")
    worker = WarmWorker()
    try:
        code, output = worker.run(["tests/warm_inductor_target.py", "-x", "-q", "-p", "no:cacheprovider",
                                   "--report-dir", str(tmp_path)], sglang_root=None, timeout=600, mutant="",
                                  output=tmp_path / "child.out")
    finally:
        worker.close()
    assert code == 0, output[-3000:]


def test_a_mutant_of_a_multiline_condition_is_reached_by_its_operands_lines():
    """Coverage on Python 3.11 records a multi-line `if (` condition on its operands' lines, not its first."""
    source = ("def f(a, b):\n    if (\n        a is not None\n        and b > a\n    ):\n"
              "        return 1\n    return 0\n")
    node = ast.parse(source).body[0]
    swapped = next(m for m in operators.function_mutants("x.py", source, "f", node) if m.operator == "swap-and-or")
    assert swapped.line == 2 and {3, 4} <= set(swapped.lines)


class _WarmThatPrints:
    """A warm worker's stand-in: answers every run with `code` and `output`."""

    def __init__(self, code: int, output: str):
        self.code, self.output = code, output

    def run(self, args, **kwargs):
        return self.code, self.output


def test_a_mutant_sglang_cannot_import_is_killed_not_a_stale_line_map(tmp_path):
    """A mutant that breaks SGLang's import (a removed statement defining a name every registration reads) fails
    the named items' collection, and pytest exits 4 as for an unknown item: that is a kill, with the error; an
    item that is simply not there still stops the run (seed 12011 over `register_custom_op`)."""
    from harness.errors import HarnessError
    from harness.mutate.judge import _run

    mutant = operators.Mutant(file="srt/utils/custom_op.py", function="register_custom_op", line=1,
                              operator="remove-statement", start=(1, 0), end=(1, 1), replacement="pass",
                              original="x", mutated="pass", base="0")
    broken = ("ERROR collecting suites/test_prefill_pcg.py\nE   NameError: name 'extra_kwarg_keys' is not defined\n"
              "ERROR: found no collectors for suites/test_prefill_pcg.py::test_piecewise_forward_modes\n")
    verdict, fields = _run(mutant, tmp_path, ["suites/test_prefill_pcg.py::x"], tmp_path / "run", 60, None,
                           _WarmThatPrints(4, broken))
    assert verdict == KILLED and fields["oracle"] == "crash", fields
    assert "NameError: name 'extra_kwarg_keys'" in fields["diagnosis"], fields
    with pytest.raises(HarnessError, match="line map"):
        _run(mutant, tmp_path, ["suites/test_prefill_pcg.py::x"], tmp_path / "run", 60, None,
             _WarmThatPrints(4, "ERROR: not found: suites/test_prefill_pcg.py::x\n"))
