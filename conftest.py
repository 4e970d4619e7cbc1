"""The harness's pytest plugin lives in harness/pytest_plugin.py; this loads it for every run from this tree."""
pytest_plugins = ["harness.pytest_plugin"]
