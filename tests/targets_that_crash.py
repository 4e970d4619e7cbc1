"""A suite whose targets crash or hang on purpose, run by tests/test_isolation.py under xdist (not collected by
default: its name does not start with test_)."""
import ctypes
import os
import time

from hypothesis import example as explicit, given, settings, strategies as st

from harness.record import example


@settings(max_examples=10, database=None)
@given(n=st.integers(0, 5))
@explicit(n=3)
def test_segfaults_when_n_is_three(n):
    with example("crashy", n=n, kind="segfault"):
        if n == 3:
            ctypes.string_at(0)  # reads address 0: SIGSEGV in this process


@settings(max_examples=5, database=None)
@given(n=st.integers(0, 5))
@explicit(n=4)
def test_hangs_when_n_is_four(n):
    with example("crashy", n=n, kind="hang"):
        if n == 4:
            time.sleep(3600)


def test_the_run_goes_on_after_them():
    with example("crashy", kind="after"):
        assert os.getpid() > 0
