"""JPEG decoding through simplejpeg's libjpeg-turbo: Pillow's pixels, without Pillow's overhead.

Pillow decodes a JPEG one scanline at a time into its own 4-byte-per-pixel
memory, behind a Python loop over file chunks; ``pil_loader`` then copies
it once more (``convert("RGB")``).  simplejpeg (a pip-installable wheel that
carries libjpeg-turbo) decodes the whole image in one call into a packed RGB
array, with the same library settings as Pillow (accurate integer IDCT,
smooth chroma upsampling), at full size or at 1/2, 1/4, 1/8 scale.  Its
pixels are Pillow's, bit for bit, at every scale (tests compare them on every
subsampling, progressive and baseline, grayscale), and the fused resize reads
them where they lie (``resample.resize_rgb_array_to_chw``).

It is used only where that is certain to hold, and Pillow decodes everything
else as before: when simplejpeg is not installed, for other formats, for
colour spaces other than YCbCr and grayscale (CMYK, YCCK, Adobe RGB), for an
image past Pillow's decompression-bomb limit (Pillow warns or refuses), and
for any file libjpeg reports a problem with, however small (``strict``):
Pillow then decodes it and raises, or recovers, exactly as without this path.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from PIL import Image

try:
    import simplejpeg
except ImportError:  # a dependency, but a platform may lack its wheel: Pillow decodes
    simplejpeg = None

__all__ = ["available", "JpegHeader", "read_header", "decode_rgb"]

_JPEG_START = b"\xff\xd8\xff"  # Pillow recognises a JPEG by these bytes, whatever its name
_COLOUR_SPACES = frozenset({"YCbCr", "Gray"})
# Chroma subsampled by different factors across and down.
UNEVEN_SUBSAMPLING = frozenset({"422", "440", "411", "441"})


def available() -> bool:
    """Whether simplejpeg is installed (else every JPEG is Pillow's to decode)."""
    return simplejpeg is not None


class JpegHeader:
    """What the decode needs from a JPEG's header: size and chroma subsampling."""

    __slots__ = ("width", "height", "subsampling")

    def __init__(self, width: int, height: int, subsampling: str) -> None:
        self.width, self.height, self.subsampling = width, height, subsampling


def read_header(data: Any) -> JpegHeader | None:
    """The header of ``data`` when this path can decode it as Pillow would, else None."""
    if simplejpeg is None or data[:3] != _JPEG_START:
        return None
    try:
        height, width, colour_space, subsampling = simplejpeg.decode_jpeg_header(data)
    except ValueError:
        return None
    if colour_space not in _COLOUR_SPACES:
        return None
    limit = Image.MAX_IMAGE_PIXELS
    if limit is not None and width * height > limit:
        return None
    return JpegHeader(width, height, subsampling)


def decode_rgb(data: Any, header: JpegHeader, reduction: int) -> np.ndarray | None:
    """``data`` decoded at ``1/reduction`` scale as a ``(height, width, 3)`` uint8 array
    (Pillow's ``draft`` then ``convert("RGB")``, bit for bit), or None when
    libjpeg reports any problem or the scale is not the one asked for."""
    width = -(-header.width // reduction)
    height = -(-header.height // reduction)
    try:
        pixels = simplejpeg.decode_jpeg(data, colorspace="RGB", min_width=width,
                                        min_height=height, min_factor=reduction, strict=True)
    except ValueError:
        return None
    if pixels.shape != (height, width, 3) or not pixels.flags.c_contiguous:
        return None
    return pixels
