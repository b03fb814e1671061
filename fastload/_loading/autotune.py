"""``num_workers="auto"``: as many workers as keep the consumer from waiting, no more.

NOTE [ The autopilot's hill climb ]
An epoch starts with ``AutoOptions.start_workers`` workers (1, or the count a
state or the last epoch ended with).  Every window (at least ``WINDOW``
seconds and ``WINDOW_BATCHES`` batches of the consumer's), the loader's
account (``time_ledger``) gives the window's rate (batches per second of the
consumer's time) and the share of it spent blocked on workers in ``next()``
(the main process's own work per batch, which no worker removes, left out):

* the consumer waited (``WAIT_SHARE`` or more) and more workers fit the
  memory budget: add as many as the report's estimate says would keep up,
  at most doubling; if the next window's rate (and, being noisy, the one
  after) is not ``GAIN`` better, more workers stopped helping: retire them
  again, and settle if it was one (else go on one at a time);
* the consumer did not wait and the workers sat idle for want of a ring slot
  most of the time: try one worker fewer; if the consumer then waits, add it
  back and settle;
* workers plus ring over the budget: retire one (never the last), whatever
  the rate, and never grow past that count again;
* workers on a CPU most of their busy time (CPU-bound, as ``report()`` tells
  it) never outnumber the CPUs: more would only take the consumer's CPU.

A window right after a change is not judged (a new worker is starting up).
Settling is final for the epoch but for the budget, which is checked every
window; after ``SETTLE_SECONDS`` the climb settles where the rate was best.
With ``prefetch_factor="auto"`` a worker's share of the ring grows by one
(up to ``MAX_PREFETCH``) when the consumer waits while workers sit idle:
batches come in bursts the ring is too shallow to smooth.

Which worker makes a batch no longer decides its content: in auto mode each
batch's random state (Python's ``random``, numpy's global generator, torch's)
is seeded from ``(base_seed, batch number)`` before it is made
(``worker_info.seed_for_batch``), so the same seed gives the same batches
whatever the climb chose.  Batches go to the least loaded live worker and
are handed out in sampler order as always.  A retired worker is sent no more
tasks, answers those it has, and is told to stop: its exit is expected; any
other worker's exit is still an error.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import dataclass
from typing import Any

from fastload._loading.memory_budget import default_budget
from fastload._loading.reaping import shown_workers
from fastload._loading.report import CPU_BOUND_SHARE
from fastload._loading.stage_clock import BATCHES, COLLATE, CPU, CPU_BUSY, FETCH, IDLE, MEMORY, \
    SEND, unpack
from fastload._loading.wire.layouts import LayoutReceiver
from fastload._loading.wire.messages import epoch_task

__all__ = ["AutoOptions", "AutoWorkers", "HillClimb", "MAX_PREFETCH", "max_workers",
           "usable_cpus"]

WINDOW = 0.3             # seconds of the consumer's time per judged window, at least
WINDOW_BATCHES = 4       # and batches
WAIT_SHARE = 0.05        # the consumer waits: more workers may help
IDLE_SHARE = 0.5         # the workers wait for slots this much: one fewer may do
GAIN = 0.05              # a new worker must raise the rate this much to stay
SETTLE_SECONDS = 10.0    # the climb settles by then, at the best rate seen
MAX_PREFETCH = 8


def usable_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def max_workers() -> int:
    """Workers the climb may reach: I/O-bound datasets may use more than the CPUs."""
    return max(4, 4 * usable_cpus())


@dataclass(frozen=True)
class AutoOptions:
    """What an auto loader's epoch starts from (handed to its iterator)."""

    start_workers: int
    start_prefetch: int
    auto_prefetch: bool
    memory_budget: int | None     # bytes; None: the default share, read as the epoch starts
    max_workers: int
    cpus: int = 1                 # CPUs this process may run on: CPU-bound workers' cap


@dataclass
class _Window:
    """The consumer's account when a window began."""

    batches: int
    wait: float
    step: float
    blocked: float


class HillClimb:
    """The decisions of NOTE [ The autopilot's hill climb ], apart from the processes.

    ``judge`` is given each window's figures and returns what to do:
    ``("add", n)``, ``("retire", n)``, ``("deepen", 1)`` (prefetch), or None.
    """

    def __init__(self, workers: int, prefetch: int, options: AutoOptions,
                 clock: Any = time.monotonic) -> None:
        self.workers, self.prefetch, self.options = workers, prefetch, options
        self.settled = False
        self.cap = options.max_workers   # lowered when the budget is hit
        self._clock = clock
        self._started = clock()
        self._trial: tuple[str, float, int] | None = None  # (kind, rate before, count)
        self._skip = False                                  # the window after a change
        self._best: tuple[float, int] = (0.0, workers)
        self._max_step = options.max_workers               # 1 once a larger step failed
        self._second_look = False                           # a trial's window, judged twice
        self._cpu_bound = False

    def judge(self, rate: float, wait_share: float, idle_share: float, needed: int | None,
              memory: int | None, per_worker: int | None, budget: int | None,
              cpu_bound: bool = False) -> tuple[str, int] | None:
        """``needed``: about how many workers would keep up (the report's estimate);
        ``cpu_bound``: the workers are on a CPU most of their busy time."""
        self._cpu_bound = cpu_bound
        if budget is not None and memory is not None and memory > budget and self.workers > 1:
            self.cap = self.workers - 1
            return self._change("retire", 1, rate, trial=False)
        if self._skip:
            self._skip = False
            return None
        if rate > self._best[0]:
            self._best = (rate, self.workers)
        if self.settled:
            return None
        if self._trial is not None:
            verdict = self._judge_trial(rate, wait_share)
            if verdict is not None or self._second_look:
                return verdict
        if self._clock() - self._started > SETTLE_SECONDS:
            self.settled = True              # where the rate was best
            best = self._best[1]
            if best != self.workers:
                return self._change("add" if best > self.workers else "retire",
                                    abs(best - self.workers), rate, trial=False)
            return None
        if wait_share >= WAIT_SHARE:
            return self._more(rate, idle_share, needed, memory, per_worker, budget)
        if idle_share >= IDLE_SHARE and self.workers > 1:
            return self._change("retire", 1, rate)
        return None

    def _judge_trial(self, rate: float, wait_share: float) -> tuple[str, int] | None:
        kind, before, count = self._trial
        self._trial = None
        if kind == "add" and rate < before * (1 + GAIN) and not self._second_look:
            # One window is noisy (other processes share the CPUs): a step that
            # seems to give nothing gets a second window before it is undone.
            self._trial, self._second_look = (kind, before, count), True
            return None
        self._second_look = False
        if kind == "add" and rate < before * (1 + GAIN):
            # More workers stopped helping: back to before; a larger step is
            # retried one worker at a time.
            self.settled = count == 1
            self._max_step = 1
            return self._change("retire", count, rate, trial=False)
        if kind == "retire" and wait_share >= WAIT_SHARE:
            self.settled = True              # one fewer was too few
            return self._change("add", count, rate, trial=False)
        return None

    def _more(self, rate: float, idle_share: float, needed: int | None, memory: int | None,
              per_worker: int | None, budget: int | None) -> tuple[str, int] | None:
        """The consumer waits: deepen the ring, or add workers (as many as the
        estimate says, at most doubling), within the cap and the budget."""
        if self.options.auto_prefetch and idle_share >= IDLE_SHARE \
                and self.prefetch < MAX_PREFETCH and self._fits(memory, per_worker, budget, 0):
            self.prefetch += 1
            self._skip = True
            return ("deepen", 1)
        # CPU-bound workers past the CPUs only take the consumer's CPU: never more.
        cap = min(self.cap, max(self.options.cpus, 1)) if self._cpu_bound else self.cap
        count = 1 if needed is None else needed - self.workers
        count = max(1, min(count, self.workers, self._max_step, cap - self.workers))
        while count > 0 and not self._fits(memory, per_worker, budget, count):
            count -= 1
        if count <= 0 or self.workers >= cap:
            self.settled = True              # at the cap or the budget
            return None
        return self._change("add", count, rate)

    def _fits(self, memory: int | None, per_worker: int | None, budget: int | None,
              workers: int) -> bool:
        """Whether ``workers`` more workers (and one more slot each) fit the budget."""
        if budget is None or memory is None:
            return True
        return memory + workers * (per_worker or 0) <= budget

    def _change(self, kind: str, count: int, rate: float, trial: bool = True) -> tuple[str, int]:
        self.workers += count if kind == "add" else -count
        self._trial = (kind, rate, count) if trial else None
        self._skip = True
        return (kind, count)


class AutoWorkers:
    """An auto iterator's climb: its windows, and its workers added and retired.

    ``iterator`` is the ``_MultiProcessIter`` (its pool, ring, tasks and
    ledger); this object reads them and calls its ``_add_worker`` /
    ``_retire_worker`` hooks.
    """

    def __init__(self, iterator: Any, options: AutoOptions, choice: dict) -> None:
        self.iterator = iterator
        self.options = options
        self._choice = choice  # the loader's: the next epoch and a state start from it
        self.budget = options.memory_budget if options.memory_budget is not None \
            else default_budget()
        self.climb = HillClimb(options.start_workers, options.start_prefetch, options)
        self.retiring: set[int] = set()
        self.peak_memory = 0
        self._window = self._mark()
        self._window_started = time.monotonic()
        self._worker_marks = (0.0, 0.0, 0.0, 0.0)
        choice.update(self.choice())

    @property
    def target(self) -> int:
        """Batches in flight: a share of the ring per live worker not retiring."""
        live = len(self.iterator._pool.live_workers) - len(self.retiring)
        return max(live, 1) * self.climb.prefetch

    def _mark(self) -> _Window:
        ledger = self.iterator._ledger
        return _Window(ledger.batches, ledger.wait, ledger.step, ledger.blocked)

    def memory(self) -> tuple[int | None, int | None]:
        """(workers' memory + the ring's bytes, what one more worker would add), or
        (None, None) before any worker said.  Each worker sends its own PSS with its
        answers (``stage_clock``); one that has not yet is counted as the largest."""
        iterator = self.iterator
        times = iterator._times.workers
        sizes = []
        for worker in iterator._pool.live_workers:
            packed = times[worker] if worker < len(times) else None
            sizes.append(unpack(packed)[MEMORY] if packed is not None else -1.0)
        known = [size for size in sizes if size >= 0]
        if not known:
            return None, None
        largest = max(known)
        total = int(sum(size if size >= 0 else largest for size in sizes)) \
            + iterator._ring.mapped_bytes()
        self.peak_memory = max(self.peak_memory, total)
        return total, int(largest) + iterator._ring.slot_bytes() * self.climb.prefetch

    def tick(self) -> None:
        """After a batch is handed out: judge the window once it is long enough."""
        now = time.monotonic()
        mark = self._mark()
        batches = mark.batches - self._window.batches
        spent = (mark.wait - self._window.wait) + (mark.step - self._window.step)
        if batches < WINDOW_BATCHES or now - self._window_started < WINDOW or spent <= 0:
            return
        waited = mark.wait - self._window.wait
        idle, whole, busy, made = self._worker_totals()
        before = self._worker_marks
        idle_share = (idle - before[0]) / (whole - before[1]) if whole > before[1] else 0.0
        # The report's estimate: a worker makes a batch in `making`, the consumer
        # takes one every `taking` (its step and the main process's own work).
        making = (busy - before[2]) / (made - before[3]) if made > before[3] else None
        taking = (mark.step - self._window.step + waited
                  - (mark.blocked - self._window.blocked)) / batches
        needed = math.ceil(making / taking) if making is not None and taking > 1e-6 else None
        memory, per_worker = self.memory()
        # The share of the consumer's time blocked on workers: what more workers can
        # remove (the main process's own work per batch they cannot).
        # (The next() in progress has its blocked time counted, not yet its wait: at most 1.)
        blocked = min((mark.blocked - self._window.blocked) / spent, 1.0)
        decision = self.climb.judge(batches / spent, blocked, idle_share, needed,
                                    memory, per_worker, self.budget, self._cpu_bound())
        if decision is not None and decision[0] == "add":
            try:
                for _ in range(decision[1]):
                    self._add_worker()
            except BaseException:
                self.iterator.shutdown()  # a worker half started (fork failed): stop them all
                raise
        elif decision is not None and decision[0] == "retire":
            for _ in range(decision[1]):
                self._retire_one()
        self.iterator._ring.in_flight = self.target
        self._choice.update(self.choice())
        self._window, self._window_started = self._mark(), now
        self._worker_marks = self._worker_totals()

    def top_up(self) -> None:
        """Dispatch until the climb's share of the ring is in flight (or nothing is left)."""
        iterator = self.iterator
        while len(iterator._tasks) + len(iterator._replies) < self.target:
            sent = iterator._next_batch_no
            iterator._dispatch()
            if iterator._next_batch_no == sent:
                return

    def pick(self) -> int | None:
        """The worker for the next batch: the least loaded live one not retiring."""
        iterator = self.iterator
        load, active = iterator._load, iterator._active
        best = None
        for worker in iterator._pool.live_workers:
            if active[worker] and worker not in self.retiring \
                    and (best is None or load[worker] < load[best]):
                best = worker
        return best

    def _add_worker(self) -> None:
        """Start a worker mid-epoch: it is told the epoch first, then given tasks."""
        iterator = self.iterator
        pool = iterator._pool
        worker = pool.add_worker(len(pool.live_workers) + 1)
        iterator._num_workers = worker + 1
        iterator._layouts.append(LayoutReceiver())
        iterator._load.append(0)
        iterator._active.append(True)
        iterator._times.workers.append(None)
        pool.send(worker, epoch_task(iterator._base_seed, iterator._snapshot_every, True))
        shown_workers(iterator._workers_key).append(pool.processes[worker])

    def _cpu_bound(self) -> bool:
        """Whether the live workers are on a CPU most of their busy time (as the report
        tells it: CPU seconds per busy second between their CPU readings)."""
        cpu = busy = 0.0
        times = self.iterator._times.workers
        for worker in self.iterator._pool.live_workers:
            if worker < len(times) and times[worker] is not None:
                totals = unpack(times[worker])
                if totals[CPU] >= 0:
                    cpu, busy = cpu + totals[CPU], busy + totals[CPU_BUSY]
        return busy > 0 and cpu / busy >= CPU_BOUND_SHARE

    def _worker_totals(self) -> tuple[float, float, float, float]:
        """(idle seconds, all seconds, busy seconds, batches made), summed over the
        live workers' last totals."""
        idle = whole = busy = made = 0.0
        times = self.iterator._times.workers
        for worker in self.iterator._pool.live_workers:
            if worker < len(times) and times[worker] is not None:
                totals = unpack(times[worker])
                working = totals[FETCH] + totals[COLLATE] + totals[SEND]
                idle += totals[IDLE]
                whole += totals[IDLE] + working
                busy += working
                made += totals[BATCHES]
        return idle, whole, busy, made

    def _retire_one(self) -> None:
        """Retire the live worker with the fewest tasks (the newest among equals)."""
        candidates = [w for w in self.iterator._pool.live_workers if w not in self.retiring]
        if len(candidates) <= 1:
            return
        load = self.iterator._load
        worker = min(reversed(candidates), key=lambda w: load[w])
        self.retiring.add(worker)
        self.iterator._ring.in_flight = self.target
        self.answered(worker)

    def answered(self, worker: int) -> None:
        """A worker answered: a retiring one with no task left is told to stop."""
        if worker in self.retiring and self.iterator._load[worker] == 0:
            self.retiring.discard(worker)
            self.iterator._active[worker] = False
            self.iterator._pool.retire_worker(worker)

    def choice(self) -> dict:
        """What the climb chose, for a state and the next epoch."""
        live = len(self.iterator._pool.live_workers) - len(self.retiring)
        return {"num_workers": live, "prefetch_factor": self.climb.prefetch}
