"""The gate's own arithmetic, in process: the lines a change touches (numbered as in the base), which tests a line
map selects for them, the behaviour comparison of two runs' records, and bad input (a base that is not a checkout,
a report folder that cannot be written, a change touching no targeted file), each one line and exit 2."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from harness.__main__ import main
from harness.errors import HarnessError
from harness.gate import behaviour
from harness.gate.changes import changed_lines, tree_changes
from harness.gate.select import select
from harness.mutate.reach import LineMap

RUNNER = "srt/model_executor/runner/decode_cuda_graph_runner.py"


def test_changed_lines_are_numbered_as_in_the_base():
    base = ["a", "b", "c", "d", "e"]
    assert changed_lines(base, ["a", "B", "c", "d", "e"]) == (2,)  # replaced
    assert changed_lines(base, ["a", "b", "d", "e"]) == (3,)  # deleted
    assert changed_lines(base, ["a", "b", "new", "c", "d", "e"]) == (2, 3)  # inserted between 2 and 3
    assert changed_lines(base, base + ["tail"]) == (5,)  # appended after the last line


def _tree(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (root / "sglang" / name).parent.mkdir(parents=True, exist_ok=True)
        (root / "sglang" / name).write_text(text)
    return root


def test_tree_changes_lists_modified_added_and_removed_files(tmp_path):
    base = _tree(tmp_path / "base", {"__init__.py": "", "a.py": "x = 1\ny = 2\n", "gone.py": "z = 3\n"})
    head = _tree(tmp_path / "head", {"__init__.py": "", "a.py": "x = 1\ny = 3\n", "new.py": "w = 4\n"})
    found = {c.file: (c.status, c.lines) for c in tree_changes(base / "sglang", head / "sglang")}
    assert found == {"a.py": ("modified", (2,)), "gone.py": ("removed", ()), "new.py": ("added", ())}


def _runner_tree(tmp_path: Path) -> Path:
    lines = ["def f(x):", "    if x:", "        return 1", "    # a comment", "    return 2"]
    return _tree(tmp_path / "base", {RUNNER: "\n".join(lines) + "\n"}) / "sglang"


def test_select_runs_only_the_items_that_executed_a_changed_line(tmp_path):
    from harness.gate.changes import FileChange

    base = _runner_tree(tmp_path)
    line_map = LineMap({RUNNER: {"1": [], "2": ["t::a", "t::b"], "3": ["t::a"], "5": ["t::b"]}},
                       {"t::a": 2.0, "t::b": 1.0})
    chosen = select([FileChange(RUNNER, "modified", (3,))], line_map, base)
    assert chosen.items == ["t::a"] and chosen.suites == [] and chosen.unexecuted == {}
    chosen = select([FileChange(RUNNER, "modified", (2, 5))], line_map, base)
    assert chosen.items == ["t::b", "t::a"]  # fastest first


def test_select_says_which_changed_statements_no_test_executed(tmp_path):
    from harness.gate.changes import FileChange

    base = _runner_tree(tmp_path)
    line_map = LineMap({RUNNER: {"1": [], "2": ["t::a"]}}, {"t::a": 1.0})
    chosen = select([FileChange(RUNNER, "modified", (3, 4))], line_map, base)
    assert chosen.items == [] and chosen.unexecuted == {RUNNER: [3]}  # line 4 is a comment, not a statement


def test_select_runs_the_suites_of_a_file_without_a_record(tmp_path):
    from harness.gate.changes import FileChange

    chosen = select([FileChange(RUNNER, "modified", (3,))], LineMap({}, {}), _runner_tree(tmp_path))
    assert "suites/test_decode_capture.py" in chosen.suites and chosen.items == []
    assert "no record" in chosen.why["suites/test_decode_capture.py"]


def test_select_refuses_a_change_that_touches_no_targeted_file(tmp_path):
    from harness.gate.changes import FileChange

    with pytest.raises(HarnessError, match="touches no file the harness targets"):
        select([FileChange("srt/entrypoints/http_server.py", "modified", (1,))], LineMap({}, {}), tmp_path)


def _record(drawn: dict, verdict="pass", notes=None, outputs=None) -> dict:
    return {"test": "suites/t.py::test", "drawn": drawn, "verdict": verdict, "notes": notes or {},
            "behaviour": {"outputs": outputs or []}}


def test_behaviour_compares_notes_outputs_and_draws():
    out = {"shape": [2, 3], "stats": [1.0, 2.0]}
    base = [_record({"bs": 1}, notes={"capture_bs": [1, 2], "capture_seconds": 0.3}, outputs=[out]),
            _record({"bs": 2})]
    head = [_record({"bs": 1}, notes={"capture_bs": [1, 2, 4], "capture_seconds": 0.9},
                    outputs=[{"shape": [2, 3], "stats": [1.00001, 2.0]}]),
            _record({"bs": 3})]
    differences, compared = behaviour.compare(base, head, rtol=1e-4)
    assert compared == 1
    assert {d.what for d in differences} == {"note capture_bs", "drawn on one tree only"}  # timings and the 1e-5
    moved = [_record({"bs": 1}, outputs=[{"shape": [2, 3], "stats": [1.1, 2.0]}])]
    differences, _ = behaviour.compare([_record({"bs": 1}, outputs=[out])], moved, rtol=1e-4)
    assert [d.what for d in differences] == ["outputs[0]"]


def test_behaviour_narrows_a_note_to_the_key_that_changed():
    base = [_record({"bs": 1}, notes={"dynamo_budget": {"limit": 1024, "hits": 0}})]
    head = [_record({"bs": 1}, notes={"dynamo_budget": {"limit": 512, "hits": 0}})]
    (difference,), _ = behaviour.compare(base, head)
    assert (difference.what, difference.base, difference.head) == ("note dynamo_budget.limit", 1024, 512)


def test_behaviour_is_written_into_the_junit_xml(tmp_path):
    (tmp_path / "junit.xml").write_text('<testsuites><testsuite name="pytest" tests="0"/></testsuites>')
    base, head = [_record({"bs": 1}, verdict="pass")], [_record({"bs": 1}, verdict="fail")]
    differences, compared = behaviour.compare(base, head)
    behaviour.write(tmp_path, differences, compared, 1e-4, fail=True)
    text = (tmp_path / "junit.xml").read_text()
    assert 'name="behaviour"' in text and "<failure" in text and 'name="verdict"' in text
    assert json.loads((tmp_path / "behaviour.jsonl").read_text())["what"] == "verdict"


def test_gate_refuses_a_base_that_is_not_a_checkout(tmp_path, capsys):
    tree = _tree(tmp_path / "head", {"__init__.py": ""})
    assert main(["gate", str(tree), "--base", str(tmp_path / "nowhere"), "--report-dir", str(tmp_path / "r")]) == 2
    assert "is not an SGLang source tree" in capsys.readouterr().err


def test_gate_refuses_a_report_folder_it_cannot_write(tmp_path, capsys):
    tree = _tree(tmp_path / "head", {"__init__.py": ""})
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert main(["gate", str(tree), "--report-dir", str(blocker / "r")]) == 2
    assert "cannot be written" in capsys.readouterr().err


def test_gate_refuses_a_diff_touching_no_targeted_file(tmp_path, capsys):
    base = _tree(tmp_path / "base", {"__init__.py": "", "srt/x.py": "a = 1\n"})
    head = _tree(tmp_path / "head", {"__init__.py": "", "srt/x.py": "a = 2\n"})
    select_dir = tmp_path / "map"
    select_dir.mkdir()
    (select_dir / ".sglang-coverage").write_text("")
    (select_dir / "examples.jsonl").write_text(json.dumps({"sglang_path": str(base / "sglang")}) + "\n")
    code = main(["gate", str(head), "--base", str(base), "--select", str(select_dir),
                 "--report-dir", str(tmp_path / "r")])
    assert code == 2 and "touches no file the harness targets" in capsys.readouterr().err


def test_no_behaviour_change_needs_a_base(tmp_path, capsys):
    assert main(["gate", str(tmp_path), "--no-behaviour-change"]) == 2
    assert "give --base TREE" in capsys.readouterr().err
