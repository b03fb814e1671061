"""Forks the loader makes of its own workers, told apart from the caller's.

At-fork hooks treat the two differently.  A fork the caller makes (an
``os.fork()``, a fork-context ``multiprocessing.Process``, from any thread)
shares the batches the caller holds (NOTE [ Batches a forked child holds ] in
_ring/fork_marks.py) and must start with the caller's signal handlers (NOTE
[ Ctrl-C held over fork and teardown ] in interrupts.py).  A loader's own
worker forks leave that loader's slots in circulation, and a new worker keeps
Ctrl-C recorded until it ignores it.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any, Iterator

from fastload._lifetime.hooks import at_fork

__all__ = ["forking_workers", "workers_being_forked", "forked_as_worker"]

# Thread -> the holders of slots (a ring, spare slots) of the loader forking
# its workers from that thread now.
_workers_forked_by: dict[int, tuple] = {}
# In a child: whether it was forked as a loader's worker.
_forked_as_worker = False


@contextlib.contextmanager
def forking_workers(*holders: Any) -> Iterator[None]:
    """The block in which a loader forks its workers from this thread;
    ``holders`` are its ring and spare slots, which its workers never read."""
    thread = threading.get_ident()
    _workers_forked_by[thread] = holders
    try:
        yield
    finally:
        _workers_forked_by.pop(thread, None)


def workers_being_forked() -> tuple | None:
    """In a ``before`` fork hook: the holders of the loader forking its
    workers from this thread, or None for a fork the caller makes."""
    return _workers_forked_by.get(threading.get_ident())


def forked_as_worker() -> bool:
    """In an ``after_in_child`` fork hook: whether this child is a loader's worker."""
    return _forked_as_worker


def _note_what_this_child_is() -> None:
    global _forked_as_worker
    _forked_as_worker = threading.get_ident() in _workers_forked_by
    _workers_forked_by.clear()  # the parent's threads are not this process's


# First of the child's hooks (FORK_HOOKS): the others read it.
at_fork("fork kind", after_in_child=_note_what_this_child_is)
