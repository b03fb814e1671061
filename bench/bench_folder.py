"""Folder scan time and worker memory: fastload's DatasetFolder against torchvision's, same run.

Two measurements (issue #4), each against a baseline measured in the same run:

* **scan**: ``fastload.vision.ImageFolder(root)`` against torchvision's
  ``ImageFolder`` construction, written out below step for step (torchvision is
  not needed): ``find_classes`` (sorted ``os.scandir``), ``make_dataset``
  (``sorted(os.walk(class_dir, followlinks=True))``, sorted file names,
  ``has_file_allowed_extension``, a list of ``(path, class_index)`` tuples)
  and ``targets = [s[1] for s in samples]``.  The folder holds 100,000 empty
  ``.JPEG`` files in 100 class folders, ImageNet-style names; only the scan is
  timed.  One warm-up of each, then alternating rounds (ours, baseline, then
  baseline, ours, ...), medians; both must give the same ``(path, target)`` list.
* **worker memory**: one shuffled epoch (batch 256, 2 persistent workers) over
  the 100,000-entry dataset, with a loader that does not open the file (it
  returns ``len(path)``), so only the sample table is touched.  fastload's
  ``DatasetFolder`` (numpy table) and a torchvision-style dataset (a Python list
  of ``(str, int)`` tuples), each under fastload's and under torch's
  ``DataLoader``.  Each configuration runs in a fresh child process; after the
  epoch the child reads Pss and USS (Private_Clean + Private_Dirty) of itself
  and of each worker from ``/proc/<pid>/smaps_rollup``.  Medians over rounds.

    python bench/bench_folder.py                          # default: 5 scan rounds, 3 memory rounds
    python bench/bench_folder.py --root /data/scratch/folder-100k --files 100000
"""

from __future__ import annotations

import argparse
import gc
import json
import multiprocessing
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np
from results import write_section  # bench/results.py; this script owns "bench_folder"

from fastload.vision import IMG_EXTENSIONS, DatasetFolder, ImageFolder

DEFAULT_ROOT = "/tmp/fastload-bench-folder-100k"
MARKER = ".fastload-bench-folder"  # a file, so neither scan counts it as a class

# (name, DataLoader library, dataset kind)
CONFIGS = {
    "table/fastload": ("fastload", "table"),
    "list/fastload": ("fastload", "list"),
    "list/torch": ("torch", "list"),
    "table/torch": ("torch", "table"),
}


# ---------------------------------------------------------------------------
# The folder.
# ---------------------------------------------------------------------------

def ensure_folder(root: str, files: int, classes: int) -> str:
    """Create (once) ``root`` with ``files`` empty .JPEG files spread over ``classes`` folders."""
    stamp = f"{files} files, {classes} classes\n"
    marker = os.path.join(root, MARKER)
    if os.path.exists(marker):
        with open(marker) as handle:
            if handle.read() == stamp:
                return root
        raise SystemExit(f"{root} holds a different benchmark folder; delete it or pass --root")
    if os.path.exists(root):
        raise SystemExit(f"{root} exists and is not a folder made by this script; pass another --root")
    start = time.perf_counter()
    building = f"{root}.building-{os.getpid()}"
    os.makedirs(building)
    for c in range(classes):
        wnid = f"n{10_000_000 + c * 7919:08d}"  # ImageNet-like class and file names
        class_dir = os.path.join(building, wnid)
        os.mkdir(class_dir)
        for i in range(files // classes + (c < files % classes)):
            open(os.path.join(class_dir, f"{wnid}_{i * 13 + 7}.JPEG"), "wb").close()
    with open(os.path.join(building, MARKER), "w") as handle:
        handle.write(stamp)
    os.rename(building, root)
    print(f"created {files:,} files in {classes} classes under {root} "
          f"in {time.perf_counter() - start:.1f} s", flush=True)
    return root


# ---------------------------------------------------------------------------
# The baseline: torchvision's ImageFolder, as torchvision/datasets/folder.py does it.
# ---------------------------------------------------------------------------

def tv_has_file_allowed_extension(filename: str, extensions: str | tuple[str, ...]) -> bool:
    return filename.lower().endswith(extensions if isinstance(extensions, str) else tuple(extensions))


def tv_find_classes(directory: str) -> tuple[list[str], dict[str, int]]:
    classes = sorted(entry.name for entry in os.scandir(directory) if entry.is_dir())
    if not classes:
        raise FileNotFoundError(f"Couldn't find any class folder in {directory}.")
    class_to_idx = {cls_name: i for i, cls_name in enumerate(classes)}
    return classes, class_to_idx


def tv_make_dataset(directory: str, class_to_idx: dict[str, int],
                    extensions: tuple[str, ...]) -> list[tuple[str, int]]:
    directory = os.path.expanduser(directory)

    def is_valid_file(x: str) -> bool:
        return tv_has_file_allowed_extension(x, extensions)

    instances = []
    available_classes = set()
    for target_class in sorted(class_to_idx.keys()):
        class_index = class_to_idx[target_class]
        target_dir = os.path.join(directory, target_class)
        if not os.path.isdir(target_dir):
            continue
        for root, _, fnames in sorted(os.walk(target_dir, followlinks=True)):
            for fname in sorted(fnames):
                path = os.path.join(root, fname)
                if is_valid_file(path):
                    item = path, class_index
                    instances.append(item)
                    if target_class not in available_classes:
                        available_classes.add(target_class)
    empty_classes = set(class_to_idx.keys()) - available_classes
    if empty_classes:
        raise FileNotFoundError(f"Found no valid file for the classes {', '.join(sorted(empty_classes))}.")
    return instances


class TorchvisionStyleFolder:
    """torchvision's DatasetFolder: ``samples`` is a list of (str, int) tuples."""

    def __init__(self, root: str, loader: Callable[[str], Any],
                 extensions: tuple[str, ...] = tuple(IMG_EXTENSIONS)) -> None:
        self.root = root
        classes, class_to_idx = tv_find_classes(root)
        samples = tv_make_dataset(root, class_to_idx, extensions)
        self.loader = loader
        self.extensions = extensions
        self.classes = classes
        self.class_to_idx = class_to_idx
        self.samples = samples
        self.targets = [s[1] for s in samples]
        self.transform = self.target_transform = None

    def __getitem__(self, index: int) -> tuple[Any, Any]:
        path, target = self.samples[index]
        sample = self.loader(path)
        if self.transform is not None:
            sample = self.transform(sample)
        if self.target_transform is not None:
            target = self.target_transform(target)
        return sample, target

    def __len__(self) -> int:
        return len(self.samples)


def path_length(path: str) -> int:
    """The benchmark's loader: touches the path, not the file."""
    return len(path)


def list_bytes(samples: list[tuple[str, int]]) -> int:
    """Bytes of the list, its tuples and their strings (small ints are shared)."""
    return sys.getsizeof(samples) + sum(sys.getsizeof(t) + sys.getsizeof(t[0]) for t in samples)


# ---------------------------------------------------------------------------
# Scan.
# ---------------------------------------------------------------------------

def scan_ours(root: str) -> Any:
    return ImageFolder(root)


def scan_baseline(root: str) -> Any:
    return TorchvisionStyleFolder(root, loader=path_length)


def timed(build: Callable[[str], Any], root: str) -> tuple[float, Any]:
    gc.collect()
    start = time.perf_counter()
    result = build(root)
    return time.perf_counter() - start, result


def measure_scan(root: str, rounds: int) -> dict:
    times: dict[str, list[float]] = {"fastload": [], "torchvision": []}
    builders = {"fastload": scan_ours, "torchvision": scan_baseline}
    order = ["fastload", "torchvision"]
    ours = theirs = None
    for round_no in range(rounds + 1):  # round 0 warms the dentry/inode caches, not counted
        ours = theirs = built = None  # drop the previous round's results before timing
        for name in (order if round_no % 2 == 0 else order[::-1]):
            seconds, built = timed(builders[name], root)
            if round_no > 0:
                times[name].append(seconds)
            if name == "fastload":
                ours = built
            else:
                theirs = built
        if round_no == 0:
            assert ours.samples == theirs.samples, "fastload and torchvision scans differ"
            assert list(ours.targets) == theirs.targets and ours.classes == theirs.classes
            stored = {"fastload": ours.samples.nbytes, "torchvision": list_bytes(theirs.samples)}
            count = len(theirs.samples)
    result = {"files": count, "rounds": rounds}
    for name in order:
        result[name] = {"median_s": statistics.median(times[name]),
                        "rounds_s": [round(t, 4) for t in times[name]],
                        "samples_mib": stored[name] / 2**20}
    result["speedup"] = result["torchvision"]["median_s"] / result["fastload"]["median_s"]
    return result


# ---------------------------------------------------------------------------
# Worker memory (runs in a fresh child process per configuration).
# ---------------------------------------------------------------------------

def memory_of(pid: int) -> dict[str, float]:
    """Pss and USS (private clean + dirty) of ``pid`` in MiB, from smaps_rollup."""
    fields = {}
    with open(f"/proc/{pid}/smaps_rollup") as handle:
        for line in handle:
            parts = line.split()
            if len(parts) == 3 and parts[2] == "kB":
                fields[parts[0].rstrip(":")] = int(parts[1])
    return {"pss": fields["Pss"] / 1024,
            "uss": (fields["Private_Clean"] + fields["Private_Dirty"]) / 1024}


def child_memory(config: str, root: str, batch_size: int, workers: int) -> dict:
    library, kind = CONFIGS[config]
    if library == "torch":
        import torch  # imported before the dataset exists, as a training script does

    if kind == "table":
        dataset = DatasetFolder(root, loader=path_length, extensions=IMG_EXTENSIONS)
    else:
        dataset = TorchvisionStyleFolder(root, loader=path_length)
    if library == "fastload":
        import fastload as fl

        loader = fl.DataLoader(dataset, batch_size=batch_size, shuffle=True, num_workers=workers,
                               persistent_workers=True, generator=0)
    else:
        loader = torch.utils.data.DataLoader(dataset, batch_size=batch_size, shuffle=True,
                                             num_workers=workers, persistent_workers=True,
                                             generator=torch.Generator().manual_seed(0))
    start = time.perf_counter()
    iterator = iter(loader)
    pids = list(iterator.worker_pids) if library == "fastload" else [w.pid for w in iterator._workers]
    first = next(iterator)
    at_first = [memory_of(pid) for pid in pids]
    samples = len(first[1])
    for _, targets in iterator:
        samples += len(targets)
    epoch_s = time.perf_counter() - start
    assert samples == len(dataset), (samples, len(dataset))
    after = [memory_of(pid) for pid in pids]
    main = memory_of(os.getpid())
    if library == "fastload":
        iterator.shutdown()
    else:
        iterator._shutdown_workers()
    return {"config": config, "pids": pids, "epoch_s": epoch_s, "samples": samples,
            "workers_at_first_batch": at_first, "workers": after, "main": main,
            "start_method": (loader.multiprocessing_context
                             or multiprocessing.get_context()).get_start_method()}


def run_child(config: str, root: str, batch_size: int, workers: int) -> dict:
    command = [sys.executable, os.path.abspath(__file__), "--child", config, "--root", root,
               "--batch-size", str(batch_size), "--workers", str(workers)]
    done = subprocess.run(command, check=False, stdout=subprocess.PIPE, text=True, timeout=300)
    if done.returncode != 0:
        raise RuntimeError(f"child {config} failed with {done.returncode}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def measure_memory(root: str, rounds: int, batch_size: int, workers: int,
                   configs: list[str]) -> list[dict]:
    runs: dict[str, list[dict]] = {name: [] for name in configs}
    for round_no in range(rounds):
        for name in (configs if round_no % 2 == 0 else configs[::-1]):
            runs[name].append(run_child(name, root, batch_size, workers))
    results = []
    for name in configs:
        per_run = runs[name]

        def median(pick: Callable[[dict], float], per_run: list[dict] = per_run) -> float:
            return statistics.median(pick(r) for r in per_run)

        summary = {"config": name, "library": CONFIGS[name][0], "dataset": CONFIGS[name][1],
                   "start_method": per_run[0]["start_method"],
                   "epoch_s": median(lambda r: r["epoch_s"]),
                   "worker_pss_sum": median(lambda r: sum(w["pss"] for w in r["workers"])),
                   "worker_uss_sum": median(lambda r: sum(w["uss"] for w in r["workers"])),
                   "worker_pss": [median(lambda r, i=i: r["workers"][i]["pss"]) for i in range(workers)],
                   "worker_uss": [median(lambda r, i=i: r["workers"][i]["uss"]) for i in range(workers)],
                   "worker_uss_first_sum": median(
                       lambda r: sum(w["uss"] for w in r["workers_at_first_batch"])),
                   "main_pss": median(lambda r: r["main"]["pss"]),
                   "main_uss": median(lambda r: r["main"]["uss"])}
        summary["total_pss"] = summary["worker_pss_sum"] + summary["main_pss"]
        results.append(summary)
    return results


# ---------------------------------------------------------------------------
# Reporting.
# ---------------------------------------------------------------------------

def scan_table(scan: dict) -> str:
    f, t = scan["fastload"], scan["torchvision"]
    return "\n".join([
        "| scan of 100k-file folder | median (s) | rounds (s) | samples held (MiB) |",
        "|---|---:|---:|---:|",
        (f"| fastload `ImageFolder(root)` | {f['median_s']:.3f} | "
         f"{', '.join(f'{x:.3f}' for x in f['rounds_s'])} | {f['samples_mib']:.1f} |"),
        (f"| torchvision rules (list of tuples) | {t['median_s']:.3f} | "
         f"{', '.join(f'{x:.3f}' for x in t['rounds_s'])} | {t['samples_mib']:.1f} |"),
        (f"| **torchvision / fastload** | **{scan['speedup']:.2f}x** | | "
         f"{t['samples_mib'] / f['samples_mib']:.1f}x |"),
    ])


def memory_table(results: list[dict]) -> str:
    names = {"table": "fastload `DatasetFolder` (numpy table)",
             "list": "torchvision-style (list of tuples)"}
    lines = [("| samples | DataLoader | per-worker PSS (MiB) | per-worker USS (MiB) | "
              "workers PSS sum | workers USS sum (first batch → epoch end) | main PSS / USS | "
              "total PSS | epoch (s) |"),
             "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    for r in results:
        lines.append(
            f"| {names[r['dataset']]} | {r['library']} | "
            f"{' / '.join(f'{x:.1f}' for x in r['worker_pss'])} | "
            f"{' / '.join(f'{x:.1f}' for x in r['worker_uss'])} | "
            f"**{r['worker_pss_sum']:.1f}** | {r['worker_uss_first_sum']:.1f} → "
            f"**{r['worker_uss_sum']:.1f}** | {r['main_pss']:.1f} / {r['main_uss']:.1f} | "
            f"{r['total_pss']:.1f} | {r['epoch_s']:.2f} |")
    return "\n".join(lines)


def filesystem_of(path: str) -> str:
    path = os.path.realpath(path)
    best, kind = "", "?"
    try:
        with open("/proc/mounts") as handle:
            for line in handle:
                _, mount, fstype = line.split()[:3]
                if (path == mount or path.startswith(mount.rstrip("/") + "/")) and len(mount) > len(best):
                    best, kind = mount, fstype
    except OSError:
        pass
    return kind


def machine(root: str) -> str:
    import torch

    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as handle:
            for line in handle:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return (f"{cpu}, {os.cpu_count()} cores, Linux {platform.release()}, Python "
            f"{platform.python_version()}, numpy {np.__version__}, torch {torch.__version__}; "
            f"folder on {filesystem_of(root)}")


def shm_segments() -> set[str]:
    try:
        return {name for name in os.listdir("/dev/shm") if name.startswith("fl_")}
    except OSError:
        return set()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", default=DEFAULT_ROOT,
                        help="where the benchmark folder is created once and reused")
    parser.add_argument("--files", type=int, default=100_000)
    parser.add_argument("--classes", type=int, default=100)
    parser.add_argument("--scan-rounds", type=int, default=5)
    parser.add_argument("--memory-rounds", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=list(CONFIGS))
    parser.add_argument("--no-write", action="store_true", help="print only; leave RESULTS.md")
    parser.add_argument("--json", default=None, help="also write the raw results here")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    options = parser.parse_args(argv)
    if options.child:
        print(json.dumps(child_memory(options.child, options.root, options.batch_size,
                                      options.workers)))
        return 0

    started = time.perf_counter()
    shm_before = shm_segments()
    root = ensure_folder(options.root, options.files, options.classes)
    scan = measure_scan(root, options.scan_rounds)
    print(scan_table(scan), flush=True)
    memory = measure_memory(root, options.memory_rounds, options.batch_size, options.workers,
                            options.configs)
    print(memory_table(memory), flush=True)
    leaked = shm_segments() - shm_before
    if leaked:
        print(f"WARNING: /dev/shm segments left behind: {sorted(leaked)}", file=sys.stderr)

    command = "python bench/bench_folder.py " + " ".join(argv if argv is not None else sys.argv[1:])
    methods = sorted({r["start_method"] for r in memory})
    text = (
        f"## Folder scan and worker memory\n\n`{command.strip()}` on {machine(root)}.\n\n"
        f"**Scan.** {scan['files']:,} empty `.JPEG` files in {options.classes} class folders. "
        f"fastload `ImageFolder(root)` against torchvision's `ImageFolder` construction written "
        f"out in the script (sorted `os.scandir` classes, sorted `os.walk(followlinks=True)`, "
        f"sorted names, `has_file_allowed_extension`, a list of `(path, class_index)` tuples, "
        f"then `targets`); both give the same list (asserted). Median of {options.scan_rounds} "
        f"alternating rounds (fastload, torchvision, then torchvision, fastload, ...) after a "
        f"warm-up of each, in one process, warm dentry cache. *Samples held*: the table's numpy "
        f"bytes against the list, its tuples and strings (`sys.getsizeof`).\n\n"
        + scan_table(scan) + "\n\n"
        f"**Worker memory.** One shuffled epoch over the {scan['files']:,} samples, batch "
        f"{options.batch_size}, {options.workers} persistent workers ({', '.join(methods)}), "
        f"loader `len(path)` (no file is opened, so only the sample table is read). Each "
        f"configuration runs in a fresh process; after the epoch it reads `Pss` and USS "
        f"(`Private_Clean + Private_Dirty`) of itself and of each worker from "
        f"`/proc/<pid>/smaps_rollup`; USS is also read at the first batch. Median of "
        f"{options.memory_rounds} alternating rounds. Processes that import torch carry its "
        f"libraries, so compare rows with the same DataLoader for the table's effect and rows "
        f"with the same samples for the loader's.\n\n"
        + memory_table(memory) + "\n")
    print("\n" + text)
    print(f"total {time.perf_counter() - started:.0f} s", file=sys.stderr)
    if options.json:
        with open(options.json, "w") as handle:
            json.dump({"scan": scan, "memory": memory}, handle, indent=2)
    if not options.no_write:
        write_section("bench_folder", text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
