"""Every hook fastload runs at a fork and at exit, in one order stated here.

Modules name their hook with ``at_fork``; this module installs one set of
``os.register_at_fork`` callbacks that run them in the order of
``FORK_HOOKS`` below, whatever order the modules were imported in.  A name
missing from the list is refused, so a new hook has to take its place in it.

NOTE [ What happens at fork, at exit and on a signal ]

* **A fork** (the loader forking a worker, or the caller's ``os.fork()`` or
  fork-context ``multiprocessing.Process``, from any thread).  Before it, in
  the parent: decoded-image caches reread their index, so children start from
  the entries on disk; then the ring marks every slot the caller holds as held
  by the child (a forked child shares those pages: NOTE [ Batches a forked
  child holds ] in ``_ring/fork_marks.py``), under a lock the parent releases
  right after.
  In the child, in this order: note whether it is a loader's worker
  (``forks.py``; the other hooks ask); give a child the caller made the
  caller's signal handlers back (``interrupts.py``); a new lock for the slot
  marks; forget the parent's worker processes, so the child's exit does not
  terminate them; close the iterators inherited from the parent (their
  workers answer the parent).  The loader forks its workers inside
  ``signals_held``: a Ctrl-C arriving in any at-fork hook (its own or
  another library's) is recorded and raised after the fork, not dropped.
* **Normal exit.** An iterator's teardown (``_loading/teardown.py``) stops its
  workers and closes its ring when the iterator is shut down or collected,
  and at the latest from ``atexit``.  In a child multiprocessing forked,
  which ends with ``os._exit`` and no ``atexit``, the teardowns run from
  multiprocessing's own exit function, before it terminates daemonic
  children (our workers), so they are stopped in order, not killed mid-batch.
* **Ctrl-C.** It reaches the whole process group.  Workers ignore SIGINT;
  the main process gets KeyboardInterrupt in ``next()``, its iterator's
  teardown stops the workers and closes the ring.  Teardowns and forks run
  with signals held (``interrupts.py``), so a Ctrl-C landing in a finalizer,
  where CPython would print and drop it, is raised once the teardown is over.
* **SIGTERM (or SIGHUP) to the process group** (``kill -TERM -pgid``, a
  scheduler, ``timeout``).  The main process dies of it (unless the caller
  handles it, then its iterators tear down normally).  Workers die of it at
  once: SIGTERM is at its default action in them, SIGHUP as the caller set it.
* **The main process dies** (SIGKILL, a crash).  Workers watch it (a pidfd,
  else a liveness poll) and exit once it is gone: no orphan is left.

Nothing needs cleaning up after a death: ring slots are anonymous memory
files (NOTE [ Anonymous memory files ] in ``_ring/segments.py``), freed with
the last process that maps them, whatever kills whom.  Only where memfd is
missing are slots named POSIX segments; their names are unlinked on every
path above on which the main process survives to run its teardown (normal
exit, an exception, Ctrl-C, a dead worker), not when the main process
itself is killed.
"""

from __future__ import annotations

import atexit
import multiprocessing.util
import os
from typing import Callable

__all__ = ["FORK_HOOKS", "at_fork", "at_exit", "arm_exit_in_this_process"]

# Hooks run in this order at each stage of a fork (before, after in the
# parent, after in the child).  "before" hooks work on the parent's state the
# child will copy; the ring's marks come last so its lock is held briefly.
FORK_HOOKS = (
    "fork kind",             # forks.py: is this child a loader's worker?
    "signal handlers",       # interrupts.py: a caller's child gets its handlers back
    "image cache index",     # vision/cache.py: children start from the index on disk
    "slots held at fork",    # _ring/fork_marks.py: slots the caller holds stay held in the child
    "parent's workers",      # _loading: a child does not own (or stop) them
    "inherited iterators",   # _loading: a child does not read the parent's batches
)

Hook = Callable[[], None]
_fork_hooks: dict[str, dict[str, Hook]] = {"before": {}, "after_in_parent": {}, "after_in_child": {}}


def at_fork(name: str, *, before: Hook | None = None, after_in_parent: Hook | None = None,
            after_in_child: Hook | None = None) -> None:
    """Run these at every fork of this process, in ``FORK_HOOKS``' order."""
    if name not in FORK_HOOKS:
        raise ValueError(f"fork hook {name!r} has no place in FORK_HOOKS")
    for stage, hook in (("before", before), ("after_in_parent", after_in_parent),
                        ("after_in_child", after_in_child)):
        if hook is not None:
            _fork_hooks[stage][name] = hook


def _runner(stage: str) -> Hook:
    hooks = _fork_hooks[stage]

    def run() -> None:
        # One hook's error must not skip the others (CPython runs each
        # registered hook apart); the first is raised after all ran, and
        # CPython reports it as it would have.
        first_error = None
        for name in FORK_HOOKS:
            hook = hooks.get(name)
            if hook is not None:
                try:
                    hook()
                except BaseException as error:
                    first_error = first_error or error
        if first_error is not None:
            raise first_error
    return run


if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=_runner("before"), after_in_parent=_runner("after_in_parent"),
                        after_in_child=_runner("after_in_child"))


# At exit: (at interpreter exit, at multiprocessing's exit), in registration order.
_exit_hooks: list[tuple[Hook, Hook]] = []
_armed_pid: int | None = None


def at_exit(at_interpreter_exit: Hook, at_multiprocessing_exit: Hook) -> None:
    """Run the first at interpreter exit (``atexit``); the second from
    multiprocessing's exit function in a process that called
    ``arm_exit_in_this_process``, before it terminates daemonic children."""
    atexit.register(at_interpreter_exit)
    _exit_hooks.append((at_interpreter_exit, at_multiprocessing_exit))


def _run_at_multiprocessing_exit() -> None:
    for _, hook in _exit_hooks:
        hook()


def arm_exit_in_this_process() -> None:
    """Make multiprocessing's exit function run the exit hooks in this process.

    A child multiprocessing forks starts with its list of finalizers emptied,
    so this is done per process, by whatever starts workers in it; priority 0
    runs before the daemonic children are terminated.
    """
    global _armed_pid
    if _armed_pid != os.getpid():
        _armed_pid = os.getpid()
        multiprocessing.util.Finalize(None, _run_at_multiprocessing_exit, exitpriority=0)
