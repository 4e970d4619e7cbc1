"""The wheel's pytest entry point (`sglang_harness`): inert unless asked, so that installing the harness into
another project's environment (SGLang's test tree) changes none of its pytest runs: no options that could clash
with its own conftests (`--device`), no reports written, no Hypothesis profile or heap freeze.

Asked: `pytest --sglang-harness ...` loads the harness's plugin (`harness.pytest_plugin`) before pytest reads the
rest of the command line, as `pytest -p harness.pytest_plugin ...` does.
"""
from __future__ import annotations

import pytest

ASK = "--sglang-harness"
PLUGIN = "harness.pytest_plugin"


def pytest_addoption(parser):
    parser.addoption(ASK, action="store_true",
                     help=f"load the SGLang capture harness's plugin and its options, as -p {PLUGIN} does")


@pytest.hookimpl(tryfirst=True)
def pytest_load_initial_conftests(early_config, parser, args):
    if ASK in args and not early_config.pluginmanager.has_plugin(PLUGIN):
        early_config.pluginmanager.import_plugin(PLUGIN)
