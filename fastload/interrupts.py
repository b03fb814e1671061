"""Ctrl-C (SIGINT) held over code where CPython would drop the KeyboardInterrupt.

The worker pool forks and tears down inside these blocks; see NOTE [ Ctrl-C
held over fork and teardown ] at ``ctrl_c_held``.
"""

from __future__ import annotations

import _thread
import contextlib
import signal
import threading
from typing import Any, Iterator

__all__ = ["ctrl_c_held", "ctrl_c_deferred"]


@contextlib.contextmanager
def ctrl_c_held() -> Iterator[list]:
    """Hold a Ctrl-C that arrives inside the block; deliver it when the block ends.

    Yields the list the Ctrl-Cs are recorded in, so that a wait in the block
    can end at one.

    NOTE [ Ctrl-C held over fork and teardown ]
    CPython drops an exception raised inside an at-fork hook, a ``__del__``
    or a weakref callback: it prints "Exception ignored in ..." and goes on.
    Python's SIGINT handler raises KeyboardInterrupt wherever the main thread
    next checks for signals, which may be inside one of those, and then the
    Ctrl-C is lost and the loop goes on.  A loop of short epochs with new
    workers, interrupted at a random instant (``bench/ctrl_c_trials.py``),
    lost 5 Ctrl-Cs in 300 so: in the workers' pipes' ``Connection.__del__``,
    the finalizer multiprocessing attaches to each worker process, and the
    ring's lease ``__del__``; and in 28 more, a new worker printed such a
    dropped KeyboardInterrupt.  torch's DataLoader lost 5 in 100, mostly in
    logging's at-fork hook.
    * ``os.fork`` runs the at-fork hooks that modules register (logging's,
      for one), in the parent and in the child.
    * A worker's pipes and its ``Process`` run Python finalizers when they
      are dropped.
    So the pool forks, and drops what it owned at shutdown, inside this
    block: the main thread's SIGINT handler only records the signal, and the
    handler that was in place gets it once the block is left.  A forked
    worker inherits the recording handler until it ignores SIGINT, so a
    Ctrl-C cannot raise in its start-up either.  (Leases need no such block:
    see NOTE [ Leases ] in ring.py.)  Since then none is lost or printed in
    600 (300 with new workers, 300 with persistent ones).  Only the
    main thread runs Python signal handlers, so elsewhere this does nothing;
    nor for SIG_DFL and SIG_IGN, which involve no Python handler.
    The teardown of an iterator may itself run as a finalizer (a ``break``,
    and the iterator is dropped), so there a held Ctrl-C is not raised at the
    block's end but sent again once the teardown is over (``ctrl_c_deferred``),
    and the teardown's wait for busy workers ends at a Ctrl-C: they are
    terminated, not left running (one could create a slot's segment after the
    ring unlinked its names).  Before, a Ctrl-C during that wait was printed
    and dropped, and left segments behind; in 250 Ctrl-Cs at random instants
    into a loop of short epochs (a helper's storm script, not in the
    repository), none is lost now, no segment and no process is left.
    """
    with _ctrl_c_recorded() as held:
        yield held
    if held:
        signal.getsignal(signal.SIGINT)(*held[0])


@contextlib.contextmanager
def ctrl_c_deferred() -> Iterator[list]:
    """Hold a Ctrl-C that arrives inside the block; send it again after the block.

    Yields the list the Ctrl-Cs are recorded in, as ``ctrl_c_held`` does.

    For teardown that may run as a finalizer (a dropped iterator's), where
    CPython prints and drops any exception: a KeyboardInterrupt raised at
    the block's end, or re-raised there with ``_thread.interrupt_main`` (the
    very next call checks for it), would be lost.  Instead a new thread sends
    the main thread a SIGINT: it runs once the main thread lets go of the
    GIL, by then back in the caller's code, and a real signal also cuts short
    a ``sleep`` or a blocking read there.
    """
    with _ctrl_c_recorded() as held:
        yield held
    if held:
        _thread.start_new_thread(signal.pthread_kill,
                                 (threading.main_thread().ident, signal.SIGINT))


@contextlib.contextmanager
def _ctrl_c_recorded() -> Iterator[list]:
    """The main thread's SIGINT handler, inside the block, only records the
    signal (in the list yielded); the handler in place is back after it.
    Nothing changes in another thread, or for SIG_DFL and SIG_IGN."""
    held: list[tuple[int, Any]] = []
    if threading.current_thread() is not threading.main_thread():
        yield held
        return
    previous = signal.getsignal(signal.SIGINT)
    if not callable(previous):
        yield held
        return
    signal.signal(signal.SIGINT, lambda signum, frame: held.append((signum, frame)))
    try:
        yield held
    finally:
        signal.signal(signal.SIGINT, previous)
