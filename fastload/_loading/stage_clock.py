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
is read at most every ``CPU_SAMPLE_INTERVAL`` seconds.
"""

from __future__ import annotations

import struct
import time

__all__ = ["STAGES", "FETCH", "DECODE", "TRANSFORM", "COLLATE", "IDLE", "SEND", "BATCHES",
           "CPU", "CPU_BUSY", "SAMPLE_SECONDS", "StageTotals", "CPU_SAMPLE_INTERVAL", "unpack"]

# A StageTotals' fields, in this order in the tuple a worker sends.  DECODE and
# TRANSFORM are parts of FETCH (the dataset's own time, where it tells them).
STAGES = ("fetch", "decode", "transform", "collate", "idle", "send")
FETCH, DECODE, TRANSFORM, COLLATE, IDLE, SEND = range(6)
# Then the batches made; the process's CPU seconds between its first and its last
# reading (-1: fewer than two), and the busy seconds (fetch, collate, send) between them.
BATCHES, CPU, CPU_BUSY = 6, 7, 8

# How often a worker reads its CPU time (seconds): often enough for a share over
# an epoch, rarely enough that the system call costs nothing per batch.
CPU_SAMPLE_INTERVAL = 0.1


class _SampleSeconds:
    """Seconds this process spent decoding samples and running their transforms."""

    __slots__ = ("decode", "transform")

    def __init__(self) -> None:
        self.decode = 0.0
        self.transform = 0.0


SAMPLE_SECONDS = _SampleSeconds()


class StageTotals:
    """One process's cumulative seconds per stage, batches made, and CPU seconds."""

    __slots__ = ("seconds", "_cpu_read_at", "_cpu_base", "_busy_base")

    def __init__(self) -> None:
        # STAGES' seconds, then BATCHES, CPU and CPU_BUSY; a list, added to in place.
        self.seconds = [0.0] * len(STAGES) + [0, -1.0, 0.0]
        self._cpu_read_at = 0.0
        self._cpu_base: float | None = None
        self._busy_base = 0.0

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
        busy = seconds[FETCH] + seconds[COLLATE] + seconds[SEND]
        if self._cpu_base is None:
            self._cpu_base, self._busy_base = cpu, busy
            return
        seconds[CPU] = cpu - self._cpu_base
        seconds[CPU_BUSY] = busy - self._busy_base

    def packed(self) -> bytes:
        """The totals as an answer carries them: packed doubles (one object to
        pickle and unpickle on the main process's per-batch path, not nine)."""
        return _PACKED.pack(*self.seconds)


_PACKED = struct.Struct(f"{len(STAGES) + 3}d")


def unpack(packed: bytes) -> tuple:
    """``StageTotals.packed``'s totals as a tuple."""
    return _PACKED.unpack(packed)
