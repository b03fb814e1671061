"""An iterator's teardown: stop its workers, then close its ring, exactly once.

The teardown holds the pool and the ring, never the iterator, so it runs on
``shutdown()``, when the iterator is collected (even inside a reference
cycle), or at the latest when the process exits (NOTE [ What happens at fork,
at exit and on a signal ] in ``_lifetime/hooks.py``).
"""

from __future__ import annotations

import os
import weakref
from typing import Any

from fastload._lifetime.hooks import arm_exit_in_this_process, at_exit
from fastload._lifetime.interrupts import signals_deferred

__all__ = ["tear_down_when_gone", "finish_cut_short_teardowns"]

# Teardowns not yet run to their end: ring -> (owner pid, its finalizer, the
# pool).  A handler of the caller's that raises the moment a finalizer starts,
# before ``signals_deferred`` holds the signals, ends the teardown there, and a
# finalizer runs once: the next iterator, or the process's exit, finishes it.
_teardowns_due: dict[Any, tuple[int, Any, Any]] = {}


def _stop_then_close(pool: Any, ring: Any) -> None:
    # Often run as a finalizer, where CPython would print and drop a
    # KeyboardInterrupt: a signal the caller handles that arrives meanwhile is
    # sent again after it (NOTE [ Every handler held over teardown ]).
    with signals_deferred():
        try:
            pool.shutdown()  # bounded waits for the workers
        finally:
            ring.close()


def release_workers_and_ring(owner_pid: int, pool: Any, ring: Any) -> None:
    """Stop the workers, then close the ring (POSIX segments: unlink their names).

    A process forked by the caller (``os.fork()``) inherits the finalizer and
    runs it at its own exit; the workers and the ring are still the owner's
    then, in use, so it leaves them alone.
    """
    if os.getpid() != owner_pid:
        return
    _stop_then_close(pool, ring)
    _teardowns_due.pop(ring, None)


def tear_down_when_gone(owner: Any, pool: Any, ring: Any) -> weakref.finalize:
    """The finalizer that tears ``owner``'s workers and ring down (call it to do so now)."""
    finish_cut_short_teardowns()
    owner_pid = os.getpid()
    finalizer = weakref.finalize(owner, release_workers_and_ring, owner_pid, pool, ring)
    _teardowns_due[ring] = (owner_pid, finalizer, pool)
    arm_exit_in_this_process()
    return finalizer


def finish_cut_short_teardowns() -> None:
    for ring, (owner_pid, finalizer, pool) in list(_teardowns_due.items()):
        if owner_pid == os.getpid() and not finalizer.alive:
            _teardowns_due.pop(ring, None)
            _stop_then_close(pool, ring)


def _tear_down_as_multiprocessing_exits() -> None:
    """A child multiprocessing forked ends with ``os._exit`` after its exit
    function, running no ``atexit`` handler (so no finalizer), and that
    function terminates the child's daemonic processes, our workers, which
    then leave the ring to a main process that is alive: tear down first."""
    for _, (owner_pid, finalizer, _) in list(_teardowns_due.items()):
        if owner_pid == os.getpid():
            finalizer()
    finish_cut_short_teardowns()


at_exit(finish_cut_short_teardowns, _tear_down_as_multiprocessing_exits)
