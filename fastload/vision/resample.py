"""Pillow's resize, flip and ``ToArray`` as one step: ``resize_to_chw``.

A standard training pipeline ends ``RandomResizedCrop -> RandomHorizontalFlip
-> ToArray``.  Pillow's resize reads a few pixels per output pixel in its
horizontal pass and walks down columns in its vertical one, which keeps it
scalar; then the flip makes another image and ``ToArray`` copies and
transposes the pixels.  Here (``_core.resize_packed_to_chw``) the passes read
the pixels where they are, Pillow's memory (lent through its Arrow export) or
the decoded-image cache's mapped bytes: the vertical pass runs along rows
(``_core.resample_rows``' loop, vectorised), the horizontal one gathers the
taps of 8 output pixels at once and writes each channel's plane, mirrored for
the flip: no copy in between.  Every pass does Pillow's own fixed-point
arithmetic, so the pixels are Pillow's, bit for bit.  Where Pillow cannot
lend its memory, ``_resize`` runs the same passes along rows over a copy,
turning columns into rows with 32-bit transposes of ``RGBX`` pixels.

Which pass Pillow runs first shows in the last bit (each pass rounds to 8
bits).  Pillow up to 12 always runs the horizontal pass first; Pillow 13
runs the vertical one first in the cases ``_pillow13_order`` gives (a rule
read off its output, which reproduced it on every one of thousands of random
sizes, boxes and filters compared).  ``pass_order()`` asks the installed
Pillow once, on a few small images, which rule it follows; if none matches,
``fusable()`` is False and callers keep Pillow's own steps, so an unknown
Pillow changes speed, never pixels.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

import numpy as np
from PIL import Image

from fastload import _core

__all__ = ["resize_to_chw", "resize_rgb_bytes_to_chw", "resize_rgb_array_to_chw", "fusable",
           "pass_order", "RESAMPLE_FILTERS"]

RESAMPLE_FILTERS = _core.RESAMPLE_FILTERS

# (image height, width, output height, width) -> True when the vertical pass runs first.
PassOrder = Callable[[int, int, int, int], bool]


def _horizontal_first(height: int, width: int, out_height: int, out_width: int) -> bool:
    return False


def _pillow13_order(height: int, width: int, out_height: int, out_width: int) -> bool:
    return out_height < height and 2 * (out_width - width) > out_height - height


_KNOWN_ORDERS: tuple[PassOrder, ...] = (_pillow13_order, _horizontal_first)

# Shapes (height, width, out_height, out_width) on which the known rules
# disagree, and some on which they agree.
_PROBES = ((12, 12, 5, 20), (12, 12, 20, 5), (12, 12, 9, 11), (12, 12, 5, 9), (9, 14, 4, 30),
           (12, 12, 6, 6), (12, 12, 16, 18))


@functools.lru_cache(maxsize=1)
def pass_order() -> PassOrder | None:
    """The installed Pillow's choice of pass order, or None if no known rule reproduces it."""
    rng = np.random.default_rng(7)
    cases = []
    for height, width, out_height, out_width in _PROBES:
        img = Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8), "RGB")
        expected = np.asarray(img.resize((out_width, out_height), Image.Resampling.BILINEAR))
        cases.append((img, expected.transpose(2, 0, 1)))
    for rule in _KNOWN_ORDERS:
        if all(np.array_equal(_resize(img, (expected.shape[2], expected.shape[1]),
                                      Image.Resampling.BILINEAR, None, False, rule), expected)
               for img, expected in cases):
            return rule
    return None


def fusable(mode: str, resample: int) -> bool:
    """Whether ``resize_to_chw`` reproduces Pillow for images of ``mode`` and this filter.

    RGB only, convolution filters only (not NEAREST), and only under a Pillow
    whose pass order a known rule reproduces.
    """
    return mode == "RGB" and int(resample) in RESAMPLE_FILTERS and pass_order() is not None


def resize_to_chw(img: Image.Image, size: tuple[int, int], resample: int,
                  box: tuple[float, float, float, float] | None = None,
                  flip: bool = False) -> np.ndarray:
    """``ToArray()`` of ``img.resize(size, resample, box)``, mirrored when ``flip``.

    ``size`` is ``(width, height)`` as Pillow takes it.  Only where
    ``fusable(img.mode, resample)``; elsewhere use Pillow's steps.
    """
    if not fusable(img.mode, resample):
        raise ValueError(f"resize_to_chw cannot reproduce Pillow for a {img.mode} image with "
                         f"resample={resample}; check fusable() first")
    in_place = _resize_in_pillow_memory(img, size, resample, box, flip)
    if in_place is not None:
        return in_place
    return _resize(img, size, resample, box, flip, pass_order())


def pillow_memory(img: Image.Image) -> tuple[Any, Any] | None:
    """Pillow's own pixel memory, lent through its Arrow export (schema, array
    capsules); None where Pillow cannot lend it (an older Pillow, an image in
    several blocks of memory)."""
    export = getattr(img, "__arrow_c_array__", None)
    if export is None:
        return None
    try:
        return export()
    except (ValueError, TypeError, OSError, NotImplementedError):
        return None


def _resize_in_pillow_memory(img: Image.Image, size: tuple[int, int], resample: int,
                             box: tuple[float, float, float, float] | None, flip: bool
                             ) -> np.ndarray | None:
    """``resize_to_chw`` read where Pillow keeps the pixels (its Arrow export, no copy);
    None where Pillow does not lend them."""
    lent = pillow_memory(img)
    if lent is None:
        return None
    schema, array = lent
    width, height = img.size
    out_width, out_height = size
    return _core.resize_arrow_rgb_to_chw(
        schema, array, width, height, box if box is not None else (0, 0, width, height),
        out_width, out_height, int(resample), pass_order()(height, width, out_height, out_width),
        flip)


def resize_rgb_bytes_to_chw(buffer, width: int, height: int, crop: tuple[int, int, int, int],
                            size: tuple[int, int], resample: int, flip: bool = False
                            ) -> np.ndarray:
    """``resize_to_chw(image.crop(crop), size, resample, flip=flip)`` of the ``width`` x
    ``height`` RGB image whose packed pixels (3 bytes each, row after row) are
    ``buffer`` (a memory map of stored pixels), without making a PIL image of it.

    The decoded-image cache keeps raw RGB pixels; the passes read them where
    they lie (``_core.resize_packed_to_chw``): no PIL image, no copy between.
    """
    if not fusable("RGB", resample):
        raise ValueError(f"resize_rgb_bytes_to_chw cannot reproduce Pillow with "
                         f"resample={resample}; check fusable() first")
    left, top, right, bottom = crop
    if not (0 <= left < right <= width and 0 <= top < bottom <= height):
        raise ValueError(f"crop {crop} is not inside a {width}x{height} image")
    out_width, out_height = size
    region_width, region_height = right - left, bottom - top
    return _core.resize_packed_to_chw(
        buffer, (top * width + left) * 3, width * 3, 3, region_width, region_height,
        (0, 0, region_width, region_height), out_width, out_height, int(resample),
        pass_order()(region_height, region_width, out_height, out_width), flip)


def resize_rgb_array_to_chw(pixels: np.ndarray, box: tuple[float, float, float, float],
                            size: tuple[int, int], resample: int, flip: bool = False
                            ) -> np.ndarray:
    """``resize_to_chw(Image.fromarray(pixels), size, resample, box, flip)`` of a
    C-contiguous ``(height, width, 3)`` uint8 array (a decoded JPEG), read where
    it lies; ``box`` may be fractional, as Pillow's."""
    if not fusable("RGB", resample):
        raise ValueError(f"resize_rgb_array_to_chw cannot reproduce Pillow with "
                         f"resample={resample}; check fusable() first")
    height, width = pixels.shape[:2]
    out_width, out_height = size
    return _core.resize_packed_to_chw(
        pixels.reshape(-1), 0, width * 3, 3, width, height, box, out_width, out_height,
        int(resample), pass_order()(height, width, out_height, out_width), flip)


def _rgbx(img: Image.Image) -> np.ndarray:
    """The pixels as (height, width, 4) bytes, as Pillow stores them (one copy)."""
    return np.frombuffer(img.tobytes("raw", "RGBX"), dtype=np.uint8).reshape(
        img.height, img.width, 4)


def _swap_axes(pixels: np.ndarray) -> np.ndarray:
    """(rows, cols, 4) -> (cols, rows, 4): a transpose of 32-bit words."""
    rows, cols = pixels.shape[:2]
    words = np.ascontiguousarray(pixels.view(np.uint32).reshape(rows, cols).T)
    return words.view(np.uint8).reshape(cols, rows, 4)


def _pass(pixels: np.ndarray, start: float, stop: float, out_rows: int, resample: int
          ) -> np.ndarray:
    """One Pillow pass along the rows of (rows, cols, 4) ``pixels``."""
    rows, cols = pixels.shape[:2]
    out = np.empty((out_rows, cols, 4), dtype=np.uint8)
    _core.resample_rows(pixels.reshape(rows, cols * 4), start, stop,
                        out.reshape(out_rows, cols * 4), int(resample))
    return out


def _resize(img: Image.Image, size: tuple[int, int], resample: int,
            box: tuple[float, float, float, float] | None, flip: bool,
            order: PassOrder) -> np.ndarray:
    width, height = img.size
    out_width, out_height = size
    left, top, right, bottom = box if box is not None else (0, 0, width, height)
    # Pillow skips a pass that would change nothing (same size, whole extent).
    along_x = out_width != width or left != 0 or right != out_width
    along_y = out_height != height or top != 0 or bottom != out_height
    if along_y and order(height, width, out_height, out_width):
        pixels = _pass(_rgbx(img), top, bottom, out_height, resample)
        if along_x:
            pixels = _swap_axes(_pass(_swap_axes(pixels), left, right, out_width, resample))
    else:
        if along_x:
            columns = _rgbx(img.transpose(Image.Transpose.TRANSPOSE))
            pixels = _swap_axes(_pass(columns, left, right, out_width, resample))
        else:
            pixels = _rgbx(img)
        if along_y:
            pixels = _pass(pixels, top, bottom, out_height, resample)
    pixels = pixels[:, ::-1, :3] if flip else pixels[:, :, :3]
    return np.ascontiguousarray(pixels.transpose(2, 0, 1))
