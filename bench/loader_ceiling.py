"""How close can any loader with torch's rules come to the limit on this machine?

``bench_loader.py`` reports fastload against a *limit*: twice what the batch
code makes in one process.  This script asks what part of the gap is
fastload's, by running, in one process and in rotated rounds:

* ``pipeline``: the loader's batch code in a plain loop (``bench_loader.pipeline_epoch``),
  one process; twice its rate is the limit;
* ``side by side``: two forked processes running that loop at once, released
  together (their samples over the span from the first start to the last
  end): what two processes make on this machine with no third process and
  nothing to wait for;
* ``stripped loader``: the least a loader with torch's rules must do.  The
  epoch's order is in shared memory, worker ``w`` makes batches ``w, w + 2,
  ...`` (torch's assignment) with the same batch code straight into its own
  slots, never more than ``prefetch_factor`` (2) batches ahead of what the
  main process has taken, and the main process takes them in order.  The two
  sides signal through futexes on counters in shared memory: no task, no
  answer, no pickling, no pipe, no views, no error handling;
* ``fastload``: ``fastload.DataLoader``, as ``bench_loader.py`` builds it.

What the stripped loader leaves below the limit comes with the rules
(batches are taken in order, a wake-up for each, by a third process that
needs a CPU too; each worker rotates through slots that do not stay in its
cache) and with the machine (two CPUs shared by three processes); what
fastload leaves below the stripped loader is the price of everything it
does per batch on top.

Four options change the stripped loader (fastload is left as it is), to
see where its own loss lies: ``--prefetch N`` lets its workers run N batches
ahead instead of 2; ``--hand-over epoch-end`` makes the main process take
nothing until the epoch's end, so the workers run free (overwriting their
slots: nobody reads them); ``--destination private`` has each worker write
every batch into one private buffer, reused as the pipeline alone reuses its
own, instead of rotating through its slots (no loader can do that: the caller
holds one batch while the next ones are made); ``--signal pipes`` carries its
per-batch signals through pipes read with ``poll``, as fastload's tasks and
answers travel, instead of futexes (whether fastload would gain from moving
its messages to shared memory).

Linux on x86-64 only: the futex system call's number is x86-64's, and the
counters are plain stores, which x86-64 makes visible in order.

    python bench/loader_ceiling.py --workloads tiny dict --workers 2p 2 --rounds 20
    python bench/loader_ceiling.py --workloads tiny --workers 2p --rounds 10 --no-write \
        --hand-over epoch-end --destination private
    python bench/loader_ceiling.py --workloads dict --rounds 10 --no-write --signal pipes
"""

from __future__ import annotations

import argparse
import ctypes
import errno
import mmap
import os
import platform
import select
import statistics
import sys
import time
import traceback
from typing import Callable

import numpy as np

from bench_loader import Workload, batch_length, build_workload, make_loader, pipeline_epoch
from fastload.collate import default_collate
from fastload._loading.fetch import BatchSource
from fastload._loading.settings import BatchSettings
from results import write_section

if platform.system() != "Linux" or platform.machine() != "x86_64":  # pragma: no cover
    sys.exit("loader_ceiling.py runs on Linux x86-64 only (futex numbers, store ordering)")

_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long
_SYS_FUTEX, _FUTEX_WAIT, _FUTEX_WAKE = 202, 0, 1


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


# A waiting process wakes this often to check that the other side lives.
_LIVENESS = _Timespec(0, 100_000_000)
# No wait lasts longer than this: a wedged run fails instead of hanging.
_DEADLINE_S = 30.0

PREFETCH = 2  # torch's default prefetch_factor
WORKERS = 2


class Counters:
    """32-bit counters in memory shared with forked children; each has one writer."""

    def __init__(self, words: np.ndarray) -> None:
        self.words = words
        self._base = words.ctypes.data

    def bump(self, i: int) -> None:
        """Add one and wake whoever waits for it."""
        self.words[i] += 1
        _libc.syscall(_SYS_FUTEX, ctypes.c_void_p(self._base + 4 * i), _FUTEX_WAKE,
                      ctypes.c_int(1 << 30), None, None, 0)

    def wait_above(self, i: int, target: int, alive: Callable[[], bool]) -> None:
        """Until counter ``i`` exceeds ``target``; RuntimeError if ``alive()`` turns
        false or the deadline passes."""
        address = ctypes.c_void_p(self._base + 4 * i)
        deadline = time.monotonic() + _DEADLINE_S
        while True:
            seen = int(self.words[i])
            if seen > target:
                return
            timed_out = _libc.syscall(_SYS_FUTEX, address, _FUTEX_WAIT, ctypes.c_int(seen),
                                      ctypes.byref(_LIVENESS), None, 0) != 0 \
                and ctypes.get_errno() == errno.ETIMEDOUT
            if timed_out and not alive():
                raise RuntimeError("the other side of the stripped loader is gone")
            if time.monotonic() > deadline:
                raise RuntimeError(f"counter {i} stayed at {seen} for {_DEADLINE_S} s")


class PipeCounters:
    """The per-batch counters of ``Counters`` (``made[w]``, ``taken[w]``) carried
    instead as bytes through one pipe each, read with ``poll`` and ``read`` as
    fastload's two sides read their messages: each bump writes one byte, and
    a waiting reader counts every byte waiting at once.

    Made anew with each set of workers (``base``: the counts so far), so that
    bytes a past epoch's worker left unread do not count for the next.
    """

    def __init__(self, base: list[int]) -> None:
        self.counts = list(base)
        self.ends = [os.pipe() for _ in base]
        self.pollers = []
        for read_end, _ in self.ends:
            poller = select.poll()
            poller.register(read_end, select.POLLIN)
            self.pollers.append(poller)

    def bump(self, i: int) -> None:
        self.counts[i] += 1
        os.write(self.ends[i][1], b"\x01")

    def wait_above(self, i: int, target: int, alive: Callable[[], bool]) -> None:
        deadline = time.monotonic() + _DEADLINE_S
        liveness_ms = _LIVENESS.tv_nsec // 1_000_000
        while self.counts[i] <= target:
            if self.pollers[i].poll(liveness_ms):
                self.counts[i] += len(os.read(self.ends[i][0], 4096))
            elif not alive():
                raise RuntimeError("the other side of the stripped loader is gone")
            if time.monotonic() > deadline:
                raise RuntimeError(f"pipe {i} stayed at {self.counts[i]} for {_DEADLINE_S} s")

    def close(self) -> None:
        for read_end, write_end in self.ends:
            os.close(read_end)
            os.close(write_end)


class StrippedLoader:
    """Torch's batch assignment and prefetch bound, and nothing else (module docstring).

    Worker ``w``'s ``j``-th batch of all (counted across epochs) goes to its
    slot ``j mod (prefetch + 2)``; it may start once the main process has
    taken its batch ``j - prefetch`` (torch sends batch ``k``'s task when
    batch ``k - prefetch * WORKERS`` arrives).  Counters: ``made[w]``, ``taken[w]``,
    then the number of epochs whose order has been published.  ``hand_over``
    and ``destination``: the module docstring's variants.
    """

    def __init__(self, workload: Workload, persistent: bool, prefetch: int = PREFETCH,
                 hand_over: str = "each", destination: str = "slots",
                 signal: str = "futex") -> None:
        self.dataset, self.batch_size = workload.pipeline(), workload.batch_size
        self.batches = len(self.dataset) // self.batch_size  # the last, partial one left out
        self.persistent = persistent
        self.prefetch, self.hand_over, self.destination = prefetch, hand_over, destination
        self.signal = signal
        self.slots_per_worker = prefetch + 2
        self.slot_bytes = slot_bytes = self._batch_bytes()
        slots = WORKERS * self.slots_per_worker
        samples = len(self.dataset)
        self._memory = mmap.mmap(-1, slots * slot_bytes + 8 * samples + 64)  # MAP_SHARED
        whole = np.frombuffer(self._memory, np.uint8)
        self.slots = [whole[i * slot_bytes:(i + 1) * slot_bytes] for i in range(slots)]
        self.order = whole[slots * slot_bytes:][:8 * samples].view(np.int64)
        self.counters = Counters(whole[slots * slot_bytes + 8 * samples:][:64].view(np.int32))
        # made[w], taken[w]: the counters themselves, or pipes (``signal="pipes"``)
        self.per_batch: Counters | PipeCounters = self.counters
        self.epochs_begun = 0
        self.pids: list[int] = []
        self.epoch_pids: list[int] = []
        self.exiting: list[int] = []  # new workers of past epochs, not yet reaped
        self.parent = os.getpid()
        self.rng = np.random.default_rng(0)

    def _source(self) -> BatchSource:
        """The batch code, as the pipeline and fastload's workers run it."""
        return BatchSource(self.dataset, BatchSettings(False, True, default_collate,
                                                 self.batch_size, False))

    def _batch_bytes(self) -> int:
        source = self._source()
        source.start_epoch(0)
        sizes: list[int] = []

        def measure(nbytes: int) -> np.ndarray:
            sizes.append(nbytes)
            return np.empty(nbytes, np.uint8)

        source.make_into(0, np.arange(self.batch_size, dtype=np.int64), True, measure)
        return -(-sizes[-1] // mmap.PAGESIZE) * mmap.PAGESIZE

    def _own_batches(self, worker: int) -> range:
        return range(worker, self.batches, WORKERS)

    def _work(self, worker: int, first_epoch: int, epochs: int) -> None:
        source = self._source()
        counters, per_batch, order, size = self.counters, self.per_batch, self.order, self.batch_size
        private = np.empty(self.slot_bytes, np.uint8) if self.destination == "private" else None
        bounded = self.hand_over == "each"

        def main_alive() -> bool:
            return os.getppid() == self.parent

        for epoch in range(first_epoch, first_epoch + epochs):
            counters.wait_above(2 * WORKERS, epoch, main_alive)  # its order is published
            source.start_epoch(epoch)
            made_before = epoch * len(self._own_batches(worker))
            for j, batch_no in enumerate(self._own_batches(worker), start=made_before):
                if bounded:
                    per_batch.wait_above(WORKERS + worker, j - self.prefetch, main_alive)
                out = private if private is not None else \
                    self.slots[worker * self.slots_per_worker + j % self.slots_per_worker]
                source.make_into(batch_no, order[batch_no * size:(batch_no + 1) * size], True,
                                 lambda nbytes, out=out: out)
                per_batch.bump(worker)

    def start_workers(self, epochs: int) -> None:
        if self.signal == "pipes":
            # At an epoch's start every batch made so far has been taken.
            made = [self.epochs_begun * len(self._own_batches(w)) for w in range(WORKERS)]
            if isinstance(self.per_batch, PipeCounters):
                self.per_batch.close()
            self.per_batch = PipeCounters(made + made)  # made[w], then taken[w]
        for worker in range(WORKERS):
            pid = os.fork()
            if pid == 0:  # pragma: no cover - the child
                code = 0
                try:
                    self._work(worker, self.epochs_begun, epochs)
                except BaseException:
                    traceback.print_exc()  # the main process only sees the worker gone
                    code = 1
                finally:
                    os._exit(code)
            self.pids.append(pid)

    def _workers_alive(self) -> bool:
        return all(os.waitpid(pid, os.WNOHANG) == (0, 0) for pid in self.pids)

    def epoch(self) -> int:
        """One epoch; returns its samples."""
        epoch = self.epochs_begun
        self.order[:] = self.rng.permutation(len(self.order))
        if not self.persistent:
            # Last epoch's workers exit in the background, as fastload's and
            # torch's do: reap the ones that have, start new ones.
            self.exiting = [pid for pid in self.exiting if os.waitpid(pid, os.WNOHANG)[0] == 0]
            self.start_workers(1)
        self.counters.bump(2 * WORKERS)
        size, samples = self.batch_size, 0
        if self.hand_over == "epoch-end":
            for worker in range(WORKERS):
                made = (epoch + 1) * len(self._own_batches(worker))
                self.per_batch.wait_above(worker, made - 1, self._workers_alive)
            samples = self.batches * size
        else:
            for batch_no in range(self.batches):
                worker = batch_no % WORKERS
                j = epoch * len(self._own_batches(worker)) + batch_no // WORKERS
                self.per_batch.wait_above(worker, j, self._workers_alive)
                slot = self.slots[worker * self.slots_per_worker + j % self.slots_per_worker]
                samples += len(slot[:size])  # the caller's view
                self.per_batch.bump(WORKERS + worker)
        self.epochs_begun += 1
        self.epoch_pids = list(self.pids)  # this epoch's workers
        if not self.persistent:
            self.exiting += self.pids
            self.pids = []
        return samples

    def close(self) -> None:
        if isinstance(self.per_batch, PipeCounters):
            self.per_batch.close()
            self.per_batch = self.counters
        for pid in self.pids:
            try:
                os.kill(pid, 9)
            except ProcessLookupError:
                pass
        for pid in self.pids + self.exiting:
            os.waitpid(pid, 0)
        self.pids, self.exiting = [], []


def side_by_side(pipeline: Callable[[], int]) -> float:
    """Two forked processes, released together, each running one epoch of the
    batch code: the samples of both over the span from the first start to
    the last end (forks and exits left out, as the loaders' persistent
    workers have them done before the clock starts)."""
    read_end, write_end = os.pipe()
    go_read, go_write = os.pipe()
    pids = []
    for _ in range(WORKERS):
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child
            code = 0
            try:
                os.close(read_end)
                os.close(go_write)
                os.read(go_read, 1)
                start = time.perf_counter()  # CLOCK_MONOTONIC: one clock for all processes
                samples = pipeline()
                os.write(write_end, f"{samples} {start} {time.perf_counter()}\n".encode())
            except BaseException:
                code = 1
            finally:
                os._exit(code)
        pids.append(pid)
    os.close(write_end)
    os.close(go_read)
    os.write(go_write, b"g" * WORKERS)
    os.close(go_write)
    with os.fdopen(read_end) as results:
        reports = [[float(field) for field in line.split()] for line in results]
    for pid in pids:
        os.waitpid(pid, 0)
    if len(reports) != WORKERS:
        raise RuntimeError("a side-by-side process failed")
    span = max(end for _, _, end in reports) - min(start for _, start, _ in reports)
    return sum(samples for samples, _, _ in reports) / span


def measure(name: str, workers: str, rounds: int, epochs: int, variant: dict) -> dict:
    workload = build_workload(name, "fastload", None)
    pipeline = pipeline_epoch(workload)
    pipeline(3)  # warm-up
    persistent = workers.endswith("p")
    stripped = StrippedLoader(workload, persistent, **variant)
    loader = make_loader("fastload", workload, workers)
    try:
        if persistent:
            stripped.start_workers(1 + rounds * epochs)

        def timed(epoch: Callable[[], int]) -> float:
            start = time.perf_counter()
            samples = epoch()
            return samples / (time.perf_counter() - start)

        def fastload_epoch() -> int:
            return sum(batch_length(batch) for batch in loader)

        kinds: dict[str, Callable[[], float]] = {
            "pipeline": lambda: timed(pipeline),
            "side_by_side": lambda: side_by_side(pipeline),
            "stripped": lambda: timed(stripped.epoch),
            "fastload": lambda: timed(fastload_epoch),
        }
        stripped.epoch()  # its first epoch (and fastload's) is not counted
        fastload_epoch()
        rates: dict[str, list[float]] = {kind: [] for kind in kinds}
        order = list(kinds)
        for round_no in range(rounds):
            shift = round_no % len(order)
            for kind in order[shift:] + order[:shift]:
                rates[kind] += [kinds[kind]() for _ in range(epochs)]
    finally:
        stripped.close()  # fastload's workers go with ``loader``, on return
    medians = {kind: statistics.median(values) for kind, values in rates.items()}
    limit = WORKERS * medians["pipeline"]
    return {"workload": name, "workers": workers, "limit": limit, **medians,
            "rounds": rounds, "epochs": epochs}


def table(results: list[dict]) -> str:
    lines = ["| workload | workers | limit (samples/s) | side by side / limit | stripped loader / limit "
             "| fastload / limit | fastload / stripped loader |",
             "|---|---|---:|---:|---:|---:|---:|"]
    for r in results:
        limit = r["limit"]
        lines.append(f"| {r['workload']} | {r['workers']} | {limit:,.0f} | "
                     f"{r['side_by_side'] / limit:.0%} | {r['stripped'] / limit:.0%} | "
                     f"{r['fastload'] / limit:.0%} | {r['fastload'] / r['stripped']:.0%} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workloads", nargs="+", default=["tiny", "dict"],
                        choices=["tiny", "array", "dict"])
    parser.add_argument("--workers", nargs="+", default=["2p", "2"], choices=["2", "2p"],
                        help="2: new workers every epoch; 2p: persistent workers")
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--epochs", type=int, default=2, help="epochs of each kind per round")
    parser.add_argument("--prefetch", type=int, default=PREFETCH,
                        help="batches the stripped loader's workers may make ahead")
    parser.add_argument("--hand-over", choices=["each", "epoch-end"], default="each",
                        help="epoch-end: the stripped loader's main process takes nothing "
                             "until the epoch's end")
    parser.add_argument("--destination", choices=["slots", "private"], default="slots",
                        help="private: the stripped loader's workers reuse one private buffer")
    parser.add_argument("--signal", choices=["futex", "pipes"], default="futex",
                        help="pipes: the stripped loader's per-batch signals go through "
                             "pipes, read with poll, as fastload's messages do")
    parser.add_argument("--no-write", action="store_true", help="print only; leave RESULTS.md")
    options = parser.parse_args(argv)
    variant = {"prefetch": options.prefetch, "hand_over": options.hand_over,
               "destination": options.destination, "signal": options.signal}
    results = []
    for name in options.workloads:
        for workers in options.workers:
            results.append(measure(name, workers, options.rounds, options.epochs, variant))
            print(table(results[-1:]).splitlines()[-1], flush=True)
    signals = {"futex": "futexes in shared memory", "pipes": "pipes"}
    command = "python bench/loader_ceiling.py " + " ".join(argv if argv is not None else sys.argv[1:])
    text = (f"## How close a loader can come\n\n`{command.strip()}`: in one process, "
            f"{options.rounds} rotated rounds of {options.epochs} epochs of each kind (pipeline, "
            f"side by side, stripped loader, fastload; then side by side, stripped loader, "
            f"fastload, pipeline; ...), medians of the epochs' samples/s.  *limit* = twice the "
            f"pipeline's one-process rate, as in *Loader*; *side by side* = two forked processes "
            f"running the pipeline at once, their samples over the span from the first start to "
            f"the last end; *stripped loader* = torch's batch assignment and "
            f"prefetch bound over {signals[options.signal]}, nothing else (see the script's "
            f"docstring); *fastload* = `fastload.DataLoader`, two workers.\n\n"
            + table(results) + "\n")
    print("\n" + text)
    if not options.no_write:
        write_section("loader_ceiling", text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
