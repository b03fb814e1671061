"""A loader's running account of where its time went, for ``loader.report()``.

The iterators add to it as they go: the consumer's seconds inside ``next()``
(waiting for data) and between its calls (its own step), the main process's
seconds blocked on workers' answers, the seconds spent starting iterators,
and for every worker (or the main process, without workers) its latest
``stage_clock`` totals.  Each addition is a ``perf_counter`` read and a float
added; a worker's totals arrive with its answers (``wire/messages.TIMES``).
"""

from __future__ import annotations

from fastload._loading.stage_clock import CPU, CPU_BUSY, unpack

__all__ = ["TimeLedger", "IteratorTimes", "add_totals"]


class IteratorTimes:
    """The makers' stage totals of one iterator (one pool of workers, or the main process)."""

    __slots__ = ("workers", "main", "done", "baseline")

    def __init__(self, num_workers: int) -> None:
        # Per worker, the totals its last answer carried (stage_clock's packed bytes).
        self.workers: list[bytes | None] = [None] * num_workers
        # Without workers: the main process's BatchSource totals (a list it adds to).
        self.main: list | None = None
        self.done = False  # the iterator adds no more (its ledger may fold it)
        # Totals already reported and reset (report(reset=True)), per maker.
        self.baseline: dict[int | None, tuple] | None = None

    def makers(self) -> list[tuple[int | None, tuple]]:
        """``(worker id or None for the main process, totals since the baseline)``."""
        current = self._absolute()
        if self.baseline is None:
            return current
        return [(maker, totals if maker not in self.baseline else
                 _since(totals, self.baseline[maker])) for maker, totals in current]

    def _absolute(self) -> list[tuple[int | None, tuple]]:
        if self.main is not None:
            return [(None, tuple(self.main))]
        return [(worker, unpack(totals)) for worker, totals in enumerate(self.workers)
                if totals is not None]

    def take_baseline(self) -> None:
        self.baseline = dict(self._absolute())


class TimeLedger:
    """The consumer's side (seconds in and between ``next()`` calls) and every
    iterator's makers, since the loader was made or the last ``report(reset=True)``."""

    __slots__ = ("batches", "wait", "first_batches", "first_wait", "step", "blocked", "startup",
                 "iterators", "folded", "resets")

    def __init__(self) -> None:
        self.iterators: list[IteratorTimes] = []
        self.resets = 0       # how many times the account started again (a window spans none)
        self.reset()

    def reset(self) -> None:
        self.resets += 1
        self.batches = 0      # batches handed to the consumer
        self.wait = 0.0       # seconds the consumer spent inside next()
        # Kept apart from ``wait`` (start-up, not the steady state): the batches that
        # were workers' first of an epoch, and the seconds next() waited for them.
        self.first_batches = 0
        self.first_wait = 0.0
        self.step = 0.0       # seconds between a batch handed out and the next next()
        self.blocked = 0.0    # of ``wait``: the main process blocked on workers' answers
        # Seconds spent starting and ending epochs: in iter() (starting workers, the
        # first tasks) and in the next() that ends an epoch (StopIteration).
        self.startup = 0.0
        # Finished iterators' totals, summed per maker (worker id, None: main process).
        self.folded: dict[int | None, list[float]] = {}
        self.iterators = [times for times in self.iterators if not times.done]
        for times in self.iterators:  # live: what they made so far is reported already
            times.take_baseline()

    @property
    def spent(self) -> float:
        """All the consumer's seconds: its steps, its waits, and epochs' starts and ends."""
        return self.wait + self.first_wait + self.step + self.startup

    def new_iterator(self, num_workers: int) -> IteratorTimes:
        for times in self.iterators:
            if times.done:
                self._fold(times)
        self.iterators = [times for times in self.iterators if not times.done]
        times = IteratorTimes(num_workers)
        self.iterators.append(times)
        return times

    def _fold(self, times: IteratorTimes) -> None:
        for maker, totals in times.makers():
            self.folded[maker] = add_totals(self.folded.get(maker), totals)

    def makers(self) -> dict[int | None, list[float]]:
        """Every maker's totals since the last reset, summed over iterators."""
        summed = {maker: list(totals) for maker, totals in self.folded.items()}
        for times in self.iterators:
            for maker, totals in times.makers():
                summed[maker] = add_totals(summed.get(maker), totals)
        return summed

    def __getstate__(self) -> dict:
        # A pickled loader (a spawned worker's payload, a copy) starts a fresh account.
        # (Not an empty dict: pickle calls no __setstate__ for a false state.)
        return {"fresh": True}

    def __setstate__(self, state: dict) -> None:
        self.iterators = []
        self.resets = 0
        self.reset()


def _since(totals: tuple, base: tuple) -> tuple:
    """A maker's totals less an earlier reading of them; CPU stays unknown (-1) if it was."""
    since = [now - then for now, then in zip(totals, base)]
    if totals[CPU] < 0:
        since[CPU], since[CPU_BUSY] = -1.0, 0.0
    elif base[CPU] < 0:
        since[CPU], since[CPU_BUSY] = totals[CPU], totals[CPU_BUSY]
    return tuple(since)


def add_totals(total: list[float] | None, more: tuple) -> list[float]:
    """Two makers' totals added field by field; the CPU field (-1: not read) as known."""
    if total is None:
        return list(more)
    added = [a + b for a, b in zip(total, more)]
    if total[CPU] < 0 or more[CPU] < 0:  # at most one of them is known
        known = total if total[CPU] >= 0 else more
        added[CPU], added[CPU_BUSY] = known[CPU], known[CPU_BUSY]
    return added
