"""What keeping ``loader.report()``'s account costs per batch: this tree against one without it.

Every loader keeps the account (it cannot be turned off), so its cost is
measured as the difference between this checkout and ``--before`` (a
revision without it; default: where this branch left ``main``), on the cheapest batch there is: an
``ArrayDataset`` of 8 x 4 float32 rows, gathered by one kernel call, where
a fixed per-batch cost shows the most.  Each side runs in a fresh child
process importing that tree's fastload, in alternating rounds; a child
times ``--epochs`` epochs of a persistent loader (worker start-up excluded)
and reports the median seconds per batch over the epochs after the first.
The before tree is the revision's files (``git archive``) with this tree's
compiled extension copied in, which is refused when the extension's sources
differ between the two.  Before those rounds, the account's own steps are
timed in one process (``micro``): a figure the machine's load hardly moves.

    python bench/bench_report_cost.py --rounds 5                 # 0 and 2 workers
    python bench/bench_report_cost.py --before 708cb0f --workers 2
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_EXTENSION_SOURCES = ["fastload/_core.pyx", "fastload/_core.pyi", "fastload/_kernels"]


def before_tree(revision: str, root: str) -> str:
    """``revision``'s files under ``root``, with this tree's compiled extension."""
    same = subprocess.run(["git", "-C", HERE, "diff", "--quiet", revision, "--",
                           *_EXTENSION_SOURCES])
    if same.returncode != 0:
        raise SystemExit(f"the extension's sources differ between {revision} and this tree: "
                         f"build {revision} yourself and pass its directory as --before-dir")
    tree = os.path.join(root, "before")
    os.makedirs(tree)
    archive = subprocess.run(["git", "-C", HERE, "archive", revision], check=True,
                             capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", tree], input=archive, check=True)
    for built in glob.glob(os.path.join(HERE, "fastload", "_core*.so")):
        shutil.copy(built, os.path.join(tree, "fastload"))
    return tree


def micro(repeats: int = 200_000) -> dict[str, float]:
    """The account's own steps, timed in this process (microseconds per batch): the
    main process's ``next()`` bookkeeping around a batch that is ready at once, and
    a worker's (stage totals added, sampled, carried by and unpickled from its answer)."""
    import pickle

    sys.path.insert(0, HERE)  # this tree's fastload (a child imports its own tree's)
    from fastload._loading.iterators import _BaseIter
    from fastload._loading.stage_clock import StageTotals
    from fastload._loading.time_ledger import TimeLedger
    from fastload._loading.wire.messages import batch_reply, with_times

    class Ready(_BaseIter):
        def __init__(self) -> None:  # only what __next__'s bookkeeping reads
            self._ledger = TimeLedger()
            self._handed_at, self._first_batch = None, False

        def _next_batch(self) -> int:
            return 1

    ready = Ready()
    start = time.perf_counter()
    for _ in range(repeats):
        ready._next_batch()
    bare = time.perf_counter() - start
    start = time.perf_counter()
    for _ in range(repeats):
        next(ready)
    main_us = 1e6 * (time.perf_counter() - start - bare) / repeats

    totals, reply = StageTotals(), batch_reply(7, 3, None, (1, ()))
    start = time.perf_counter()
    for _ in range(repeats):
        pickle.loads(pickle.dumps(reply, protocol=pickle.HIGHEST_PROTOCOL))
    bare = time.perf_counter() - start
    start = time.perf_counter()
    for _ in range(repeats):
        now = time.perf_counter()
        totals.sample_cpu(now)
        totals.made(now - 0.5, 0.0, 0.0, time.perf_counter() - now)
        sent = pickle.dumps(with_times(reply, totals.packed()), protocol=pickle.HIGHEST_PROTOCOL)
        pickle.loads(sent)
    worker_us = 1e6 * (time.perf_counter() - start - bare) / repeats
    return {"main_us": main_us, "worker_us": worker_us}


def child(workers: int, epochs: int, rows: int, batch_size: int) -> None:
    """One side's figure: median seconds per batch over the epochs after the first."""
    import numpy as np

    import fastload as fl

    data = fl.ArrayDataset(np.zeros((rows, 4), dtype=np.float32))
    options = dict(num_workers=workers, persistent_workers=True) if workers else {}
    loader = fl.DataLoader(data, batch_size=batch_size, **options)
    per_batch = []
    for _ in range(epochs):
        count = 0
        start = time.perf_counter()
        for _batch in loader:
            count += 1
        per_batch.append((time.perf_counter() - start) / count)
    print(json.dumps({"seconds_per_batch": statistics.median(per_batch[1:])}))


def run_child(tree: str, workers: int, args: argparse.Namespace) -> float:
    env = {**os.environ, "PYTHONPATH": tree}
    command = [sys.executable, os.path.abspath(__file__), "--child", str(workers),
               "--epochs", str(args.epochs), "--rows", str(args.rows),
               "--batch-size", str(args.batch_size)]
    done = subprocess.run(command, cwd=tree, env=env, capture_output=True, text=True,
                          timeout=600)
    if done.returncode != 0:
        raise RuntimeError(f"the child in {tree} failed:\n{done.stderr}")
    return json.loads(done.stdout.strip().splitlines()[-1])["seconds_per_batch"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", default=None,
                        help="a revision without the account (default: where this branch "
                             "left main, git merge-base main HEAD)")
    parser.add_argument("--before-dir", default=None, help="a built tree of it, instead")
    parser.add_argument("--workers", type=int, nargs="+", default=[0, 2])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--rows", type=int, default=8192)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--child", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        child(args.child, args.epochs, args.rows, args.batch_size)
        return
    if args.before is None and args.before_dir is None:
        args.before = subprocess.run(["git", "-C", HERE, "merge-base", "main", "HEAD"], check=True,
                                     capture_output=True, text=True).stdout.strip()[:12]
    with tempfile.TemporaryDirectory(prefix="fastload-report-cost-") as root:
        before = args.before_dir or before_tree(args.before, root)
        print(f"loader.report()'s account: this tree vs {args.before_dir or args.before}; "
              f"ArrayDataset batches of {args.batch_size} x 4 float32, {args.rows // args.batch_size} "
              f"a epoch, {args.epochs} epochs per child, {args.rounds} rounds; load average "
              f"{os.getloadavg()[0]:.1f}")
        steps = micro()
        print(f"  the account's own steps, in one process: {steps['main_us']:.2f} us per batch "
              f"in the main process's next(), {steps['worker_us']:.2f} us in a worker and on "
              f"the wire (its totals added, carried by its answer, unpickled)")
        for workers in args.workers:
            sides = {"before": [], "after": []}
            for round_no in range(args.rounds):
                order = [("before", before), ("after", HERE)]
                for name, tree in (order if round_no % 2 == 0 else order[::-1]):
                    sides[name].append(run_child(tree, workers, args))
            before_us = 1e6 * statistics.median(sides["before"])
            after_us = 1e6 * statistics.median(sides["after"])
            paired = [1e6 * (a - b) for a, b in zip(sides["after"], sides["before"])]
            print(f"  {workers} workers: {before_us:.1f} -> {after_us:.1f} us per batch; the "
                  f"account costs {statistics.median(paired):+.1f} us per batch (median of paired "
                  f"rounds; rounds {', '.join(f'{d:+.1f}' for d in paired)})")


if __name__ == "__main__":
    main()
