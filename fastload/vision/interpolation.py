"""Interpolation modes as torchvision names them, and the Pillow filters behind them."""

from __future__ import annotations

import numbers
from enum import Enum
from typing import Any

from PIL import Image

__all__ = ["InterpolationMode", "PIL_FILTERS", "AVERAGING_FILTERS", "interpolation_mode"]


class InterpolationMode(Enum):
    """Interpolation methods, named and valued as torchvision's."""

    NEAREST = "nearest"
    NEAREST_EXACT = "nearest-exact"
    BILINEAR = "bilinear"
    BICUBIC = "bicubic"
    BOX = "box"
    HAMMING = "hamming"
    LANCZOS = "lanczos"


PIL_FILTERS = {
    InterpolationMode.NEAREST: Image.Resampling.NEAREST,
    InterpolationMode.NEAREST_EXACT: Image.Resampling.NEAREST,
    InterpolationMode.BILINEAR: Image.Resampling.BILINEAR,
    InterpolationMode.BICUBIC: Image.Resampling.BICUBIC,
    InterpolationMode.BOX: Image.Resampling.BOX,
    InterpolationMode.HAMMING: Image.Resampling.HAMMING,
    InterpolationMode.LANCZOS: Image.Resampling.LANCZOS,
}

# Pillow's integer filter codes, which torchvision also still accepts.
_MODES_BY_PIL_CODE = {
    0: InterpolationMode.NEAREST,
    2: InterpolationMode.BILINEAR,
    3: InterpolationMode.BICUBIC,
    4: InterpolationMode.BOX,
    5: InterpolationMode.HAMMING,
    1: InterpolationMode.LANCZOS,
}

# Filters that average over the source pixels they shrink; a decoder that has
# already averaged 2x2..8x8 blocks changes their result only slightly.
# NEAREST picks single pixels, so a reduced decode would change *which* values
# appear, and is never used with it.
AVERAGING_FILTERS = frozenset(
    {Image.Resampling.BILINEAR, Image.Resampling.BICUBIC, Image.Resampling.BOX,
     Image.Resampling.HAMMING, Image.Resampling.LANCZOS}
)


def interpolation_mode(value: Any) -> InterpolationMode:
    """Accept our enum, torchvision's enum (by value), its string value, or a Pillow code."""
    if isinstance(value, InterpolationMode):
        return value
    if isinstance(value, Enum):  # e.g. torchvision.transforms.InterpolationMode
        value = value.value
    if isinstance(value, str):
        try:
            return InterpolationMode(value)
        except ValueError:
            pass
    elif isinstance(value, numbers.Integral):
        if int(value) in _MODES_BY_PIL_CODE:
            return _MODES_BY_PIL_CODE[int(value)]
        # torchvision looks Pillow codes up in a dict: KeyError.
        raise KeyError(f"interpolation {value!r} is not a Pillow filter code "
                       f"(one of {sorted(_MODES_BY_PIL_CODE)})")
    names = ", ".join(mode.value for mode in InterpolationMode)
    raise TypeError(f"interpolation must be an InterpolationMode (one of {names}) "
                    f"or a Pillow filter code, got {value!r}")
