"""How a worker watches the main process, and how it takes termination signals.

A worker exits by itself when the main process dies (``ParentWatch``: a pidfd,
else a liveness poll), so a killed main process leaves no orphan behind.
NOTE [ What happens at fork, at exit and on a signal ] in
``_lifetime/hooks.py`` tells the whole story.
"""

from __future__ import annotations

import os
import signal

from fastload._lifetime.descriptors import readable

__all__ = ["LIVENESS_INTERVAL", "ParentWatch", "die_of_sigterm"]

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
            self._exited = readable(self.fd)
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

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def die_of_sigterm() -> None:
    """Let SIGTERM kill this worker at once, as torch's workers are killed by it.

    A handler the main process set and a forked worker inherited (a graceful
    shutdown that saves a checkpoint) must not run in every worker too.  The
    worker has nothing to clean up: its ring is anonymous memory.  SIGHUP is
    left as the caller set it (``nohup``'s ignoring it stays the caller's
    choice).  The main process stops its own workers with SIGKILL, never with
    SIGTERM; ``worker_init_fn`` may install its own handler.
    """
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
