import os

import pytest

try:
    import torch as _torch
except ImportError:  # differential tests skip, unless CI demands them
    _torch = None


@pytest.fixture
def torch():
    """The torch module, for differential tests against torch.utils.data.

    Skips when torch is absent; fails instead when FASTLOAD_REQUIRE_TORCH is
    set (as .ci/run does), so CI cannot go green without running them.
    """
    if _torch is None:
        if os.environ.get("FASTLOAD_REQUIRE_TORCH"):
            pytest.fail("torch is required here (FASTLOAD_REQUIRE_TORCH is set) but is not installed")
        pytest.skip("differential test needs torch==2.13.0: pip install -e '.[test]'")
    return _torch


@pytest.fixture
def no_leaks():
    """Fails the test if it leaves a new ``fl_`` shared-memory segment or a live child process.

    Yields a ``tests.leakcheck.LeakCheck``; ``no_leaks.watch_pid(pid)`` also
    counts segments of a subprocess's rings.  Processes get ~5 s to exit.
    """
    from leakcheck import LeakCheck

    with LeakCheck(grace=5.0) as check:
        yield check
