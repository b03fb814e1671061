"""The two pipelines ``python -m fastload bench`` runs over the same files.

* fastload's: ``ImageFolder`` with ``standard_transform()``:
  ``RandomResizedCrop(224)``, ``RandomHorizontalFlip()``, then to a uint8
  ``(3, 224, 224)`` array; its JPEG decode at reduced size when the crop
  allows (``decode="auto"``) or always in full (``decode="full"``).
* torch's: ``TorchvisionStylePipeline``, what a torchvision user's
  ``ImageFolder`` and transforms do per sample, without torchvision.
"""

from __future__ import annotations

import copy
import functools
import os
from typing import Any

import numpy as np

from ..vision import transforms as T
from ..vision.decode import pil_loader
from ..vision.folder import ImageFolder

__all__ = ["CROP_SIZE", "DECODES", "standard_transform", "full_decode_loader", "image_folder",
           "sample_indices", "reduced_decode_shares", "TorchvisionStylePipeline"]

CROP_SIZE = 224
# How each side decodes: "auto" (fastload reduced when the crop allows, torch
# full), "full" (both full), "both-reduced" (fastload as auto, torch's loader
# with Pillow's draft to the output size).
DECODES = ("auto", "full", "both-reduced")


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


def image_folder(root: str, transform: Any = None, decode: str = "auto") -> ImageFolder:
    """``ImageFolder(root, transform=transform)``, reusing an earlier scan of ``root``.

    ``decode="full"`` gives it ``full_decode_loader``, the way a user asks for
    torchvision's full decode; ``"auto"`` and ``"both-reduced"`` keep the
    reduced-size JPEG decode.
    """
    if decode not in DECODES:
        raise ValueError(f"decode must be one of {DECODES}, got {decode!r}")
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

    from ..rng import seed_transform_rng

    folder = image_folder(root)
    pool = sample_indices(len(folder), max_images)
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


def sample_indices(count: int, max_images: int | None) -> np.ndarray | None:
    """The same random subset of ``max_images`` indices in every call (None: use all)."""
    if max_images is None or max_images >= count:
        return None
    return np.sort(np.random.default_rng(0).choice(count, size=max_images, replace=False))


class TorchvisionStylePipeline:
    """What a torchvision user's ``ImageFolder`` + transforms do per sample, without torchvision.

    ``pil_loader`` (open, ``convert("RGB")``), ``RandomResizedCrop`` with its
    ``get_params`` drawn from torch's RNG, Pillow crop and bilinear resize,
    ``RandomHorizontalFlip`` (``torch.rand(1) < 0.5``), then ``PILToTensor``'s
    conversion.  Samples are a plain list of ``(path, target)`` tuples, as
    torchvision keeps them.  torch is imported only when a sample is loaded.
    With ``draft=True`` the loader first asks Pillow for ``draft("RGB",
    (size, size))``: a JPEG decoded at the smallest of 1/2, 1/4, 1/8 scale
    still at least ``size`` each way, the reduced-size decode a torchvision
    user can have (the loader does not know the crop the transform will draw).
    """

    def __init__(self, samples: list[tuple[str, int]], size: int,
                 scale: tuple[float, float] = (0.08, 1.0),
                 ratio: tuple[float, float] = (3.0 / 4.0, 4.0 / 3.0), draft: bool = False) -> None:
        self.samples = samples
        self.size = size
        self.draft = draft
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
            img = Image.open(f)
            if self.draft:
                img.draft("RGB", (self.size, self.size))
            img = img.convert("RGB")
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
