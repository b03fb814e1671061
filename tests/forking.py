"""Running a test's code in a child forked from the test process."""

from __future__ import annotations

import os
import traceback


def run_and_exit(body) -> None:
    """In a forked child: run ``body()``, exit 0 if it returned, else print why and exit 1."""
    code = 1
    try:
        body()
        code = 0
    except BaseException:
        traceback.print_exc()
    finally:
        os._exit(code)


def fork_child(body) -> int:
    """Run ``body()`` in a forked child; its exit status."""
    pid = os.fork()
    if pid == 0:  # pragma: no cover - runs in the child
        run_and_exit(body)
    return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
