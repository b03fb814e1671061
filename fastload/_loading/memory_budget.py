"""What a loader's workers hold in memory, against ``num_workers="auto"``'s budget.

A worker is counted at its PSS (proportional set size: its private pages
plus its share of each page it shares, with the main process and the other
workers, as forked copy-on-write pages are), read from
``/proc/<pid>/smaps_rollup``; PSS summed over processes counts a shared page
once.  Where that file is missing (Linux before 4.14, other systems) a
worker is counted at its resident size, which counts shared pages in full: a
budget then errs on the safe side.  The ring's slots are memory files,
counted once at their size (``Ring.mapped_bytes``).

The default budget is ``DEFAULT_SHARE`` of the memory available when the
epoch starts: the smaller of the system's ``MemAvailable`` and the room
under the tightest memory cgroup limit.
"""

from __future__ import annotations

import os

from fastload._ring.room import cgroup_memory_room

__all__ = ["DEFAULT_SHARE", "available_memory", "default_budget", "worker_memory"]

DEFAULT_SHARE = 0.5
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def available_memory() -> int | None:
    """Bytes this process can still use: ``MemAvailable``, or less under a cgroup limit."""
    available = None
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    available = int(line.split()[1]) * 1024
                    break
    except OSError:
        pass
    room = cgroup_memory_room()
    if room is not None and (available is None or room[0] < available):
        available = max(room[0], 0)
    return available


def default_budget() -> int | None:
    """``DEFAULT_SHARE`` of the available memory; None when it cannot be read."""
    available = available_memory()
    return None if available is None else int(available * DEFAULT_SHARE)


def worker_memory(pid: int) -> int | None:
    """A worker's memory in bytes: its PSS, else its resident size; None once it is gone."""
    try:
        with open(f"/proc/{pid}/smaps_rollup", "rb") as f:
            for line in f:
                if line.startswith(b"Pss:"):
                    return int(line.split()[1]) * 1024
    except FileNotFoundError:
        pass  # no such process, or no smaps_rollup: tell which by statm
    except (OSError, ValueError, IndexError):
        return None
    try:
        with open(f"/proc/{pid}/statm") as f:
            return int(f.read().split()[1]) * _PAGE
    except (OSError, ValueError, IndexError):
        return None
