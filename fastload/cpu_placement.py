"""Where a new worker process first runs: spread over the CPUs, the main process's last.

NOTE [ Why new workers are moved off the main process's CPU ]
On the 2-CPU virtual machine fastload is measured on, ``perf sched`` showed
new workers queued behind the main process on its CPU, or both on the other
one, while a CPU stayed idle for a millisecond or more: the main process,
still starting the next worker, shared its CPU with the workers it had just
started.  With workers new every epoch that is paid every epoch; 5-8 of the
40 CPU-milliseconds of a 20 ms `dict` epoch were idle, and placing the
workers made such epochs 4-10 % shorter (`tiny`, `array`, `dict`).

So right after starting a worker, the main process looks where the kernel
queued it (``/proc/<pid>/stat``).  A CPU no other new worker was queued on,
and not the main process's, is kept: the kernel chose well.  Otherwise the
main process pins the worker to the first CPU without a new worker, in an
order that puts its own CPU last (``sched_setaffinity``, which moves a queued
process there at once), and immediately gives it back the CPU set it
inherited.  With two CPUs, the first worker starts on the idle one and the
second on the main process's, which soon sleeps waiting for batches.

A worker whose CPU is to be the main process's own is born there instead
(``starting``): the main thread holds only its own CPU while it starts that
worker (nothing moves: it runs there), the child inherits that one CPU and
is queued on it, and both get the full set back right after.  Moving such a
worker after the kernel had started it on another CPU made the main process
wait for the kernel's migration thread: 1.1 ms at the median (1.7 at the
90th percentile) of each `dict` epoch with new workers.  Born in place, the
first batch of such an epoch comes 0.4-0.7 ms sooner (`iter()` to first
batch, medians of 30-40 epochs, five alternating runs: 3.1-3.3 against
3.5-4.0 ms); the epoch itself is no shorter (16 paired runs, within the
noise), as the two CPUs were busy meanwhile.  forkserver's workers are not
the main thread's children: they are still moved.

A worker's affinity is then exactly what it inherited (as torch's workers'
is: code in a worker may read it to size thread pools, in ``worker_init_fn``
say).  For the short moment it is pinned, the worker must not run any of the
caller's code: the main process holds back a worker's first message until it
has placed it (``WorkerPool``), and a worker waits for that message before it
touches the dataset or calls ``worker_init_fn`` (``worker._serve``).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
from typing import Iterator

__all__ = ["WorkerPlacement"]


def _find_sched_getcpu():
    """glibc's (or musl's) ``sched_getcpu``, or None; looked up once, at import."""
    try:
        return ctypes.CDLL(None).sched_getcpu
    except (OSError, AttributeError):  # pragma: no cover - no such libc function
        return None


_sched_getcpu = _find_sched_getcpu()
# /proc/<pid>/stat: the CPU a process is queued on (or last ran on) is field
# 39, the 37th after the ")" that closes its command name.
_STAT_PROCESSOR = 36


def _cpu_of(pid: int) -> int:
    """The CPU ``pid`` is queued on or last ran on; -1 if it cannot be read."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as handle:
            fields = handle.read().rsplit(b")", 1)[1].split()
        return int(fields[_STAT_PROCESSOR])
    except (OSError, IndexError, ValueError):
        return -1


class WorkerPlacement:
    """Where the workers of one start of a pool begin to run.

    Does nothing where it cannot help: no ``sched_setaffinity`` (not Linux) or
    a main process allowed on a single CPU.
    """

    def __init__(self, children_inherit_affinity: bool = True) -> None:
        self.allowed: set[int] = set()
        self.order: list[int] = []
        self.main_cpu = -1
        self._taken: set[int] = set()  # CPUs a worker of this start begins on
        # Whether a started worker is a child of this thread (fork, spawn), so
        # it is born with this thread's CPU set (not with forkserver's).
        self._children_inherit = children_inherit_affinity
        self._born_pinned: set[int] = set()  # workers started with only the main CPU
        if not hasattr(os, "sched_setaffinity"):
            return
        try:
            self.allowed = os.sched_getaffinity(0)
        except OSError:  # pragma: no cover - the kernel refused to say
            return
        if len(self.allowed) < 2:
            return
        cpus = sorted(self.allowed)
        self.main_cpu = _sched_getcpu() if _sched_getcpu is not None else -1
        if self.main_cpu in self.allowed:
            after = cpus.index(self.main_cpu) + 1
            cpus = cpus[after:] + cpus[:after]  # the main process's CPU last
        self.order = cpus

    def _next_cpu(self, worker_index: int) -> int:
        free = [cpu for cpu in self.order if cpu not in self._taken]
        return free[0] if free else self.order[worker_index % len(self.order)]

    @contextlib.contextmanager
    def starting(self, worker_index: int) -> Iterator[None]:
        """Around the start of worker ``worker_index``: when its CPU is to be the
        main process's, it is born there (see NOTE [ Why new workers are moved
        off the main process's CPU ]): this thread holds that CPU alone while
        it starts the worker, which inherits that CPU set.
        """
        pin = self._children_inherit and bool(self.order) \
            and self._next_cpu(worker_index) == self.main_cpu \
            and _sched_getcpu is not None and _sched_getcpu() == self.main_cpu
        if pin:
            try:
                os.sched_setaffinity(0, {self.main_cpu})  # where it runs: nothing moves
            except OSError:
                pin = False
        try:
            yield
        finally:
            if pin:
                _restore_affinity(0, self.allowed)
                self._born_pinned.add(worker_index)

    def start_on_own_cpu(self, worker_index: int, pid: int) -> None:
        """Give just-started worker ``pid`` a CPU of its own; it keeps the affinity it inherited.

        Failures are ignored (a worker that already exited, a CPU set changed
        meanwhile): this only chooses where the worker starts.
        """
        if not self.order or pid is None:
            return
        if worker_index in self._born_pinned:
            self._taken.add(self.main_cpu)
            _restore_affinity(pid, self.allowed)
            return
        queued_on = _cpu_of(pid)
        if queued_on >= 0 and queued_on != self.main_cpu and queued_on not in self._taken:
            self._taken.add(queued_on)  # a CPU of its own already
            return
        cpu = self._next_cpu(worker_index)
        self._taken.add(cpu)
        if cpu == queued_on:
            return
        try:
            os.sched_setaffinity(pid, {cpu})
        except OSError:
            return
        _restore_affinity(pid, self.allowed)


def _restore_affinity(pid: int, allowed: set[int]) -> None:
    """Give ``pid`` (0: this thread) back the CPU set ``allowed`` after a pin."""
    try:
        os.sched_setaffinity(pid, allowed)
    except ProcessLookupError:
        pass
    except OSError:
        # The CPU set changed since we read it: let the kernel intersect
        # every CPU with what the process may use now, rather than leave
        # it pinned.
        try:
            os.sched_setaffinity(pid, range(os.cpu_count() or 1))
        except OSError:
            pass
