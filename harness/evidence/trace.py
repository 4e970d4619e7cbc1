"""`--torch-trace DIR`: a failing example re-run under `TORCH_TRACE` (PyTorch's structured trace of every Dynamo
and Inductor step) and rendered by `tlparse` into an HTML index, as PyTorch's compile bug template asks."""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from harness import errors
from harness.evidence.rerun import rerun


def script_prologue(root: str) -> str:
    """The lines a standalone repro script starts with so that `--torch-trace DIR` works on it: TORCH_TRACE set
    before torch is imported, the trace rendered when the script exits (whatever its status)."""
    return f'''import atexit as _atexit
import os as _os
import sys as _sys

if "--torch-trace" in _sys.argv[:-1]:  # TORCH_TRACE into DIR/raw, rendered by tlparse into DIR/tlparse at exit
    _TRACE = _sys.argv[_sys.argv.index("--torch-trace") + 1]
    _os.environ["TORCH_TRACE"] = _os.path.join(_TRACE, "raw")

    def _render_trace():
        _sys.path.insert(0, {root!r})
        from pathlib import Path
        from harness.evidence.trace import render

        found = render(Path(_TRACE))
        print(f"trace: {{found['trace_index'] or found['trace']}} {{found.get('trace_note', '')}}")

    _atexit.register(_render_trace)
'''


def writable(folder: Path) -> Path:
    """`folder`, created; a one-line error when it cannot be written."""
    return errors.writable(folder, "the --torch-trace folder")


def tlparse() -> str | None:
    """The tlparse binary beside this interpreter (requirements/harness.txt pins it), or on PATH."""
    beside = Path(sys.executable).parent / "tlparse"
    return str(beside) if beside.exists() else shutil.which("tlparse")


def trace(failure: dict, folder: Path, timeout: float = 600) -> dict:
    """Re-run `failure` under TORCH_TRACE into FOLDER/raw and render it (`render`); returns what the failure record
    gains: the trace folder, the index (None when nothing was traced or rendered) and why."""
    outcome = rerun(failure, folder / "run", {"TORCH_TRACE": str(folder / "raw")}, timeout)
    return {**render(folder), "trace_rerun": outcome.verdict}


def render(folder: Path) -> dict:
    """Render the newest log of FOLDER/raw (a TORCH_TRACE folder) with tlparse into FOLDER/tlparse."""
    raw = folder / "raw"
    logs = sorted(raw.glob("*.log"), key=lambda p: p.stat().st_mtime) if raw.exists() else []
    found = {"trace": str(raw), "trace_index": None, "trace_logs": len(logs)}
    binary = tlparse()
    if not logs:
        found["trace_note"] = "the run wrote no trace (it compiled nothing)"
    elif binary is None:
        found["trace_note"] = "tlparse is not installed (pip install -r requirements/harness.txt)"
    else:
        done = subprocess.run([binary, str(logs[-1]), "-o", str(folder / "tlparse"), "--overwrite", "--no-browser"],
                              capture_output=True, text=True, timeout=300)
        index = folder / "tlparse" / "index.html"
        if done.returncode == 0 and index.exists():
            found["trace_index"] = str(index)
        else:
            found["trace_note"] = f"tlparse failed (exit {done.returncode}): {done.stderr.strip()[-300:]}"
    return found
