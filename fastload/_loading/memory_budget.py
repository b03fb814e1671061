"""What a loader's workers hold in memory, against ``num_workers="auto"``'s budget.

A worker is counted at its PSS (proportional set size: its private pages
plus its share of each page it shares, with the main process and the other
workers, as forked copy-on-write pages are), read from
``/proc/<pid>/smaps_rollup``; PSS summed over processes counts a shared page
once.  Reading it walks the process's page tables (milliseconds per GB), so
each worker reads its own, when its resident size moved, and sends it with
its stage totals (``stage_clock.StageTotals``): the main process reads none.
A worker started later (the next epoch's, or one added) starts from the
figure of one started before it, moved by their resident sizes' difference,
unless fewer workers share the pages now than then.  Where that file is
missing (Linux before 4.14, other systems) a worker is counted at its
resident size, which counts shared pages in full: a budget then errs on the
safe side.  The ring's slots are memory files, counted once at their size
(``Ring.mapped_bytes``).

The default budget is ``DEFAULT_SHARE`` of the memory available when the
epoch starts: the smaller of the system's ``MemAvailable`` and the room
under the tightest memory cgroup limit.
"""

from __future__ import annotations


from fastload._loading.stage_clock import pss_bytes, resident_bytes
from fastload._ring.room import cgroup_memory_room

__all__ = ["DEFAULT_SHARE", "available_memory", "default_budget", "worker_memory"]

DEFAULT_SHARE = 0.5


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
    """A process's memory in bytes: its PSS, else its resident size; None once it is gone."""
    pss = pss_bytes(pid)
    return pss if pss is not None else resident_bytes(pid)
