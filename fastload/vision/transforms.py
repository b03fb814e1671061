"""Image transforms with torchvision's parameters, defaults and sampling rules.

The geometric transforms take PIL images (``CenterCrop`` and
``RandomHorizontalFlip`` also take numpy arrays shaped ``(..., H, W)``, the
layout ``ToArray`` produces).  ``ToArray`` turns a PIL image into a C-contiguous
``(C, H, W)`` numpy array, as torchvision's ``PILToTensor`` does for tensors,
and ``Normalize`` works on such arrays.

Randomness comes only from ``fastload.rng.transform_rng()``, never from Python's
``random`` or numpy's global generator: the DataLoader reseeds that generator
before every batch, so a seeded loader produces the same crops and flips for
any ``num_workers``.  Call ``fastload.rng.seed_transform_rng(seed, 0)`` to make
transforms reproducible outside a loader.

Reduced-size decoding: ``Resize`` and ``RandomResizedCrop`` can say, before an
image is decoded, which region of it they will read and how large their output
is (``plan_region``).  ``ImageFolder`` uses that to let libjpeg decode a JPEG at
1/2, 1/4 or 1/8 scale when the region still has at least as many pixels as the
output (see ``fastload.vision.decode``).
"""

from __future__ import annotations

import math
import numbers
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from PIL import Image

from ..rng import transform_rng
from .interpolation import AVERAGING_FILTERS, PIL_FILTERS, InterpolationMode, interpolation_mode
from .resample import resize_to_chw

__all__ = [
    "InterpolationMode",
    "RegionPlan",
    "covering_reduction",
    "Compose",
    "Resize",
    "CenterCrop",
    "RandomResizedCrop",
    "RandomHorizontalFlip",
    "ToArray",
    "Normalize",
]


def _setup_size(size: Any, error_msg: str) -> Any:
    """torchvision's size normalisation: a number becomes (n, n), [n] becomes (n, n);
    anything else with two items (a numpy array too) is kept, as torchvision keeps it."""
    if isinstance(size, numbers.Number):
        return int(size), int(size)
    if isinstance(size, Sequence) and len(size) == 1:
        return size[0], size[0]
    try:
        count = len(size)
    except TypeError:  # torchvision's error type, with the size named
        raise TypeError(f"{error_msg} Got size={size!r}") from None
    if count != 2:
        raise ValueError(error_msg)
    return size


def _require_pil(img: Any, transform: str) -> Image.Image:
    if not isinstance(img, Image.Image):
        raise TypeError(f"{transform} takes a PIL image, got {type(img).__name__}; "
                        f"apply it before ToArray()")
    return img


def _image_width_height(img: Any) -> tuple[int, int]:
    """(width, height) of a PIL image or of a (..., H, W) array."""
    if isinstance(img, Image.Image):
        return img.size
    if isinstance(img, np.ndarray) and img.ndim >= 2:
        return int(img.shape[-1]), int(img.shape[-2])
    raise TypeError(f"expected a PIL image or a numpy array shaped (..., H, W), "
                    f"got {type(img).__name__}")


def covering_reduction(width: int, height: int, out_width: int, out_height: int) -> int:
    """The largest JPEG reduction (1, 2, 4 or 8) that leaves a ``width`` x ``height``
    region at least ``out_width`` x ``out_height`` pixels."""
    for reduction in (8, 4, 2):
        if width >= reduction * out_width and height >= reduction * out_height:
            return reduction
    return 1


@dataclass(frozen=True)
class RegionPlan:
    """What a resizing transform will do to an image of known size, decided before decoding.

    ``box`` is ``(left, top, right, bottom)`` in pixels of the full-size image;
    the transform's output is that region resampled to ``size`` ``(width,
    height)`` with Pillow filter ``resample``.
    """

    box: tuple[int, int, int, int]
    size: tuple[int, int]
    resample: int

    @property
    def is_empty(self) -> bool:
        """Whether the region or the output has no pixels (a 1-pixel-wide image can
        give either, ``Resize(0)`` or ``Resize(-1)`` the output): then only
        Pillow's own crop and resize say what happens (an output of zeros, or
        its ValueError), so nothing may be planned."""
        left, top, right, bottom = self.box
        return right <= left or bottom <= top or min(self.size) <= 0

    def max_reduction(self) -> int:
        """The largest JPEG reduction (1, 2, 4 or 8) that keeps the region >= the output size.

        Decoding at 1/s scale leaves the region ``(right - left) / s`` pixels
        wide; while that is still at least the output width (and likewise for
        height) the result differs from a full decode only by resampling error.
        """
        if self.resample not in AVERAGING_FILTERS or self.is_empty:
            return 1
        left, top, right, bottom = self.box
        return covering_reduction(right - left, bottom - top, *self.size)

    def render(self, img: Image.Image, reduction: int = 1) -> Image.Image:
        """Apply the plan to ``img``, which was decoded at ``1/reduction`` of full size.

        At ``reduction == 1`` this is exactly torchvision's crop-then-resize.
        Otherwise the box is mapped into the reduced image's coordinates as
        floats (libjpeg's reduced pixel ``k`` covers full pixels ``[k*s, (k+1)*s)``),
        and Pillow resamples that sub-pixel box straight to the output size.
        """
        left, top, right, bottom = self.box
        if reduction == 1:
            region = img if self.box == (0, 0, *img.size) else img.crop(self.box)
            if region.size == self.size:
                return region
            return region.resize(self.size, self.resample)
        scaled_box = (left / reduction, top / reduction, right / reduction, bottom / reduction)
        return img.resize(self.size, self.resample, box=scaled_box)

    def render_chw(self, img: Image.Image, reduction: int = 1, flip: bool = False) -> np.ndarray:
        """``ToArray()`` of ``render(img, reduction)``, mirrored when ``flip``, in one pass.

        The same pixels, bit for bit (see ``fastload.vision.resample``); only
        where ``fusable(img.mode, self.resample)``.
        """
        left, top, right, bottom = self.box
        if reduction == 1:
            region = img if self.box == (0, 0, *img.size) else img.crop(self.box)
            return resize_to_chw(region, self.size, self.resample, flip=flip)
        scaled_box = (left / reduction, top / reduction, right / reduction, bottom / reduction)
        return resize_to_chw(img, self.size, self.resample, box=scaled_box, flip=flip)


class Compose:
    """Chain transforms: ``Compose([t1, t2])(x) == t2(t1(x))``."""

    def __init__(self, transforms: Sequence[Callable[[Any], Any]]) -> None:
        self.transforms = transforms

    def __call__(self, img: Any) -> Any:
        for transform in self.transforms:
            img = transform(img)
        return img

    def __repr__(self) -> str:
        lines = [f"{self.__class__.__name__}("]
        lines += [f"    {transform}" for transform in self.transforms]
        return "\n".join(lines) + "\n)"


def _warn_if_antialias_off(antialias: bool | None, transform: str) -> None:
    if antialias is False:
        warnings.warn(f"{transform}(antialias=False) is ignored: Pillow always antialiases "
                      f"when it shrinks an image", UserWarning, stacklevel=3)


class Resize:
    """Resize a PIL image to ``size``, as torchvision's ``Resize``.

    ``size`` an int (or ``[int]``): the shorter edge becomes ``size`` and the
    longer keeps the aspect ratio (truncated to int); with ``max_size`` the longer
    edge is capped, shrinking both.  ``size`` a pair: ``(height, width)``
    exactly.  ``size=None`` with ``max_size``: the longer edge becomes
    ``max_size``.  An image already at the target size is returned as is.
    ``antialias`` is accepted for compatibility; Pillow always antialiases.
    """

    def __init__(self, size: int | Sequence[int] | None,
                 interpolation: InterpolationMode | int = InterpolationMode.BILINEAR,
                 max_size: int | None = None, antialias: bool | None = True) -> None:
        if not isinstance(size, (int, Sequence, type(None))) or isinstance(size, (bool, str)):
            raise TypeError(f"Size should be int or sequence. Got {type(size)}")
        if isinstance(size, Sequence) and len(size) not in (1, 2):
            raise ValueError("If size is a sequence, it should have 1 or 2 values")
        if size is None and max_size is None:
            raise ValueError("If size is None, then max_size must be provided.")
        if isinstance(size, int):
            smaller_edge = size
        elif size is not None and len(size) == 1:
            smaller_edge = size[0]
        else:
            smaller_edge = None  # size None, or an exact (h, w)
        if max_size is not None:
            if size is not None and smaller_edge is None:
                raise ValueError("max_size should only be passed if size is None or specifies "
                                 "the length of the smaller edge, i.e. size should be an int or a "
                                 f"sequence of length 1; got size={size}")
            if smaller_edge is not None and max_size <= smaller_edge:
                raise ValueError(f"max_size = {max_size} must be strictly greater than the "
                                 f"requested size for the smaller edge size = {size}")
        _warn_if_antialias_off(antialias, "Resize")
        self.size = size
        self.max_size = max_size
        self.interpolation = interpolation_mode(interpolation)
        self.antialias = antialias

    def output_size(self, width: int, height: int) -> tuple[int, int]:
        """The (width, height) this transform gives an image of ``width`` x ``height``."""
        size = self.size
        if isinstance(size, Sequence) and len(size) == 2:
            return int(size[1]), int(size[0])
        short, long = (width, height) if width <= height else (height, width)
        if size is None:
            new_short, new_long = int(self.max_size * short / long), self.max_size
        else:
            requested = size if isinstance(size, int) else size[0]
            new_short, new_long = requested, int(requested * long / short)
            if self.max_size is not None and new_long > self.max_size:
                new_short, new_long = int(self.max_size * new_short / new_long), self.max_size
        return (new_short, new_long) if width <= height else (new_long, new_short)

    def plan_region(self, width: int, height: int) -> RegionPlan:
        """The whole image, resampled to ``output_size``; draws no randomness."""
        return RegionPlan((0, 0, width, height), self.output_size(width, height),
                          PIL_FILTERS[self.interpolation])

    def __call__(self, img: Image.Image) -> Image.Image:
        img = _require_pil(img, "Resize")
        return self.plan_region(*img.size).render(img)

    def __repr__(self) -> str:
        return (f"{self.__class__.__name__}(size={self.size}, interpolation={self.interpolation.value}, "
                f"max_size={self.max_size}, antialias={self.antialias})")


class CenterCrop:
    """Crop the centre ``size`` (``(h, w)``, or an int for a square), as torchvision's.

    A crop larger than the image first pads it with zeros (extra pixel of an
    odd difference on the right/bottom), then crops.  Takes PIL images or
    numpy arrays shaped ``(..., H, W)``.  Never uses reduced-size decoding: it
    keeps pixels 1:1, so there is nothing to save.
    """

    def __init__(self, size: int | Sequence[int]) -> None:
        self.size = _setup_size(size, error_msg="Please provide only two dimensions (h, w) for size.")

    def __call__(self, img: Any) -> Any:
        crop_height, crop_width = (int(v) for v in self.size)
        width, height = _image_width_height(img)
        if crop_width > width or crop_height > height:
            pad_left = (crop_width - width) // 2 if crop_width > width else 0
            pad_top = (crop_height - height) // 2 if crop_height > height else 0
            pad_right = (crop_width - width + 1) // 2 if crop_width > width else 0
            pad_bottom = (crop_height - height + 1) // 2 if crop_height > height else 0
            img = _zero_pad(img, pad_left, pad_top, pad_right, pad_bottom)
            width, height = _image_width_height(img)
            if crop_width == width and crop_height == height:
                return img
        top = int(round((height - crop_height) / 2.0))
        left = int(round((width - crop_width) / 2.0))
        if isinstance(img, Image.Image):
            return img.crop((left, top, left + crop_width, top + crop_height))
        return np.ascontiguousarray(img[..., top:top + crop_height, left:left + crop_width])

    def __repr__(self) -> str:
        return f"{self.__class__.__name__}(size={self.size})"


def _zero_pad(img: Any, left: int, top: int, right: int, bottom: int) -> Any:
    if isinstance(img, Image.Image):
        padded = Image.new(img.mode, (img.width + left + right, img.height + top + bottom))
        if img.mode in ("P", "PA"):  # a new image has a default palette: keep the colours
            padded.putpalette(img.getpalette())
        padded.paste(img, (left, top))
        return padded
    spec = [(0, 0)] * (img.ndim - 2) + [(top, bottom), (left, right)]
    return np.pad(img, spec, mode="constant", constant_values=0)


def _sample_crop_box(width: int, height: int, scale: Sequence[float],
                     ratio: Sequence[float]) -> tuple[int, int, int, int]:
    """torchvision's RandomResizedCrop.get_params on a ``width`` x ``height`` image.

    Up to ten tries of (area fraction ~ U(scale), log aspect ~ U(log ratio)),
    each rounded to whole pixels and kept if it fits; then a random position.
    If none fits, a central crop of the whole image clamped to the ratio range.
    """
    if not scale[0] <= scale[1] or not 0 < ratio[0] <= ratio[1]:
        # torchvision fails here too (RuntimeError, from its uniform_ draws).
        raise RuntimeError(f"RandomResizedCrop needs scale=(min, max) and ratio=(min, max) "
                           f"with 0 < min, got scale={tuple(scale)} ratio={tuple(ratio)}")
    rng = transform_rng()
    area = height * width
    log_low, log_high = math.log(ratio[0]), math.log(ratio[1])
    for _ in range(10):
        target_area = area * rng.uniform(scale[0], scale[1])
        aspect_ratio = math.exp(rng.uniform(log_low, log_high))
        w = int(round(math.sqrt(target_area * aspect_ratio)))
        h = int(round(math.sqrt(target_area / aspect_ratio)))
        if 0 < w <= width and 0 < h <= height:
            i = int(rng.integers(0, height - h + 1))
            j = int(rng.integers(0, width - w + 1))
            return i, j, h, w
    in_ratio = float(width) / float(height)
    if in_ratio < min(ratio):
        w = width
        h = int(round(w / min(ratio)))
    elif in_ratio > max(ratio):
        h = height
        w = int(round(h * max(ratio)))
    else:
        w, h = width, height
    return (height - h) // 2, (width - w) // 2, h, w


class RandomResizedCrop:
    """A random crop of random area and aspect ratio, resized to ``size``, as torchvision's.

    ``size`` is ``(h, w)`` or an int for a square; ``scale`` bounds the crop's
    area as a fraction of the image; ``ratio`` bounds its width/height, sampled
    uniformly in log space.  Randomness from ``fastload.rng.transform_rng()``.

    Under ``ImageFolder``'s default loader a JPEG is decoded at 1/2, 1/4 or 1/8
    scale when the crop box still has at least ``size`` pixels at that scale.
    For ImageNet-size photos (~500x375) and ``size=224`` that is rare (the crop
    must cover > 448x448); for camera photos (4000x3000) it is the common case
    and decoding is several times faster.
    """

    def __init__(self, size: int | Sequence[int], scale: Sequence[float] = (0.08, 1.0),
                 ratio: Sequence[float] = (3.0 / 4.0, 4.0 / 3.0),
                 interpolation: InterpolationMode | int = InterpolationMode.BILINEAR,
                 antialias: bool | None = True) -> None:
        self.size = _setup_size(size, error_msg="Please provide only two dimensions (h, w) for size.")
        if not isinstance(scale, Sequence):
            raise TypeError("Scale should be a sequence")
        if not isinstance(ratio, Sequence):
            raise TypeError("Ratio should be a sequence")
        if len(scale) < 2 or len(ratio) < 2:  # torchvision reads the first two
            raise ValueError(f"scale and ratio must each have two values (min, max), "
                             f"got scale={scale} ratio={ratio}")
        if scale[0] > scale[1] or ratio[0] > ratio[1]:
            warnings.warn("Scale and ratio should be of kind (min, max)", UserWarning, stacklevel=2)
        _warn_if_antialias_off(antialias, "RandomResizedCrop")
        self.interpolation = interpolation_mode(interpolation)
        self.antialias = antialias
        self.scale = scale
        self.ratio = ratio

    @staticmethod
    def get_params(img: Any, scale: Sequence[float],
                   ratio: Sequence[float]) -> tuple[int, int, int, int]:
        """``(top, left, height, width)`` of a random crop of ``img`` (PIL or (..., H, W) array)."""
        width, height = _image_width_height(img)
        return _sample_crop_box(width, height, scale, ratio)

    def plan_region(self, width: int, height: int) -> RegionPlan:
        """Draw this call's crop for a ``width`` x ``height`` image (consumes randomness)."""
        top, left, h, w = _sample_crop_box(width, height, self.scale, self.ratio)
        out_height, out_width = (int(v) for v in self.size)
        return RegionPlan((left, top, left + w, top + h), (out_width, out_height),
                          PIL_FILTERS[self.interpolation])

    def __call__(self, img: Image.Image) -> Image.Image:
        img = _require_pil(img, "RandomResizedCrop")
        return self.plan_region(*img.size).render(img)

    def __repr__(self) -> str:
        scale = tuple(round(s, 4) for s in self.scale)
        ratio = tuple(round(r, 4) for r in self.ratio)
        return (f"{self.__class__.__name__}(size={self.size}, scale={scale}, ratio={ratio}, "
                f"interpolation={self.interpolation.value}, antialias={self.antialias})")


class RandomHorizontalFlip:
    """Mirror left-right with probability ``p`` (one draw per call, as torchvision).

    Takes PIL images or numpy arrays shaped ``(..., H, W)`` (flips the last axis
    and returns a C-contiguous copy).
    """

    def __init__(self, p: float = 0.5) -> None:
        self.p = p

    def flips(self) -> bool:
        """Draw this call's coin: the one random number ``__call__`` uses."""
        return transform_rng().random() < self.p

    def __call__(self, img: Any) -> Any:
        if self.flips():
            if isinstance(img, Image.Image):
                return img.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
            if isinstance(img, np.ndarray) and img.ndim >= 2:
                return np.ascontiguousarray(img[..., ::-1])
            raise TypeError(f"RandomHorizontalFlip takes a PIL image or a numpy array shaped "
                            f"(..., H, W), got {type(img).__name__}")
        return img

    def __repr__(self) -> str:
        return f"{self.__class__.__name__}(p={self.p})"


class ToArray:
    """A PIL image (or an ``(H, W, C)``/``(H, W)`` array) as a C-contiguous ``(C, H, W)`` array.

    The numpy counterpart of torchvision's ``PILToTensor``: values are not
    rescaled, and the dtype is Pillow's (uint8 for ``L``/``RGB``/``RGBA``...,
    bool for ``1``, int32 for ``I``, float32 for ``F``).
    """

    def __call__(self, pic: Any) -> np.ndarray:
        if isinstance(pic, Image.Image):
            pixels = np.asarray(pic)
        elif isinstance(pic, np.ndarray):
            pixels = pic
        else:
            raise TypeError(f"ToArray takes a PIL image or a numpy array, got {type(pic).__name__}")
        if pixels.ndim == 2:
            return np.ascontiguousarray(pixels[None])
        if pixels.ndim != 3:
            raise ValueError(f"ToArray expects an image shaped (H, W) or (H, W, C), "
                             f"got shape {pixels.shape}")
        return np.ascontiguousarray(pixels.transpose(2, 0, 1))

    def __repr__(self) -> str:
        return f"{self.__class__.__name__}()"


def _per_channel(values: Any, name: str, dtype: np.dtype) -> np.ndarray:
    """``Normalize``'s ``mean`` or ``std`` as a ``(C, 1, 1)`` array, or the error
    torchvision's broadcasting would raise, naming the argument."""
    given = np.asarray(values)
    if given.dtype.kind not in "biuf":
        # torchvision: TypeError (None) or a failed conversion; never NaN.
        raise TypeError(f"Normalize: {name} should be numbers, but got {values!r}")
    if given.ndim > 1:
        # torchvision reshapes only a 1-D mean/std to (C, 1, 1); any other shape
        # broadcasts against the image's last axes and fails (or worse).
        raise RuntimeError(f"Normalize: {name} should be one number or one per channel, but "
                           f"got shape {given.shape}")
    return given.astype(dtype, copy=False).reshape(-1, 1, 1)


class Normalize:
    """``(x - mean) / std`` per channel on an array shaped ``(..., C, H, W)``.

    Float input is normalised as torchvision does (dtype kept; in place when
    ``inplace=True``).  uint8 input, as ``ToArray`` produces, is first scaled to
    [0, 1] (what torchvision's ``ToTensor`` does before ``Normalize``), so
    ``Compose([..., ToArray(), Normalize(mean, std)])`` gives, bit for bit,
    the float32 result of torchvision's ``ToTensor(), Normalize(mean, std)``;
    ``inplace`` cannot apply to it and a new float32 array is returned.  Other
    integer dtypes are rejected.
    """

    def __init__(self, mean: Sequence[float], std: Sequence[float], inplace: bool = False) -> None:
        self.mean = mean
        self.std = std
        self.inplace = inplace

    def __call__(self, array: np.ndarray) -> np.ndarray:
        if not isinstance(array, np.ndarray):
            raise TypeError(f"Normalize takes a numpy array shaped (..., C, H, W), got "
                            f"{type(array).__name__}; put ToArray() before Normalize()")
        # torchvision's checks, in its order and with its types: not an image
        # at all (below 2 dimensions), then the dtype, then a 2-D image.
        shape_error = f"Expected an image array of shape (..., C, H, W), got shape {array.shape}"
        if array.ndim < 2:
            raise TypeError(shape_error)
        from_uint8 = array.dtype == np.uint8
        if not from_uint8 and not np.issubdtype(array.dtype, np.floating):
            raise TypeError(f"Normalize takes a float or uint8 array, got dtype {array.dtype}")
        if array.ndim < 3:
            raise ValueError(shape_error)
        dtype = np.float32 if from_uint8 else array.dtype
        mean = _per_channel(self.mean, "mean", dtype)
        std = _per_channel(self.std, "std", dtype)
        if (std == 0).any():
            raise ValueError(f"std evaluated to zero after conversion to {np.dtype(dtype)}, "
                             f"leading to division by zero.")
        channels = array.shape[-3]
        if mean.shape[0] not in (1, channels) or std.shape[0] not in (1, channels):
            # RuntimeError: what torch's broadcasting raises in torchvision's Normalize.
            raise RuntimeError(f"mean ({mean.shape[0]} values) and std ({std.shape[0]} values) must "
                             f"have 1 value or one per channel; the array has {channels} channels")
        if from_uint8:
            # torchvision's ToTensor step, in its float32 operations, so the
            # result is bit for bit ToTensor() then Normalize(): folding 1/255
            # into the scale saved two passes over the image but differed in
            # the last bit of two values in three.
            out = array.astype(np.float32)
            out /= np.float32(255)
        else:
            out = array if self.inplace else array.copy()
        out -= mean
        out /= std
        return out

    def __repr__(self) -> str:
        return f"{self.__class__.__name__}(mean={self.mean}, std={self.std})"
