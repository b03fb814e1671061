"""fastload's kernels side by side with torch and numpy, in one process.

    python bench/bench_kernels.py            # print the table, update bench/RESULTS.md
    python bench/bench_kernels.py --no-write --repeats 3

Each benchmark is a function returning rows; ``main`` runs every function in
``BENCHMARKS``, so more (collation, gather) can be added the same way.  Each
candidate runs once to warm up, then ``repeats`` times in rotating order
(a different one goes first each round, so none always runs on a cold cache
or right after the biggest allocation); the median is reported.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from fastload import _core  # noqa: E402
from fastload.collate import collate_into, default_collate  # noqa: E402
from results import write_section  # noqa: E402

try:
    import torch
except ImportError:  # the table then has fastload and numpy only
    torch = None


@dataclass
class Row:
    task: str
    timings: dict[str, float]  # implementation -> median seconds

    def ratio_line(self) -> str:
        ours = self.timings["fastload"]
        others = {k: v for k, v in self.timings.items() if k != "fastload"}
        best = min(others, key=others.get)
        return f"{others[best] / ours:.2f}x vs {best}"


def measure(candidates: dict[str, Callable[[], object]], repeats: int,
            number: int = 1) -> dict[str, float]:
    """Median wall time of each candidate (per call, over ``number`` calls a run),
    runs rotated so the order varies."""
    names = list(candidates)
    for name in names:
        candidates[name]()
    times: dict[str, list[float]] = {name: [] for name in names}
    for round_no in range(repeats):
        k = round_no % len(names)
        for name in names[k:] + names[:k]:
            call = candidates[name]
            start = time.perf_counter()
            for _ in range(number):
                call()
            times[name].append((time.perf_counter() - start) / number)
    return {name: statistics.median(ts) for name, ts in times.items()}


def bench_permutation(repeats: int) -> list[Row]:
    rows = []
    gen = np.random.default_rng(0)
    for n in (10**7, 10**8):
        candidates = {"fastload": lambda n=n: _core.permutation(n, 12345),
                      "numpy": lambda n=n: gen.permutation(n)}
        if torch is not None:
            candidates["torch"] = lambda n=n: torch.randperm(n)
        rows.append(Row(f"permutation n=10^{len(str(n)) - 1}", measure(candidates, repeats)))
    return rows


def bench_randint(repeats: int) -> list[Row]:
    n, count = 10**6, 10**7
    gen = np.random.default_rng(0)
    candidates = {"fastload": lambda: _core.randint(n, count, 7),
                  "numpy": lambda: gen.integers(0, n, size=count)}
    if torch is not None:
        candidates["torch"] = lambda: torch.randint(n, (count,))
    return [Row("uniform ints 10^7 in [0, 10^6)", measure(candidates, repeats))]


def bench_weighted(repeats: int) -> list[Row]:
    weights = np.random.default_rng(1).random(10**6)
    p = weights / weights.sum()
    gen = np.random.default_rng(0)
    tw = torch.from_numpy(weights) if torch is not None else None
    rows = []

    # Table build included, as torch and numpy redo theirs on every call.
    candidates = {"fastload": lambda: _core.weighted_sample(weights, 10**7, True, 3),
                  "numpy": lambda: gen.choice(weights.size, size=10**7, replace=True, p=p)}
    if torch is not None:
        candidates["torch"] = lambda: torch.multinomial(tw, 10**7, replacement=True)
    rows.append(Row("weighted 10^7 of 10^6, replacement", measure(candidates, repeats)))

    candidates = {"fastload": lambda: _core.weighted_sample(weights, 10**5, False, 3),
                  "numpy": lambda: gen.choice(weights.size, size=10**5, replace=False, p=p)}
    if torch is not None:
        candidates["torch"] = lambda: torch.multinomial(tw, 10**5, replacement=False)
    rows.append(Row("weighted 10^5 of 10^6, no replacement", measure(candidates, repeats)))
    return rows


def bench_collation(repeats: int) -> list[Row]:
    """256 samples into one batch: fastload, torch, np.stack; memcpy of the same bytes.

    Two fastload rows: ``default_collate`` (a fresh buffer, as the public
    function returns) and ``collate_into`` a reused buffer (what a worker does
    with its ring slot).  ``memcpy`` copies the batch's bytes from one
    contiguous array into a reused one: the bandwidth limit.
    """
    rows = []
    for shape in ((3, 32, 32), (3, 224, 224)):
        rng = np.random.default_rng(0)
        samples = [rng.integers(0, 256, shape, dtype=np.uint8) for _ in range(256)]
        nbytes = 256 * samples[0].nbytes
        slot = np.empty(nbytes + 64, dtype=np.uint8)
        flat_source = np.concatenate([s.ravel() for s in samples])
        flat_target = np.empty_like(flat_source)
        candidates = {
            "fastload": lambda s=samples: default_collate(s),
            "fastload, reused slot": lambda s=samples, b=slot: collate_into(s, lambda n: b),
            "numpy": lambda s=samples: np.stack(s),
            "memcpy": lambda a=flat_source, b=flat_target: np.copyto(b, a),
        }
        if torch is not None:
            tensors = [torch.from_numpy(s) for s in samples]
            from torch.utils.data import default_collate as torch_collate
            candidates["torch"] = lambda t=tensors: torch_collate(t)
            candidates["torch, numpy samples"] = lambda s=samples: torch_collate(s)
        # Small batches take tens of microseconds: time 200 calls per run.
        number = 200 if nbytes < 2**22 else 1
        rows.append(Row(f"collate 256 x {shape} uint8 ({nbytes / 2**20:.1f} MiB)",
                        measure(candidates, repeats, number)))
    return rows


def format_collation(rows: list[Row]) -> str:
    impls = ["fastload", "fastload, reused slot", "torch", "torch, numpy samples", "numpy", "memcpy"]
    lines = ["| task | " + " | ".join(f"{i} (ms)" for i in impls)
             + " | fastload vs torch | reused slot, % of memcpy bandwidth |",
             "|---|" + "---:|" * (len(impls) + 2)]
    for row in rows:
        t = row.timings
        cells = [f"{t[i] * 1e3:.3f}" if i in t else "n/a" for i in impls]
        versus = (f"{t['torch'] / t['fastload']:.1f}x (numpy samples: "
                  f"{t['torch, numpy samples'] / t['fastload']:.1f}x)") if "torch" in t else "n/a"
        lines.append(f"| {row.task} | " + " | ".join(cells)
                     + f" | {versus} | {t['memcpy'] / t['fastload, reused slot']:.0%} |")
    return "\n".join(lines)


NOTES = """\
Why: `torch.randperm` and numpy's `permutation` are plain Fisher-Yates, one
cache/TLB miss per swap once the array outgrows the caches; fastload's
bucketed shuffle (see `_random.pxi`) scatters into L2-sized buckets and
shuffles each in cache, still exactly uniform.  With-replacement weighted
draws use an alias table (O(1) per draw, rows prefetched in blocks of 64)
where torch and numpy binary-search a cumulative sum per draw.  All
fastload kernels are single-threaded; torch may use its intra-op threads."""


COLLATION_NOTES = """\
*fastload* is the public `default_collate` (it returns a fresh buffer, so
its first touch of the pages is part of the time, as it is for torch and
`np.stack`); *reused slot* is the same kernel writing into a buffer that is
reused, which is what a worker does with its ring slot, and is the figure to
hold against *memcpy* (the same bytes copied between two reused contiguous
arrays).  *torch* collates tensor samples (`torch.stack`), *torch, numpy
samples* the numpy arrays a numpy dataset returns."""


BENCHMARKS: list[Callable[[int], list[Row]]] = [bench_permutation, bench_randint, bench_weighted]


def format_table(rows: list[Row]) -> str:
    impls = ["fastload", "numpy", "torch"]
    lines = ["| task | " + " | ".join(f"{i} (s)" for i in impls) + " | fastload speed-up |",
             "|---|" + "---:|" * (len(impls) + 1)]
    for row in rows:
        cells = [f"{row.timings[i]:.3f}" if i in row.timings else "n/a" for i in impls]
        lines.append(f"| {row.task} | " + " | ".join(cells) + f" | {row.ratio_line()} |")
    return "\n".join(lines)


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine() -> str:
    torch_part = (f"torch {torch.__version__} ({torch.get_num_threads()} intra-op threads)"
                  if torch is not None else "torch not installed")
    return (f"{_cpu_model()}, {os.cpu_count()} cores, "
            f"Python {platform.python_version()}, numpy {np.__version__}, {torch_part}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--no-write", action="store_true", help="print only; leave RESULTS.md alone")
    args = parser.parse_args(argv)

    rows = []
    for bench in BENCHMARKS:
        rows.extend(bench(args.repeats))
    table = format_table(rows)
    collation = format_collation(bench_collation(args.repeats))
    print(table + "\n\n" + collation)
    if not args.no_write:
        body = (f"## Kernels\n\n`python bench/bench_kernels.py --repeats {args.repeats}` on "
                f"{machine()}.\nMedian wall time of {args.repeats} rotated runs after a warm-up; "
                f"speed-up is the faster of numpy and torch over fastload.\n\n{table}\n\n{NOTES}"
                f"\n\n### Collation\n\n{collation}\n\n{COLLATION_NOTES}")
        write_section("bench_kernels", body)


if __name__ == "__main__":
    main()
