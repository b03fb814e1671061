"""The worker processes once started: alive or not, why they died, and reaping them.

A pool stops its workers at shutdown; idle ones left to exit on their own at
an epoch's end are reaped later (``reap_exiting``), or when their loader goes
(``join_exiting_workers``).  Every wait is bounded: a worker that outstays
its grace is killed.
"""

from __future__ import annotations

import itertools
import multiprocessing.process
import os
import signal
import time
import weakref
from typing import Any

from fastload._lifetime.hooks import at_fork
from fastload._lifetime.descriptors import readable
from fastload._lifetime.interrupts import signals_deferred
from fastload._lifetime.weak_registry import WeakRegistry
from fastload._loading.errors import WorkerDied

__all__ = ["JOIN_GRACE", "describe_exit", "running", "died", "workers_of_this_process",
           "leave_to_exit", "reap_exiting", "join_exiting_workers", "reap", "stop",
           "show_workers", "shown_workers"]

# How long shutdown waits for workers to exit before terminating them.
JOIN_GRACE = 5.0
# How often that wait looks for a Ctrl-C (which it holds).
_INTERRUPT_CHECK = 0.05


def describe_exit(pid: int, exitcode: int | None) -> str:
    if exitcode is not None and exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
            text = signal.strsignal(-exitcode) or name
        except ValueError:
            name = text = f"signal {-exitcode}"
        message = f"DataLoader worker (pid {pid}) is killed by signal: {text} ({name})."
        if exitcode == -signal.SIGBUS:
            # torch's hint: slots reserve their pages, but a mapped file can still shrink.
            message += (" It is possible that dataloader's workers are out of shared memory. "
                        "Please try to raise your shared memory limit.")
        return message
    if exitcode is None:
        # Reaped by someone else: SIGCHLD ignored, or a handler calling waitpid(-1).
        return (f"DataLoader worker (pid {pid}) exited unexpectedly (its exit status was "
                f"collected elsewhere: is SIGCHLD ignored, or reaped by a handler?)")
    return (f"DataLoader worker (pid {pid}) exited unexpectedly with exit code {exitcode}. "
            f"Details are lost due to multiprocessing. Rerunning with num_workers=0 may give "
            f"better error trace.")  # torch's words


def running(process: Any) -> bool:
    """Whether a worker has not exited (reaping it if it has).

    ``is_alive()`` alone says True forever of a child that someone else
    reaped (SIGCHLD set to SIG_IGN, a handler calling ``waitpid(-1)``:
    multiprocessing takes the ECHILD for a child not started yet), so waits
    would run to their deadline and a kill could hit a reused pid.  The
    sentinel, a pipe whose other end only the worker holds, tells that case
    apart without a wait.
    """
    try:
        sentinel = process.sentinel
    except ValueError:  # never started
        return False
    if not process.is_alive():  # reaps it if it has exited
        return False
    if not readable(sentinel):
        return True
    # Its descriptors are closed: it is exiting (its status comes a moment
    # later), or its status was collected elsewhere.
    try:
        os.waitid(os.P_PID, process.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    except ChildProcessError:
        return False
    return True


def died(process: Any) -> WorkerDied:
    """The error for a worker found gone, once its exit status is in (or 1 s has passed)."""
    process.join(timeout=1.0)
    return WorkerDied(describe_exit(process.pid, process.exitcode))


# Every worker process the pools of this process started (and that lives on
# as an object).
workers_of_this_process = WeakRegistry()


def _leave_the_parents_workers_alone() -> None:
    """In a child the caller forks (``os.fork()``): forget the parent's workers.

    multiprocessing lists them as this process's children too (its list is
    inherited), and at a normal exit terminates the daemonic ones among its
    children (``multiprocessing.util._exit_function``): a child that ended
    with ``sys.exit()`` took the parent's loader's workers with it, and the
    parent's next batch raised that a worker was killed by SIGTERM (torch's
    loader the same).  A child multiprocessing starts itself clears the list.
    """
    children = getattr(multiprocessing.process, "_children", None)
    if children:
        children.difference_update(workers_of_this_process.live())
    workers_of_this_process.clear()


at_fork("parent's workers", after_in_child=_leave_the_parents_workers_alone)


# Idle workers told to exit at the end of an epoch, not waited for:
# (owning pid, deadline, processes).  See WorkerPool.shutdown.
_exiting: list[tuple[int, float, list]] = []


def leave_to_exit(processes: list) -> None:
    """Idle workers told to exit, not waited for: reaped later, stopped past ``JOIN_GRACE``."""
    _exiting.append((os.getpid(), time.monotonic() + JOIN_GRACE, processes))


# The lists iterators show as torch's ``_workers``, each beside a weak
# reference to its iterator, which holds only the key: so dropping an
# iterator frees no ``Process`` (its finalizer is Python code, where a Ctrl-C
# would be lost: NOTE [ Ctrl-C held over fork and teardown ]).
# ``reap_exiting`` lets go of those whose iterator is gone, signals held.
_shown_worker_lists: dict[int, tuple[Any, list]] = {}
_shown_keys = itertools.count()


def show_workers(owner: Any) -> int:
    """A key to ``owner``'s list of worker processes (``shown_workers``), kept while it lives."""
    key = next(_shown_keys)
    _shown_worker_lists[key] = (weakref.ref(owner), [])
    return key


def shown_workers(key: int) -> list:
    return _shown_worker_lists[key][1]


def _forget_workers_of_dropped_iterators() -> None:
    for key, (owner, _) in list(_shown_worker_lists.items()):
        if owner() is None:
            _shown_worker_lists.pop(key, None)


def reap_exiting() -> None:
    """Reap the exited workers of earlier epochs without waiting; stop the ones past their grace.

    Runs whenever a pool starts or shuts down.  (A thread that joined them
    would fight the caller for the GIL just as the next epoch starts; at exit,
    multiprocessing itself terminates and joins whatever is left, as it does
    for every daemonic process.)
    """
    now, pid = time.monotonic(), os.getpid()
    # Entry by entry, over a copy: another call can run in the middle of this
    # one (a loader's teardown that the collector runs at any allocation here,
    # or another thread's pool), and writing back the list as this call saw it
    # dropped what that call left or added: those workers were never reaped
    # (a finished epoch's two, still there once their loader was gone).
    for entry in list(_exiting):
        owner, deadline, processes = entry
        if owner == pid:  # else inherited by a forked child: not its processes
            processes[:] = [p for p in list(processes) if running(p)]  # reaps the exited ones
            if processes and now < deadline:
                continue
            stop(processes)  # their grace is over
        _drop_exiting(entry)
    _forget_workers_of_dropped_iterators()


def _drop_exiting(entry: tuple) -> None:
    """Remove ``entry`` itself (not an equal one) from ``_exiting``, if a
    nested call has not already."""
    for index, listed in enumerate(_exiting):
        if listed is entry:
            del _exiting[index]
            return


def join_exiting_workers() -> None:
    """Wait for the idle workers left to exit at an epoch's end (each up to its grace,
    then stopped), and reap them.

    Run when a loader goes away (a ``weakref.finalize``): its last epoch's
    workers must not outlive it, not even as exited, unreaped processes.  A
    Ctrl-C ends the wait, and is sent again once this has returned.
    """
    with signals_deferred() as interrupted:
        pid = os.getpid()
        for owner, deadline, processes in list(_exiting):
            if owner == pid:
                reap(processes, max(0.0, deadline - time.monotonic()), interrupted)
        reap_exiting()


def reap(processes: list, grace: float, interrupted: list) -> None:
    """Join workers that were asked to exit; after ``grace`` seconds, or as soon
    as ``interrupted`` holds a Ctrl-C, terminate, then kill, the ones that have not.

    (A worker left running would go on writing slots nobody reads: even at a
    Ctrl-C they are stopped, not abandoned.)
    """
    deadline = time.monotonic() + grace
    for process in list(processes):  # a nested reap_exiting may shorten the list
        while not interrupted and running(process) and time.monotonic() < deadline:
            # In steps: the Ctrl-C only records itself (the wait runs held).
            process.join(timeout=min(_INTERRUPT_CHECK, max(0.0, deadline - time.monotonic())))
    stop(processes)


def stop(processes: list) -> None:
    """Kill the workers still alive; each wait bounded.

    SIGKILL, not torch's SIGTERM: a worker dies of either (its SIGTERM is at
    the default action, ``parent_watch.die_of_sigterm``), but a
    ``worker_init_fn`` may have installed a handler of its own.
    """
    for process in list(processes):
        if running(process):
            process.kill()
            process.join(timeout=1.0)
