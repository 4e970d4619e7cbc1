"""Mutant tables that more than one self-test file reads (no test module imports another): the compile-kwargs
suite's mutants, known bug 1's by-value import of `patch_model` with the static test that finds it, and known bug
2's edit (the piecewise runner passing MIXED through). Each file that owns a table's tests imports it from here."""
from __future__ import annotations

from tests.mutant_runs import Mutant

DECODE_RUNNER = "srt/model_executor/runner/decode_cuda_graph_runner.py"
PREFILL_RUNNER = "srt/model_executor/runner/prefill_cuda_graph_runner.py"
STATIC = "suites/test_decode_capture.py::test_no_module_imports_a_rebound_name_by_value"

BUG1 = [
    (DECODE_RUNNER,
     "from sglang.srt.compilation import torch_compile_decoration\n"
     "from sglang.srt.compilation.torch_compile_decoration import set_torch_compile_config\n",
     "from sglang.srt.compilation.torch_compile_decoration import (\n"
     "    patch_model,\n"
     "    set_torch_compile_config,\n"
     ")\n"),
    (DECODE_RUNNER, "with torch_compile_decoration.patch_model(", "with patch_model("),
]

LOCAL_NORMALISED = """        pcg_forward_mode = (
            ForwardMode.EXTEND
            if forward_batch.forward_mode == ForwardMode.MIXED
            else forward_batch.forward_mode
        )
"""
GLOBAL_NORMALISED = """        pcg_global_forward_mode = (
            ForwardMode.EXTEND
            if forward_batch.global_forward_mode == ForwardMode.MIXED
            else forward_batch.global_forward_mode
        )
"""

BUG2_MIXED_NOT_NORMALISED = [(PREFILL_RUNNER, LOCAL_NORMALISED + GLOBAL_NORMALISED,
                              "        pcg_forward_mode = forward_batch.forward_mode\n"
                              "        pcg_global_forward_mode = forward_batch.global_forward_mode\n")]

KWARGS_SUITE = "suites/test_compile_kwargs.py"
KWARGS_FILE = "multimodal_gen/runtime/utils/torch_compile.py"

KWARGS_MUTANTS = {
    # Known bug class 3: mode reaches torch.compile together with the platform's options.
    "mode_with_options": Mutant(
        test=KWARGS_SUITE,
        edits=[(KWARGS_FILE, '"options" not in compile_kwargs\n            and backend == "inductor"',
                'backend == "inductor"')],
        oracle="kwargs-validity",
        texts=["mode and options both reach torch.compile"]),
    # The out-of-tree hooks ignored: falls back to inductor with plain mode.
    "oot_hooks_ignored": Mutant(
        test=KWARGS_SUITE,
        edits=[(KWARGS_FILE, "if current_platform.is_out_of_tree():",
                "if False and current_platform.is_out_of_tree():")],
        oracle="hook-contract",
        texts=["get_compile_backend"]),
    # The module not passed to the options hook.
    "module_not_passed_to_options_hook": Mutant(
        test=KWARGS_SUITE,
        edits=[(KWARGS_FILE, "current_platform.get_compile_options(module)",
                "current_platform.get_compile_options(None)")],
        oracle="hook-contract",
        texts=["get_compile_options must receive the module"]),
    # The stages' entry point drops the module on its way to build_torch_compile_kwargs.
    "resolve_drops_module": Mutant(
        test=KWARGS_SUITE,
        edits=[(KWARGS_FILE, "        mode=mode,\n        module=module,\n", "        mode=mode,\n")],
        oracle="hook-contract",
        texts=["the module being compiled must reach get_compile_options"]),
    # NPU loses dynamic=False.
    "npu_dynamic_dropped": Mutant(
        test=KWARGS_SUITE,
        edits=[(KWARGS_FILE, '        compile_kwargs["dynamic"] = False\n', "")],
        oracle="kwargs-validity",
        texts=["expected dynamic=False"]),
    # Built-in platforms lose the compile mode.
    "builtin_mode_dropped": Mutant(
        test=KWARGS_SUITE,
        edits=[(KWARGS_FILE, '    elif mode is not None:\n        compile_kwargs["mode"] = mode',
                "    elif False:\n        pass")],
        oracle="kwargs-validity",
        texts=["did not reach torch.compile"]),
}
