"""How close fastload's default decode comes to torchvision's, on the bench's own files.

``decode_psnr`` draws ``RandomResizedCrop(224)`` crops for some of the files,
as the pipeline draws them, and compares fastload's default output (a JPEG
decoded at 1/2 to 1/8 scale when the crop allows) with torchvision's steps on
the same crop (decode in full, crop, resize), as a PSNR.  Crops decoded in
full are the same bit for bit and are only counted.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..rng import seed_transform_rng
from ..vision import transforms as T
from ..vision.decode import decode_planned, pil_loader
from .pipelines import image_folder, sample_indices, standard_transform

__all__ = ["DecodeFidelity", "psnr", "decode_psnr"]


@dataclass(frozen=True)
class DecodeFidelity:
    """``mean_psnr_db`` over the ``differing`` crops (those a reduced-size decode made;
    None if none), their lowest, and how many crops were compared in all."""

    mean_psnr_db: float | None
    min_psnr_db: float | None
    differing: int
    probed: int


def psnr(got: np.ndarray, expected: np.ndarray) -> float:
    """Peak signal-to-noise ratio of two uint8 images of one shape, in dB (inf if equal)."""
    error = np.mean((got.astype(np.float64) - expected.astype(np.float64)) ** 2)
    return float("inf") if error == 0 else float(10 * np.log10(255.0 ** 2 / error))


def decode_psnr(root: str, *, max_images: int | None = None, seed: int = 0,
                probe: int = 32) -> DecodeFidelity:
    """The default decode's PSNR against torchvision's on up to ``probe`` of ``root``'s
    files (of the first ``max_images``, as the bench picks them), one crop each.

    A file that cannot be read is skipped: the measurement itself reports it,
    naming its sample.
    """
    folder = image_folder(root)
    pool = sample_indices(len(folder), max_images)
    pool = np.arange(len(folder)) if pool is None else pool
    chosen = np.random.default_rng(seed).choice(pool, size=min(probe, len(pool)), replace=False)
    head = standard_transform().transforms[0]
    to_array = T.ToArray()
    values, probed = [], 0
    for index in chosen:
        path = folder.samples.path(int(index))
        seed_transform_rng(seed, int(index))
        try:
            got, _ = decode_planned(path, head, [to_array])
            full = pil_loader(path)
        except OSError:
            continue
        seed_transform_rng(seed, int(index))
        plan = head.plan_region(*full.size)
        probed += 1
        expected = to_array(plan.render(full))
        if not np.array_equal(got, expected):
            values.append(psnr(got, expected))
    if not values:
        return DecodeFidelity(None, None, 0, probed)
    return DecodeFidelity(float(np.mean(values)), float(min(values)), len(values), probed)
