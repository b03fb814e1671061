"""Where a fastload epoch's time goes, with and without persistent workers.

For one workload of ``bench_loader.py`` and two workers, runs a few epochs
and prints, per epoch (median over the epochs after the first):

* wall time, and the time from ``iter(loader)`` to the first batch;
* CPU time of the main process, and of each worker (from /proc, so the
  workers' start-up and exit are counted when they are new every epoch);
* minor page faults of the main process;
* CPU time the whole machine left idle during an epoch (from /proc/stat, in
  10 ms ticks, so the mean over the epochs, not their median): with two
  workers and the main process on two CPUs, time a CPU waited with nothing
  to run (run nothing else meanwhile).

The difference between the two modes is what starting and stopping two
worker processes costs per epoch.  Diagnostic only: the comparison with torch
lives in ``bench_loader.py``.  ``--workers 2`` runs one mode alone, e.g. under
``perf record -a -g`` to see where the kernel's share of new workers goes.
``--busy-us N`` makes the main process spend N microseconds of CPU on each
batch it gets, as a caller's step would: how the epoch grows with N is what
each microsecond of the main process's own per-batch work costs.
``--loader stripped`` measures ``loader_ceiling.py``'s stripped loader
instead (the same batch code, and none of fastload's per-batch work): the
difference between the two is what fastload's own work costs each process.

    python bench/epoch_costs.py --workload dict --epochs 12
    python bench/epoch_costs.py --workload dict --epochs 12 --loader stripped
    perf record -a -g -- python bench/epoch_costs.py --workload tiny --workers 2 --epochs 150
    python bench/epoch_costs.py --workload tiny --workers 2p --epochs 15 --busy-us 50
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import time
from typing import Callable, Iterator

import fastload as fl
from bench_loader import Workload, build_workload

def _cpu_seconds(pid: int) -> float:
    """CPU time of ``pid`` so far, in ns resolution (/proc/PID/schedstat; a zombie's too)."""
    try:
        with open(f"/proc/{pid}/schedstat") as handle:
            return int(handle.read().split()[0]) / 1e9
    except (OSError, ValueError, IndexError):
        return 0.0


def _idle_seconds() -> float:
    """CPU time all CPUs have spent idle (or waiting for I/O) since boot."""
    with open("/proc/stat") as handle:
        fields = handle.readline().split()[1:]
    return (int(fields[3]) + int(fields[4])) / os.sysconf("SC_CLK_TCK")


def _busy(seconds: float) -> None:
    """Spend ``seconds`` of CPU in this process, as a caller's step per batch would."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def _fastload_epochs(workload: Workload, persistent: bool,
                     busy_per_batch: float) -> Iterator[tuple[Callable[[], list[int]], float]]:
    """Per epoch, once its batches are all taken: its workers' pids, and
    when its first batch came (``time.perf_counter``)."""
    loader = fl.DataLoader(workload.make_fastload(), batch_size=workload.batch_size, shuffle=True,
                           num_workers=2, generator=0, persistent_workers=persistent)
    while True:
        iterator = iter(loader)
        first = None
        for _ in iterator:
            if first is None:
                first = time.perf_counter()
            if busy_per_batch:
                _busy(busy_per_batch)
        yield (lambda pids=iterator.worker_pids: pids), first


def _stripped_epochs(workload: Workload, persistent: bool,
                     busy_per_batch: float) -> Iterator[tuple[Callable[[], list[int]], float]]:
    """As ``_fastload_epochs``, for ``loader_ceiling.py``'s stripped loader
    (which has no first batch to time, and no caller's step per batch)."""
    from loader_ceiling import StrippedLoader

    if busy_per_batch:
        raise SystemExit("--busy-us is for fastload's loader only")
    stripped = StrippedLoader(workload, persistent)
    try:
        if persistent:
            stripped.start_workers(1_000_000)  # they run until closed
        while True:
            stripped.epoch()
            yield (lambda pids=list(stripped.epoch_pids): pids), float("nan")
    finally:
        stripped.close()


def run(workload_name: str, persistent: bool, epochs: int, busy_per_batch: float = 0.0,
        loader: str = "fastload") -> dict:
    workload = build_workload(workload_name, "fastload", None)
    make_epochs = _fastload_epochs if loader == "fastload" else _stripped_epochs
    epochs_run = make_epochs(workload, persistent, busy_per_batch)
    rows = []
    for _ in range(epochs):
        idle = _idle_seconds()
        usage = resource.getrusage(resource.RUSAGE_SELF)
        main_cpu, faults = usage.ru_utime + usage.ru_stime, usage.ru_minflt
        start = time.perf_counter()
        worker_pids, first_at = next(epochs_run)
        wall = time.perf_counter() - start
        first = first_at - start
        pids = worker_pids()
        idle = _idle_seconds() - idle  # in ticks of 10 ms: meaningful summed over epochs
        # New workers exit after the epoch: give them a moment, then read their
        # totals before they are reaped.  (Persistent ones: read the growth.)
        worker_cpu = [_cpu_seconds(pid) for pid in pids]
        if not persistent:
            time.sleep(0.05)
            worker_cpu = [_cpu_seconds(pid) for pid in pids]
        usage = resource.getrusage(resource.RUSAGE_SELF)
        rows.append({"wall": wall, "first": first,
                     "main_cpu": usage.ru_utime + usage.ru_stime - main_cpu,
                     "faults": usage.ru_minflt - faults, "worker_cpu": worker_cpu, "idle": idle})
    if persistent:  # cumulative per worker: turn into per-epoch growth
        totals = [row["worker_cpu"] for row in rows]
        for i in range(len(rows) - 1, 0, -1):
            rows[i]["worker_cpu"] = [a - b for a, b in zip(totals[i], totals[i - 1])]
    epochs_run.close()
    later = rows[1:]
    return {
        "wall_ms": 1e3 * statistics.median(r["wall"] for r in later),
        "first_ms": 1e3 * statistics.median(r["first"] for r in later),
        "main_cpu_ms": 1e3 * statistics.median(r["main_cpu"] for r in later),
        "worker_cpu_ms": 1e3 * statistics.median(sum(r["worker_cpu"]) for r in later),
        "main_faults": statistics.median(r["faults"] for r in later),
        "idle_ms": 1e3 * statistics.fmean(r["idle"] for r in later),
        "samples": workload.samples,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workload", default="dict", choices=["tiny", "array", "dict"])
    parser.add_argument("--epochs", type=int, default=12)
    parser.add_argument("--busy-us", type=float, default=0.0,
                        help="CPU the main process spends on each batch it gets (a busy loop), "
                             "to see what the main process's time per batch costs an epoch")
    parser.add_argument("--workers", nargs="+", default=["2", "2p"], choices=["2", "2p"],
                        help="2: new workers every epoch; 2p: persistent workers")
    parser.add_argument("--loader", choices=["fastload", "stripped"], default="fastload",
                        help="stripped: loader_ceiling.py's stripped loader instead, to see "
                             "where fastload spends more")
    options = parser.parse_args()
    print(f"{options.workload}, {options.loader}, 2 workers, "
          f"median of epochs 2..{options.epochs} (idle CPU: mean)")
    print("| workers | epoch (ms) | first batch (ms) | main CPU (ms) | workers' CPU (ms) "
          "| main page faults | idle CPU (ms) | samples/s |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for workers in options.workers:
        r = run(options.workload, workers == "2p", options.epochs, options.busy_us * 1e-6,
                options.loader)
        first = "–" if r["first_ms"] != r["first_ms"] else f"{r['first_ms']:.1f}"  # NaN: not timed
        print(f"| {workers} | {r['wall_ms']:.1f} | {first} | "
              f"{r['main_cpu_ms']:.1f} | {r['worker_cpu_ms']:.1f} | {r['main_faults']:.0f} | "
              f"{r['idle_ms']:.1f} | "
              f"{r['samples'] / r['wall_ms'] * 1e3:,.0f} |")


if __name__ == "__main__":
    main()
