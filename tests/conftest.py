import os
import signal

import pytest

# A shell starts a background job with SIGINT ignored (and nohup, SIGHUP), and
# Python then never installs its KeyboardInterrupt handler; every test of
# Ctrl-C, in this process or in the Python children it starts (an ignored
# signal stays ignored across exec, a handled one does not), would fail.
# Likewise the tests of a process group hung up.  Run as from a terminal,
# wherever the suite was started.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)
if signal.getsignal(signal.SIGHUP) == signal.SIG_IGN:
    signal.signal(signal.SIGHUP, signal.SIG_DFL)


@pytest.fixture
def torch():
    """The torch module, for differential tests against torch.utils.data.

    Skips when torch is absent; fails instead when FASTLOAD_REQUIRE_TORCH is
    set (as .ci/run does), so CI cannot go green without running them.
    Imported here, at first use, not when the suite is collected: see
    ``pytest_collection_modifyitems``.
    """
    try:
        import torch
    except ImportError:  # differential tests skip, unless CI demands them
        if os.environ.get("FASTLOAD_REQUIRE_TORCH"):
            pytest.fail("torch is required here (FASTLOAD_REQUIRE_TORCH is set) but is not installed")
        pytest.skip("differential test needs torch==2.13.0: pip install -e '.[test]'")
    return torch


def _heavy_imports(item) -> int:
    """0 for a test that imports no large library here, 1 for one that uses torch,
    2 for one marked ``imports_heavy_library`` (pyarrow, datasets, moto, ...)."""
    if item.get_closest_marker("imports_heavy_library"):
        return 2
    return 1 if "torch" in getattr(item, "fixturenames", ()) else 0


def pytest_collection_modifyitems(items):
    # Most tests fork workers, and a fork of this process costs many times more
    # with torch imported, and more again with datasets, moto, ... beside it: tests
    # run from the lightest process to the heaviest, in pytest's order otherwise.
    items.sort(key=_heavy_imports)


@pytest.fixture
def no_leaks():
    """Fails the test if it leaves a new ``fl_`` shared-memory segment or a live child process.

    Yields a ``tests.leakcheck.LeakCheck``; ``no_leaks.watch_pid(pid)`` also
    counts segments of a subprocess's rings.  Processes get ~5 s to exit.
    """
    from leakcheck import LeakCheck

    with LeakCheck(grace=5.0) as check:
        yield check
