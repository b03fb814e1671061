"""How a worker watches the main process, and what it does when that process is gone.

A worker exits by itself when the main process dies (``ParentWatch``: a pidfd,
else a liveness poll), and unlinks every segment of its ring on its way out,
so a killed main process leaves neither an orphan nor a segment behind; a
worker terminated together with the main process does the same
(``unlink_ring_when_terminated``).  NOTE [ What happens at fork, at exit and
on a signal ] in ``_lifetime/hooks.py`` tells the whole story.
"""

from __future__ import annotations

import os
import select
import signal
import time
from typing import Any

from fastload import _core
from fastload._ring import unlink_prefixed

__all__ = ["LIVENESS_INTERVAL", "ORPHAN_GRACE", "ParentWatch", "unlink_ring_when_terminated"]

# How often an idle worker checks that the main process is alive, where the
# kernel cannot tell it (no pidfd).  Seconds.
LIVENESS_INTERVAL = 0.5
# How long a worker that lost its pipes waits for the main process to be
# reported gone before deciding it is alive (and will clean up itself).
ORPHAN_GRACE = 2.0


class ParentWatch:
    """Tells a worker whether the main process (pid ``parent_pid``) has exited.

    On Linux a pidfd, which becomes readable when that process exits, lets the
    worker wait for tasks and for its parent's death in one ``poll``.  Without
    one, ``gone()`` is asked every ``LIVENESS_INTERVAL``.  The parent is not
    always the process that forked the worker: forkserver workers are children
    of the fork server, so ``getppid()`` alone cannot tell.
    """

    def __init__(self, parent_pid: int) -> None:
        self.parent_pid = parent_pid
        self._forked_by_parent = os.getppid() == parent_pid
        self.fd: int | None = None
        self._exited = False
        try:
            self.fd = os.pidfd_open(parent_pid)
        except ProcessLookupError:
            self._exited = True
        except (AttributeError, OSError):  # no pidfd on this platform or kernel
            pass

    def gone(self) -> bool:
        if self._exited:
            return True
        if self.fd is not None:
            self._exited = bool(select.select([self.fd], [], [], 0)[0])
        elif self._forked_by_parent:
            # Re-parented (to init or a subreaper) the moment the parent exits.
            self._exited = os.getppid() != self.parent_pid
        else:
            try:
                os.kill(self.parent_pid, 0)
            except ProcessLookupError:
                self._exited = True
            except PermissionError:
                pass
        return self._exited

    def wait_gone(self, timeout: float) -> bool:
        """``gone()``, waiting up to ``timeout`` seconds for it to become true."""
        deadline = time.monotonic() + timeout
        while not self.gone():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            if self.fd is not None:
                select.select([self.fd], [], [], remaining)
            else:
                time.sleep(min(remaining, 0.05))
        return True

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


# Signals that end a whole process group: ``kill -TERM -<pgid>``, GNU
# ``timeout``, a batch scheduler, a closed terminal.
_TERMINATING_SIGNALS = (signal.SIGTERM, signal.SIGHUP)


# How long a terminated worker looks for signs that the main process was
# terminated with it (the kernel signals a group's processes one by one).
_GROUP_SIGNAL_WINDOW = 0.05
# When a terminated worker that has not died yet is killed: after the longest
# its handler takes (the window, the wait for the main process, the unlinks).
_TERMINATION_DEADLINE = _GROUP_SIGNAL_WINDOW + ORPHAN_GRACE + 3.0


def unlink_ring_when_terminated(parent: ParentWatch, ring_prefix: str) -> None:
    """Make a terminating signal unlink the ring first if the main process dies too.

    Sent to the process group, such a signal kills the main process and the
    workers at once: nobody would be left to unlink the ring's segments.  A
    worker so signalled checks whether the main process is dying too (gone,
    or a fatal signal pending); if so it waits (boundedly) for it to go and
    unlinks the ring.  Then it dies of the same signal, so a main process
    that survives (the worker was signalled alone, or the main process
    handles the signal) reports the worker's death as torch's would.  A
    worker stuck in C code, where no Python handler runs, is killed after
    ``_TERMINATION_DEADLINE`` instead (``_core.kill_after_handling``).
    SIGTERM is always taken over, as torch's workers do: a handler the main
    process set and a forked worker inherited (a graceful shutdown that
    saves a checkpoint) must not run in every worker too.  SIGHUP only at
    its default action: ``nohup``'s ignoring it, or a handler, stays the
    caller's choice, as with torch.  (The main process stops its own workers
    with SIGKILL, never with these; ``worker_init_fn`` may install its own.)
    """
    def unlink_then_die(signum: int, frame: Any) -> None:
        signal.signal(signum, signal.SIG_DFL)
        deadline = time.monotonic() + _GROUP_SIGNAL_WINDOW
        while not (parent.gone() or _fatal_signal_pending(parent.parent_pid, signum)):
            if time.monotonic() >= deadline:
                break
            time.sleep(0.005)
        else:
            if parent.wait_gone(ORPHAN_GRACE):
                unlink_prefixed(ring_prefix)
        os.kill(os.getpid(), signum)

    for signum in _TERMINATING_SIGNALS:
        if signum == signal.SIGTERM or signal.getsignal(signum) == signal.SIG_DFL:
            signal.signal(signum, unlink_then_die)
            # A worker stuck in C code never runs this handler: it is killed
            # once the handler had time to finish (see _termination.pxi).
            _core.kill_after_handling(signum, _TERMINATION_DEADLINE)


def _fatal_signal_pending(pid: int, signum: int) -> bool:
    """Whether process ``pid`` is about to die of ``signum`` (or is dying: the
    kernel turns a fatal signal into a pending SIGKILL for each thread), as
    /proc shows its pending signals; a process already gone counts too."""
    try:
        with open(f"/proc/{pid}/status") as status:
            lines = status.read().splitlines()
    except OSError:
        return True
    masks = 0
    for line in lines:
        key, _, value = line.partition(":")
        if key in ("SigPnd", "ShdPnd"):
            masks |= int(value, 16)
        elif key == "State" and value.split()[:1] in (["Z"], ["X"]):
            return True
    return bool(masks & ((1 << (signum - 1)) | (1 << (signal.SIGKILL - 1))))
