"""fastload's DataLoader against torch.utils.data.DataLoader, same work, same run.

Workloads (the figures of issues #2, #3 and #4):

* ``tiny``:   50,000 samples of ((3, 32, 32) uint8 array, int label), batch 256, shuffle;
* ``array``:  the same data as an ArrayDataset (torch: TensorDataset);
* ``dict``:   20,000 samples of {"x": float32 (1024,), "y": int, "name": str}, batch 128;
* ``images``: a synthetic 2,000-image JPEG folder, RandomResizedCrop(224) + flip +
  ToArray, batch 64 (torch runs the same Pillow pipeline, converted like
  torchvision's PILToTensor).

For each, both loaders run in alternating rounds (A B, B A, ...) and the median
is reported: samples/s, time to first batch, and peak memory (PSS summed over
the main process and its workers, sampled while one extra epoch runs).  The
*limit* is the single-process rate of the same pipeline with no loader at all
(getitem + collate in a plain loop) times the number of workers.

    python bench/bench_loader.py                      # all workloads, 2 workers and 0
    python bench/bench_loader.py --workloads tiny dict --workers 2 --rounds 5
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import platform
import statistics
import sys
import threading
import time
from typing import Any, Callable

import numpy as np
import psutil

import fastload as fl

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "RESULTS.md")
SECTION_START = "<!-- bench_loader:start -->"
SECTION_END = "<!-- bench_loader:end -->"


# ---------------------------------------------------------------------------
# Datasets: plain classes both loaders accept (torch only needs __getitem__/__len__).
# ---------------------------------------------------------------------------

class TinyImages:
    def __init__(self, images: np.ndarray, labels: np.ndarray) -> None:
        self.images, self.labels = images, labels

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> tuple:
        return self.images[i], int(self.labels[i])


class Records:
    def __init__(self, features: np.ndarray, labels: np.ndarray) -> None:
        self.features, self.labels = features, labels

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> dict:
        return {"x": self.features[i], "y": int(self.labels[i]), "name": f"record-{i}"}


def tiny_data() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    return rng.integers(0, 256, (50_000, 3, 32, 32), dtype=np.uint8), rng.integers(0, 10, 50_000)


class Workload:
    def __init__(self, name: str, batch_size: int, make_fastload: Callable[[], Any],
                 make_torch: Callable[[], Any], pipeline: Callable[[], Any], samples: int) -> None:
        self.name, self.batch_size, self.samples = name, batch_size, samples
        self.make_fastload, self.make_torch, self.pipeline = make_fastload, make_torch, pipeline


def build_workloads(names: list[str], image_root: str | None) -> list[Workload]:
    import torch

    workloads = []
    if "tiny" in names or "array" in names:
        images, labels = tiny_data()
    if "tiny" in names:
        dataset = TinyImages(images, labels)
        workloads.append(Workload("tiny", 256, lambda d=dataset: d, lambda d=dataset: d,
                                  lambda d=dataset: d, len(dataset)))
    if "array" in names:
        ours = fl.ArrayDataset(images, labels)
        theirs = torch.utils.data.TensorDataset(torch.from_numpy(images), torch.from_numpy(labels))
        workloads.append(Workload("array", 256, lambda: ours, lambda: theirs, lambda: ours,
                                  len(labels)))
    if "dict" in names:
        rng = np.random.default_rng(1)
        dataset = Records(rng.standard_normal((20_000, 1024), dtype=np.float32),
                          rng.integers(0, 100, 20_000))
        workloads.append(Workload("dict", 128, lambda d=dataset: d, lambda d=dataset: d,
                                  lambda d=dataset: d, len(dataset)))
    if "images" in names:
        from fastload import bench as image_bench
        from fastload.vision import ImageFolder

        root = image_root or image_bench.synthetic_image_folder()
        ours = ImageFolder(root, transform=image_bench.standard_transform())
        theirs = image_bench.TorchvisionStylePipeline(root)
        workloads.append(Workload("images", 64, lambda: ours, lambda: theirs, lambda: ours,
                                  len(ours)))
    return workloads


# ---------------------------------------------------------------------------
# Measuring.
# ---------------------------------------------------------------------------

def batch_length(batch: Any) -> int:
    while isinstance(batch, dict):
        batch = next(iter(batch.values()))
    while isinstance(batch, (list, tuple)):
        batch = batch[0]
    return len(batch)


def run_epoch(loader: Any) -> tuple[float, float, int]:
    """(seconds for the epoch, seconds to the first batch, samples)."""
    start = time.perf_counter()
    first = None
    samples = 0
    for batch in loader:
        if first is None:
            first = time.perf_counter() - start
        samples += batch_length(batch)
    return time.perf_counter() - start, first or 0.0, samples


class PeakPss:
    """Samples the PSS of this process and its children until stopped; keeps the peak."""

    def __init__(self, interval: float = 0.02) -> None:
        self.interval, self.peak = interval, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _total(self) -> int:
        me = psutil.Process()
        total = 0
        for process in [me] + me.children(recursive=True):
            try:
                if process.name().startswith("python") or process is me:
                    total += process.memory_full_info().pss
            except (psutil.Error, OSError):
                pass
        return total

    def _run(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self._total())
            self._stop.wait(self.interval)

    def __enter__(self) -> "PeakPss":
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()


def make_loader(framework: str, workload: Workload, workers: int) -> Any:
    common = dict(batch_size=workload.batch_size, shuffle=True, num_workers=workers)
    if framework == "fastload":
        return fl.DataLoader(workload.make_fastload(), generator=0, **common)
    import torch

    return torch.utils.data.DataLoader(workload.make_torch(),
                                       generator=torch.Generator().manual_seed(0), **common)


def pipeline_rate(workload: Workload, batches: int = 40) -> float:
    """Samples/s of getitem + default_collate in a plain loop: one core, no loader."""
    dataset = workload.pipeline()
    order = np.random.default_rng(0).permutation(len(dataset))
    bs = workload.batch_size
    batches = min(batches, len(dataset) // bs)
    getitems = getattr(dataset, "__getitems__", None)
    start = time.perf_counter()
    for b in range(batches):
        keys = order[b * bs:(b + 1) * bs].tolist()
        samples = getitems(keys) if getitems else [dataset[k] for k in keys]
        fl.default_collate(samples)
    return batches * bs / (time.perf_counter() - start)


def measure(workload: Workload, workers: int, rounds: int) -> dict:
    rates: dict[str, list[float]] = {"fastload": [], "torch": []}
    firsts: dict[str, list[float]] = {"fastload": [], "torch": []}
    order = ["fastload", "torch"]
    for round_no in range(rounds + 1):  # round 0 warms caches and imports, not counted
        for framework in (order if round_no % 2 == 0 else order[::-1]):
            loader = make_loader(framework, workload, workers)
            seconds, first, samples = run_epoch(loader)
            del loader
            gc.collect()
            if round_no > 0:
                rates[framework].append(samples / seconds)
                firsts[framework].append(first)
    peaks = {}
    for framework in order:
        loader = make_loader(framework, workload, workers)
        with PeakPss() as peak:
            run_epoch(loader)
        del loader
        gc.collect()
        peaks[framework] = peak.peak
    single = statistics.median(pipeline_rate(workload) for _ in range(3))
    result = {"workload": workload.name, "workers": workers, "batch_size": workload.batch_size}
    for framework in order:
        result[framework] = {"samples_per_s": statistics.median(rates[framework]),
                             "first_batch_s": statistics.median(firsts[framework]),
                             "peak_pss_mib": peaks[framework] / 2**20}
    result["ratio"] = result["fastload"]["samples_per_s"] / result["torch"]["samples_per_s"]
    result["pipeline_one_core"] = single
    limit = single * max(1, workers)
    result["limit"] = limit
    result["efficiency"] = result["fastload"]["samples_per_s"] / limit
    return result


# ---------------------------------------------------------------------------
# Reporting.
# ---------------------------------------------------------------------------

def table(results: list[dict]) -> str:
    lines = ["| workload | workers | fastload samples/s | torch samples/s | ratio | first batch fastload / torch (ms) | peak PSS fastload / torch (MiB) | limit (samples/s) | fastload / limit |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in results:
        f, t = r["fastload"], r["torch"]
        lines.append(
            f"| {r['workload']} | {r['workers']} | {f['samples_per_s']:,.0f} | {t['samples_per_s']:,.0f} | "
            f"**{r['ratio']:.2f}x** | {f['first_batch_s'] * 1e3:.0f} / {t['first_batch_s'] * 1e3:.0f} | "
            f"{f['peak_pss_mib']:.0f} / {t['peak_pss_mib']:.0f} | {r['limit']:,.0f} | "
            f"{r['efficiency']:.0%} |")
    return "\n".join(lines)


def machine() -> str:
    import torch

    return (f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, "
            f"numpy {np.__version__}, torch {torch.__version__}")


def write_section(text: str, path: str = RESULTS) -> None:
    """Replace this script's section of RESULTS.md (other scripts own other sections)."""
    body = open(path).read() if os.path.exists(path) else "# fastload benchmark results\n"
    block = f"{SECTION_START}\n{text.rstrip()}\n{SECTION_END}"
    if SECTION_START in body and SECTION_END in body:
        head, rest = body.split(SECTION_START, 1)
        tail = rest.split(SECTION_END, 1)[1]
        body = head + block + tail
    else:
        body = body.rstrip() + "\n\n" + block + "\n"
    with open(path, "w") as handle:
        handle.write(body)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workloads", nargs="+", default=["tiny", "array", "dict", "images"],
                        choices=["tiny", "array", "dict", "images"])
    parser.add_argument("--workers", nargs="+", type=int, default=[0, 2])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--image-root", default=None, help="an ImageFolder (default: synthetic)")
    parser.add_argument("--no-write", action="store_true", help="print only; leave RESULTS.md")
    parser.add_argument("--json", default=None, help="also write the raw results here")
    options = parser.parse_args(argv)

    results = []
    for workload in build_workloads(options.workloads, options.image_root):
        for workers in options.workers:
            result = measure(workload, workers, options.rounds)
            results.append(result)
            print(table([result]).splitlines()[-1], flush=True)
    command = "python bench/bench_loader.py " + " ".join(sys.argv[1:])
    text = (f"## Loader\n\n`{command.strip()}` on {machine()}.\n"
            f"Median of {options.rounds} alternating rounds (fastload, torch, then torch, "
            f"fastload, ...) after a warm-up round. *limit* = single-process rate of the same "
            f"getitem + collate pipeline with no loader, times the worker count (times 1 for 0 "
            f"workers). Peak PSS sums the main process and its workers during one epoch.\n\n"
            + table(results) + "\n")
    print("\n" + text)
    if options.json:
        with open(options.json, "w") as handle:
            json.dump(results, handle, indent=2)
    if not options.no_write:
        write_section(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
