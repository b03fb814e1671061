"""Whether a descriptor is readable, whatever its number.

``select.select`` refuses descriptors of 1024 and above (ValueError), which a
process with many files open (a training job, a loader that ran many epochs)
hands out; ``poll`` takes any.
"""

from __future__ import annotations

import select

__all__ = ["readable"]


def readable(fd: int, timeout: float | None = 0.0) -> bool:
    """Whether ``fd`` is readable (or closed at the other end) within ``timeout``
    seconds (None: wait until it is)."""
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    return bool(poller.poll(None if timeout is None else max(0, int(timeout * 1000 + 0.999))))
