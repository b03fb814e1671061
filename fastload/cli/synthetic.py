"""Synthetic photographs and image folders, for tests and benchmarks.

Flat noise is a poor stand-in for photos: it compresses badly and decodes at a
different speed.  These images have what photos have in JPEG terms: smooth
gradients (the sky), a few hard-edged shapes (objects), low-frequency
blotches (lighting) and fine grain (sensor noise, texture).  They compress
somewhat better than ImageNet's photos of the same size, so real files decode
somewhat slower than these.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor

import numpy as np
from PIL import Image

__all__ = ["synthetic_image", "write_image_folder"]


# Structure is drawn at no more than this many pixels on the long side and
# upscaled: camera-size images then cost milliseconds, not seconds, to make.
_STRUCTURE_MAX_SIDE = 640
_GRAIN_TILE = 256


def synthetic_image(width: int, height: int, rng: np.random.Generator) -> np.ndarray:
    """An ``(height, width, 3)`` uint8 photo-like image drawn from ``rng``."""
    if width <= 0 or height <= 0:
        raise ValueError(f"image size must be positive, got {width}x{height}")
    shrink = max(1.0, max(width, height) / _STRUCTURE_MAX_SIDE)
    base_width, base_height = max(1, round(width / shrink)), max(1, round(height / shrink))
    image = _structure(base_width, base_height, rng)
    if (base_width, base_height) != (width, height):
        image = np.asarray(Image.fromarray(image).resize((width, height), Image.Resampling.BICUBIC))
    # Fine grain at full resolution, from a random tile (drawing a fresh normal
    # per pixel would dominate the cost for large images).
    tile = rng.normal(0, 8, size=(_GRAIN_TILE, _GRAIN_TILE)).astype(np.int16)
    reps = (-(-height // _GRAIN_TILE), -(-width // _GRAIN_TILE))
    grain = np.tile(tile, reps)[:height, :width, None]
    return np.clip(image.astype(np.int16) + grain, 0, 255).astype(np.uint8)


def _structure(width: int, height: int, rng: np.random.Generator) -> np.ndarray:
    """Gradient, lighting, shapes and stripes, without grain, as uint8 (height, width, 3)."""
    ys = np.linspace(0.0, 1.0, height, dtype=np.float32)[:, None]
    xs = np.linspace(0.0, 1.0, width, dtype=np.float32)[None, :]

    # Background: a linear gradient between two random colours, at a random angle.
    angle = rng.uniform(0, 2 * np.pi)
    ramp = np.cos(angle) * xs + np.sin(angle) * ys
    ramp = (ramp - ramp.min()) / max(float(ramp.max() - ramp.min()), 1e-6)
    start, end = rng.uniform(0, 255, size=(2, 3)).astype(np.float32)
    image = start + ramp[..., None] * (end - start)

    # Lighting: low-frequency blotches, a coarse random grid upsampled smoothly.
    coarse = Image.fromarray(rng.normal(0, 25, size=(5, 7)).astype(np.float32))
    image += np.asarray(coarse.resize((width, height), Image.Resampling.BICUBIC))[..., None]

    # Objects: a few filled ellipses and rectangles of random colour.
    short_side = min(width, height)
    for _ in range(int(rng.integers(2, 6))):
        colour = rng.uniform(0, 255, size=3).astype(np.float32)
        cx, cy = rng.uniform(0, 1), rng.uniform(0, 1)
        rx, ry = rng.uniform(0.05, 0.3, size=2) * short_side / np.array([width, height])
        if rng.random() < 0.5:
            mask = ((xs - cx) / rx) ** 2 + ((ys - cy) / ry) ** 2 <= 1.0
        else:
            mask = (np.abs(xs - cx) <= rx) & (np.abs(ys - cy) <= ry)
        image = np.where(mask[..., None], colour, image)

    # Texture: diagonal stripes on the lower part of the image.
    period = rng.uniform(4, 16)
    stripes = 12.0 * np.sin(2 * np.pi * (xs * width + ys * height) / period)
    image += np.where(ys > rng.uniform(0.3, 0.9), stripes, 0.0)[..., None]
    return np.clip(image, 0, 255).astype(np.uint8)


# Images are written in chunks of this many, each from its own seed, so the
# pixels do not depend on how many processes share the work.
_CHUNK = 16

_EXTENSIONS = {"JPEG": "jpg", "PNG": "png", "BMP": "bmp", "WEBP": "webp"}


def write_image_folder(root: str | os.PathLike, images_per_class: Sequence[int] | int,
                       size: tuple[int, int], classes: int | None = None, seed: int = 0,
                       image_format: str = "JPEG", quality: int = 90, workers: int = 1,
                       on_progress: Callable[[int], None] | None = None) -> list[str]:
    """Write ``root/class_<k>/img_<i>.<ext>`` images; returns the paths written, in order.

    ``images_per_class`` is a count per class, or one count for each of
    ``classes``.  ``size`` is ``(width, height)``.  The same ``seed`` writes the
    same pixels whatever ``workers`` is; ``workers > 1`` uses that many
    processes.  ``on_progress(n)`` is called as each chunk of ``n`` images lands.
    """
    if isinstance(images_per_class, int):
        if classes is None:
            raise ValueError("write_image_folder needs `classes` when images_per_class is one int")
        counts = [images_per_class] * classes
    else:
        counts = list(images_per_class)
    image_format = image_format.upper()
    if image_format not in _EXTENSIONS:
        raise ValueError(f"unsupported image_format {image_format!r}: "
                         f"use one of {', '.join(_EXTENSIONS)}")
    root = os.fspath(root)
    # Zero-padded so that the sorted class names are in class-number order.
    class_names = [f"class_{i:0{max(2, len(str(len(counts) - 1)))}d}" for i in range(len(counts))]
    jobs = [(os.path.join(root, class_names[class_index]), class_index, first,
             min(_CHUNK, count - first), tuple(size), seed, image_format, quality)
            for class_index, count in enumerate(counts) for first in range(0, count, _CHUNK)]
    written: list[str] = []
    if workers > 1 and len(jobs) > 1:
        with ProcessPoolExecutor(max_workers=workers) as pool:
            for paths in pool.map(_write_chunk, *zip(*jobs)):
                written += paths
                if on_progress is not None:
                    on_progress(len(paths))
    else:
        for job in jobs:
            paths = _write_chunk(*job)
            written += paths
            if on_progress is not None:
                on_progress(len(paths))
    return written


def _write_chunk(class_dir: str, class_index: int, first: int, count: int, size: tuple[int, int],
                 seed: int, image_format: str, quality: int) -> list[str]:
    os.makedirs(class_dir, exist_ok=True)
    rng = np.random.default_rng([seed, class_index, first])
    options = {"quality": quality} if image_format in ("JPEG", "WEBP") else {}
    paths = []
    for image_index in range(first, first + count):
        path = os.path.join(class_dir, f"img_{image_index:05d}.{_EXTENSIONS[image_format]}")
        Image.fromarray(synthetic_image(size[0], size[1], rng)).save(path, image_format, **options)
        paths.append(path)
    return paths
