"""Instructions per batch: the pipeline alone, a worker, and the main process.

The *limit* of ``bench_loader.py`` (two workers' worth of the single-process
pipeline rate) assumes two things: that a worker runs no more instructions
per batch than the pipeline does alone, and that two processes on two CPUs
run as fast as one.  Timings mix both, and this machine's speed drifts by
a factor of three between phases; callgrind's instruction counts are
exact and repeat to the instruction (whatever else the machine is doing),
so they measure the first assumption alone.

For one workload of ``bench_loader.py``, under ``valgrind --tool=callgrind``:

* the pipeline alone (``bench_loader.pipeline_rate``'s loop: fetch and
  collate, or the ArrayDataset gather, in one process);
* a loader with two persistent workers, counted per process (each worker's
  whole loop: reading tasks, the batch, answering; the main process's
  receiving, leasing, views and next task).

Each is run twice, with a warm-up epoch and then 0 or ``--epochs`` more;
the difference over the extra epochs' batches is the steady state, with
start-up and one-time costs cancelled out.  *bound* = pipeline / (worker +
main): the share of the limit a loader could reach if instructions were
all that mattered (each batch costs the worker that makes it and the main
process; two workers split the batches).

    python bench/instruction_budget.py --workloads tiny dict array --epochs 2
"""

from __future__ import annotations

import argparse
import glob
import os
import shutil
import subprocess
import sys
import tempfile

from bench_loader import build_workload, make_loader, pipeline_epoch
from results import write_section

_COMMAND = "python bench/instruction_budget.py"


def _loader_epochs(name: str, epochs: int) -> None:
    loader = make_loader("fastload", build_workload(name, "fastload", None), "2p")
    for _ in range(1 + epochs):
        for _batch in loader:
            pass


def _pipeline_epochs(name: str, epochs: int) -> None:
    epoch = pipeline_epoch(build_workload(name, "fastload", None))
    for _ in range(1 + epochs):
        epoch()


def _counts(mode: str, name: str, epochs: int) -> tuple[int, list[int]]:
    """Instructions of the process run (the main one) and of each process it forked."""
    with tempfile.TemporaryDirectory() as folder:
        command = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={folder}/out.%p",
                   sys.executable, os.path.abspath(__file__), "--child", mode, name, str(epochs)]
        # A fixed hash seed: string hashes change how dicts probe, which moves
        # the counts by a few per cent from run to run.  One OpenBLAS thread:
        # natively, OpenBLAS stops its thread pool when a process forks, so the
        # main process has no BLAS thread once its first workers started;
        # under valgrind that thread kept running, and its instructions
        # counted in the main process's total (11,000 a batch in a `tiny` run).
        env = {**os.environ, "PYTHONHASHSEED": "0", "OPENBLAS_NUM_THREADS": "1"}
        child = subprocess.run(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                               text=True, env=env)
        if child.returncode != 0:
            raise RuntimeError(f"{mode} {name} under callgrind failed:\n{child.stderr[-2000:]}")
        main, forked = 0, []
        for path in glob.glob(f"{folder}/out.*"):
            pid, total = _pid_and_total(path)
            if pid == _launched_pid(child.stderr):
                main = total
            else:
                forked.append(total)
    return main, forked


def _pid_and_total(path: str) -> tuple[int, int]:
    pid = total = None
    with open(path) as handle:
        for line in handle:
            if line.startswith("pid:"):
                pid = int(line.split()[1])
            elif line.startswith("totals:"):
                total = int(line.split()[1])
    if pid is None or total is None:
        raise RuntimeError(f"{path}: no pid or totals line")
    return pid, total


def _launched_pid(valgrind_log: str) -> int:
    """The first pid valgrind names (``==PID==``) is the process it launched."""
    for line in valgrind_log.splitlines():
        if line.startswith("==") and "==" in line[2:]:
            return int(line[2:line.index("==", 2)])
    raise RuntimeError("valgrind named no process")


def measure(name: str, epochs: int) -> dict:
    workload = build_workload(name, "fastload", None)
    # The pipeline's loop leaves the last, partial batch out; the loader's
    # epoch ends with it (drop_last=False).
    pipeline_batches = epochs * (workload.samples // workload.batch_size)
    batches = epochs * -(-workload.samples // workload.batch_size)
    pipe_base, _ = _counts("pipeline", name, 0)
    pipe_more, _ = _counts("pipeline", name, epochs)
    main_base, workers_base = _counts("loader", name, 0)
    main_more, workers_more = _counts("loader", name, epochs)
    if len(workers_base) != 2 or len(workers_more) != 2:
        raise RuntimeError(f"expected two workers, found {len(workers_base)} and {len(workers_more)}")
    # Each worker makes half of the batches; its count before it forked is
    # the same in both runs and cancels out.
    worker = (sum(workers_more) - sum(workers_base)) / batches
    result = {"workload": name, "batch_size": workload.batch_size, "batches": batches,
              "pipeline": (pipe_more - pipe_base) / pipeline_batches, "worker": worker,
              "main": (main_more - main_base) / batches}
    result["bound"] = result["pipeline"] / (result["worker"] + result["main"])
    return result


def table(results: list[dict]) -> str:
    lines = ["| workload | batch | pipeline alone | a worker | main process | worker + main | bound |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for r in results:
        lines.append(f"| {r['workload']} | {r['batch_size']} | {r['pipeline']:,.0f} | "
                     f"{r['worker']:,.0f} | {r['main']:,.0f} | {r['worker'] + r['main']:,.0f} | "
                     f"{r['bound']:.0%} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workloads", nargs="+", default=["tiny", "dict", "array"],
                        choices=["tiny", "array", "dict"])
    parser.add_argument("--epochs", type=int, default=2, help="steady-state epochs counted")
    parser.add_argument("--no-write", action="store_true", help="print only; leave RESULTS.md")
    parser.add_argument("--child", nargs=3, metavar=("MODE", "WORKLOAD", "EPOCHS"),
                        help=argparse.SUPPRESS)
    options = parser.parse_args(argv)
    if options.child:
        mode, name, epochs = options.child
        (_loader_epochs if mode == "loader" else _pipeline_epochs)(name, int(epochs))
        return 0
    if shutil.which("valgrind") is None:
        parser.error("valgrind is not installed (Debian: apt-get install valgrind)")
    results = []
    for name in options.workloads:
        results.append(measure(name, options.epochs))
        print(table(results[-1:]).splitlines()[-1], flush=True)
    command = f"{_COMMAND} " + " ".join(argv if argv is not None else sys.argv[1:])
    text = (f"## Instructions per batch\n\n`{command.strip()}`: instructions per batch "
            f"counted by callgrind over {options.epochs} steady-state epochs, two persistent "
            f"workers (see the script's docstring). *bound* = pipeline alone / (a worker + the "
            f"main process). User-space instructions only: system calls, page faults and "
            f"context switches run in the kernel, which callgrind does not count. The loader's "
            f"counts depend a little on timing (how often a wait finds its message already "
            f"there), so runs differ by up to about a tenth.\n\n" + table(results) + "\n")
    print("\n" + text)
    if not options.no_write:
        write_section("instruction_budget", text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
