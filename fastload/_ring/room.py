"""What limits the ring: the memory cgroup (or, for POSIX segments, /dev/shm's
free space), and the open-file limit.  Each is checked where the ring meets
it, with an error that says what was needed and what to change.

A slot's pages are shared memory: they count against the memory cgroup of
the process that first touches them, a worker, which is in the main
process's cgroup.  So once the first batch tells a slot's size, the whole
ring's missing slots are checked against each limit set on the process's
cgroup or its ancestors (cgroup v2 ``memory.max``, v1
``memory.limit_in_bytes``), less what is in use there (``memory.current`` or
``memory.usage_in_bytes``, less the page cache the kernel can drop).  No
limit, no check: the machine's memory is the operating system's business.
"""

from __future__ import annotations

import errno
import os
import resource  # here, not when needed: loading it takes a descriptor
import shutil
from typing import Iterator

__all__ = ["SharedMemoryError", "SHM_DIR", "check_room_for_slots", "cgroup_memory_room",
           "reserve_error", "near_open_file_limit", "too_many_open_files"]

SHM_DIR = "/dev/shm"
# Where the process's cgroups are listed, and where the hierarchies are mounted.
PROC_CGROUP = "/proc/self/cgroup"
CGROUP_ROOT = "/sys/fs/cgroup"
# cgroup v1 writes "no limit" as the largest page-aligned int64.
_V1_UNLIMITED = 1 << 60


class SharedMemoryError(RuntimeError):
    """The ring's memory could not be reserved (a memory cgroup's limit, or too little /dev/shm)."""


def _mib(nbytes: int) -> str:
    return f"{nbytes / 2**20:.1f} MiB"


_REMEDY = ("Lower prefetch_factor or num_workers (the ring holds num_workers * prefetch_factor "
           "batches in flight), use a smaller batch_size, or release batches you hold")


def _read_int(path: str) -> int | None:
    try:
        with open(path) as file:
            text = file.read().strip()
    except OSError:
        return None
    return None if text == "max" or not text.lstrip("-").isdigit() else int(text)


def _stat_value(path: str, key: str) -> int:
    try:
        with open(path) as file:
            for line in file:
                name, _, value = line.partition(" ")
                if name == key:
                    return int(value)
    except (OSError, ValueError):
        pass
    return 0


def _cgroup_dirs() -> Iterator[tuple[str, str]]:
    """(directory, version) of this process's memory cgroup and each ancestor
    under the mount, nearest first; a container whose mount is its own
    cgroup ends at the mount."""
    try:
        with open(PROC_CGROUP) as file:
            lines = file.read().splitlines()
    except OSError:
        return
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controllers == "":
            mount, version = CGROUP_ROOT, "v2"
        elif "memory" in controllers.split(","):
            mount, version = os.path.join(CGROUP_ROOT, "memory"), "v1"
        else:
            continue
        parts = [part for part in path.split("/") if part]
        for depth in range(len(parts), -1, -1):
            directory = os.path.join(mount, *parts[:depth])
            if os.path.isdir(directory):
                yield directory, version


def cgroup_memory_room() -> tuple[int, int, str] | None:
    """The tightest memory cgroup limit on this process: (bytes free under it,
    its limit, its file), or None when no limit is set."""
    tightest = None
    seen = set()
    for directory, version in _cgroup_dirs():
        if directory in seen:
            continue
        seen.add(directory)
        if version == "v2":
            limit_file, usage_file = "memory.max", "memory.current"
            stat_key = "inactive_file"
        else:
            limit_file, usage_file = "memory.limit_in_bytes", "memory.usage_in_bytes"
            stat_key = "total_inactive_file"
        limit = _read_int(os.path.join(directory, limit_file))
        if limit is None or limit >= _V1_UNLIMITED:
            continue
        usage = _read_int(os.path.join(directory, usage_file)) or 0
        usage -= _stat_value(os.path.join(directory, "memory.stat"), stat_key)
        free = limit - max(usage, 0)
        if tightest is None or free < tightest[0]:
            tightest = (free, limit, os.path.join(directory, limit_file))
    return tightest


def shm_free_bytes() -> int | None:
    try:
        return shutil.disk_usage(SHM_DIR).free
    except OSError:
        return None


def check_room_for_slots(missing: int, slot_size: int, in_flight: int, posix: bool) -> None:
    """Raise ``SharedMemoryError`` if ``missing`` more slots of ``slot_size`` bytes
    cannot fit: checked once the first batch tells a slot's size, rather than
    failing slot by slot (or as an out-of-memory kill) later."""
    needed = missing * slot_size
    if needed <= 0:
        return
    what = (f"needs {_mib(needed)} more shared memory for its ring: {missing} more slots of "
            f"{_mib(slot_size)} ({_mib(in_flight * slot_size)} for all {in_flight})")
    if posix:
        free = shm_free_bytes()
        if free is not None and needed > free:
            raise _shm_error(what)
        return
    room = cgroup_memory_room()
    if room is not None and needed > room[0]:
        free, limit, path = room
        raise SharedMemoryError(
            f"fastload {what}; the memory cgroup's limit is {_mib(limit)} ({path}), "
            f"{_mib(max(free, 0))} of it free. {_REMEDY}, or raise the container's memory "
            f"limit (Docker: --memory, Kubernetes: resources.limits.memory).")


def _shm_error(shortfall: str) -> SharedMemoryError:
    free = shm_free_bytes()
    free_text = "unknown" if free is None else _mib(free)
    return SharedMemoryError(
        f"fastload {shortfall}; {SHM_DIR} has {free_text} free. {_REMEDY}, or give the "
        f"machine a larger {SHM_DIR} (Docker: --shm-size=2g).")


def reserve_error(size: int, handle: str, posix: bool) -> SharedMemoryError:
    """A slot's pages could not be reserved."""
    shortfall = f"could not reserve {_mib(size)} of shared memory for ring slot {handle!r}"
    if posix:
        return _shm_error(shortfall)
    return SharedMemoryError(f"fastload {shortfall}: the memory it may use is exhausted. "
                             f"{_REMEDY}, or raise the memory limit.")


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
