"""The slots a forked child may be reading, marked at every fork of this process.

NOTE [ Batches a forked child holds ]
A process forked while the caller holds a batch maps that batch's slot too
(fork shares a ``MAP_SHARED`` mapping, it does not copy it): a
``multiprocessing.Process`` given the batch as an argument under fork, or an
``os.fork()`` that saves it in the background.  torch's batches each live in
a segment of their own that nothing writes again, so such a child reads its
batch intact whatever the parent does next.  A slot, though, comes back to
the ring when the parent drops its last view, and a worker would write the
next batch over the one the child is reading.  So at every fork the slots the
caller holds are marked, and one that comes back is retired instead
(let go of, unmapped here, dropped by the workers, never written again: the
child's mapping keeps its pages), nor kept for the next epoch; a new slot
takes its place when one is needed.  A loader forking its own workers leaves
its own slots alone (its workers never read its batches: the loop's last
batch, still held as the next epoch starts, keeps its slot in circulation),
but not another loader's, which a dataset may hold (a replay buffer).  A
fork from another thread takes ``marks_lock`` from its marking to its end,
the lock under which leases are made and a ring hands its own to the spares.
"""

from __future__ import annotations

import threading

from fastload._lifetime.forks import workers_being_forked
from fastload._lifetime.hooks import at_fork
from fastload._lifetime.weak_registry import WeakRegistry

__all__ = ["holders_of_slots", "marks_lock"]

# Every Ring and SpareSlots of this process: each has a ``mark_held_at_fork()``.
holders_of_slots = WeakRegistry()

# Held from the marking to the end of a fork, and while a lease is made or a
# ring's leases go to the spares: a fork from another thread then finds every
# lease in one place, marked, and the child holds no lease made after its
# marks.  Without it, a fork could mark the spares, then the ring, while the
# main thread handed the ring's leases to the spares in between, and so mark
# the caller's batch nowhere: a stress run of forks saw children read their
# batch overwritten.  Reentrant: a signal handler may fork mid-hand-over.
# Replaced in a child, so read it as ``fork_marks.marks_lock``, never import the name.
marks_lock = threading.RLock()
# A fork waits this long for the lock (a hand-over that runs a collection
# may run a teardown's bounded waits), then marks without it.
_MARKS_WAIT = 10.0
_marks_locked_by_fork = threading.local()


def _mark_slots_held_at_fork() -> None:
    _marks_locked_by_fork.held = marks_lock.acquire(timeout=_MARKS_WAIT)
    exempt = workers_being_forked() or ()
    for holder in holders_of_slots.live():
        if not any(holder is other for other in exempt):
            holder.mark_held_at_fork()


def _release_marks_after_fork() -> None:
    if getattr(_marks_locked_by_fork, "held", False):
        _marks_locked_by_fork.held = False
        marks_lock.release()


def _new_marks_lock_in_child() -> None:
    # The child's only thread is the one that forked, holding the lock.
    global marks_lock, _marks_locked_by_fork
    marks_lock = threading.RLock()
    _marks_locked_by_fork = threading.local()


at_fork("slots held at fork", before=_mark_slots_held_at_fork,
        after_in_parent=_release_marks_after_fork, after_in_child=_new_marks_lock_in_child)
