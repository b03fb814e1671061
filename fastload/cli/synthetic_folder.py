"""The synthetic image folder ``python -m fastload bench`` loads when given no ROOT.

Generated once with ``write_image_folder`` and cached by its parameters, so
the benchmark needs no dataset download and later runs start at once.
"""

from __future__ import annotations

import os
import shutil
import tempfile

from .progress import progress_bar
from .synthetic import write_image_folder

__all__ = ["default_cache_dir", "synthetic_image_folder"]

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
