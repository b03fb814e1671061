"""The pipe ends of this process's worker pools, which a forked worker lets go of.

A forked worker inherits every descriptor of the main process: the other
workers' pipe ends, the main process's, other loaders'.  A worker holding the
writing end of its own task pipe would never see it closed, so one whose pool
was lost without a word would wait for tasks as long as the main process
lives.  So the pools note each end they open here, and a worker lets go of all
but its own (``let_go_of_inherited``), reading its copy of this registry:
under fork the child's copy is the parent's registry at the instant of the
fork.  (A snapshot taken in the parent before the fork could be changed by
another thread's pool while it was taken, which failed ``iter()``.)  A pipe
another thread had opened but not yet noted at that instant, or forgotten but
not yet closed, stays open in the worker until it exits.  Under spawn or
forkserver nothing is inherited and the copy is empty.
"""

from __future__ import annotations

import os
import stat
from typing import Any

__all__ = ["track", "close", "let_go_of_inherited"]

# descriptor -> the pipe's (device, inode)
_open_ends: dict[int, tuple[int, int]] = {}


def track(*conns: Any) -> None:
    """Note pipe ends a pool has just opened."""
    for conn in conns:
        status = os.fstat(conn.fileno())
        _open_ends[conn.fileno()] = (status.st_dev, status.st_ino)


def close(conn: Any) -> None:
    """Close one of a pool's pipe ends, forgetting it first (its number is free after)."""
    try:
        _open_ends.pop(conn.fileno(), None)
    except (OSError, ValueError):  # closed already
        return
    try:
        conn.close()
    except OSError:
        pass


def let_go_of_inherited(own: tuple[int, ...]) -> None:
    """In a forked worker: let go of every pool pipe end the fork brought but
    those in ``own``; then the main process closing this worker's task pipe
    ends it (EOF), and the other workers' pipes do not depend on this one's life.

    Each descriptor is pointed at /dev/null rather than closed: the
    ``Connection`` that owns it may live on in this process (a dataset that
    holds another loader's iterator) and close its number when dropped,
    which must not close whatever reused that number.  Only a descriptor
    that still is that pipe (device, inode) is touched.
    """
    inherited = {fd: pipe for fd, pipe in _open_ends.items() if fd not in own}
    _open_ends.clear()
    if not inherited:
        return
    null = os.open(os.devnull, os.O_RDWR)
    try:
        for fd, pipe in inherited.items():
            try:
                status = os.fstat(fd)
                if stat.S_ISFIFO(status.st_mode) and (status.st_dev, status.st_ino) == pipe:
                    os.dup2(null, fd, inheritable=False)
            except OSError:
                pass
    finally:
        os.close(null)
