"""What ``num_workers="auto"`` itself costs: CPU per batch against the fixed count it chose.

When the consumer is the bottleneck (a slow step), auto should spend no more
CPU than the fixed setting it settles on.  This runs one of
``bench_autopilot.py``'s pipelines at a consumer step (50 ms by default) with
a fixed ``--workers`` and with auto, alternating, and reads the CPU time of
the main process and of each worker (their CPU-time clocks, nanoseconds)
over the same batches of every run: after ``--warm-seconds`` of running, for
``--seconds``.  Auto's workers must be the fixed count's (it prints the count
it chose); a run whose epoch ends inside the measured seconds is flagged, as
its workers restart there.

    python bench/bench_auto_overhead.py --pipeline mnist --rounds 6
    python bench/bench_auto_overhead.py --pipeline cifar --rounds 6
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import fastload as fl  # noqa: E402
from bench_autopilot import endless, pipeline, process_cpu  # noqa: E402


def run(spec: dict, workers: Any, args: argparse.Namespace) -> dict:
    """One run: CPU milliseconds per batch of the main process and of the workers."""
    options = dict(spec["loader"])
    options.update(batch_size=spec["batch"], shuffle=True, num_workers=workers)
    loader = fl.DataLoader(spec["dataset"], generator=0, **options)
    batches = endless(loader)
    step = args.step_ms / 1000
    start = time.monotonic()
    next(batches)
    while time.monotonic() - start < args.warm_seconds:
        next(batches)
        time.sleep(step)
    iterator = loader._last_iterator()
    pids = [process.pid for process in iterator._pool.processes]
    main_before = process_cpu(os.getpid())
    workers_before = {pid: process_cpu(pid) for pid in pids}
    made, begun = 0, time.monotonic()
    while time.monotonic() - begun < args.seconds:
        next(batches)
        made += 1
        time.sleep(step)
    main_after = process_cpu(os.getpid())
    workers_after = {pid: process_cpu(pid) for pid in pids}
    restarted = loader._last_iterator() is not iterator
    chosen = loader._auto_choice.get("num_workers") if workers == "auto" else workers
    batches.close()
    worker_cpu = sum(workers_after[pid] - workers_before[pid] for pid in pids
                     if workers_before[pid] is not None and workers_after[pid] is not None)
    return {"workers": chosen, "main_ms": 1e3 * (main_after - main_before) / made,
            "workers_ms": 1e3 * worker_cpu / made, "epoch_ended": restarted}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pipeline", default="mnist")
    parser.add_argument("--workers", type=int, default=1, help="the fixed count to compare with")
    parser.add_argument("--step-ms", type=float, default=50.0)
    parser.add_argument("--warm-seconds", type=float, default=3.0)
    parser.add_argument("--seconds", type=float, default=6.0)
    parser.add_argument("--rounds", type=int, default=6)
    args = parser.parse_args()
    runs: dict[Any, list[dict]] = {args.workers: [], "auto": []}
    with tempfile.TemporaryDirectory(prefix="fastload-overhead-") as scratch:
        spec = pipeline(args.pipeline, scratch)
        for round_no in range(args.rounds):
            order = [args.workers, "auto"] if round_no % 2 == 0 else ["auto", args.workers]
            for setting in order:
                result = run(spec, setting, args)
                runs[setting].append(result)
                print(f"  {str(setting):>4}: workers {result['workers']}, main "
                      f"{result['main_ms']:.3f} ms, workers {result['workers_ms']:.3f} ms per batch"
                      + ("  (an epoch ended in the measured seconds)" if result["epoch_ended"]
                         else ""), flush=True)
    medians = {setting: (statistics.median(r["main_ms"] for r in results),
                         statistics.median(r["workers_ms"] for r in results))
               for setting, results in runs.items()}
    fixed, auto = medians[args.workers], medians["auto"]
    print(f"{args.pipeline}, step {args.step_ms:g} ms, medians of {args.rounds} rounds, "
          f"CPU ms per batch: fixed {args.workers}: main {fixed[0]:.3f} + workers {fixed[1]:.3f}"
          f" = {sum(fixed):.3f}; auto: main {auto[0]:.3f} + workers {auto[1]:.3f} = "
          f"{sum(auto):.3f}; auto / fixed {sum(auto) / sum(fixed):.3f}")


if __name__ == "__main__":
    main()
