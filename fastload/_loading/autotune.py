"""``num_workers="auto"``: as many workers as keep the consumer from waiting, no more.

NOTE [ The autopilot's hill climb ]
The climb (``HillClimb``) belongs to the loader: epochs are often shorter than
it needs to settle, so it goes on from one to the next.  The first epoch
starts with ``AutoOptions.start_workers`` workers (1, or a state's choice),
each later one with the count the last one ended with.  Every window (at
least ``WINDOW`` seconds and ``WINDOW_BATCHES`` batches of the consumer's),
the loader's account (``time_ledger``) gives the window's rate (batches per
second of the consumer's time) and the share of it spent blocked on workers
in ``next()`` (the main process's own work per batch, which no worker
removes, left out).  A window right after a change is not judged (a worker
is starting up).  Epochs' starts and ends are in a window's rate: a worker
count pays them every epoch.  A count's rate is the median of its
last ``KEPT_WINDOWS`` windows, and is compared only once it has ``LOOKS``,
or more while they disagree by more than ``GAIN`` either side (one window is
noisy: other processes share the CPUs):

* the consumer waited (``WAIT_SHARE`` or more) and more workers fit the
  memory budget: add as many as the report's estimate says would keep up,
  at most doubling; if the new count's rate is not ``GAIN`` better, more
  workers stopped helping: retire them again, and settle if it was one
  (else go on one at a time);
* the consumer did not wait and the workers sat idle for want of a ring slot
  most of the time: try one worker fewer; if the consumer then waits or the
  rate drops by ``GAIN``, add it back and settle;
* workers plus ring over the budget: retire one (never the last), whatever
  the rate, and never grow past that count again;
* workers on a CPU most of their busy time (CPU-bound, as ``report()`` tells
  it) are added one at a time past the CPUs: there they only fill the gaps
  while the others send or wait for a task, which the rate must show.  No
  worker is added while the consumer does not wait, so a CPU-bound pipeline
  never takes a busy consumer's CPU.

Settled, only the budget (checked every ``SETTLED_WINDOW``) moves the count, until
``RECHECK_SECONDS`` later the climb starts again, one worker at a time, from
the current count: the machine's load, the page cache, the consumer's step
change over a run.  ``SETTLE_SECONDS`` after the first window began (or a
climb started again), the climb settles at the count whose windows were
fastest.  With ``prefetch_factor="auto"`` a worker's share of
the ring grows by one (up to ``MAX_PREFETCH``) when the consumer waits while
workers sit idle: batches come in bursts the ring is too shallow to smooth.

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
import statistics
import time
import weakref
from dataclasses import dataclass
from typing import Any

from fastload._loading.memory_budget import default_budget
from fastload._loading.reaping import shown_workers
from fastload._loading.report import CPU_BOUND_SHARE
from fastload._loading.stage_clock import BATCHES, COLLATE, CPU, CPU_BUSY, FETCH, IDLE, MEMORY, \
    RESIDENT, SEND, unpack
from fastload._loading.wire.layouts import LayoutReceiver
from fastload._loading.wire.messages import epoch_task

__all__ = ["AutoOptions", "AutoWorkers", "HillClimb", "MAX_PREFETCH", "max_workers",
           "usable_cpus"]

WINDOW = 0.3             # seconds of the consumer's time per judged window, at least
WINDOW_BATCHES = 4       # and batches
# Settled, a window only weighs the budget and the recheck's clock: a longer one
# spares the main process a judgment's work (reading every worker's totals) per batch.
SETTLED_WINDOW = 1.0
WAIT_SHARE = 0.05        # the consumer waits: more workers may help
IDLE_SHARE = 0.5         # the workers wait for slots this much: one fewer may do
GAIN = 0.05              # a new worker must raise the rate this much to stay
LOOKS = 2                # windows at a count before its rate is compared (one is noisy)
KEPT_WINDOWS = 4         # windows a count's rate is the median of
SETTLE_SECONDS = 8.0     # from the first window: settled, and its last change made, within 10 s
RECHECK_SECONDS = 60.0   # after settling, the climb looks again this often
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
    cpus: int = 1                 # CPUs this process may use (past them: CPU-bound workers singly)


@dataclass
class Window:
    """The consumer's account when a window began (``time_ledger``'s figures)."""

    batches: int
    spent: float       # all its seconds: steps, waits, and epochs' starts and ends
    step: float        # of which its own steps
    wait: float        # of which steady waits in next() (workers' first batches apart)
    blocked: float     # the main process blocked on workers' answers
    resets: int        # the account's resets so far (report(reset=True) starts it again)

    @classmethod
    def at(cls, ledger: Any) -> Window:
        """The account of ``ledger`` (a ``TimeLedger``) now."""
        return cls(ledger.batches, ledger.spent, ledger.step, ledger.wait, ledger.blocked,
                   ledger.resets)


class HillClimb:
    """The decisions of NOTE [ The autopilot's hill climb ], apart from the processes.

    One climb lives as long as its loader (a short epoch is not long enough to
    settle in), and is told each epoch's start.  ``judge`` is given each
    window's figures and returns what to do: ``("add", n)``, ``("retire", n)``,
    ``("deepen", 1)`` (prefetch), or None.
    """

    def __init__(self, workers: int, prefetch: int, options: AutoOptions,
                 clock: Any = time.monotonic) -> None:
        self.workers, self.prefetch, self.options = workers, prefetch, options
        self.settled = False
        self._settled_at = 0.0
        self.cap = options.max_workers   # lowered when the budget is hit
        self._clock = clock
        self._started: float | None = None                  # when the first window began
        self._rates: dict[int, list[float]] = {}            # workers -> the last windows' rates
        self._trial: tuple[str, int] | None = None          # (kind, the count it left)
        self._skip = True                                   # the window after a change
        self._max_step = options.max_workers                # 1 once a larger step failed
        self._cpu_bound = False
        # A worker's last memory reading (PSS, resident size, live workers then): a
        # worker started later counts itself from it (``AutoWorkers.memory_hint``).
        self.worker_memory: tuple[float, float, int] | None = None
        # The window being measured: the loader's account when it began.  It runs
        # across epochs, which may be shorter than a window; their starts and ends
        # are in its rate, since a worker count pays them every epoch.
        self.window: Window | None = None

    def begin_epoch(self, workers: int) -> None:
        """An epoch starts with ``workers`` (the count the last one ended with)."""
        self.workers = workers

    def begin_window(self, mark: Window) -> None:
        """A window begins at ``mark``; the first starts the settling clock."""
        self.window = mark
        if self._started is None:
            self._started = self._clock()

    def rate(self, workers: int) -> float | None:
        """The median rate of the last windows at ``workers`` (None: none yet)."""
        rates = self._rates.get(workers)
        return statistics.median(rates) if rates else None

    def _measured(self, workers: int) -> float | None:
        """``rate(workers)`` once it can be compared: ``LOOKS`` windows at least,
        and more (up to ``KEPT_WINDOWS``) while they disagree by more than ``GAIN``
        either side (other processes share the CPUs)."""
        rates = self._rates.get(workers, ())
        if len(rates) < LOOKS:
            return None
        median = statistics.median(rates)
        if len(rates) < KEPT_WINDOWS and max(rates) - min(rates) > 2 * GAIN * median:
            return None
        return median

    def judge(self, rate: float, wait_share: float, idle_share: float, needed: int | None,
              memory: int | None, per_worker: int | None, budget: int | None,
              cpu_bound: bool = False) -> tuple[str, int] | None:
        """``needed``: about how many workers would keep up (the report's estimate);
        ``cpu_bound``: the workers are on a CPU most of their busy time."""
        self._cpu_bound = cpu_bound
        if budget is not None and memory is not None and memory > budget and self.workers > 1:
            self.cap = self.workers - 1
            return self._change("retire", 1, trial=False)
        if self._skip:
            self._skip = False
            return None
        rates = self._rates.setdefault(self.workers, [])
        rates.append(rate)
        del rates[:-KEPT_WINDOWS]
        if self.settled:
            if self._clock() - self._settled_at < RECHECK_SECONDS:
                return None
            self._reopen()
        if self._started is None:
            self._started = self._clock()
        if self._clock() - self._started >= SETTLE_SECONDS:
            return self._settle_at_best()
        here = self._measured(self.workers)
        if here is None:
            return None                      # not yet enough windows at this count
        if self._trial is not None:
            verdict = self._judge_trial(here, wait_share)
            if verdict is not None or self.settled:
                return verdict
        if wait_share >= WAIT_SHARE:
            return self._more(idle_share, needed, memory, per_worker, budget)
        if idle_share >= IDLE_SHARE and self.workers > 1:
            return self._change("retire", 1)
        return None

    def _judge_trial(self, here: float, wait_share: float) -> tuple[str, int] | None:
        """The count a change reached, against the one it left (both over ``LOOKS`` windows)."""
        kind, left = self._trial
        self._trial = None
        before = self.rate(left) or 0.0
        if kind == "add" and here < before * (1 + GAIN):
            # More workers stopped helping: back to before; a larger step is
            # retried one worker at a time.
            if self.workers - left == 1:
                self._settle()
            self._max_step = 1
            return self._change("retire", self.workers - left, trial=False)
        if kind == "retire" and (wait_share >= WAIT_SHARE or here < before * (1 - GAIN)):
            self._settle()                   # one fewer was too few
            return self._change("add", left - self.workers, trial=False)
        return None

    def _settle(self) -> None:
        self.settled, self._settled_at = True, self._clock()

    def _reopen(self) -> None:
        """``RECHECK_SECONDS`` after settling: climb again, one worker at a time, from
        this window's rate (the load on the machine, the page cache, the
        consumer's step may have changed since)."""
        self.settled = False
        self._rates = {self.workers: self._rates[self.workers][-1:]}
        self._max_step = 1
        self._started = self._clock()

    def _settle_at_best(self) -> tuple[str, int] | None:
        """Past ``SETTLE_SECONDS``: settle at the count whose windows were fastest."""
        self._settle()
        measured = {w: self.rate(w) for w in self._rates if self._rates[w] and w <= self.cap}
        best = max(measured, key=measured.get, default=self.workers)
        if best == self.workers:
            return None
        return self._change("add" if best > self.workers else "retire",
                            abs(best - self.workers), trial=False)

    def _more(self, idle_share: float, needed: int | None, memory: int | None,
              per_worker: int | None, budget: int | None) -> tuple[str, int] | None:
        """The consumer waits: deepen the ring, or add workers (as many as the
        estimate says, at most doubling), within the cap and the budget."""
        if self.options.auto_prefetch and idle_share >= IDLE_SHARE \
                and self.prefetch < MAX_PREFETCH and self._fits(memory, per_worker, budget, 0):
            self.prefetch += 1
            self._skip = True
            return ("deepen", 1)
        count = 1 if needed is None else needed - self.workers
        count = max(1, min(count, self.workers, self._max_step, self.cap - self.workers))
        if self._cpu_bound and self.workers >= self.options.cpus:
            count = 1  # past the CPUs, CPU-bound workers only fill gaps: one at a time
        while count > 0 and not self._fits(memory, per_worker, budget, count):
            count -= 1
        if count <= 0 or self.workers >= self.cap:
            self._settle()                   # at the cap or the budget
            return None
        return self._change("add", count)

    def _fits(self, memory: int | None, per_worker: int | None, budget: int | None,
              workers: int) -> bool:
        """Whether ``workers`` more workers (and one more slot each) fit the budget."""
        if budget is None or memory is None:
            return True
        return memory + workers * (per_worker or 0) <= budget

    def _change(self, kind: str, count: int, trial: bool = True) -> tuple[str, int]:
        self._trial = (kind, self.workers) if trial else None
        self.workers += count if kind == "add" else -count
        self._skip = True
        return (kind, count)


class AutoWorkers:
    """An auto iterator's climb: its windows, and its workers added and retired.

    ``iterator`` is the ``_MultiProcessIter`` (its pool, ring, tasks and
    ledger); this object reads them and calls its ``_add_worker`` /
    ``_retire_worker`` hooks.
    """

    def __init__(self, iterator: Any, options: AutoOptions, choice: dict,
                 climb: HillClimb) -> None:
        # Weakly: the iterator holds this object, and a cycle would keep a dropped
        # iterator's workers, pipes and ring alive until the collector ran.
        self._iterator = weakref.ref(iterator)
        self.options = options
        self._choice = choice  # the loader's: the next epoch and a state start from it
        self.budget = options.memory_budget if options.memory_budget is not None \
            else default_budget()
        self.climb = climb     # the loader's: it goes on from the last epoch
        climb.begin_epoch(options.start_workers)
        self.retiring: set[int] = set()
        self.peak_memory = 0
        # This epoch's workers' totals when the window began (new workers: zero).
        self._worker_marks = (0.0, 0.0, 0.0, 0.0)
        choice.update(self.choice())

    @property
    def iterator(self) -> Any:
        """The ``_MultiProcessIter`` (it alone calls this object, so it is alive)."""
        return self._iterator()

    @property
    def target(self) -> int:
        """Batches in flight: a share of the ring per live worker not retiring."""
        live = len(self.iterator._pool.live_workers) - len(self.retiring)
        return max(live, 1) * self.climb.prefetch

    def memory(self) -> tuple[int | None, int | None]:
        """(workers' memory + the ring's bytes, what one more worker would add), or
        (None, None) before any worker said.  Each worker sends its own PSS with its
        answers (``stage_clock``); one that has not yet is counted as the largest."""
        iterator = self.iterator
        times = iterator._times.workers
        live = iterator._pool.live_workers
        readings, unread = [], 0  # (memory, resident size) of each worker that said
        for worker in live:
            packed = times[worker] if worker < len(times) else None
            totals = unpack(packed) if packed is not None else None
            if totals is not None and totals[MEMORY] >= 0:
                readings.append((totals[MEMORY], totals[RESIDENT]))
            else:
                unread += 1
        if not readings:
            return None, None
        largest = max(readings)
        self.climb.worker_memory = (*largest, len(live))
        total = int(sum(memory for memory, _ in readings) + unread * largest[0]) \
            + iterator._ring.mapped_bytes()
        self.peak_memory = max(self.peak_memory, total)
        return total, int(largest[0]) + iterator._ring.slot_bytes() * self.climb.prefetch

    def memory_hint(self, workers: int) -> tuple[float, float] | None:
        """What a worker started now, one of ``workers``, counts its memory from:
        the largest a worker of this loader last reported, unless fewer workers
        share the pages now (each one's share of them is larger then)."""
        known = self.climb.worker_memory
        return known[:2] if known is not None and known[2] <= workers else None

    def tick(self) -> None:
        """After a batch is handed out: judge the window once it is long enough."""
        ledger, window = self.iterator._ledger, self.climb.window
        if window is None or ledger.resets != window.resets:  # the first, or report(reset=True)
            self.climb.begin_window(Window.at(ledger))
            return
        # Cheaply, as it runs with every batch: the window is judged a few times a second.
        batches = ledger.batches - window.batches
        spent = ledger.spent - window.spent
        if batches < WINDOW_BATCHES or spent < (SETTLED_WINDOW if self.climb.settled else WINDOW):
            return
        mark = Window.at(ledger)
        idle, whole, busy, made = self._worker_totals()
        before = self._worker_marks
        idle_share = (idle - before[0]) / (whole - before[1]) if whole > before[1] else 0.0
        # The report's estimate: a worker makes a batch in `making`, the consumer
        # takes one every `taking` (its step and the main process's own work).
        making = (busy - before[2]) / (made - before[3]) if made > before[3] else None
        taking = (mark.step - window.step + mark.wait - window.wait
                  - (mark.blocked - window.blocked)) / batches
        needed = math.ceil(making / taking) if making is not None and taking > 1e-6 else None
        memory, per_worker = self.memory()
        # The share of the consumer's time blocked on workers: what more workers can
        # remove (the main process's own work per batch they cannot).
        # (The next() in progress has its blocked time counted, not yet its wait: at most 1.)
        blocked = min((mark.blocked - window.blocked) / spent, 1.0)
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
        self.climb.begin_window(Window.at(self.iterator._ledger))
        self._worker_marks = self._worker_totals()

    def top_up(self) -> None:
        """Dispatch until the climb's share of the ring is in flight (or nothing is left)."""
        iterator = self.iterator
        target = self.target  # dispatching adds or retires no worker
        while len(iterator._tasks) + len(iterator._replies) < target:
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
        pool.send(worker, epoch_task(iterator._base_seed, iterator._snapshot_every, True,
                                     self.memory_hint(len(pool.live_workers))))
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
