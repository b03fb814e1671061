"""POSIX shared-memory segments, the ring's one OS resource (NOTE [ Why one
segment per slot ] in slots.py), and the two limits a process meets making
them: /dev/shm's free space and the open-file limit."""

from __future__ import annotations

import errno
import mmap
import os
import resource  # here, not when needed: loading it takes a descriptor
import secrets
import shutil
from typing import Any, Callable

import numpy as np

try:
    import _posixshmem  # CPython's own POSIX shm bindings (what shared_memory uses)
except ImportError:  # pragma: no cover - non-POSIX platforms
    _posixshmem = None

__all__ = ["Segment", "SharedMemoryError", "SHM_DIR", "new_prefix", "unlink_name",
           "unlink_prefixed", "shm_free_bytes", "check_room_for_slots", "near_open_file_limit",
           "too_many_open_files"]

SHM_DIR = "/dev/shm"
_MAP_POPULATE = getattr(mmap, "MAP_POPULATE", 0)  # Linux only
# madvise(2) advice that faults a range in, writable (Linux 5.14); mmap does
# not name it before Python 3.13.
_MADV_POPULATE_WRITE = getattr(mmap, "MADV_POPULATE_WRITE", 23)


class SharedMemoryError(RuntimeError):
    """The ring's shared memory could not be reserved (too little /dev/shm)."""


def new_prefix() -> str:
    """A unique segment-name prefix for one ring; every fastload segment starts with ``fl_``."""
    return f"fl_{os.getpid()}_{secrets.token_hex(4)}_"


def shm_free_bytes() -> int | None:
    try:
        return shutil.disk_usage(SHM_DIR).free
    except OSError:
        return None


def _mib(nbytes: int) -> str:
    return f"{nbytes / 2**20:.1f} MiB"


def _space_error(shortfall: str) -> SharedMemoryError:
    """``shortfall`` says what was needed ("could not reserve ..."), this adds what is free
    and what to change."""
    free = shm_free_bytes()
    free_text = "unknown" if free is None else _mib(free)
    return SharedMemoryError(
        f"fastload {shortfall}; {SHM_DIR} has {free_text} free. Lower prefetch_factor or num_workers "
        f"(the ring holds num_workers * prefetch_factor batches in flight), use a smaller "
        f"batch_size, release batches you hold, or give the machine a larger {SHM_DIR} "
        f"(Docker: --shm-size=2g)."
    )


def check_room_for_slots(missing: int, slot_size: int, in_flight: int) -> None:
    """Raise ``SharedMemoryError`` if /dev/shm cannot hold ``missing`` more slots of
    ``slot_size`` bytes: checked once the first batch tells a slot's size, rather than
    failing slot by slot later."""
    free = shm_free_bytes()
    if free is not None and missing * slot_size > free:
        raise _space_error(
            f"needs {_mib(missing * slot_size)} more shared memory for its ring: {missing} more "
            f"slots of {_mib(slot_size)} ({_mib(in_flight * slot_size)} for all {in_flight})")


def _with_fd_room(call: Callable[[], Any]) -> Any:
    """``call()``, which opens a file descriptor; at the process's limit, torch's error.

    Every mapping holds a descriptor (Python's ``mmap`` keeps its own), so a
    caller holding many batches (an epoch kept in a list) can reach the soft
    limit (often 1024), as a caller of torch's loader does with its
    descriptor-shared tensors.  torch raises a ``RuntimeError`` that says to
    raise ``ulimit -n``, and leaves the limit alone: the process's limits are
    the caller's.  So does this.
    """
    try:
        return call()
    except OSError as error:
        if error.errno != errno.EMFILE:
            raise
        raise too_many_open_files() from error


def near_open_file_limit(margin: int = 10) -> bool:
    """Whether fewer than ``margin`` more descriptors can be opened (torch's test after a
    failed receive: a descriptor sent with a message is dropped when none is left)."""
    opened = []
    try:
        for _ in range(margin):
            opened.append(os.open(os.devnull, os.O_RDONLY))
    except OSError as error:
        return error.errno == errno.EMFILE
    finally:
        for fd in opened:
            os.close(fd)
    return False


def too_many_open_files() -> RuntimeError:
    """torch's error at the open-file limit (its words first), with what holds the
    files here, and how far torch's other remedy, the sharing strategy, reaches."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    hard_text = "unlimited" if hard == resource.RLIM_INFINITY else str(hard)
    return RuntimeError(
        f"Too many open files. Communication with the workers is no longer possible. Please "
        f"increase the limit using `ulimit -n` in the shell (now {soft}, at most {hard_text} "
        f"without privileges) or hold fewer batches at once: each batch you hold keeps file "
        f"descriptors open (its shared-memory slot's, and those of tensors a worker sent, as "
        f"torch's do) until it is released. torch's other remedy, calling "
        f"`torch.multiprocessing.set_sharing_strategy('file_system')` at the beginning of "
        f"your code, helps here only with tensors a worker sends inside objects (a custom "
        f"collate_fn's): a batch in fastload's ring keeps its slot's descriptor whatever the "
        f"strategy")


class Segment:
    """One mapped POSIX shared-memory segment.

    ``create=True`` makes it and reserves its pages (``posix_fallocate``), so a
    too-small /dev/shm fails here with a clear message instead of a SIGBUS in
    the middle of an epoch.  The mapping lives as long as ``array`` (or any
    view of it) does; ``unlink`` only removes the name.
    """

    __slots__ = ("name", "size", "array", "linked")

    def __init__(self, name: str, size: int = 0, create: bool = False,
                 populate: bool = False) -> None:
        if _posixshmem is None:
            raise OSError("fastload's shared-memory ring needs POSIX shared memory")
        self.name = name
        self.linked = True
        flags = os.O_RDWR | (os.O_CREAT | os.O_EXCL if create else 0)
        fd = _with_fd_room(lambda: _posixshmem.shm_open("/" + name, flags, mode=0o600))
        try:
            if create:
                _reserve(fd, size, name)
            else:
                size = os.fstat(fd).st_size
            self.size = size
            # ``populate``: the caller is about to write every page (a worker
            # filling a slot); mapping them all in one call beats a page
            # fault per 4 KiB.
            map_flags = mmap.MAP_SHARED | (_MAP_POPULATE if populate else 0)
            mapping = _with_fd_room(lambda: mmap.mmap(fd, size, flags=map_flags)) \
                if size > 0 else None
        except BaseException:
            if create:  # nobody else knows the name yet
                self.unlink()
            raise
        finally:
            os.close(fd)
        self.array = np.frombuffer(mapping, dtype=np.uint8) if mapping is not None \
            else np.empty(0, dtype=np.uint8)

    def unlink(self) -> None:
        """Remove the name (idempotent); the mapping stays valid for its holders."""
        if self.linked:
            self.linked = False
            unlink_name(self.name)

    def prefault(self) -> None:
        """Map every page writable now, in one call: for a mapping this process
        inherited, which it is about to fill (``populate`` at creation does the
        same).  Where the kernel cannot, the pages fault in as they are written."""
        mapping = self.array.base
        if isinstance(mapping, mmap.mmap):
            try:
                mapping.madvise(_MADV_POPULATE_WRITE)
            except OSError:  # a kernel older than 5.14
                pass


def _reserve(fd: int, size: int, name: str) -> None:
    """Size a new segment and reserve its pages, or say how much /dev/shm lacks."""
    try:
        os.ftruncate(fd, size)
        if hasattr(os, "posix_fallocate") and size > 0:
            os.posix_fallocate(fd, 0, size)
    except OSError as exc:
        if exc.errno in (errno.ENOSPC, errno.ENOMEM, errno.EFBIG):
            raise _space_error(f"could not reserve {_mib(size)} of shared "
                               f"memory for ring slot {name!r}") from exc
        raise


def unlink_name(name: str) -> bool:
    """Remove segment ``name`` if it exists (mapped here or not); True if it existed."""
    try:
        _posixshmem.shm_unlink("/" + name)
    except FileNotFoundError:
        return False
    return True


def unlink_prefixed(prefix: str) -> None:
    """Unlink every segment whose name starts with ``prefix`` (one ring's, all generations).

    Workers call it when the main process was killed, so no segment outlives
    the loader even then.  (Python's resource tracker could do the same job,
    but it is a process of its own, started on first use: its start-up would
    land on the first batch of every program.)
    """
    try:
        names = os.listdir(SHM_DIR)
    except OSError:
        return
    for name in names:
        if name.startswith(prefix):
            unlink_name(name)
