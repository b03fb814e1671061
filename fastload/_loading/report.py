"""``loader.report()``: where the time went, in numbers and in words.

The consumer's time is split in two: inside ``next()`` (waiting for data,
including the main process's own per-batch work) and between its calls
(its step).  The makers' time (each worker's, or the main process's at
``num_workers=0``) is split by stage (``stage_clock.py``): fetching the
samples, of which decoding and transforms where the dataset tells them,
collating, sending the answer, and waiting with no task (the ring had no
free slot for the worker: the consumer is behind).  From these, the verdict
says how much data loading costs the consumer and about how many workers
would remove that cost: a worker makes a batch in ``B`` seconds and the
consumer takes one every ``C`` (its step plus the main process's own work
per batch), so ``ceil(B / C)`` workers keep up with it.  Whether a
``__getitem__`` holds the GIL is not estimated; the workers' CPU seconds
(read every ``stage_clock.CPU_SAMPLE_INTERVAL``) against their busy seconds
tell CPU-bound work (where workers past the free cores only compete with the
training loop) from waiting on I/O (where more workers than cores can help).
"""

from __future__ import annotations

import dataclasses
import math
import os
from dataclasses import dataclass, field

from fastload._loading.stage_clock import BATCHES, COLLATE, CPU, CPU_BUSY, DECODE, FETCH, \
    IDLE, SEND, TRANSFORM
from fastload._loading.time_ledger import TimeLedger

__all__ = ["LoaderReport", "MakerTimes", "make_report"]

# Below this share of the consumer's time spent waiting, data loading costs nothing worth naming.
NO_WAIT_SHARE = 0.05
# Workers needed past this many per CPU: the consumer does next to nothing between batches.
_FAR_PAST_CPUS = 8
# A maker busy on its CPU for more than this share of its busy time is CPU-bound.
CPU_BOUND_SHARE = 0.7


@dataclass(frozen=True)
class MakerTimes:
    """One maker's seconds: a worker (``worker`` its id) or, at ``num_workers=0``,
    the main process (``worker`` None)."""

    worker: int | None
    batches: int
    fetch: float       # the dataset's __getitem__ / __getitems__, or a whole-batch gather
    decode: float      # of fetch: decoding samples (datasets that tell it apart)
    transform: float   # of fetch: the transforms after the decode
    collate: float     # collate_fn, into the batch's buffer (a ring slot)
    send: float        # answering the main process
    idle: float        # no task: the ring had no free slot for this worker
    cpu: float | None  # CPU seconds between its first and last reading (None: not read twice)
    cpu_busy: float    # the busy seconds between the same readings

    @property
    def busy(self) -> float:
        """Seconds spent making and sending batches."""
        return self.fetch + self.collate + self.send

    @property
    def idle_share(self) -> float:
        total = self.busy + self.idle
        return self.idle / total if total > 0 else 0.0

    @property
    def cpu_share(self) -> float | None:
        """CPU seconds per busy second (None: unknown)."""
        if self.cpu is None or self.cpu_busy <= 0:
            return None
        return min(self.cpu / self.cpu_busy, 1.0)


@dataclass(frozen=True)
class LoaderReport:
    """Where a loader's time went; ``str()`` is the verdict and a table per maker.

    Seconds are totals since the loader was made (or last reset); shares are
    fractions (0.31 is 31 %).
    """

    num_workers: int
    batches: int               # batches handed to the consumer
    wait_seconds: float        # the consumer inside next(), but for workers' first batches
    first_batches: int         # workers' first batch of an epoch: start-up, not counted in
    first_wait_seconds: float  # wait_seconds, and how long next() took for them
    step_seconds: float        # the consumer between next() calls
    startup_seconds: float     # starting and ending epochs: in iter(), and the next() that ends one
    blocked_seconds: float     # of wait_seconds: the main process blocked on workers
    makers: tuple[MakerTimes, ...]
    cpus: int                  # CPUs this process may run on
    autopilot: bool = False    # num_workers="auto": num_workers is its latest choice
    verdict: str = field(default="", compare=False)

    @property
    def wait_share(self) -> float:
        """The share of the consumer's time spent waiting for data in ``next()``."""
        total = self.wait_seconds + self.step_seconds
        return self.wait_seconds / total if total > 0 else 0.0

    @property
    def steady_batches(self) -> int:
        """The batches ``wait_seconds`` counts (all but workers' first of each epoch)."""
        return self.batches - self.first_batches

    @property
    def made(self) -> int:
        return sum(maker.batches for maker in self.makers)

    @property
    def busy_seconds(self) -> float:
        return sum(maker.busy for maker in self.makers)

    @property
    def stage_seconds(self) -> dict[str, float]:
        """Each stage's seconds, summed over the makers (decode, transform: parts of fetch)."""
        return {name: sum(getattr(maker, name) for maker in self.makers)
                for name in ("fetch", "decode", "transform", "collate", "send", "idle")}

    @property
    def stage_shares(self) -> dict[str, float]:
        """Each stage's share of the time spent making batches (``idle``: of the
        makers' whole time)."""
        seconds = self.stage_seconds
        busy = self.busy_seconds
        shares = {name: (seconds[name] / busy if busy > 0 else 0.0)
                  for name in ("fetch", "decode", "transform", "collate", "send")}
        whole = busy + seconds["idle"]
        shares["idle"] = seconds["idle"] / whole if whole > 0 else 0.0
        return shares

    @property
    def batch_seconds(self) -> float | None:
        """What one maker spends making one batch, on average (None: none made)."""
        made = self.made
        return self.busy_seconds / made if made else None

    @property
    def main_seconds_per_batch(self) -> float:
        """The main process's own work per batch inside ``next()`` (with workers: not
        blocked on them; without: not making the batch)."""
        if not self.steady_batches:
            return 0.0
        own = self.wait_seconds - (self.blocked_seconds if self.num_workers
                                   else self.busy_seconds)
        return max(own, 0.0) / self.steady_batches

    @property
    def consumer_seconds_per_batch(self) -> float | None:
        """How often the consumer takes a batch when none is late: its step plus the
        main process's own work per batch."""
        if not self.steady_batches:
            return None
        return self.step_seconds / self.batches + self.main_seconds_per_batch

    @property
    def workers_needed(self) -> int | None:
        """About how many workers keep up with the consumer (None: unknown, or the
        consumer takes batches as fast as anything can make them)."""
        making, taking = self.batch_seconds, self.consumer_seconds_per_batch
        if making is None or not taking or taking < 1e-6:
            return None
        return max(1, math.ceil(making / taking - 1e-9))

    @property
    def cpu_share(self) -> float | None:
        """The makers' CPU seconds per busy second (workers only; None: unknown)."""
        known = [maker for maker in self.makers if maker.cpu is not None]
        busy = sum(maker.cpu_busy for maker in known)
        if not known or busy <= 0:
            return None
        return min(sum(maker.cpu for maker in known) / busy, 1.0)

    def __str__(self) -> str:
        return self.verdict + "\n" + _table(self)


def make_report(ledger: TimeLedger, num_workers: int, autopilot: bool = False) -> LoaderReport:
    """The report of ``ledger``'s account so far (``autopilot``: ``num_workers`` is
    ``"auto"``'s latest choice)."""
    makers = tuple(_maker(worker, totals) for worker, totals in
                   sorted(ledger.makers().items(), key=lambda item: -1 if item[0] is None
                          else item[0]))
    report = LoaderReport(num_workers=num_workers, batches=ledger.batches,
                          wait_seconds=ledger.wait, first_batches=ledger.first_batches,
                          first_wait_seconds=ledger.first_wait, step_seconds=ledger.step,
                          startup_seconds=ledger.startup, blocked_seconds=ledger.blocked,
                          makers=makers, cpus=_cpus(), autopilot=autopilot)
    return dataclasses.replace(report, verdict=_verdict(report))


def _maker(worker: int | None, totals: list[float]) -> MakerTimes:
    cpu = totals[CPU]
    return MakerTimes(worker=worker, batches=int(totals[BATCHES]), fetch=totals[FETCH],
                      decode=totals[DECODE], transform=totals[TRANSFORM],
                      collate=totals[COLLATE], send=totals[SEND], idle=totals[IDLE],
                      cpu=None if cpu < 0 or worker is None else cpu, cpu_busy=totals[CPU_BUSY])


def _cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _worker_count(report: LoaderReport) -> str:
    if report.autopilot:
        return f"num_workers='auto', {report.num_workers} at the latest choice"
    return f"{report.num_workers} workers"


def _workers(count: int) -> str:
    return f"about {count} worker{'s' if count != 1 else ''}"


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.3g} ms"


def _verdict(report: LoaderReport) -> str:
    """The report in words: what data loading costs, why, and what would remove it."""
    if report.batches == 0:
        return "no batches handed out yet: nothing to report"
    steady = max(report.steady_batches, 1)
    start = f"{report.startup_seconds:.2f} s starting and ending epochs"
    if report.first_batches:
        start += f", {report.first_wait_seconds:.2f} s waiting for the workers' first batches"
    lines = [f"data loading costs {100 * report.wait_share:.0f} % of step time: the consumer "
             f"waited {_ms(report.wait_seconds / steady)} per batch in next() and spent "
             f"{_ms(report.step_seconds / report.batches)} between batches ({report.batches} "
             f"batches, {_worker_count(report)}; {start})"]
    making, needed = report.batch_seconds, report.workers_needed
    cpu_share = report.cpu_share
    if making is not None:
        lines.append(f"making a batch takes {'a worker' if report.num_workers else 'the main process'} "
                     f"{_ms(making)}: " + _stage_words(report))
    if report.wait_share >= NO_WAIT_SHARE:
        lines.append(_waiting_words(report, needed, cpu_share))
    elif report.num_workers:
        idle = report.stage_shares["idle"]
        advice = f"; {_workers(needed)} would keep up" if needed is not None \
            and needed < report.num_workers else ""
        lines.append(f"the consumer is the bottleneck: its data is ready when it asks, and the "
                     f"workers wait for a free ring slot {100 * idle:.0f} % of their time{advice}")
    else:
        lines.append("the consumer is the bottleneck: making a batch in the main process costs "
                     "it little")
    if cpu_share is not None:
        kind = "CPU-bound" if cpu_share >= CPU_BOUND_SHARE else "mostly off a CPU (I/O, sleeps, locks, or CPUs busy with other work)"
        lines.append(f"workers are on a CPU {100 * cpu_share:.0f} % of their busy time: {kind}")
    return "\n".join(lines)


def _stage_words(report: LoaderReport) -> str:
    shares = report.stage_shares
    fetch = f"fetch {100 * shares['fetch']:.0f} %"
    parts = [f"{name} {100 * shares[name]:.0f} %" for name in ("decode", "transform")
             if report.stage_seconds[name] > 0]
    if parts:
        fetch += f" (of which {', '.join(parts)})"
    words = f"{fetch}, collate {100 * shares['collate']:.0f} %"
    if report.num_workers:
        words += f", sending {100 * shares['send']:.0f} %"
    return words


def _waiting_words(report: LoaderReport, needed: int | None, cpu_share: float | None) -> str:
    """Why the consumer waits, and what would remove the wait."""
    taking = report.consumer_seconds_per_batch or 0.0
    main = report.main_seconds_per_batch
    if report.num_workers and needed is not None and needed <= report.num_workers \
            and main > 0.5 * taking:
        return (f"the main process's own work per batch ({_ms(main)}) is the limit, not the "
                f"workers: a faster batch path (ArrayDataset, default_collate) would help")
    if needed is None or needed > _FAR_PAST_CPUS * report.cpus:
        return (f"the consumer takes batches as fast as they come (every {_ms(taking)}): "
                f"the loader is the bottleneck whatever its settings; more workers help "
                f"until the CPUs are busy")
    words = f"the consumer takes a batch every {_ms(taking)}: {_workers(needed)} would remove it"
    if cpu_share is not None and cpu_share >= CPU_BOUND_SHARE and needed >= report.cpus:
        words += (f", but the work is CPU-bound and this process may use {report.cpus} CPUs: "
                  f"past {max(report.cpus - 1, 1)} workers they take the training loop's CPU; "
                  f"make the largest stage cheaper")
    return words


def _table(report: LoaderReport) -> str:
    """Per maker: batches made, milliseconds per batch by stage, idle and CPU shares."""
    rows = [f"{'maker':<10}{'batches':>8}{'fetch ms':>10}{'decode ms':>11}{'transform ms':>14}"
            f"{'collate ms':>12}{'send ms':>9}{'idle':>6}{'cpu':>6}"]
    for maker in report.makers:
        name = "main" if maker.worker is None else f"worker {maker.worker}"
        count = max(maker.batches, 1)
        cpu = "-" if maker.cpu_share is None else f"{100 * maker.cpu_share:.0f}%"
        rows.append(f"{name:<10}{maker.batches:>8}{1000 * maker.fetch / count:>10.2f}"
                    f"{1000 * maker.decode / count:>11.2f}{1000 * maker.transform / count:>14.2f}"
                    f"{1000 * maker.collate / count:>12.2f}{1000 * maker.send / count:>9.2f}"
                    f"{100 * maker.idle_share:>5.0f}%{cpu:>6}")
    return "\n".join(rows)
