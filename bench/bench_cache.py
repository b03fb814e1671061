"""The decoded-image cache (``ImageFolder(cache=DIR)``) against torch's DataLoader decoding.

Workloads:

* ``images``: the 2,000-JPEG 500x375 synthetic folder, RandomResizedCrop(224)
  + RandomHorizontalFlip + ToArray, batch 64, 2 workers, ``cache_format="raw"``
  (every image is within ``cache_max_side=512``: cached pixels are the file's);
* ``camera``: 200 synthetic 4000x3000 JPEGs, the same pipeline,
  ``cache_format="jpeg"``, ``cache_max_side=512``.

Per round, in rotated order: torch's DataLoader over a dataset doing what
torchvision's ImageFolder does (``fastload.cli.TorchvisionStylePipeline``:
PIL open + convert RGB, RandomResizedCrop drawn with torch's RNG, Pillow
crop/resize, flip, PILToTensor's conversion; one epoch); where the cache
shrinks images (camera), the same torch pipeline over a copy of the folder
shrunk offline to the cache's side, which is what a torch user would do
instead of a cache (the like-for-like row); fastload without a cache (one
epoch); fastload with a cache in a fresh directory (epoch 1 fills it, epochs
2.. read it).  Rates are images per wall-clock second of whole epochs (worker
start-up included); medians over rounds.

The cached epochs read a store that sits in the page cache, as the source
JPEGs do for every contender.  Once per workload, after the rounds, one more
cached epoch runs with the store evicted from the page cache first
(``posix_fadvise(POSIX_FADV_DONTNEED)`` on every store file, after an
``fsync``), and is reported beside them.

"Per core" is the single-process rate of ``dataset[i]`` from a filled cache,
no loader: what one core delivers.  FFCV's published ~1,800 images/s per vCPU
(another machine and pipeline) is printed beside it as context, not as a
ratio.  Disk is the store's bytes per image (data + 64-byte index record);
memory is the index a process holds per image (the pixels live in the page
cache, shared by every process mapping them).

    python bench/bench_cache.py --rounds 3            # both workloads, 3 rounds each
    python bench/bench_cache.py --workloads images --rounds 2 --epochs 3
"""

from __future__ import annotations

import argparse
import gc
import os
import platform
import resource
import shutil
import statistics
import sys
import tempfile
import time
from typing import Any

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from fastload import cli as fb  # noqa: E402
from fastload.rng import seed_transform_rng  # noqa: E402
from fastload.vision import ImageFolder  # noqa: E402
from fastload.vision.cache_store import RECORD_SIZE, data_bytes  # noqa: E402
from results import write_section  # noqa: E402

FFCV_PER_VCPU = 1800.0
WORKLOADS = {
    "images": dict(images=2000, size=(500, 375), format="raw", side=512),
    "camera": dict(images=200, size=(4000, 3000), format="jpeg", side=512),
}


def cpu_seconds() -> float:
    """CPU time of this process and of its reaped children (the loaders' workers)."""
    me, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + children.ru_utime + children.ru_stime


def one_epoch(make_loader: Any) -> tuple[float, float]:
    """``(images per wall second, images per CPU second)`` of one epoch of a new loader.

    The loader is dropped before the clock stops, so its workers are joined
    and their CPU time is counted in this epoch (CPU time barely moves when
    other processes load the machine; wall time does).
    """
    cpu, start, images = cpu_seconds(), time.perf_counter(), 0
    loader = make_loader()
    iterator = iter(loader)
    for batch in iterator:
        images += len(batch[1])
    del batch, iterator, loader
    gc.collect()
    return images / (time.perf_counter() - start), images / (cpu_seconds() - cpu)


def fastload_epochs(root: str, workers: int, batch: int, epochs: int, seed: int,
                    cache: str | None, fmt: str, side: int) -> list[tuple[float, float]]:
    """Each epoch of a fastload DataLoader over one ImageFolder (so one cache)."""
    import fastload

    dataset = ImageFolder(root, transform=fb.standard_transform(), cache=cache,
                          cache_max_side=side, cache_format=fmt)
    return [one_epoch(lambda: fastload.DataLoader(dataset, batch_size=batch, shuffle=True,
                                                  num_workers=workers, generator=seed + epoch))
            for epoch in range(epochs)]


def evict_from_page_cache(directory: str) -> None:
    """Drop every file under ``directory`` from the page cache (written back first)."""
    for folder, _, names in os.walk(directory):
        for name in names:
            fd = os.open(os.path.join(folder, name), os.O_RDONLY)
            try:
                os.fsync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def shrunk_folder(root: str, side: int) -> str:
    """A copy of the ImageFolder ``root`` with every image shrunk to ``side`` (longest side).

    What a torch user does instead of a cache: shrink offline once with
    Pillow's ``thumbnail`` (reduced-size JPEG decode, then a resample) and
    save as JPEG quality 90.  Kept beside the synthetic folder and reused.
    """
    from PIL import Image

    final = f"{root.rstrip(os.sep)}-shrunk{side}"
    if os.path.isdir(final):
        return final
    building = tempfile.mkdtemp(prefix=os.path.basename(final) + ".", dir=os.path.dirname(final))
    for path, _ in ImageFolder(root).samples:
        target = os.path.join(building, os.path.relpath(path, root))
        os.makedirs(os.path.dirname(target), exist_ok=True)
        with Image.open(path) as image:
            image.thumbnail((side, side))
            image.convert("RGB").save(target, quality=90)
    os.rename(building, final)
    return final


def torch_epoch(root: str, workers: int, batch: int, seed: int) -> tuple[float, float]:
    import torch
    import torch.utils.data

    samples = list(ImageFolder(root).samples)
    dataset = fb.TorchvisionStylePipeline(samples, fb.CROP_SIZE)
    return one_epoch(lambda: torch.utils.data.DataLoader(
        dataset, batch_size=batch, shuffle=True, num_workers=workers,
        generator=torch.Generator().manual_seed(seed)))


def per_process_rate(root: str, cache: str, fmt: str, side: int, limit: int = 400) -> float:
    """``dataset[i]`` per CPU second in this one process, every image served by the cache."""
    dataset = ImageFolder(root, transform=fb.standard_transform(), cache=cache,
                          cache_max_side=side, cache_format=fmt)
    order = np.random.default_rng(0).permutation(len(dataset))[:limit]
    seed_transform_rng(0, 0)
    dataset[int(order[0])]
    start = time.process_time()
    for index in order:
        dataset[int(index)]
    rate = len(order) / (time.process_time() - start)
    stats = dataset.image_cache.stats()
    assert stats["stored"] == 0, "the per-core rate must be measured on a filled cache"
    return rate


def run_workload(name: str, workers: int, batch: int, rounds: int, epochs: int,
                 images: int | None) -> dict:
    spec = dict(WORKLOADS[name])
    count = images or spec["images"]
    root = fb.synthetic_image_folder(count, spec["size"], 10, progress=False)
    scratch = tempfile.mkdtemp(prefix="bench-cache-", dir=fb.default_cache_dir())
    shrinks = max(spec["size"]) > spec["side"]
    small_root = shrunk_folder(root, spec["side"]) if shrinks else None
    runs: dict[str, list] = {"torch": [], "torch_shrunk": [], "plain": [], "cached": []}
    try:
        for round_no in range(rounds):
            cache = os.path.join(scratch, f"round{round_no}")
            steps = [("torch", lambda: torch_epoch(root, workers, batch, round_no)),
                     ("plain", lambda: fastload_epochs(root, workers, batch, 1, round_no, None,
                                                       spec["format"], spec["side"])[0]),
                     ("cached", lambda: fastload_epochs(root, workers, batch, epochs, round_no,
                                                        cache, spec["format"], spec["side"]))]
            if small_root is not None:
                steps.append(("torch_shrunk",
                              lambda: torch_epoch(small_root, workers, batch, round_no)))
            shift = round_no % len(steps)
            for key, step in steps[shift:] + steps[:shift]:
                runs[key].append(step())
                print(f"  {name} round {round_no}: {key} {runs[key][-1]}", flush=True)
        last = os.path.join(scratch, f"round{rounds - 1}")
        store = data_bytes(last)
        evict_from_page_cache(last)
        evicted = fastload_epochs(root, workers, batch, 1, rounds, last, spec["format"],
                                  spec["side"])[0]
        print(f"  {name}: cached, store evicted first {evicted}", flush=True)
        per_process = per_process_rate(root, last, spec["format"], spec["side"])
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    def summary(values: list[tuple[float, float]]) -> tuple[float, float]:
        return (statistics.median(v[0] for v in values), statistics.median(v[1] for v in values))

    later = [summary(r[1:]) for r in runs["cached"]]
    return dict(name=name, count=count, size=spec["size"], format=spec["format"],
                side=spec["side"], workers=workers, batch=batch, rounds=rounds, epochs=epochs,
                torch=summary(runs["torch"]), plain=summary(runs["plain"]),
                torch_shrunk=summary(runs["torch_shrunk"]) if small_root else None,
                evicted=evicted,
                fill=summary([r[0] for r in runs["cached"]]), later=summary(later),
                later_rounds=later, per_process=per_process,
                disk_per_image=store / count + RECORD_SIZE,
                index_per_image=RECORD_SIZE + 8 + 4)


def section(results: list[dict], command: str, load: tuple[float, float]) -> str:
    """The RESULTS.md section: the tables, then what each column means."""
    cores = os.cpu_count() or 1
    lines = [
        "## Decoded-image cache",
        "",
        f"`{command}` on {platform.machine()}, {cores} CPUs, Python {platform.python_version()},",
        f"1-minute load average {load[0]:.1f} at the start and {load[1]:.1f} at the end (other jobs",
        "on the machine make wall-clock rates swing between rounds).  Each cell is",
        "images per wall second / images per CPU second (main process + workers, workers joined",
        "inside the epoch); the CPU figure is what load changes least and what the ratios use.",
        "Medians of rotated rounds; torch = torch.utils.data.DataLoader over a torchvision-style",
        "ImageFolder (`fastload.cli.TorchvisionStylePipeline`: PIL open + convert RGB +",
        "RandomResizedCrop(224) + flip + PILToTensor's conversion), batch 64.",
        "",
        "| workload | torch | fastload, no cache | cache: epoch 1 (filling) | cache: epochs 2+ "
        "| epochs 2+ / torch (CPU) | filling / no cache (CPU) |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    pairs = [r for r in results if r["torch_shrunk"] is not None]

    def cell(pair: tuple[float, float]) -> str:
        return f"{pair[0]:.0f} / {pair[1]:.0f}"

    for r in results:
        lines.append(
            f"| {r['name']}: {r['count']} x {r['size'][0]}x{r['size'][1]}, {r['format']}, "
            f"side {r['side']}, {r['workers']} workers | {cell(r['torch'])} | {cell(r['plain'])} | "
            f"{cell(r['fill'])} | {cell(r['later'])} | {r['later'][1] / r['torch'][1]:.1f}x | "
            f"{r['fill'][1] / r['plain'][1]:.2f} |")
    if pairs:
        lines += ["", "Like for like where the cache shrinks images: torch over the folder shrunk",
                  "offline to the cache's side (Pillow `thumbnail`, JPEG q90), against fastload's",
                  "epochs 2+ from the cache.", "",
                  "| workload | torch, full-size files | torch, files shrunk to the side | "
                  "fastload cache, epochs 2+ | vs full-size (CPU) | vs shrunk (CPU) |",
                  "|---|---:|---:|---:|---:|---:|"]
        for r in pairs:
            lines.append(f"| {r['name']} | {cell(r['torch'])} | {cell(r['torch_shrunk'])} | "
                         f"{cell(r['later'])} | {r['later'][1] / r['torch'][1]:.1f}x | "
                         f"{r['later'][1] / r['torch_shrunk'][1]:.1f}x |")
    lines += ["", "| workload | cache: epochs 2+, store in the page cache | one epoch, store "
              "evicted first | one core from the cache (1 process, no loader, per CPU second) "
              "| disk per image | index memory per image per process |",
              "|---|---:|---:|---:|---:|---:|"]
    for r in results:
        lines.append(f"| {r['name']} | {cell(r['later'])} | {cell(r['evicted'])} | "
                     f"{r['per_process']:.0f} images/s | "
                     f"{r['disk_per_image'] / 1024:.0f} KiB | {r['index_per_image']} B |")
    lines += ["", f"For context only (another machine and pipeline, not a ratio): FFCV publishes "
              f"about {FFCV_PER_VCPU:,.0f} images/s per vCPU from raw pixels."]
    lines += ["", "Epochs 2+ per round (wall / CPU): " + "; ".join(
        f"{r['name']} " + ", ".join(cell(v) for v in r["later_rounds"]) for r in results),
        "",
        "Epoch 1 with the cache filling does, on top of an uncached epoch: a decode at the",
        "smallest JPEG scale that still covers the cache side (1/4 for a 4000x3000 photo",
        "and side 512, where an uncached epoch's crops decode at 1/4 or 1/8; in full for",
        "500x375), the shrink to the cache side,",
        "one copy of the pixels out of Pillow's memory and their XXH3-64 hash (or a",
        "JPEG encode), and the write, whose kernel time (new page-cache pages",
        "for raw pixels) is most of the difference for `images`.  Epochs 2+ resize the",
        "mapped pixels where they lie, with no PIL image and no intermediate copy.",
        "",
        "Disk is the store's data bytes plus its 64-byte index record; the pixels are",
        "memory-mapped, so they sit once in the page cache for all workers and runs, and a",
        "process holds only the index (numpy, shared by forked workers).",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workloads", nargs="+", choices=sorted(WORKLOADS),
                        default=["images", "camera"])
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--camera-rounds", type=int, default=3,
                        help="rounds of the camera workload (a torch epoch of it takes minutes)")
    parser.add_argument("--epochs", type=int, default=3, help="epochs of the cached loader (>= 2)")
    parser.add_argument("--images", type=int, default=None, help="override the image count")
    parser.add_argument("--no-write", action="store_true", help="do not update RESULTS.md")
    options = parser.parse_args(argv)
    if options.epochs < 2:
        parser.error("--epochs must be at least 2 (epoch 1 fills the cache)")
    results = []
    load_at_start = os.getloadavg()[0]
    for name in options.workloads:
        rounds = options.camera_rounds if name == "camera" else options.rounds
        results.append(run_workload(name, options.workers, options.batch_size, rounds,
                                    options.epochs, options.images))
    command = "python bench/bench_cache.py " + " ".join(argv if argv is not None else sys.argv[1:])
    text = section(results, command.strip(), (load_at_start, os.getloadavg()[0]))
    print(text)
    if not options.no_write:
        write_section("bench_cache", text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
