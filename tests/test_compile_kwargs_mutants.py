"""Each mutant re-introduces a break of the build_torch_compile_kwargs contract into a scratch copy of the
installed SGLang; the suite must fail naming the broken contract. Clean SGLang must pass."""
from __future__ import annotations

import pytest

from harness.record import read_records
from tests.mutant_runs import Mutant, assert_caught, run_suite_on_mutant

pytestmark = pytest.mark.subprocess  # every test here runs a suite in another process

SUITE = "suites/test_compile_kwargs.py"
FILE = "multimodal_gen/runtime/utils/torch_compile.py"

MUTANTS = {
    # Known bug class 3: mode reaches torch.compile together with the platform's options.
    "mode_with_options": Mutant(
        test=SUITE,
        edits=[(FILE, '"options" not in compile_kwargs\n            and backend == "inductor"',
                'backend == "inductor"')],
        oracle="kwargs-validity",
        texts=["mode and options both reach torch.compile"]),
    # The out-of-tree hooks ignored: falls back to inductor with plain mode.
    "oot_hooks_ignored": Mutant(
        test=SUITE,
        edits=[(FILE, "if current_platform.is_out_of_tree():", "if False and current_platform.is_out_of_tree():")],
        oracle="hook-contract",
        texts=["get_compile_backend"]),
    # The module not passed to the options hook.
    "module_not_passed_to_options_hook": Mutant(
        test=SUITE,
        edits=[(FILE, "current_platform.get_compile_options(module)", "current_platform.get_compile_options(None)")],
        oracle="hook-contract",
        texts=["get_compile_options must receive the module"]),
    # The stages' entry point drops the module on its way to build_torch_compile_kwargs.
    "resolve_drops_module": Mutant(
        test=SUITE,
        edits=[(FILE, "        mode=mode,\n        module=module,\n", "        mode=mode,\n")],
        oracle="hook-contract",
        texts=["the module being compiled must reach get_compile_options"]),
    # NPU loses dynamic=False.
    "npu_dynamic_dropped": Mutant(
        test=SUITE,
        edits=[(FILE, '        compile_kwargs["dynamic"] = False\n', "")],
        oracle="kwargs-validity",
        texts=["expected dynamic=False"]),
    # Built-in platforms lose the compile mode.
    "builtin_mode_dropped": Mutant(
        test=SUITE,
        edits=[(FILE, '    elif mode is not None:\n        compile_kwargs["mode"] = mode',
                "    elif False:\n        pass")],
        oracle="kwargs-validity",
        texts=["did not reach torch.compile"]),
}


@pytest.mark.parametrize("name", sorted(MUTANTS))
def test_mutant_fails_the_suite_with_its_diagnosis(name, tmp_path):
    failure = assert_caught(name, MUTANTS[name], tmp_path)
    assert failure["sglang_mutant"] == name and failure["test"] in failure["replay"]


def test_clean_sglang_passes(tmp_path):
    code, output = run_suite_on_mutant(SUITE, "clean", [], tmp_path)
    assert code == 0, output[-3000:]
    rows = read_records(tmp_path / "examples.jsonl")
    assert len(rows) >= 40 and not [r for r in rows if r["verdict"] in ("fail", "error")]
