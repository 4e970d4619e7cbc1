"""The static rebinding scan on a small synthetic package: each kind of rebinding and import, found or not."""
from __future__ import annotations

import textwrap

from harness.oracles.rebinding import scan


def write(root, files: dict) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))


def test_scan_finds_by_value_imports_of_rebound_names(tmp_path, monkeypatch):
    monkeypatch.setenv("HARNESS_CACHE_DIR", str(tmp_path / "cache"))
    package = tmp_path / "pkg"
    write(package, {
        "__init__.py": "",
        "hooks.py": "def patch():\n    return 'original'\n\ndef other():\n    return 1\n",
        "platform.py": """
            from pkg import hooks
            import pkg.hooks as hooks_module

            def install():
                hooks.patch = lambda: 'override'          # rebinding by assignment, at run time
                setattr(hooks_module, "other", lambda: 2)  # rebinding by setattr
            """,
        "runner.py": "from pkg.hooks import patch\n\ndef run():\n    return patch()\n",       # finding
        "reader.py": "from pkg import hooks\n\ndef run():\n    return hooks.patch()\n",     # fine: looks up
        "late.py": "def run():\n    from pkg.hooks import other\n    return other()\n",     # benign: call time
        "unused.py": "from pkg.hooks import patch  # noqa\n",                               # not used: fine
        "reexport/__init__.py": "from pkg.hooks import other\n",                          # re-export, unused
        "user.py": "from pkg.reexport import other\n\nVALUE = other()\n",                   # finding via re-export
    })
    result = scan(package)
    found = sorted((f.target_module + "." + f.name, f.by_value_import.module) for f in result.findings)
    assert found == [("pkg.hooks.other", "pkg.user"), ("pkg.hooks.patch", "pkg.runner")]
    runner = next(f for f in result.findings if f.by_value_import.module == "pkg.runner")
    assert runner.rebinding.module == "pkg.platform" and runner.rebinding.scope == "in install"
    assert "platform.py:6" in runner.describe() and "runner.py:1" in runner.describe()
    assert [f.by_value_import.module for f in result.benign] == ["pkg.late"]
    assert result.rebinding_count == 2


def test_findings_outside_the_capture_path_are_advisories(tmp_path, monkeypatch):
    """A stale binding used by a capture-path module fails the oracle; the same class in a module off that path
    (the scheduler) is returned as an advisory, and fails too with HARNESS_REBINDING_SCOPE=all."""
    import pytest

    from harness.oracles import OracleFailure
    from harness.oracles.rebinding import assert_no_by_value_imports_of_rebound_names

    monkeypatch.setenv("HARNESS_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("HARNESS_REBINDING_SCOPE", raising=False)
    package = tmp_path / "sglang"
    files = {
        "__init__.py": "", "srt/__init__.py": "", "srt/managers/__init__.py": "",
        "srt/model_executor/__init__.py": "",
        "srt/hooks.py": "def stream():\n    return 'cuda'\n",
        "srt/npu_runner.py": "from sglang.srt import hooks\n\nhooks.stream = lambda: 'npu'\n",
        "srt/managers/scheduler.py": "from sglang.srt.hooks import stream\n\nS = stream()\n",
    }
    write(package, files)
    result = assert_no_by_value_imports_of_rebound_names(package)
    assert result.findings == [] and [a.by_value_import.module for a in result.advisories] == [
        "sglang.srt.managers.scheduler"]
    monkeypatch.setenv("HARNESS_REBINDING_SCOPE", "all")
    with pytest.raises(OracleFailure, match="scheduler"):
        assert_no_by_value_imports_of_rebound_names(package)
    monkeypatch.delenv("HARNESS_REBINDING_SCOPE")
    write(package, {"srt/model_executor/runner.py": "from sglang.srt.hooks import stream\n\nS = stream()\n"})
    with pytest.raises(OracleFailure, match=r"sglang\.srt\.model_executor\.runner imports it by value"):
        assert_no_by_value_imports_of_rebound_names(package)


def test_the_cache_is_where_harness_cache_dir_says_and_keyed_on_the_scanner(tmp_path, monkeypatch):
    """HARNESS_CACHE_DIR is read when the scan runs (set here, after import, it is the folder written), and a
    summary made by another version of the scanner is never reused."""
    from harness.oracles import rebinding

    monkeypatch.setenv("HARNESS_CACHE_DIR", str(tmp_path / "cache"))
    package = tmp_path / "pkg"
    write(package, {"__init__.py": "", "hooks.py": "def patch():\n    return 1\n",
                    "platform.py": "from pkg import hooks\n\nhooks.patch = None\n",
                    "runner.py": "from pkg.hooks import patch\n\nVALUE = patch()\n"})
    summarised = []
    real = rebinding._summarise
    monkeypatch.setattr(rebinding, "_summarise", lambda *args: summarised.append(args[1]) or real(*args))

    first = scan(package)
    assert (tmp_path / "cache" / "rebinding-v1.pickle").exists()
    assert sorted(summarised) == ["pkg.platform", "pkg.runner"]  # the files with a rebinding or an import of one
    summarised.clear()
    assert scan(package).findings == first.findings and summarised == []  # same scanner: every summary cached
    monkeypatch.setattr(rebinding, "_scanner_digest", lambda: "another scanner")
    assert scan(package).findings == first.findings and sorted(summarised) == ["pkg.platform", "pkg.runner"]
