"""The HTML report of a real failing run, rendered in headless Chromium: the page parses, the picture of what was
explored is drawn with the failing cell outlined red, and the failure shows its oracle and replay command."""
from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
import torch
from torchvision.io import decode_png, read_file

from tests.mutant_runs import failure_records, run_suite_on_mutant
from tests.mutant_tables import KWARGS_MUTANTS as MUTANTS, KWARGS_SUITE as SUITE

# Flags that keep Chromium off this machine's closed network and out of any profile but a scratch one.
QUIET = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage"]


def chromium() -> str:
    found = os.environ.get("HARNESS_CHROMIUM") or next(
        (shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome") if shutil.which(n)), None)
    if not found:
        pytest.skip("no headless Chromium (.ci/run installs Debian's chromium; HARNESS_CHROMIUM names another)")
    return found


def browse(page: Path, profile: Path, *action: str) -> subprocess.CompletedProcess:
    return subprocess.run([chromium(), *QUIET, f"--user-data-dir={profile}", "--window-size=1280,2400", *action,
                           page.as_uri()], capture_output=True, text=True, timeout=120, check=True)


@pytest.fixture(scope="module")
def failing_report(tmp_path_factory) -> Path:
    report_dir = tmp_path_factory.mktemp("report")
    edits = MUTANTS["mode_with_options"].edits
    code, output = run_suite_on_mutant(SUITE, "mode_with_options", edits, report_dir)
    assert code == 1 and (report_dir / "report.html").exists(), output[-2000:]
    return report_dir


@pytest.mark.subprocess
def test_the_page_parses_with_the_picture_and_the_failure(failing_report, tmp_path):
    dom = browse(failing_report / "report.html", tmp_path / "profile", "--dump-dom").stdout
    failure = failure_records(failing_report)[0]
    assert "1 failing test(s)" in dom and "What compile_kwargs explored" in dom
    assert "<svg" in dom and 'stroke="#c62828"' in dom, "the failing cell is not outlined in the picture"
    assert f"[{failure['oracle']}]" in dom and "mode and options both reach torch.compile" in dom
    assert failure["replay"].split(" --replay-blob ")[0].replace("&", "&amp;") in dom


@pytest.mark.subprocess
def test_the_picture_is_drawn_with_the_failure_marked(failing_report, tmp_path):
    """Look at the pixels, not the markup: the cells are drawn (blue) and a red outline lies among them."""
    shot = tmp_path / "page.png"
    browse(failing_report / "report.html", tmp_path / "profile", f"--screenshot={shot}")
    red, green, blue = decode_png(read_file(str(shot)))[:3].to(torch.int32)
    cells = (blue - red > 60) & (blue > 150)
    assert int(cells.sum()) > 1000, "no explored cells were drawn"
    rows, cols = torch.nonzero(cells, as_tuple=True)
    box = (slice(int(rows.min()), int(rows.max()) + 1), slice(int(cols.min()), int(cols.max()) + 1))
    outline = (red > 170) & (green < 80) & (blue < 80)
    assert int(outline[box].sum()) > 40, "no failing cell is outlined red inside the picture"


def test_each_recorded_suite_is_drawn_over_the_axes_the_registry_names():
    """Without a browser: the decode suite's cells are the batches each example replayed, compile_kwargs's its
    platform by backend, and a suite the registry draws no picture for its first two scalar drawn values."""
    from reports.html import picture

    decode = [{"drawn": {"capture_bs": [1, 2]}, "notes": {"replayed": [["DECODE", 1], ["IDLE", 2]]},
               "verdict": "fail"}]
    svg = picture("decode_capture", decode)
    assert "forward mode (rows) by batch size (columns)" in svg
    assert "batch size=1, forward mode=DECODE: fail: 1" in svg and "batch size=2, forward mode=IDLE: fail: 1" in svg
    kwargs = [{"drawn": {"mode": None, "platform": "oot", "backend": "inductor"}, "verdict": "pass"}]
    assert "backend (rows) by platform (columns)" in picture("compile_kwargs", kwargs)
    other = [{"drawn": {"capture_bs": 4, "lora": "a"}, "verdict": "pass"}]
    assert "lora (rows) by capture_bs (columns)" in picture("decode_capture_inductor", other)


def test_coverage_rows_are_shown_for_the_suites_that_ran():
    """A suite's coverage row only when one of its recorded suites ran examples (the static rebinding scan
    drives none); a personality's row only when that personality ran."""
    from reports.summary import ran_suites_coverage

    rows = [{"suite": name} for name in ("compile_kwargs", "decode_capture", "decode_capture_npu", "prefill_pcg")]

    def shown(*examples):
        return [row["suite"] for row in ran_suites_coverage(rows, list(examples))]
    assert shown({"suite": "rebinding_static", "personality": "cuda"}) == []
    assert shown({"suite": "decode_capture_inductor", "personality": "cuda"}) == ["decode_capture"]
    assert shown({"suite": "decode_capture", "personality": "npu"}, {"suite": "prefill_pcg_stateful"}) == [
        "decode_capture", "decode_capture_npu", "prefill_pcg"]
