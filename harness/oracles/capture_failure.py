"""capture-failure: a capture that fails surfaces as SGLang's message with what its user needs to act: the
failure's cause, the backend that failed, and the way out that backend's user has (another prefill backend).
Derived from the case: the backend it drew and the cause the harness injected."""
from __future__ import annotations

from harness.oracles import OracleFailure

ORACLE = "capture-failure"
HEADLINE = "Capture prefill CUDA graph failed"
WAY_OUT = {"tc_piecewise": "--cuda-graph-backend-prefill=breakable"}  # backend -> the flag SGLang must suggest


def check_capture_failure_message(text: str, *, cause: str, backend: str) -> None:
    """Raise unless SGLang's error `text` holds the headline, `cause`, `backend` and the backend's way out."""
    wanted = (HEADLINE, cause, f"backend: {backend}", WAY_OUT[backend])
    missing = [want for want in wanted if want not in text]
    if missing:
        raise OracleFailure(ORACLE, f"the {backend} capture-failure message lacks {missing}: {text[:300]}",
                            missing=missing, backend=backend)
