"""Images/s of each pipeline over timed epochs, in alternating rounds.

What is measured, and how
-------------------------
* ``measure_fastload`` runs ``fastload.DataLoader`` over ``ImageFolder``
  with ``standard_transform()``, in shuffled batches (64 by default).
* ``measure_torch`` runs ``torch.utils.data.DataLoader`` over the same files
  with ``TorchvisionStylePipeline`` (torchvision's ``pil_loader``, the crop
  drawn with torch's RNG as ``RandomResizedCrop.get_params`` does, Pillow
  crop+resize and flip, then ``PILToTensor``'s conversion) and torch's
  ``default_collate``.
* ``measure_pipeline_limit`` is the single-process rate of fastload's
  pipeline with no loader (a plain loop over ``dataset[i]``); times the worker
  count it is the most any loader could deliver on this machine.
* ``measure_fastload``'s result also holds the loader's ``report()``
  (where the time went: the consumer's wait, each stage, each worker).
* Rates are images per wall-clock second over whole epochs, worker start-up
  included (it is part of what a user waits for); the first batch's latency
  is reported separately.  ``input_mb_per_s`` is compressed file bytes read,
  ``output_mb_per_s`` decoded batch bytes delivered.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..vision.folder import ImageFolder
from .pipelines import (CROP_SIZE, TorchvisionStylePipeline, image_folder, sample_indices,
                        standard_transform)
from .progress import DataWaitNote, progress_bar

__all__ = ["measure_pipeline_limit", "measure_fastload", "measure_torch",
           "measure_fastload_cached", "compare_rounds"]


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
    # fastload's loader says how long the consumer waits for data: shown on the bar.
    note = DataWaitNote(bar, loader) if bar is not None and hasattr(loader, "report") else None
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
                if note is not None:
                    note.update()
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
    from ..rng import seed_transform_rng

    dataset = image_folder(root, standard_transform(), decode)
    indices = sample_indices(len(dataset), max_images)
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
    from ..dataloader import DataLoader
    from ..dataset import Subset

    folder = image_folder(root, standard_transform(), decode)
    indices = sample_indices(len(folder), max_images)
    dataset = folder if indices is None else Subset(folder, indices)
    loader = DataLoader(dataset, batch_size=batch_size, shuffle=True, num_workers=workers,
                        generator=seed)
    images, seconds, first = _run_epochs(loader, epochs, f"fastload, {workers} workers", progress)
    result = _result("fastload", workers, batch_size, images, seconds, first,
                     _mean_file_bytes(folder, indices))
    result["report"] = loader.report()  # where the time went
    return result


def measure_torch(root: str, workers: int, batch_size: int = 64, *, epochs: int = 1,
                  max_images: int | None = None, seed: int = 0, decode: str = "auto",
                  progress: bool = False) -> dict:
    """Images/s of ``torch.utils.data.DataLoader`` with a torchvision user's equivalent pipeline.

    It decodes in full, as torchvision does, except under
    ``decode="both-reduced"``: then its loader asks Pillow for a reduced-size
    decode (``TorchvisionStylePipeline(draft=True)``).
    """
    import torch
    import torch.utils.data

    folder = image_folder(root)  # only for the file list: torchvision's order, same files
    indices = sample_indices(len(folder), max_images)
    dataset: Any = TorchvisionStylePipeline(list(folder.samples), CROP_SIZE,
                                            draft=decode == "both-reduced")
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
    other common options and changes nothing: the fill decodes at the
    smallest JPEG scale that still covers ``cache_max_side``, and later
    epochs decode no JPEG.
    """
    from ..dataloader import DataLoader
    from ..dataset import Subset
    from ..vision.cache import DecodedImageCache

    folder = image_folder(root, standard_transform())  # a copy: the cache is this one's
    folder.image_cache = DecodedImageCache(cache, max_side=cache_max_side, format=cache_format)
    indices = sample_indices(len(folder), max_images)
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
