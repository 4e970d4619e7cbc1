"""Where the harness's checkout is: the one definition every module that reads its files (docs, requirements,
suites, the release environments) takes. Installed from the wheel it is the site-packages folder above `harness/`."""
from __future__ import annotations

from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
