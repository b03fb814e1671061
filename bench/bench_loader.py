"""fastload's DataLoader against torch.utils.data.DataLoader, same work, same run.

Workloads (the figures of issues #2, #3 and #4):

* ``tiny``:   50,000 samples of ((3, 32, 32) uint8 array, int label), batch 256, shuffle;
* ``array``:  the same data as an ArrayDataset (torch: TensorDataset);
* ``dict``:   20,000 samples of {"x": float32 (1024,), "y": int, "name": str}, batch 128;
* ``images``: a synthetic 2,000-image JPEG folder, RandomResizedCrop(224) + flip +
  ToArray, batch 64 (torch runs the same Pillow pipeline, converted like
  torchvision's PILToTensor).

Each round is a fresh child process that imports only its own library (a
fastload user does not import torch) and iterates one DataLoader for a few
epochs, new workers every epoch (the default; "2p" rows keep persistent
workers): samples/s is the median of the epochs after the first, time to
first batch is from DataLoader construction (worker start-up included).  The two
loaders, the plain pipeline and the pipelines side by side (below) run in
rotated rounds (A B C D, B C D A, ...) and medians are reported.  Peak memory is PSS summed over the child
and its workers, polled from /proc every 20 ms by this process in one extra
run per library (polling costs CPU, so the timed rounds do without).  The
*limit* is the single-process rate of the loader's own batch code (fetch +
collate, or the ArrayDataset gather) with no loader at all, times the number
of workers; a third child process measures that rate in the same rotation
as the two loaders, so drift of the machine moves all three alike.  *Side by
side* is what that limit leaves out: as many such pipeline processes as there
are workers, started together and running at once (no loader, no messages,
nothing shared but the machine), their rates summed.  It is the most any
loader's workers could make on this machine; the limit assumes that
processes sharing it do not slow each other down.

    python bench/bench_loader.py --workers 0 2 2p     # all workloads; 2p: persistent workers
    python bench/bench_loader.py --workloads tiny dict --workers 2 --rounds 5
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from typing import Any, Callable

import numpy as np
import psutil

import fastload as fl
from results import write_section



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


def build_workload(name: str, framework: str, image_root: str | None) -> Workload:
    """One workload, built with only ``framework``'s library imported."""
    if name in ("tiny", "array"):
        images, labels = tiny_data()
        if name == "tiny":
            dataset = TinyImages(images, labels)
            return Workload(name, 256, lambda: dataset, lambda: dataset, lambda: dataset, len(dataset))
        if framework == "torch":
            import torch

            theirs = torch.utils.data.TensorDataset(torch.from_numpy(images), torch.from_numpy(labels))
            return Workload(name, 256, lambda: None, lambda: theirs, lambda: None, len(labels))
        ours = fl.ArrayDataset(images, labels)
        return Workload(name, 256, lambda: ours, lambda: None, lambda: ours, len(labels))
    if name == "dict":
        rng = np.random.default_rng(1)
        dataset = Records(rng.standard_normal((20_000, 1024), dtype=np.float32),
                          rng.integers(0, 100, 20_000))
        return Workload(name, 128, lambda: dataset, lambda: dataset, lambda: dataset, len(dataset))
    if name == "images":
        from fastload import cli as image_bench
        from fastload.vision import ImageFolder

        root = image_root or image_bench.synthetic_image_folder(progress=False)
        if framework == "torch":
            folder = ImageFolder(root)
            theirs = image_bench.TorchvisionStylePipeline(list(folder.samples), image_bench.CROP_SIZE)
            return Workload(name, 64, lambda: None, lambda: theirs, lambda: None, len(theirs))
        ours = ImageFolder(root, transform=image_bench.standard_transform())
        return Workload(name, 64, lambda: ours, lambda: None, lambda: ours, len(ours))
    raise ValueError(f"unknown workload {name!r}")


# ---------------------------------------------------------------------------
# Measuring.
# ---------------------------------------------------------------------------

def batch_length(batch: Any) -> int:
    while isinstance(batch, dict):
        batch = next(iter(batch.values()))
    while isinstance(batch, (list, tuple)):
        batch = batch[0]
    return len(batch)


def parse_workers(token: str) -> tuple[int, bool]:
    """``"2"``: two workers; ``"2p"``: two persistent workers."""
    persistent = token.endswith("p")
    return int(token[:-1] if persistent else token), persistent


def make_loader(framework: str, workload: Workload, workers: str) -> Any:
    count, persistent = parse_workers(workers)
    common = dict(batch_size=workload.batch_size, shuffle=True, num_workers=count,
                  persistent_workers=persistent)
    if framework == "fastload":
        return fl.DataLoader(workload.make_fastload(), generator=0, **common)
    import torch

    return torch.utils.data.DataLoader(workload.make_torch(),
                                       generator=torch.Generator().manual_seed(0), **common)


def child_epochs(name: str, framework: str, workers: str, image_root: str | None,
                 epochs: int) -> dict:
    """In the child process: build the workload, signal readiness, run ``epochs`` epochs.

    One loader is iterated ``epochs`` times, as a training script does (without
    persistent workers, unless ``workers`` ends in "p", every epoch starts its
    workers again).  The first
    epoch gives the time to first batch (worker start-up included); the rate
    is the median over the later epochs, once one-time costs (imports, page
    cache, helper processes) are paid by both libraries.
    """
    workload = build_workload(name, framework, image_root)
    if framework == "torch":
        import torch  # noqa: F401  (imported before the clock starts, as a user's script does)
    print("ready", flush=True)
    sys.stdin.readline()  # the parent has its memory baseline; go
    start = time.perf_counter()
    loader = make_loader(framework, workload, workers)
    first = None
    rates = []
    for _ in range(epochs):
        epoch_start = time.perf_counter()
        samples = 0
        for batch in loader:
            if first is None:
                first = time.perf_counter() - start
            samples += batch_length(batch)
        rates.append(samples / (time.perf_counter() - epoch_start))
    steady = rates[1:] or rates
    return {"samples_per_s": statistics.median(steady), "first_batch_s": first,
            "first_epoch_samples_per_s": rates[0]}


def _pss_bytes(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/smaps_rollup") as handle:
            for line in handle:
                if line.startswith("Pss:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def tree_pss(root: psutil.Process) -> int:
    try:
        processes = [root] + root.children(recursive=True)
    except psutil.Error:
        return 0
    return sum(_pss_bytes(p.pid) for p in processes)


def _start_child(name: str, framework: str, workers: str, image_root: str | None,
                 epochs: int) -> subprocess.Popen:
    """A child process that has built its workload and waits for "go"."""
    command = [sys.executable, os.path.abspath(__file__), "--child", name, framework, workers,
               "--epochs", str(epochs)]
    if image_root:
        command += ["--image-root", image_root]
    child = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    if child.stdout.readline().strip() != "ready":
        child.kill()
        child.wait()
        raise RuntimeError(f"child for {name}/{framework} failed before it was ready")
    return child


def _go(child: subprocess.Popen) -> None:
    child.stdin.write("go\n")
    child.stdin.flush()


def _result_of(child: subprocess.Popen, what: str) -> dict:
    output = child.stdout.read()
    child.wait()
    if child.returncode != 0:
        raise RuntimeError(f"child {what} failed with {child.returncode}")
    return json.loads(output.strip().splitlines()[-1])


def run_child(name: str, framework: str, workers: str, image_root: str | None,
              epochs: int, sample_memory: bool) -> dict:
    """One child run; with ``sample_memory`` this process polls its PSS meanwhile.

    Polling reads /proc for every process of the tree, which costs CPU the
    loaders compete for on a small machine; so throughput rounds do not poll,
    and memory comes from a separate run.
    """
    child = _start_child(name, framework, workers, image_root, epochs)
    process = psutil.Process(child.pid)
    peak = tree_pss(process)
    _go(child)
    while sample_memory and child.poll() is None:
        peak = max(peak, tree_pss(process))
        time.sleep(0.02)
    result = _result_of(child, f"{name}/{framework}/{workers}")
    result["peak_pss_mib"] = peak / 2**20
    return result


def run_side_by_side(name: str, count: int, image_root: str | None) -> dict:
    """``count`` pipeline processes released together: their summed samples/s.

    Each measures over the same span (``PIPELINE_SECONDS``, after its
    warm-up), so they overlap but for the few milliseconds between their
    releases.
    """
    children: list[subprocess.Popen] = []
    try:
        for _ in range(count):
            children.append(_start_child(name, "pipeline", "0", image_root, 1))
    except BaseException:
        for child in children:  # ready, and waiting for a "go" that will not come
            child.kill()
            child.wait()
        raise
    for child in children:
        _go(child)
    rates = [_result_of(child, f"{name}/pipeline side by side")["samples_per_s"]
             for child in children]
    return {"samples_per_s": sum(rates), "each": rates}


# How long a pipeline child measures: long enough that children released
# together overlap but for their releases' milliseconds.
PIPELINE_SECONDS = 0.5


def pipeline_epoch(workload: Workload) -> Callable[..., int]:
    """One shuffled epoch of the loader's own batch code in a plain loop (or its
    first ``batches``); returns its samples.

    ``BatchSource.make`` is what the loader runs per batch in one process (for
    an ArrayDataset, its gather kernel), without sampler, iterator or workers.
    The last, partial batch is left out.
    """
    from fastload.collate import default_collate
    from fastload._loading.fetch import BatchSource
    from fastload._loading.settings import BatchSettings

    dataset = workload.pipeline()
    bs = workload.batch_size
    source = BatchSource(dataset, BatchSettings(False, True, default_collate, bs, False))
    source.start_epoch(0)
    order = np.random.default_rng(0).permutation(len(dataset))
    whole = len(dataset) // bs

    def epoch(batches: int = whole) -> int:
        for b in range(batches):
            source.make(b, order[b * bs:(b + 1) * bs], True)
        return batches * bs

    return epoch


def pipeline_rate(workload: Workload) -> float:
    """Samples/s of ``pipeline_epoch``: one core.

    Shuffled epochs, after a few batches of warm-up, for at least
    ``PIPELINE_SECONDS``; the median epoch's rate.
    """
    epoch = pipeline_epoch(workload)
    epoch(3)
    rates = []
    end = time.perf_counter() + PIPELINE_SECONDS
    while not rates or time.perf_counter() < end:
        start = time.perf_counter()
        samples = epoch()
        rates.append(samples / (time.perf_counter() - start))
    return statistics.median(rates)


def child_pipeline(name: str, image_root: str | None) -> dict:
    """In a child process: the one-core pipeline rate that the *limit* multiplies."""
    workload = build_workload(name, "fastload", image_root)
    print("ready", flush=True)
    sys.stdin.readline()
    return {"samples_per_s": pipeline_rate(workload)}


def measure(name: str, workers: str, rounds: int, image_root: str | None, epochs: int) -> dict:
    # The pipeline's own rate is measured in the same rotation as the two
    # loaders, so machine drift moves the limit with them.
    count = parse_workers(workers)[0]
    order = ["fastload", "torch", "pipeline"] + (["side_by_side"] if count > 1 else [])
    runs: dict[str, list[dict]] = {framework: [] for framework in order}
    for round_no in range(rounds + 1):  # round 0 warms the page cache, not counted
        shift = round_no % len(order)
        for framework in order[shift:] + order[:shift]:
            if framework == "side_by_side":
                result = run_side_by_side(name, count, image_root)
            else:
                result = run_child(name, framework, workers, image_root, epochs,
                                   sample_memory=False)
            if round_no > 0:
                runs[framework].append(result)
    peaks = {framework: run_child(name, framework, workers, image_root, epochs,
                                  sample_memory=True)["peak_pss_mib"]
             for framework in ("fastload", "torch")}
    single = statistics.median(r["samples_per_s"] for r in runs["pipeline"])
    result = {"workload": name, "workers": workers,
              "batch_size": build_workload(name, "fastload", image_root).batch_size}
    for framework in ("fastload", "torch"):
        result[framework] = {key: statistics.median(r[key] for r in runs[framework])
                             for key in ("samples_per_s", "first_batch_s",
                                         "first_epoch_samples_per_s")}
        result[framework]["peak_pss_mib"] = peaks[framework]
        result[framework]["rounds"] = [round(r["samples_per_s"]) for r in runs[framework]]
    result["ratio"] = result["fastload"]["samples_per_s"] / result["torch"]["samples_per_s"]
    result["pipeline_one_core"] = single
    result["pipeline_rounds"] = [round(r["samples_per_s"]) for r in runs["pipeline"]]
    result["limit"] = single * max(1, count)
    result["efficiency"] = result["fastload"]["samples_per_s"] / result["limit"]
    if runs.get("side_by_side"):
        side = statistics.median(r["samples_per_s"] for r in runs["side_by_side"])
        result["side_by_side"] = side
        result["side_by_side_rounds"] = [round(r["samples_per_s"]) for r in runs["side_by_side"]]
        result["of_side_by_side"] = result["fastload"]["samples_per_s"] / side
    return result


# ---------------------------------------------------------------------------
# Reporting.
# ---------------------------------------------------------------------------

def table(results: list[dict]) -> str:
    lines = ["| workload | workers | fastload samples/s | torch samples/s | ratio | first batch fastload / torch (ms) | peak PSS fastload / torch (MiB) | limit (samples/s) | fastload / limit | side by side (samples/s) | side by side / limit | fastload / side by side |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in results:
        f, t = r["fastload"], r["torch"]
        side = ("| – | – | – |" if "side_by_side" not in r else
                f"| {r['side_by_side']:,.0f} | {r['side_by_side'] / r['limit']:.0%} | "
                f"{r['of_side_by_side']:.0%} |")
        lines.append(
            f"| {r['workload']} | {r['workers']} | {f['samples_per_s']:,.0f} | {t['samples_per_s']:,.0f} | "
            f"**{r['ratio']:.2f}x** | {f['first_batch_s'] * 1e3:.0f} / {t['first_batch_s'] * 1e3:.0f} | "
            f"{f['peak_pss_mib']:.0f} / {t['peak_pss_mib']:.0f} | {r['limit']:,.0f} | "
            f"{r['efficiency']:.0%} " + side)
    return "\n".join(lines)


def machine() -> str:
    import torch

    return (f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}, "
            f"numpy {np.__version__}, torch {torch.__version__}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workloads", nargs="+", default=["tiny", "array", "dict", "images"],
                        choices=["tiny", "array", "dict", "images"])
    parser.add_argument("--workers", nargs="+", default=["2"],
                        help="worker counts; a trailing p means persistent_workers, e.g. 0 2 2p")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--epochs", type=int, default=3, help="epochs per child process")
    parser.add_argument("--image-root", default=None, help="an ImageFolder (default: synthetic)")
    parser.add_argument("--no-write", action="store_true", help="print only; leave RESULTS.md")
    parser.add_argument("--json", default=None, help="also write the raw results here")
    parser.add_argument("--child", nargs=3, metavar=("WORKLOAD", "FRAMEWORK", "WORKERS"),
                        help=argparse.SUPPRESS)
    options = parser.parse_args(argv)
    if options.child:
        name, framework, workers = options.child
        if framework == "pipeline":
            print(json.dumps(child_pipeline(name, options.image_root)))
        else:
            print(json.dumps(child_epochs(name, framework, workers, options.image_root,
                                          options.epochs)))
        return 0

    results, load_at_start = [], os.getloadavg()[0]
    for name in options.workloads:
        for workers in options.workers:
            result = measure(name, workers, options.rounds, options.image_root, options.epochs)
            results.append(result)
            print(table([result]).splitlines()[-1], flush=True)
    command = "python bench/bench_loader.py " + " ".join(argv if argv is not None else sys.argv[1:])
    text = (f"## Loader\n\n`{command.strip()}` on {machine()}; 1-minute load average "
            f"{load_at_start:.1f} at the start, {os.getloadavg()[0]:.1f} at the end.\n"
            f"Median of {options.rounds} rotated rounds (fastload, torch, pipeline, side by side; "
            f"then torch, pipeline, side by side, fastload; ...) after a warm-up round. Each round is a fresh process that imports only "
            f"its own library and iterates one DataLoader for {options.epochs} epochs (new workers "
            f"every epoch, the default; workers `2p` = persistent_workers=True): samples/s is the "
            f"median of the epochs after the first, "
            f"first batch is measured from DataLoader construction in the first epoch (worker "
            f"start-up included), peak PSS sums the process and its workers, polled every 20 ms in "
            f"one more run per library (polling is left out of the timed rounds: it costs CPU). "
            f"*limit* = single-process rate of the loader's own batch code (fetch + collate, or the "
            f"ArrayDataset gather) with no loader, times the worker count; that rate is measured "
            f"in a third child process in the same rotation as the two loaders (median of the "
            f"rounds). *side by side* = as many of those pipeline processes as workers, released "
            f"together and running at once (no loader), their rates summed: the most that many "
            f"processes make at once on this machine, measured in the same rotation.\n\n"
            + table(results) + "\n")
    print("\n" + text)
    if options.json:
        with open(options.json, "w") as handle:
            json.dump(results, handle, indent=2)
    if not options.no_write:
        write_section("bench_loader", text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
