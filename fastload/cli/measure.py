"""The engine behind ``python -m fastload bench``: image-folder loading throughput.

What is measured, and how
-------------------------
* The pipeline is the standard training one: ``RandomResizedCrop(224)``,
  ``RandomHorizontalFlip()``, then to a uint8 ``(3, 224, 224)`` array, in
  shuffled batches of 64.
* ``measure_fastload`` runs ``fastload.DataLoader`` over ``ImageFolder``.
* ``measure_torch`` runs ``torch.utils.data.DataLoader`` over the same files
  with the pipeline a torchvision user runs: torchvision's ``pil_loader``,
  the crop drawn with torch's RNG as ``RandomResizedCrop.get_params`` does,
  Pillow crop+resize and flip, then ``PILToTensor``'s conversion, and torch's
  ``default_collate``.
* ``measure_pipeline_limit`` is the single-process rate of fastload's
  pipeline with no loader (a plain loop over ``dataset[i]``); times the worker
  count it is the most any loader could deliver on this machine.
* Rates are images per wall-clock second over whole epochs, worker start-up
  included (it is part of what a user waits for); the first batch's latency
  is reported separately.  ``input_mb_per_s`` is compressed file bytes read,
  ``output_mb_per_s`` decoded batch bytes delivered.

``synthetic_image_folder`` makes (once, cached) an ImageFolder of photo-like
JPEGs, so the benchmark needs no dataset download.
"""

from __future__ import annotations

import copy
import functools
import importlib.util
import os
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from .progress import progress_bar
from .vision.decode import pil_loader
from .vision.folder import ImageFolder
from .vision.synthetic import write_image_folder
from .vision import transforms as T

__all__ = [
    "default_cache_dir",
    "synthetic_image_folder",
    "standard_transform",
    "measure_pipeline_limit",
    "measure_fastload",
    "measure_torch",
    "TorchvisionStylePipeline",
    "full_decode_loader",
    "reduced_decode_shares",
    "compare_rounds",
    "plot_scaling",
]

CROP_SIZE = 224
# Bumped whenever synthetic_image changes, so stale caches are not reused.
_SYNTHETIC_VERSION = 1


def default_cache_dir() -> str:
    """``$FASTLOAD_CACHE``, else ``$XDG_CACHE_HOME/fastload``, else ``~/.cache/fastload``."""
    if os.environ.get("FASTLOAD_CACHE"):
        return os.environ["FASTLOAD_CACHE"]
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "fastload")


def synthetic_image_folder(images: int = 2000, size: tuple[int, int] = (500, 375), classes: int = 10,
                           *, seed: int = 0, quality: int = 90, cache_dir: str | None = None,
                           workers: int | None = None, progress: bool = False) -> str:
    """The path of a cached ImageFolder of ``images`` photo-like JPEGs of ``size`` (w, h).

    Generated once under ``cache_dir`` (see ``default_cache_dir``) and reused
    by later calls with the same parameters.  Built in a temporary directory
    beside it and renamed into place, so an interrupted or concurrent build
    never leaves a half-written folder under the final name.
    """
    if images < classes or classes < 1:
        raise ValueError(f"need at least one image per class: images={images}, classes={classes}")
    width, height = size
    if width < 1 or height < 1:
        raise ValueError(f"image size must be positive, got {width}x{height}")
    cache_dir = cache_dir or default_cache_dir()
    name = f"synthetic-v{_SYNTHETIC_VERSION}-{images}x{width}x{height}-c{classes}-q{quality}-s{seed}"
    final = os.path.join(cache_dir, name)
    if os.path.isdir(final):
        return final
    os.makedirs(cache_dir, exist_ok=True)
    building = tempfile.mkdtemp(prefix=f".{name}.", dir=cache_dir)
    try:
        # Spread images over classes as evenly as possible, extras to the first classes.
        counts = [images // classes + (1 if k < images % classes else 0) for k in range(classes)]
        bar = progress_bar(images, f"generating {images} synthetic {width}x{height} JPEGs", progress)
        write_image_folder(building, counts, (width, height), seed=seed, quality=quality,
                           workers=workers or os.cpu_count() or 1,
                           on_progress=bar.update if bar is not None else None)
        if bar is not None:
            bar.close()
        try:
            os.rename(building, final)
        except OSError:
            if not os.path.isdir(final):  # not a lost race with another builder: a real failure
                raise
    finally:
        if os.path.isdir(building):
            shutil.rmtree(building, ignore_errors=True)
    return final


def standard_transform(size: int = CROP_SIZE) -> T.Compose:
    """``RandomResizedCrop(size)``, ``RandomHorizontalFlip()``, ``ToArray()``."""
    return T.Compose([T.RandomResizedCrop(size), T.RandomHorizontalFlip(), T.ToArray()])


@functools.lru_cache(maxsize=4)
def _scanned_folder(root: str) -> ImageFolder:
    # Scanning a million-file folder takes seconds; every measurement of a run
    # shares one scan (the sample table is immutable, so sharing is safe).
    return ImageFolder(root)


def full_decode_loader(path: str) -> Any:
    """``pil_loader`` under another name: a loader that is not ``default_loader`` is never
    planned, so ``ImageFolder`` decodes every JPEG in full, as torchvision does."""
    return pil_loader(path)


def _image_folder(root: str, transform: Any = None, decode: str = "auto") -> ImageFolder:
    """``ImageFolder(root, transform=transform)``, reusing an earlier scan of ``root``.

    ``decode="full"`` gives it ``full_decode_loader``, the way a user asks for
    torchvision's full decode; ``"auto"`` keeps the reduced-size JPEG decode.
    """
    if decode not in ("auto", "full"):
        raise ValueError(f"decode must be 'auto' or 'full', got {decode!r}")
    folder = copy.copy(_scanned_folder(os.path.abspath(root)))
    folder.transform = transform
    if decode == "full":
        folder.loader = full_decode_loader
    return folder


def reduced_decode_shares(root: str, *, max_images: int | None = None, seed: int = 0,
                          probe: int = 256) -> dict[int, float]:
    """The share of images fastload's pipeline decodes at each JPEG reduction (1, 2, 4, 8).

    Plans the standard transform's region for up to ``probe`` of the files
    from their headers alone, drawing crops as the pipeline does, so the
    report can say which decode fastload used without instrumenting workers.
    """
    from PIL import Image

    from .rng import seed_transform_rng

    folder = _image_folder(root)
    pool = _sample_indices(len(folder), max_images)
    pool = np.arange(len(folder)) if pool is None else pool
    chosen = np.random.default_rng(seed).choice(pool, size=min(probe, len(pool)), replace=False)
    head = standard_transform().transforms[0]
    seed_transform_rng(seed, 0)
    counts = {1: 0, 2: 0, 4: 0, 8: 0}
    for index in chosen:
        try:
            with Image.open(folder.samples.path(int(index))) as img:
                is_jpeg, (width, height) = img.format == "JPEG", img.size
        except OSError:
            continue  # the measurement itself reports an unreadable file, naming its sample
        reduction = head.plan_region(width, height).max_reduction() if is_jpeg else 1
        counts[reduction] += 1
    probed = sum(counts.values())
    return {reduction: count / probed if probed else 0.0 for reduction, count in counts.items()}


def _sample_indices(count: int, max_images: int | None) -> np.ndarray | None:
    """The same random subset of ``max_images`` indices in every call (None: use all)."""
    if max_images is None or max_images >= count:
        return None
    return np.sort(np.random.default_rng(0).choice(count, size=max_images, replace=False))


def _mean_file_bytes(dataset: ImageFolder, indices: np.ndarray | None) -> float:
    """Mean compressed size of the benchmarked files (from up to 2000 of them)."""
    pool = np.arange(len(dataset)) if indices is None else indices
    probe = np.random.default_rng(0).choice(pool, size=min(2000, len(pool)), replace=False)
    return float(np.mean([os.path.getsize(dataset.samples.path(int(i))) for i in probe]))


def _result(framework: str, workers: int, batch_size: int, images: int, seconds: float,
            first_batch_s: float | None, mean_file_bytes: float) -> dict:
    rate = images / seconds if seconds > 0 else float("inf")
    return {
        "framework": framework,
        "workers": workers,
        "batch_size": batch_size,
        "images": images,
        "seconds": seconds,
        "images_per_s": rate,
        "input_mb_per_s": rate * mean_file_bytes / 1e6,
        "output_mb_per_s": rate * 3 * CROP_SIZE * CROP_SIZE / 1e6,
        "first_batch_s": first_batch_s,
    }


def _run_epochs(loader: Any, epochs: int, description: str,
                progress: bool) -> tuple[int, float, float | None]:
    """Iterate ``loader`` for ``epochs`` epochs; returns (images, seconds, first batch latency).

    Batches are ``(images, targets)``; only their length is looked at.
    """
    bar = progress_bar(epochs * len(loader.dataset), description, progress)
    images, seconds, first_batch = 0, 0.0, None
    for _ in range(epochs):
        start = time.perf_counter()
        for batch in loader:
            count = len(batch[1])
            images += count
            if first_batch is None:
                first_batch = time.perf_counter() - start
            if bar is not None:
                bar.update(count)
        seconds += time.perf_counter() - start
    if bar is not None:
        bar.close()
    return images, seconds, first_batch


def measure_pipeline_limit(root: str, workers: int = 1, *, max_images: int | None = None,
                           seed: int = 0, decode: str = "auto", progress: bool = False) -> dict:
    """Single-process rate of the pipeline with no loader, and that rate times ``workers``.

    Returns the result dict (``framework="pipeline"``) plus
    ``limit_images_per_s``: the rate times ``max(workers, 1)``.
    """
    from .rng import seed_transform_rng

    dataset = _image_folder(root, standard_transform(), decode)
    indices = _sample_indices(len(dataset), max_images)
    order = np.random.default_rng(seed).permutation(len(dataset) if indices is None else indices)
    bar = progress_bar(len(order), "pipeline, no loader", progress)
    seed_transform_rng(seed, 0)
    start = time.perf_counter()
    for index in order:
        dataset[int(index)]
        if bar is not None:
            bar.update(1)
    seconds = time.perf_counter() - start
    if bar is not None:
        bar.close()
    result = _result("pipeline", 0, 1, len(order), seconds, None,
                     _mean_file_bytes(dataset, indices))
    result["limit_images_per_s"] = result["images_per_s"] * max(workers, 1)
    return result


def measure_fastload(root: str, workers: int, batch_size: int = 64, *, epochs: int = 1,
                     max_images: int | None = None, seed: int = 0, decode: str = "auto",
                     progress: bool = False) -> dict:
    """Images/s of ``fastload.DataLoader`` over ``ImageFolder(root)`` with the standard pipeline."""
    from .dataloader import DataLoader
    from .dataset import Subset

    folder = _image_folder(root, standard_transform(), decode)
    indices = _sample_indices(len(folder), max_images)
    dataset = folder if indices is None else Subset(folder, indices)
    loader = DataLoader(dataset, batch_size=batch_size, shuffle=True, num_workers=workers,
                        generator=seed)
    images, seconds, first = _run_epochs(loader, epochs, f"fastload, {workers} workers", progress)
    return _result("fastload", workers, batch_size, images, seconds, first,
                   _mean_file_bytes(folder, indices))


class TorchvisionStylePipeline:
    """What a torchvision user's ``ImageFolder`` + transforms do per sample, without torchvision.

    ``pil_loader`` (open, ``convert("RGB")``), ``RandomResizedCrop`` with its
    ``get_params`` drawn from torch's RNG, Pillow crop and bilinear resize,
    ``RandomHorizontalFlip`` (``torch.rand(1) < 0.5``), then ``PILToTensor``'s
    conversion.  Samples are a plain list of ``(path, target)`` tuples, as
    torchvision keeps them.  torch is imported only when a sample is loaded.
    """

    def __init__(self, samples: list[tuple[str, int]], size: int,
                 scale: tuple[float, float] = (0.08, 1.0),
                 ratio: tuple[float, float] = (3.0 / 4.0, 4.0 / 3.0)) -> None:
        self.samples = samples
        self.size = size
        self.scale = scale
        self.ratio = ratio

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, index: int) -> tuple[Any, int]:
        import math

        import torch
        from PIL import Image

        path, target = self.samples[index]
        with open(path, "rb") as f:
            img = Image.open(f).convert("RGB")
        width, height = img.size
        area = height * width
        log_ratio = torch.log(torch.tensor(self.ratio))
        for _ in range(10):
            target_area = area * torch.empty(1).uniform_(self.scale[0], self.scale[1]).item()
            aspect_ratio = math.exp(torch.empty(1).uniform_(log_ratio[0], log_ratio[1]).item())
            w = int(round(math.sqrt(target_area * aspect_ratio)))
            h = int(round(math.sqrt(target_area / aspect_ratio)))
            if 0 < w <= width and 0 < h <= height:
                top = int(torch.randint(0, height - h + 1, size=(1,)).item())
                left = int(torch.randint(0, width - w + 1, size=(1,)).item())
                break
        else:  # torchvision's fallback: the central crop, clamped to the ratio range
            in_ratio = width / height
            if in_ratio < min(self.ratio):
                w, h = width, int(round(width / min(self.ratio)))
            elif in_ratio > max(self.ratio):
                w, h = int(round(height * max(self.ratio))), height
            else:
                w, h = width, height
            top, left = (height - h) // 2, (width - w) // 2
        img = img.crop((left, top, left + w, top + h)).resize((self.size, self.size),
                                                             Image.Resampling.BILINEAR)
        if torch.rand(1) < 0.5:
            img = img.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
        pixels = torch.from_numpy(np.array(img, copy=True))
        return pixels.view(img.size[1], img.size[0], 3).permute(2, 0, 1), target


def measure_torch(root: str, workers: int, batch_size: int = 64, *, epochs: int = 1,
                  max_images: int | None = None, seed: int = 0, decode: str = "auto",
                  progress: bool = False) -> dict:
    """Images/s of ``torch.utils.data.DataLoader`` with a torchvision user's equivalent pipeline.

    It always decodes in full, as torchvision does; ``decode`` is accepted so
    every ``measure_*`` takes the same options.
    """
    import torch
    import torch.utils.data

    folder = _image_folder(root)  # only for the file list: torchvision's order, same files
    indices = _sample_indices(len(folder), max_images)
    dataset: Any = TorchvisionStylePipeline(list(folder.samples), CROP_SIZE)
    if indices is not None:
        dataset = torch.utils.data.Subset(dataset, indices.tolist())
    loader = torch.utils.data.DataLoader(dataset, batch_size=batch_size, shuffle=True,
                                         num_workers=workers,
                                         generator=torch.Generator().manual_seed(seed))
    images, seconds, first = _run_epochs(loader, epochs, f"torch, {workers} workers", progress)
    return _result("torch", workers, batch_size, images, seconds, first,
                   _mean_file_bytes(folder, indices))


def measure_fastload_cached(root: str, workers: int, cache: str, batch_size: int = 64, *,
                            epochs: int = 2, max_images: int | None = None, seed: int = 0,
                            cache_format: str = "raw", cache_max_side: int = 512,
                            decode: str = "auto", progress: bool = False) -> list[dict]:
    """One result per epoch of ``fastload.DataLoader`` over ``ImageFolder(root, cache=cache)``.

    Epoch 1 fills the decoded-image cache (unless an earlier run did);
    later epochs read it.  Each result also holds ``cache_entries``: how many
    images the store held after that epoch.  ``decode`` is accepted with the
    other common options and changes nothing: filling the cache always
    decodes in full, and later epochs decode no JPEG.
    """
    from .dataloader import DataLoader
    from .dataset import Subset
    from .vision.cache import DecodedImageCache

    folder = _image_folder(root, standard_transform())  # a copy: the cache is this one's
    folder.image_cache = DecodedImageCache(cache, max_side=cache_max_side, format=cache_format)
    indices = _sample_indices(len(folder), max_images)
    dataset = folder if indices is None else Subset(folder, indices)
    loader = DataLoader(dataset, batch_size=batch_size, shuffle=True, num_workers=workers,
                        generator=seed)
    results = []
    for epoch in range(1, epochs + 1):
        images, seconds, first = _run_epochs(loader, 1, f"fastload + cache, epoch {epoch}",
                                             progress)
        result = _result("fastload+cache", workers, batch_size, images, seconds, first,
                         _mean_file_bytes(folder, indices))
        store = DecodedImageCache(cache)
        store.refresh()
        result["cache_entries"] = store.stats()["entries"]
        results.append(result)
    return results


def compare_rounds(root: str, workers: int, batch_size: int = 64, *, rounds: int = 3,
                   epochs: int = 1, max_images: int | None = None, seed: int = 0,
                   decode: str = "auto", frameworks: Sequence[str] = ("fastload", "torch"),
                   progress: bool = False) -> dict[str, dict]:
    """Run each framework ``rounds`` times, alternating (and alternating who goes first).

    Alternation spreads drift (page cache warming, thermal throttling, other
    load) over both; each framework's result is its median-rate round, with
    every round's rate under ``round_images_per_s``.
    """
    measure = {"fastload": measure_fastload, "torch": measure_torch}
    runs: dict[str, list[dict]] = {name: [] for name in frameworks}
    for round_no in range(rounds):
        order = list(frameworks) if round_no % 2 == 0 else list(reversed(frameworks))
        for name in order:
            runs[name].append(measure[name](root, workers, batch_size, epochs=epochs,
                                            max_images=max_images, seed=seed + round_no,
                                            decode=decode, progress=progress))
    summary = {}
    for name, results in runs.items():
        rates = [r["images_per_s"] for r in results]
        median = sorted(results, key=lambda r: r["images_per_s"])[len(results) // 2]
        summary[name] = dict(median, rounds=rounds, round_images_per_s=rates,
                             images_per_s_median=statistics.median(rates))
    return summary


def plot_scaling(points: dict[str, dict[int, float]], limit_per_worker: float, path: str,
                 title: str) -> None:
    """Images/s against worker count, one line per framework, plus the pipeline limit."""
    import matplotlib

    matplotlib.use("Agg")  # files only; never needs a display
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(6.4, 4.2))
    all_workers = sorted({w for series in points.values() for w in series})
    limit = [limit_per_worker * max(w, 1) for w in all_workers]
    axes.plot(all_workers, limit, linestyle="--", color="grey",
              label="limit: single-core pipeline x workers")
    for name, series in points.items():
        workers = sorted(series)
        axes.plot(workers, [series[w] for w in workers], marker="o", label=name)
    axes.set_xlabel("num_workers")
    axes.set_ylabel("images / s")
    axes.set_xticks(all_workers)
    axes.set_ylim(bottom=0)
    axes.set_title(title)
    axes.grid(alpha=0.3)
    axes.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


# -- the command line ---------------------------------------------------------


def _parse_size(text: str) -> tuple[int, int]:
    import argparse

    try:
        width, height = (int(part) for part in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--size must look like 500x375 (width x height), got {text!r}")
    if width < 1 or height < 1:
        raise argparse.ArgumentTypeError(f"--size must be positive, got {text!r}")
    return width, height


def _parse_worker_list(text: str) -> list[int]:
    import argparse

    try:
        counts = sorted({int(part) for part in text.split(",")})
    except ValueError:
        raise argparse.ArgumentTypeError(f"--plot-workers must be comma-separated ints, got {text!r}")
    if not counts or counts[0] < 0:
        raise argparse.ArgumentTypeError(f"--plot-workers must be non-negative ints, got {text!r}")
    return counts


def add_arguments(parser: Any) -> None:
    """The options of ``python -m fastload bench``."""
    cores = os.cpu_count() or 1
    parser.add_argument("root", nargs="?", metavar="ROOT",
                        help="an ImageFolder directory (ROOT/<class>/<image>); default: a cached "
                             "synthetic one, see --images/--size/--classes")
    synthetic = parser.add_argument_group("synthetic dataset (when ROOT is not given)")
    synthetic.add_argument("--images", type=int, default=2000, help="number of images (default 2000)")
    synthetic.add_argument("--size", type=_parse_size, default=(500, 375), metavar="WxH",
                           help="image size (default 500x375; e.g. 4000x3000 for camera photos)")
    synthetic.add_argument("--classes", type=int, default=10, help="number of classes (default 10)")
    synthetic.add_argument("--cache-dir", default=None,
                           help=f"where synthetic folders are kept (default {default_cache_dir()})")
    parser.add_argument("--batch-size", type=int, default=64, help="batch size (default 64)")
    parser.add_argument("--workers", type=int, default=cores,
                        help=f"num_workers (default: all cores, {cores})")
    parser.add_argument("--epochs", type=int, default=1, help="epochs per measurement (default 1)")
    parser.add_argument("--rounds", type=int, default=None,
                        help="alternating rounds with --compare (default 3; 1 without)")
    parser.add_argument("--max-images", type=int, default=None,
                        help="use a fixed random subset of this many images (for huge folders)")
    parser.add_argument("--compare", choices=["torch"], default=None,
                        help="also run torch.utils.data.DataLoader on the same files and pipeline")
    parser.add_argument("--plot", metavar="FILE.png", default=None,
                        help="draw images/s against worker count (see --plot-workers)")
    parser.add_argument("--plot-workers", type=_parse_worker_list, default=None, metavar="0,1,2",
                        help="worker counts for --plot (default 0 .. cores)")
    parser.add_argument("--decode", choices=["auto", "full"], default="auto",
                        help="auto (default): fastload decodes a JPEG at 1/2 to 1/8 of its size when "
                             "the crop is at least twice the output each way; full: fastload decodes "
                             "every image in full, as torch's side always does (like for like)")
    parser.add_argument("--seed", type=int, default=0, help="shuffle and augmentation seed (default 0)")
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")
    add_cache_arguments(parser)


def add_cache_arguments(parser: Any) -> None:
    """``--cache DIR``: measure ``ImageFolder(cache=DIR)``, epoch 1 and later epochs apart."""
    parser.add_argument("--cache", metavar="DIR", default=None,
                        help="use a decoded-image cache in DIR (ImageFolder(cache=DIR)) and report "
                             "epoch 1 (filling it) and later epochs (reading it) separately; "
                             "--epochs counts both (at least 2)")
    parser.add_argument("--cache-format", choices=["raw", "jpeg"], default="raw",
                        help="how --cache stores images (default raw pixels)")
    parser.add_argument("--cache-max-side", type=int, default=512, metavar="PIXELS",
                        help="longest side of a cached image (default 512)")


def _check_options(options: Any) -> None:
    for name in ("images", "classes", "batch_size", "epochs"):
        if getattr(options, name) < 1:
            raise SystemExit(f"fastload bench: --{name.replace('_', '-')} must be at least 1, "
                             f"got {getattr(options, name)}")
    if options.workers < 0:
        raise SystemExit(f"fastload bench: --workers must be >= 0, got {options.workers}")
    if options.rounds is not None and options.rounds < 1:
        raise SystemExit(f"fastload bench: --rounds must be at least 1, got {options.rounds}")
    if options.max_images is not None and options.max_images < 1:
        raise SystemExit(f"fastload bench: --max-images must be at least 1, got {options.max_images}")
    if options.root is not None and not os.path.isdir(options.root):
        raise SystemExit(f"fastload bench: ROOT {options.root!r} is not a directory")
    if getattr(options, "cache", None) is not None and options.cache_max_side < 1:
        raise SystemExit(f"fastload bench: --cache-max-side must be at least 1, got "
                         f"{options.cache_max_side}")
    if options.root is None and options.images < options.classes:
        raise SystemExit(f"fastload bench: --images ({options.images}) must be at least --classes "
                         f"({options.classes}): the synthetic folder needs an image in every class")
    # What would fail after minutes of measuring fails now instead.
    if options.compare and importlib.util.find_spec(options.compare) is None:
        raise SystemExit(f"fastload bench: --compare {options.compare} needs {options.compare}, "
                         f"which is not installed: pip install 'fastload[bench]'")
    if options.plot is not None:
        if importlib.util.find_spec("matplotlib") is None:
            raise SystemExit("fastload bench: --plot needs matplotlib, which is not installed: "
                             "pip install 'fastload[bench]'")
        directory = os.path.dirname(os.path.abspath(options.plot))
        if not os.path.isdir(directory):
            raise SystemExit(f"fastload bench: --plot {options.plot!r}: directory {directory!r} "
                             f"does not exist")
        if not os.access(directory, os.W_OK):
            raise SystemExit(f"fastload bench: --plot {options.plot!r}: directory {directory!r} "
                             f"is not writable")
        from matplotlib.backend_bases import FigureCanvasBase

        formats = FigureCanvasBase.get_supported_filetypes()
        extension = os.path.splitext(options.plot)[1][1:].lower()
        if extension and extension not in formats:  # none: matplotlib's default, PNG
            raise SystemExit(f"fastload bench: --plot {options.plot!r}: matplotlib cannot write "
                             f"'.{extension}' files; use one of "
                             f"{', '.join('.' + name for name in sorted(formats))}")


def _line(label: str, result: dict, limit: float | None = None) -> str:
    text = (f"{label:<28}{result['images_per_s']:>9.1f} images/s  "
            f"{result['input_mb_per_s']:>7.1f} MB/s read  {result['output_mb_per_s']:>7.1f} MB/s out")
    if result.get("first_batch_s") is not None:
        text += f"  first batch {result['first_batch_s']:.2f} s"
    if limit:
        text += f"  {100 * result['images_per_s'] / limit:.0f}% of limit"
    return text


def _decode_line(root: str, options: Any) -> str:
    """Which JPEG decode each side uses, so a ratio is never read as like for like when not."""
    if options.decode == "full":
        return "  decode: full on both sides (--decode full)"
    shares = reduced_decode_shares(root, max_images=options.max_images, seed=options.seed)
    if not any(shares.values()):
        return "  decode: unknown (none of the probed files could be opened)"
    if shares[1] == 1.0:
        return ("  decode: full on both sides (no crop is large enough for a reduced-size "
                "JPEG decode)")
    reduced = ", ".join(f"1/{r}: {100 * share:.0f}%" for r, share in shares.items()
                        if r > 1 and share > 0)
    rest = ", full for the rest" if shares[1] > 0 else ""
    return (f"  decode: fastload reduced-size JPEG decode for {100 * (1 - shares[1]):.0f}% of "
            f"images ({reduced}){rest}; torch full; --decode full compares like for like")


def run(options: Any) -> int:
    """Run the benchmark described by parsed ``options``; prints a report, returns an exit code.

    Problems with the folder or its files (none found, unreadable, not an
    image) end the command with their message, which names the path, and exit
    code 1; Ctrl-C ends it with code 130.  A traceback through the benchmark's
    own code would only bury the message.  Other errors keep their traceback:
    they are bugs to report.
    """
    _check_options(options)
    try:
        return _measure_and_report(options)
    except KeyboardInterrupt:
        print("\nfastload bench: interrupted", file=sys.stderr)
        return 130
    except OSError as error:
        print(f"fastload bench: {error}", file=sys.stderr)
        return 1


def _measure_and_report(options: Any) -> int:
    progress = not options.no_progress
    if options.root is None:
        root = synthetic_image_folder(options.images, options.size, options.classes,
                                      cache_dir=options.cache_dir, progress=progress)
        origin = f"synthetic, {options.size[0]}x{options.size[1]} JPEGs"
    else:
        root = options.root
        origin = "given folder"
    try:
        folder = _image_folder(root)
    except FileNotFoundError as error:
        # torchvision's messages: "no valid file" names only the classes.
        if str(root) not in str(error):
            raise FileNotFoundError(f"{root}: {error}") from error
        raise
    count = len(folder) if options.max_images is None else min(options.max_images, len(folder))
    rounds = options.rounds or (3 if options.compare else 1)
    print(f"fastload bench: {root}\n  {origin}; {count} of {len(folder)} images in "
          f"{len(folder.classes)} classes; pipeline RandomResizedCrop({CROP_SIZE}), "
          f"RandomHorizontalFlip, to uint8 CHW; batch {options.batch_size}, "
          f"{options.workers} workers, {options.epochs} epoch(s) x {rounds} round(s)", flush=True)

    common = dict(max_images=options.max_images, seed=options.seed, decode=options.decode)
    if getattr(options, "cache", None) is not None:
        print("  decode: fastload decodes in full while epoch 1 fills the cache, then reads "
              "cached pixels; torch full", flush=True)
        return _report_cached(options, root, rounds, progress, common)
    print(_decode_line(root, options), flush=True)
    pipeline = measure_pipeline_limit(root, options.workers, progress=progress, **common)
    limit = pipeline["limit_images_per_s"]
    print(_line("pipeline, no loader, 1 proc", pipeline))
    processes = f"{options.workers} workers" if options.workers else "1 process"
    print(f"{'limit (x ' + processes + ')':<28}{limit:>9.1f} images/s")

    frameworks = ["fastload"] + ([options.compare] if options.compare else [])
    summary = compare_rounds(root, options.workers, options.batch_size, rounds=rounds,
                             epochs=options.epochs, frameworks=frameworks, progress=progress, **common)
    for name in frameworks:
        result = summary[name]
        print(_line(f"{name} ({options.workers} workers)", result, limit))
        if rounds > 1:
            print(f"{'':<28}rounds: " + ", ".join(f"{r:.1f}" for r in result["round_images_per_s"]))
    if options.compare:
        ratio = summary["fastload"]["images_per_s"] / summary[options.compare]["images_per_s"]
        print(f"{'fastload / ' + options.compare:<28}{ratio:>9.2f}x")

    if options.plot:
        cores = os.cpu_count() or 1
        counts = options.plot_workers or list(range(0, cores + 1))
        points: dict[str, dict[int, float]] = {name: {} for name in frameworks}
        for workers in counts:
            result = compare_rounds(root, workers, options.batch_size, rounds=rounds,
                                    epochs=options.epochs, frameworks=frameworks, progress=progress,
                                    **common)
            for name in frameworks:
                points[name][workers] = result[name]["images_per_s"]
                print(f"  plot point: {name:<9} {workers} workers "
                      f"{points[name][workers]:>9.1f} images/s")
        title = f"{os.path.basename(root.rstrip(os.sep))}: batch {options.batch_size}, {cores} cores"
        plot_scaling(points, pipeline["images_per_s"], options.plot, title)
        print(f"plot written to {options.plot}")
    return 0


def _report_cached(options: Any, root: str, rounds: int, progress: bool, common: dict) -> int:
    """``--cache DIR``: epoch 1 and epochs 2.. of the cached loader, apart; torch with --compare."""
    epochs = max(options.epochs, 2)
    per_round: list[list[dict]] = []
    torch_rates: list[float] = []
    for round_no in range(rounds):
        seeded = dict(common, seed=options.seed + round_no)
        per_round.append(measure_fastload_cached(root, options.workers, options.cache,
                                                 options.batch_size, epochs=epochs,
                                                 cache_format=options.cache_format,
                                                 cache_max_side=options.cache_max_side,
                                                 progress=progress, **seeded))
        if options.compare:
            torch_rates.append(measure_torch(root, options.workers, options.batch_size,
                                             progress=progress, **seeded)["images_per_s"])
    median = statistics.median
    first = [results[0] for results in per_round]
    print(_line(f"cache, epoch 1 ({options.workers} w)", sorted(
        first, key=lambda r: r["images_per_s"])[len(first) // 2]))
    print(f"{'':<28}rounds: " + ", ".join(f"{r['images_per_s']:.1f}" for r in first)
          + f"; store then held {first[0]['cache_entries']} images ({options.cache})")
    later = [median(r["images_per_s"] for r in results[1:]) for results in per_round]
    print(f"{'cache, epochs 2-' + str(epochs):<28}{median(later):>9.1f} images/s  rounds: "
          + ", ".join(f"{rate:.1f}" for rate in later))
    if torch_rates:
        print(f"{'torch (' + str(options.workers) + ' workers)':<28}{median(torch_rates):>9.1f} "
              f"images/s")
        print(f"{'cache epochs 2+ / torch':<28}{median(later) / median(torch_rates):>9.2f}x")
    return 0
