"""fastload before and after a change, each against torch, in alternating rounds.

A refactor must leave speed alone; this shows whether it did.  Each cell
(workload x workers of ``bench_loader.py``) runs torch, fastload at the
``--before`` revision and fastload at this checkout in rotated order
(T B A, B A T, A T B, ...), each a fresh child process of that tree's own
``bench/bench_loader.py`` (its ``--child`` mode: one loader, ``--epochs``
epochs, the median rate of the epochs after the first).  It prints, per cell,
the median fastload/torch ratio before and after and their quotient.

    python bench/before_after.py --before d8adc22 --workers 0 2 2p --rounds 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

from results import write_section

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def checkout(revision: str, root: str) -> str:
    """A built worktree of ``revision`` under ``root`` (the before side)."""
    tree = os.path.join(root, "before")
    subprocess.run(["git", "-C", HERE, "worktree", "add", "--detach", "-f", tree, revision],
                   check=True, capture_output=True)
    subprocess.run([sys.executable, "setup.py", "build_ext", "--inplace", "-q"], cwd=tree,
                   check=True, capture_output=True)
    return tree


def run_child(tree: str, workload: str, framework: str, workers: str, epochs: int) -> float:
    """Samples/s of one child of ``tree``'s bench_loader.py, fastload imported from ``tree``."""
    env = {**os.environ, "PYTHONPATH": tree}
    command = [sys.executable, os.path.join(tree, "bench", "bench_loader.py"), "--epochs",
               str(epochs), "--child", workload, framework, workers]
    done = subprocess.run(command, cwd=tree, env=env, input="go\n", capture_output=True,
                          text=True, timeout=1800)
    if done.returncode != 0:
        raise RuntimeError(f"{workload}/{framework}/{workers} in {tree} failed:\n{done.stderr}")
    return json.loads(done.stdout.strip().splitlines()[-1])["samples_per_s"]


def measure(before: str, workload: str, workers: str, rounds: int, epochs: int) -> dict:
    sides = [("torch", HERE, "torch"), ("before", before, "fastload"), ("after", HERE, "fastload")]
    rates: dict[str, list[float]] = {name: [] for name, _, _ in sides}
    for round_no in range(rounds):
        shift = round_no % len(sides)
        for name, tree, framework in sides[shift:] + sides[:shift]:
            rates[name].append(run_child(tree, workload, framework, workers, epochs))
    ratios = {side: [f / t for f, t in zip(rates[side], rates["torch"])]
              for side in ("before", "after")}
    return {"workload": workload, "workers": workers, "rates": rates, "ratios": ratios}


def _ratio(ratios: list[float]) -> str:
    return f"{statistics.median(ratios):.2f}x ({min(ratios):.2f}-{max(ratios):.2f})"


def table(results: list[dict]) -> str:
    lines = ["| workload | workers | torch samples/s | fastload/torch before (range) "
             "| after (range) | after / before |",
             "|---|---:|---:|---:|---:|---:|"]
    for r in results:
        before, after = (statistics.median(r["ratios"][side]) for side in ("before", "after"))
        lines.append(f"| {r['workload']} | {r['workers']} | {statistics.median(r['rates']['torch']):,.0f} "
                     f"| {_ratio(r['ratios']['before'])} | {_ratio(r['ratios']['after'])} "
                     f"| {after / before:.2f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", required=True, help="a git revision, or a built tree's path")
    parser.add_argument("--workloads", nargs="+", default=["tiny", "array", "dict", "images"])
    parser.add_argument("--workers", nargs="+", default=["0", "2", "2p"])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--no-write", action="store_true", help="print only; leave RESULTS.md")
    options = parser.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="fastload-before-") as root:
        before = options.before if os.path.isdir(options.before) else checkout(options.before, root)
        try:
            results = []
            for workload in options.workloads:
                for workers in options.workers:
                    results.append(measure(before, workload, workers, options.rounds,
                                           options.epochs))
                    print(table(results[-1:]).splitlines()[-1], flush=True)
        finally:
            if before.startswith(root):
                subprocess.run(["git", "-C", HERE, "worktree", "remove", "--force", before],
                               capture_output=True)
    command = "python bench/before_after.py " + " ".join(argv if argv is not None else sys.argv[1:])
    text = (f"## Before and after the house redesign\n\n`{command.strip()}`: fastload at "
            f"`{options.before}` and at this checkout, each against torch's DataLoader, in "
            f"rotated rounds of fresh child processes (`bench_loader.py --child`); medians of "
            f"{options.rounds} rounds of the per-round ratio. An after/before within the "
            f"rounds' spread is no change.\n\n" + table(results) + "\n")
    print("\n" + text)
    if not options.no_write:
        write_section("before_after", text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
