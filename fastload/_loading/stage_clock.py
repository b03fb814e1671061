"""Where the time of making a batch goes, counted in the process that makes it.

A ``BatchSource`` (in a worker, or in the main process at ``num_workers=0``)
adds each batch's seconds to its ``StageTotals``: fetching the samples
(``__getitem__`` / ``__getitems__``, or a whole-batch gather), and collating
them into their buffer.  Datasets that can tell decoding from their
transforms (``vision.DatasetFolder``) add those two to the process-wide
``SAMPLE_SECONDS``; the source reads it before and after each fetch, so the
part of the fetch they account for is the batch's own.  A worker adds the
time it sat with no task (the ring had no free slot for it: the consumer is
behind) and the time it spent sending its answers, and sends its totals with
every answer (``wire/messages.py``), so nothing is added on the wire but a
few floats.  Only ``time.perf_counter`` is read on the per-batch path (no
system call: it is the vDSO's clock); the process's CPU time, a system call,
is read at most every ``CPU_SAMPLE_INTERVAL`` seconds, and (only for
``num_workers="auto"``'s budget) its memory every ``MEMORY_SAMPLE_INTERVAL``.
"""

from __future__ import annotations

import os
import struct
import time

__all__ = ["STAGES", "FETCH", "DECODE", "TRANSFORM", "COLLATE", "IDLE", "SEND", "BATCHES",
           "CPU", "CPU_BUSY", "MEMORY", "RESIDENT", "SAMPLE_SECONDS", "StageTotals",
           "CPU_SAMPLE_INTERVAL", "MEMORY_SAMPLE_INTERVAL", "unpack", "pss_bytes",
           "resident_bytes"]

# A StageTotals' fields, in this order in the tuple a worker sends.  DECODE and
# TRANSFORM are parts of FETCH (the dataset's own time, where it tells them).
STAGES = ("fetch", "decode", "transform", "collate", "idle", "send")
FETCH, DECODE, TRANSFORM, COLLATE, IDLE, SEND = range(6)
# Then the batches made; the process's CPU seconds between its first and its last
# reading (-1: fewer than two), and the busy seconds (fetch, collate, send) between
# them; with ``watch_memory`` (num_workers="auto"), the process's memory in bytes
# (its PSS, kept current by its resident size: -1 unread) and that resident size.
BATCHES, CPU, CPU_BUSY, MEMORY, RESIDENT = 6, 7, 8, 9, 10
# A PSS reading walks the process's page tables (milliseconds), so it is taken
# again only when the resident size moved this much since, or this long passed
# (pages shared with the main process turn private slowly: copy-on-write).
PSS_REREAD_BYTES = 16 << 20
PSS_REREAD_SECONDS = 15.0

# How often a worker reads its CPU time (seconds): often enough for a share over
# an epoch, rarely enough that the system call costs nothing per batch.
CPU_SAMPLE_INTERVAL = 0.1
# And its memory (num_workers="auto"): about once per window of the climb, which
# is when the main process weighs it; a worker that mostly waits for a slow
# consumer would otherwise spend a noticeable share of its CPU reading /proc.
MEMORY_SAMPLE_INTERVAL = 0.25


class _SampleSeconds:
    """Seconds this process spent decoding samples and running their transforms."""

    __slots__ = ("decode", "transform")

    def __init__(self) -> None:
        self.decode = 0.0
        self.transform = 0.0


SAMPLE_SECONDS = _SampleSeconds()


class StageTotals:
    """One process's cumulative seconds per stage, batches made, and CPU seconds."""

    __slots__ = ("seconds", "watch_memory", "memory_hint", "_cpu_read_at", "_cpu_base",
                 "_busy_base", "_memory_read_at", "_pss", "_pss_at")

    def __init__(self) -> None:
        # STAGES' seconds, then BATCHES, CPU, CPU_BUSY, MEMORY and RESIDENT; a list,
        # added to in place.
        self.seconds = [0.0] * len(STAGES) + [0, -1.0, 0.0, -1.0, -1.0]
        self.watch_memory = False
        # (PSS, resident size) of a sibling forked from the same process, or None: a
        # new worker counts itself from it instead of reading its own PSS at once.
        self.memory_hint: tuple[float, float] | None = None
        self._cpu_read_at = 0.0
        self._cpu_base: float | None = None
        self._busy_base = 0.0
        self._memory_read_at: float | None = None
        self._pss: tuple[int, int] | None = None  # (PSS, resident size) at the last PSS reading
        self._pss_at = 0.0

    def made(self, fetch: float, decode: float, transform: float, collate: float) -> None:
        """A batch was made: its fetch (of which decode and transform) and collate seconds."""
        seconds = self.seconds
        seconds[FETCH] += fetch
        seconds[DECODE] += decode
        seconds[TRANSFORM] += transform
        seconds[COLLATE] += collate
        seconds[BATCHES] += 1

    def sample_cpu(self, now: float) -> None:
        """Read the process's CPU time, if it was last read long enough ago.

        Counted from the first reading (the first task), so start-up (imports,
        ``worker_init_fn``) is not counted as time spent on batches; the busy
        seconds between the same two readings go with it, so the two compare."""
        if now - self._cpu_read_at < CPU_SAMPLE_INTERVAL:
            return
        self._cpu_read_at = now
        cpu = time.process_time()
        seconds = self.seconds
        if self.watch_memory and (self._memory_read_at is None
                                  or now - self._memory_read_at >= MEMORY_SAMPLE_INTERVAL):
            self._memory_read_at = now
            self._sample_memory(now)
        busy = seconds[FETCH] + seconds[COLLATE] + seconds[SEND]
        if self._cpu_base is None:
            self._cpu_base, self._busy_base = cpu, busy
            return
        seconds[CPU] = cpu - self._cpu_base
        seconds[CPU_BUSY] = busy - self._busy_base

    def _sample_memory(self, now: float) -> None:
        """The process's PSS: read again when its resident size moved (or after a
        while), else moved by the resident size's change since the last reading.

        The reading walks page tables as large as the process that forked the
        worker, so a worker given ``memory_hint`` starts from its sibling's figure
        instead: the first reading would otherwise delay every new worker's first
        batch, each epoch, by a time that grows with the caller's memory."""
        resident = _OWN_STATM.resident()
        if resident is None:
            return
        last, hint = self._pss, self.memory_hint
        if last is None and hint is not None:
            self._pss = (min(max(hint[0] + resident - hint[1], 0.0), resident), resident)
            self._pss_at = now
            last = self._pss
        if last is None or abs(resident - last[1]) >= PSS_REREAD_BYTES \
                or now - self._pss_at >= PSS_REREAD_SECONDS:
            pss = pss_bytes(os.getpid())
            if pss is None:
                pss = resident  # no smaps_rollup: the resident size, shared pages in full
            self._pss, self._pss_at = (pss, resident), now
            self.seconds[MEMORY] = float(pss)
        else:
            self.seconds[MEMORY] = float(last[0] + resident - last[1])
        self.seconds[RESIDENT] = float(resident)

    def packed(self) -> bytes:
        """The totals as an answer carries them: packed doubles (one object to
        pickle and unpickle on the main process's per-batch path, not nine)."""
        return _PACKED.pack(*self.seconds)


_PACKED = struct.Struct(f"{len(STAGES) + 5}d")


def pss_bytes(pid: int) -> int | None:
    """A process's PSS from ``/proc/<pid>/smaps_rollup`` (None: gone, or no such file)."""
    try:
        with open(f"/proc/{pid}/smaps_rollup", "rb") as f:
            for line in f:
                if line.startswith(b"Pss:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def resident_bytes(pid: int) -> int | None:
    """A process's resident size from ``/proc/<pid>/statm`` (None: gone, or no such file)."""
    try:
        with open(f"/proc/{pid}/statm", "rb") as f:
            return _resident_of(f.read())
    except (OSError, ValueError, IndexError):
        return None


def _resident_of(statm: bytes) -> int:
    """The resident size in bytes of a ``statm`` line (its second field, in pages)."""
    return int(statm.split()[1]) * _PAGE


_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


class _OwnStatm:
    """This process's resident size, read through a descriptor kept open: one
    ``pread`` instead of an open, a read and a close each time (a worker that
    waits on a slow consumer runs each of them cold).  Opened in the process
    that reads it: a forked child opens its own."""

    __slots__ = ("_fd", "_pid")

    def __init__(self) -> None:
        self._fd: int | None = None
        self._pid = 0

    def resident(self) -> int | None:
        pid = os.getpid()
        try:
            if self._pid != pid:
                if self._fd is not None:
                    os.close(self._fd)  # the parent's, inherited across a fork
                    self._fd = None
                self._fd, self._pid = os.open(f"/proc/{pid}/statm", os.O_RDONLY | os.O_CLOEXEC), pid
            return _resident_of(os.pread(self._fd, 128, 0))
        except (OSError, ValueError, IndexError):
            return None


_OWN_STATM = _OwnStatm()


def unpack(packed: bytes) -> tuple:
    """``StageTotals.packed``'s totals as a tuple."""
    return _PACKED.unpack(packed)
