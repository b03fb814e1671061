"""Length-prefixed messages on a pipe, one system call per message on each side.

The framing is ``multiprocessing.Connection``'s (a 4-byte big-endian length,
then the bytes), but ``Connection.recv_bytes`` reads each message with two
reads (the length, then the body) and both of its methods go through several
Python calls; tasks and answers cross the pipes once per batch, so both
processes pay that on every batch.  A ``FrameReader`` takes whatever the pipe
holds in one read and keeps what follows the first message, since a worker
can answer twice between two polls.
"""

from __future__ import annotations

import os
import struct
from typing import Callable

__all__ = ["send_frame", "FrameReader"]

_HEADER = struct.Struct("!i")
_READ_SIZE = 1 << 16


def send_frame(fd: int, data: bytes, wait_writable: Callable[[], bool] | None = None) -> None:
    """Write one message, until all of it is in the pipe.

    On a non-blocking ``fd``, a full pipe calls ``wait_writable()``, which
    returns once the pipe can take more, or False when the reader is known
    to be gone: then ``BrokenPipeError``.
    """
    if len(data) > 0x7FFFFFFF:
        raise ValueError(f"message of {len(data)} bytes is too large for a pipe frame")
    frame = _HEADER.pack(len(data)) + data
    try:
        written = os.write(fd, frame)
    except BlockingIOError:
        written = 0
    if written < len(frame):  # a full pipe, or a signal: write the rest
        view = memoryview(frame)[written:]
        while view:
            try:
                view = view[os.write(fd, view):]
            except BlockingIOError:
                if wait_writable is None or not wait_writable():
                    raise BrokenPipeError(f"the reader of pipe fd {fd} is gone") from None


class FrameReader:
    """The receiving end of one pipe: whole messages out of whatever was read."""

    __slots__ = ("fd", "_buffer")

    def __init__(self, fd: int) -> None:
        self.fd = fd
        self._buffer = bytearray()

    def pending(self) -> bytes | None:
        """The next message if it has been read whole, else None (nothing is read here)."""
        buffer = self._buffer
        if len(buffer) < _HEADER.size:
            return None
        end = _HEADER.size + _HEADER.unpack_from(buffer)[0]
        if len(buffer) < end:
            return None
        message = bytes(buffer[_HEADER.size:end])
        del buffer[:end]
        return message

    def holds(self, message: bytes) -> bool:
        """Whether ``message`` is among the whole messages read but not yet taken."""
        buffer, start = self._buffer, 0
        while start + _HEADER.size <= len(buffer):
            end = start + _HEADER.size + _HEADER.unpack_from(buffer, start)[0]
            if end > len(buffer):
                break
            if buffer[start + _HEADER.size:end] == message:
                return True
            start = end
        return False

    @property
    def has_leftover(self) -> bool:
        return bool(self._buffer)

    def fill(self) -> None:
        """One read of what the pipe holds; call it once poll says the pipe is readable.

        Raises ``EOFError`` when the writer has closed its end.
        """
        buffer = self._buffer
        wanted = _READ_SIZE
        if len(buffer) >= _HEADER.size:  # the rest of a long message, in one read
            wanted = max(wanted, _HEADER.size + _HEADER.unpack_from(buffer)[0] - len(buffer))
        data = os.read(self.fd, wanted)
        if not data:
            raise EOFError(f"pipe {self.fd} closed")
        buffer += data
