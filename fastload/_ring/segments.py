"""The ring's one OS resource: a slot's file and its mapping.

NOTE [ Anonymous memory files ]
A slot is an anonymous memory file (``memfd_create``): it has no name, so
nothing in /dev/shm, nothing that can outlive the processes that hold it,
whatever kills whom, and /dev/shm's size does not matter (its pages count
against the memory cgroup, as any memory does: ``room.py`` checks that).
The main process creates each slot's file, empty, and keeps its descriptor;
a worker reaches it through ``/proc/<main pid>/fd/<n>`` (the handle a
``SlotInfo`` carries), which reopens the same file in any process of the
same user, whatever its start method, sizes it (a file only grows: it is
sealed against shrinking, so no mapping can lose its pages) and maps it.
Where memfd (or /proc) is missing, a slot is a POSIX shared-memory segment
under a name the main process chose, unlinked on every exit path the main
process lives through (a killed main process leaves its names: the
fallback's one weakness); ``FASTLOAD_RING=posix`` forces it, for tests.

Mappings are made with libc's ``mmap`` rather than Python's, which keeps a
duplicate descriptor per mapping: a worker closes the file right after
mapping it, and the main process holds one descriptor per slot.
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import mmap
import os
from typing import Any, Callable

import numpy as np

from fastload._ring.room import reserve_error, too_many_open_files

try:
    import _posixshmem  # CPython's own POSIX shm bindings (what shared_memory uses)
except ImportError:  # pragma: no cover - non-POSIX platforms
    _posixshmem = None

__all__ = ["Segment", "USES_MEMFD", "uses_memfd", "write_message", "read_and_discard"]

_PROC_FD = "/proc/self/fd"
_MAP_POPULATE = getattr(mmap, "MAP_POPULATE", 0)  # Linux only
# madvise(2) advice that faults a range in, writable (Linux 5.14); mmap does
# not name it before Python 3.13.
_MADV_POPULATE_WRITE = getattr(mmap, "MADV_POPULATE_WRITE", 23)
_MAP_FAILED = ctypes.c_void_p(-1).value


def _memfd_usable() -> bool:
    if os.environ.get("FASTLOAD_RING", "").lower() == "posix":
        return False
    if not hasattr(os, "memfd_create") or not hasattr(fcntl, "F_ADD_SEALS"):
        return False
    try:  # a memfd reopened through /proc: what a worker does
        fd = os.memfd_create("fl_probe", os.MFD_CLOEXEC)
    except OSError:
        return False
    try:
        os.close(os.open(f"{_PROC_FD}/{fd}", os.O_RDWR | os.O_CLOEXEC))
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


USES_MEMFD = _memfd_usable()


def uses_memfd() -> bool:
    """Whether ring slots are anonymous memory files here (else POSIX segments)."""
    return USES_MEMFD


def _libc() -> Any:
    # The process's own symbols, libc's among them: find_library would run a
    # subprocess at import.
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int,
                          ctypes.c_int, ctypes.c_long]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    return libc


_LIBC = _libc()


class _Mapping:
    """``size`` bytes of a file mapped shared; unmapped when the last array over it dies."""

    __slots__ = ("address", "size", "__array_interface__", "__weakref__")

    def __init__(self, fd: int, size: int, populate: bool) -> None:
        flags = mmap.MAP_SHARED | (_MAP_POPULATE if populate else 0)
        address = _LIBC.mmap(None, size, mmap.PROT_READ | mmap.PROT_WRITE, flags, fd, 0)
        if address in (None, _MAP_FAILED):
            code = ctypes.get_errno()
            raise OSError(code, f"mmap of {size} bytes: {os.strerror(code)}")
        self.address, self.size = address, size
        self.__array_interface__ = {"data": (address, False), "shape": (size,),
                                    "typestr": "|u1", "version": 3}

    def __del__(self) -> None:
        _LIBC.munmap(self.address, self.size)


def _with_fd_room(call: Callable[[], Any]) -> Any:
    """``call()``, which opens a file descriptor; at the process's limit, torch's error.

    The main process holds a descriptor per slot, so a caller holding many
    batches (an epoch kept in a list) can reach the soft limit (often 1024),
    as a caller of torch's loader does with its descriptor-shared tensors.
    torch raises a ``RuntimeError`` that says to raise ``ulimit -n``, and
    leaves the limit alone: the process's limits are the caller's.  So does this.
    """
    try:
        return call()
    except OSError as error:
        if error.errno != errno.EMFILE:
            raise
        raise too_many_open_files() from error


class Segment:
    """One slot's file, mapped: ``array`` is its first ``size`` bytes.

    ``Segment.create(name)`` (main process) makes an empty file and keeps its
    descriptor; ``name`` is then the handle any process of this user opens it
    by.  ``Segment.attach(handle, size)`` (worker) opens it, grows it to
    ``size`` if it is smaller, maps it, and closes it.  The mapping lives as
    long as ``array`` (or any view of it) does.
    """

    __slots__ = ("name", "size", "array", "fd", "linked", "_owner_pid", "__weakref__")

    def __init__(self, name: str, fd: int | None, linked: bool) -> None:
        self.name, self.fd, self.size, self.linked = name, fd, 0, linked
        self._owner_pid = os.getpid()
        self.array = np.empty(0, dtype=np.uint8)

    @classmethod
    def create(cls, name: str, seal: bool = True) -> "Segment":
        """A new, empty slot file; ``name`` labels it (POSIX: names it).
        ``seal``: it may never shrink, so no mapping of it can lose its pages."""
        if USES_MEMFD:
            fd = _with_fd_room(lambda: os.memfd_create(
                name, os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING))
            if seal:
                fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_SHRINK)
            return cls(f"/proc/{os.getpid()}/fd/{fd}", fd, linked=False)
        if _posixshmem is None:  # pragma: no cover
            raise OSError("fastload's shared-memory ring needs memfd or POSIX shared memory")
        fd = _with_fd_room(lambda: _posixshmem.shm_open(
            "/" + name, os.O_RDWR | os.O_CREAT | os.O_EXCL, mode=0o600))
        return cls(name, fd, linked=True)

    @classmethod
    def attach(cls, handle: str, size: int, populate: bool = False) -> "Segment":
        """Map ``size`` bytes of the slot file ``handle``, growing it first if it is
        smaller (reserving the pages, so a lack of memory fails here, not as a
        SIGBUS mid-epoch).  ``populate``: the caller is about to write every
        page; mapping them in one call beats a page fault per 4 KiB."""
        if handle.startswith("/"):
            fd = _with_fd_room(lambda: os.open(handle, os.O_RDWR | os.O_CLOEXEC))
        else:
            fd = _with_fd_room(lambda: _posixshmem.shm_open("/" + handle, os.O_RDWR, mode=0o600))
        try:
            _grow(fd, size, handle)
            segment = cls(handle, None, linked=False)
            segment.map(size, fd, populate)
            return segment
        finally:
            os.close(fd)

    def map(self, size: int, fd: int | None = None, populate: bool = False) -> None:
        """Map the file's first ``size`` bytes (the file is that large already)."""
        fd = self.fd if fd is None else fd
        mapping = _Mapping(fd, size, populate) if size > 0 else None
        self.array = np.asarray(mapping) if mapping is not None else np.empty(0, np.uint8)
        self.size = size

    def file_size(self) -> int:
        return os.fstat(self.fd).st_size

    def unlink(self) -> None:
        """Remove a POSIX segment's name (idempotent); a memfd has none.  The
        mapping stays valid for its holders."""
        if self.linked:
            self.linked = False
            try:
                _posixshmem.shm_unlink("/" + self.name)
            except FileNotFoundError:
                pass

    def close(self) -> None:
        """Close the file (the mapping stays valid); in a forked child the
        descriptor is the parent's copy, left alone."""
        fd, self.fd = self.fd, None
        if fd is not None and self._owner_pid == os.getpid():
            os.close(fd)

    def __del__(self) -> None:
        self.close()

    def prefault(self) -> None:
        """Map every page writable now, in one call: for a mapping this process
        inherited, which it is about to fill.  Where the kernel cannot, the
        pages fault in as they are written."""
        mapping = self.array.base
        if isinstance(mapping, _Mapping):
            _LIBC.madvise(mapping.address, mapping.size, _MADV_POPULATE_WRITE)


def _grow(fd: int, size: int, handle: str) -> None:
    """Make the file at least ``size`` bytes and reserve its pages, or say what is lacking."""
    try:
        if os.fstat(fd).st_size < size:
            os.ftruncate(fd, size)
        if hasattr(os, "posix_fallocate") and size > 0:
            os.posix_fallocate(fd, 0, size)
    except OSError as exc:
        if exc.errno in (errno.ENOSPC, errno.ENOMEM, errno.EFBIG):
            raise reserve_error(size, handle, posix=not handle.startswith("/")) from exc
        raise



def write_message(name: str, data: bytes) -> Segment:
    """A task too large for its pipe, in a new file (not sealed: its reader empties it)."""
    segment = Segment.create(name, seal=False)
    view = memoryview(data)
    while view:
        view = view[os.write(segment.fd, view):]
    return segment


def read_and_discard(handle: str, size: int) -> bytes:
    """Read a message ``write_message`` left, and free its pages (and its name)."""
    if handle.startswith("/"):
        fd = os.open(handle, os.O_RDWR | os.O_CLOEXEC)
    else:
        fd = _posixshmem.shm_open("/" + handle, os.O_RDWR, mode=0o600)
        _posixshmem.shm_unlink("/" + handle)
    try:
        chunks = []
        while size > 0:
            chunk = os.pread(fd, size, sum(map(len, chunks)))
            if not chunk:
                raise EOFError(f"a task file ended {size} bytes short")
            chunks.append(chunk)
            size -= len(chunk)
        os.ftruncate(fd, 0)
        return b"".join(chunks)
    finally:
        os.close(fd)
