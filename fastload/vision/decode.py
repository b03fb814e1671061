"""Opening image files: torchvision's loaders, and reduced-size JPEG decoding.

Reduced-size decoding
---------------------
libjpeg can decode a JPEG at 1/2, 1/4 or 1/8 of its size by scaling the DCT,
skipping most of the work; Pillow exposes this as ``Image.draft``.  It pays
when the pixels a transform reads are far more than the pixels it outputs:
``Resize(256)`` of a 4000x3000 photo, or a ``RandomResizedCrop(224)`` whose box
is over 448 pixels on its short side.

The transform decides where it reads and how big its output is *before*
decoding, from the size in the file header (``plan_region``, which draws
exactly the random numbers the transform's ``__call__`` would, in the same
order).  We pick the largest reduction ``s`` for which the box, shrunk by
``s``, still has at least as many pixels as the output in each direction, ask
libjpeg for that, and resample the box mapped into the reduced image's
coordinates (a float box: reduced pixel ``k`` covers full pixels
``[k*s, (k+1)*s)``).  The crop therefore covers the same part of the scene
as after a full decode; the only difference is resampling error (the DCT
downscale pre-averages s x s blocks before Pillow's antialiasing filter).
Tests bound it at a mean absolute error of 1 level (of 255) on smooth images;
measured, it is about 0.1 there and about 0.5 on grainy, striped synthetic
photos, for Resize, RandomResizedCrop and Resize + CenterCrop.  As a PSNR
against torchvision's decode-then-crop-then-resize on the same crop, tests
hold it at 38 dB or more on average over each photo-like file (every chroma
subsampling, baseline, progressive, restart markers, grayscale, CMYK) and
never below 30 dB for a single crop (fine stripes, where the reduced region
is exactly the output size).  Chroma subsampled by different factors across
and down (4:2:2) is decoded at 1/4 at most: libjpeg-turbo replicates such
chroma when it scales, and at 1/8 single crops fell to 26 dB.  Detail at the
scale of single pixels suffers more: on a sawtooth plus noise, a helper's
fuzz measured 2.5 to 9 levels on average and single pixels up to 178 apart
(BOX filter).  A loader other than ``default_loader``/``pil_loader`` (even a
lambda calling ``pil_loader``) is never planned: that is the exact path.

Only the scale is reduced, not the area: libjpeg-turbo can also skip the
rows above a crop and the columns beside it (``jpeg_skip_scanlines``,
``jpeg_crop_scanline``), but no package pip installs exposes that to Python
(Pillow's wheel carries the library without its headers), and it would save
little: Huffman decoding, which every row above the crop's bottom still
needs, is most of a JPEG's decode time (``bench/bench_decode.py``).

When no reduction applies (non-JPEG, small box, NEAREST interpolation) the
image is decoded fully and the transform's exact crop-then-resize is used, so
the result is bit-identical to calling the transform on ``pil_loader(path)``.

Through simplejpeg
------------------
When the output is fused into an array (below) and simplejpeg is installed,
a JPEG it can decode exactly as Pillow does is decoded by it, at the same
scale, and resized from its packed pixels (``turbo_decode``): the same
pixels and random draws, with less overhead.  Everything else is Pillow's.

Fused resize
------------
When the resizing step is followed by ``[RandomHorizontalFlip,] ToArray``
(the standard training pipeline), the three run as one
(``fastload.vision.resample``): Pillow's resize arithmetic, bit for bit,
about twice as fast as Pillow's own resize plus flip plus copy, with the
flip's random draw taken at the same point.  Any other pipeline runs its
steps one by one.
"""

from __future__ import annotations

import io
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from typing import Any, Protocol

from PIL import Image

from . import turbo_decode
from .resample import fusable, resize_rgb_array_to_chw, resize_rgb_bytes_to_chw
from .transforms import Compose, RandomHorizontalFlip, RegionPlan, ToArray, covering_reduction

__all__ = ["pil_loader", "default_loader", "RegionPlanner", "split_planned_head", "decode_planned",
           "decode_planned_stream", "render_planned", "decode_covering"]


def pil_loader(path: str) -> Image.Image:
    """Open ``path`` with Pillow and return it decoded as an RGB image (torchvision's loader)."""
    # Open the file ourselves so the descriptor is closed now, not at garbage collection.
    with open(path, "rb") as f:
        img = Image.open(f)
        return img.convert("RGB")


def default_loader(path: str) -> Image.Image:
    """The loader ``ImageFolder`` uses: Pillow, RGB (torchvision's accimage backend is not offered)."""
    return pil_loader(path)


def _as_rgb(img: Image.Image) -> Image.Image:
    """``img`` decoded, as RGB, without ``convert``'s copy when it is RGB already.

    ``pil_loader`` keeps torchvision's unconditional ``convert`` (it returns a
    plain ``Image``); the planned path saves the copy.  The image is fully
    loaded, so its closed file is never read again.
    """
    img.load()
    return img if img.mode == "RGB" else img.convert("RGB")


class RegionPlanner(Protocol):
    """A transform that can say, from an image's size alone, what region it reads."""

    def plan_region(self, width: int, height: int) -> RegionPlan: ...


def split_planned_head(transform: Any) -> tuple[RegionPlanner | None, Sequence[Callable[[Any], Any]]]:
    """Split ``transform`` into a first step that can plan its region, and the steps after it.

    ``(None, ())`` when it cannot plan (then decode fully and apply ``transform``).
    A subclass that overrides ``__call__`` (of ``Compose`` or of the first
    step) does something its plan does not know of, so it is called instead.
    """
    if isinstance(transform, Compose):
        steps = transform.transforms
        if type(transform).__call__ is Compose.__call__ and len(steps) > 0 \
                and _plans_its_call(steps[0]):
            return steps[0], steps[1:]
        return None, ()
    if _plans_its_call(transform):
        return transform, ()
    return None, ()


def _plans_its_call(step: Any) -> bool:
    """Whether ``step`` has a ``plan_region`` that describes its ``__call__``: both
    defined by the same class."""
    if not hasattr(step, "plan_region"):
        return False
    call_owner = next((c for c in type(step).__mro__ if "__call__" in vars(c)), None)
    return call_owner is not None and "plan_region" in vars(call_owner)


def decode_planned(path: str, head: RegionPlanner, rest: Sequence[Callable[[Any], Any]] = (),
                   reading: AbstractContextManager = nullcontext()
                   ) -> tuple[Any, Sequence[Callable[[Any], Any]]]:
    """``(sample, steps_left)``: ``head(pil_loader(path))``, then the steps of ``rest`` it took.

    The JPEG is decoded at reduced size when ``head``'s plan allows it.  When
    ``rest`` begins with ``[RandomHorizontalFlip,] ToArray`` those two run
    fused into the resampling (``RegionPlan.render_chw``: the same pixels and
    the same random draw, in one pass), and ``steps_left`` is what follows them.
    Opening and decoding the file run inside ``reading`` (the folder names the
    sample in their errors, as around its loader); the transforms' steps,
    interleaved with them, raise their own errors as they are.
    """
    with reading:
        f = open(path, "rb")
    with f:
        return _decode_and_render(f, head, rest, reading)


def decode_planned_stream(f: Any, head: RegionPlanner, rest: Sequence[Callable[[Any], Any]] = (),
                          reading: AbstractContextManager = nullcontext()
                          ) -> tuple[Any, Sequence[Callable[[Any], Any]]]:
    """``decode_planned`` of an open binary file (the decoded-image cache's stored JPEGs)."""
    return _decode_and_render(f, head, rest, reading)


def render_planned(img: Image.Image, head: RegionPlanner, rest: Sequence[Callable[[Any], Any]] = ()
                   ) -> tuple[Any, Sequence[Callable[[Any], Any]]]:
    """``decode_planned``'s result for an image already decoded: ``head(img)``, fused
    with ``[RandomHorizontalFlip,] ToArray`` at the start of ``rest`` as there."""
    return _render(img, head.plan_region(*img.size), 1, rest)


def _decode_and_render(f: Any, head: RegionPlanner, rest: Sequence[Callable[[Any], Any]],
                       reading: AbstractContextManager
                       ) -> tuple[Any, Sequence[Callable[[Any], Any]]]:
    """``decode_planned``'s work on an open file: through simplejpeg when the output is
    fused into an array and the file is a JPEG it decodes as Pillow does
    (``turbo_decode``), else through Pillow."""
    if _flip_and_to_array(rest)[1] and turbo_decode.available():
        with reading:
            data = f.read()
        header = turbo_decode.read_header(data)
        if header is not None:
            return _turbo_render(data, header, head, rest, reading)
        f = io.BytesIO(data)
    img, plan, reduction = _decode_for_plan(f, head, reading)
    return _render(img, plan, reduction, rest)


def _turbo_render(data: bytes, header: turbo_decode.JpegHeader, head: RegionPlanner,
                  rest: Sequence[Callable[[Any], Any]], reading: AbstractContextManager
                  ) -> tuple[Any, Sequence[Callable[[Any], Any]]]:
    """``_render``'s result from simplejpeg's pixels: the same plan, draws and pixels.
    Where simplejpeg refuses the file, Pillow decodes it with the plan already drawn."""
    plan = head.plan_region(header.width, header.height)
    reduction = _turbo_reduction(header, plan.max_reduction())
    pixels = None
    if not plan.is_empty and fusable("RGB", plan.resample):
        pixels = turbo_decode.decode_rgb(data, header, reduction)
    if pixels is None:
        with reading:
            img = Image.open(io.BytesIO(data))
        img, reduction = _decode_opened(img, reduction, reading)
        return _render(img, plan, reduction, rest)
    flip_step, fused_steps = _flip_and_to_array(rest)
    flip = flip_step.flips() if flip_step is not None else False
    return _render_array(plan, pixels, reduction, flip), rest[fused_steps:]


def _render_array(plan: RegionPlan, pixels: Any, reduction: int, flip: bool) -> Any:
    """``plan.render_chw`` of the RGB image whose pixels are the C-contiguous ``(height,
    width, 3)`` uint8 array ``pixels`` (a JPEG decoded at ``1/reduction``), read
    where they lie: the same pixels, bit for bit."""
    if reduction == 1:
        height, width = pixels.shape[:2]
        return resize_rgb_bytes_to_chw(pixels.reshape(-1), width, height, plan.box, plan.size,
                                       plan.resample, flip)
    left, top, right, bottom = plan.box
    scaled_box = (left / reduction, top / reduction, right / reduction, bottom / reduction)
    return resize_rgb_array_to_chw(pixels, scaled_box, plan.size, plan.resample, flip)


def _decode_for_plan(f: Any, head: RegionPlanner, reading: AbstractContextManager
                     ) -> tuple[Image.Image, RegionPlan, int]:
    """Decode ``f`` at the reduction ``head``'s plan allows; ``(image, plan, reduction)``."""
    with reading:
        img = Image.open(f)
        full_width, full_height = img.size
    plan = head.plan_region(full_width, full_height)
    img, reduction = _decode_opened(img, plan.max_reduction(), reading)
    return img, plan, reduction


def _decode_opened(img: Image.Image, reduction: int, reading: AbstractContextManager
                   ) -> tuple[Image.Image, int]:
    """An opened image decoded as RGB at ``1/reduction`` (at most) scale, and the
    reduction Pillow applied."""
    with reading:
        if reduction > 1:
            reduction = _draft(img, reduction)
        img = _as_rgb(img)
    return img, reduction


def _render(img: Image.Image, plan: RegionPlan, reduction: int,
            rest: Sequence[Callable[[Any], Any]]) -> tuple[Any, Sequence[Callable[[Any], Any]]]:
    flip_step, fused_steps = _flip_and_to_array(rest)
    if fused_steps and not plan.is_empty and fusable(img.mode, plan.resample):
        flip = flip_step.flips() if flip_step is not None else False
        return plan.render_chw(img, reduction, flip), rest[fused_steps:]
    sample = plan.render(img, reduction)
    if sample is img and type(img) is not Image.Image:
        # A plan that changes nothing: the decoder's own image (a JpegImageFile)
        # would reach the caller, where pil_loader gives a plain Image.
        sample = img.copy()
    return sample, rest


def _flip_and_to_array(steps: Sequence[Any]) -> tuple[RandomHorizontalFlip | None, int]:
    """``(the flip step or None, how many leading steps)`` when ``steps`` start with
    ``[RandomHorizontalFlip,] ToArray``, else ``(None, 0)``.  Exact types only:
    a subclass may behave otherwise."""
    if len(steps) >= 2 and type(steps[0]) is RandomHorizontalFlip and type(steps[1]) is ToArray:
        return steps[0], 2
    if len(steps) >= 1 and type(steps[0]) is ToArray:
        return None, 1
    return None, 0


def decode_covering(f: Any, out_size: Callable[[int, int], tuple[int, int]],
                    reading: AbstractContextManager = nullcontext()
                    ) -> tuple[Image.Image, tuple[int, int], int]:
    """``(image, (full width, full height), reduction)``: the image in ``f`` decoded as
    RGB at the smallest JPEG scale whose pixels still cover ``out_size(full width,
    full height)`` (a not-JPEG decodes in full: reduction 1).

    The step ``Image.thumbnail`` takes, without its reducing gap (through
    simplejpeg where ``turbo_decode`` allows: the same pixels).  To resize
    it as a full decode would be, use the full frame's box in its pixels,
    ``(0, 0, width / reduction, height / reduction)``: a reduced pixel ``k``
    covers full pixels ``[k*s, (k+1)*s)``.
    """
    if turbo_decode.available():
        with reading:
            data = f.read()
        header = turbo_decode.read_header(data)
        if header is not None:
            width, height = header.width, header.height
            reduction = _turbo_reduction(
                header, covering_reduction(width, height, *out_size(width, height)))
            pixels = turbo_decode.decode_rgb(data, header, reduction)
            if pixels is not None:  # Pillow's pixels, bit for bit
                return Image.fromarray(pixels, "RGB"), (width, height), reduction
        f = io.BytesIO(data)
    with reading:
        img = Image.open(f)
        width, height = img.size
        reduction = covering_reduction(width, height, *out_size(width, height))
        if reduction > 1:
            reduction = _draft(img, reduction)
        img = _as_rgb(img)
    return img, (width, height), reduction


# Past 1/4, libjpeg-turbo's scaled decode of chroma sampled unevenly (4:2:2,
# 4:4:0) loses most of its colour detail: it can scale chroma by its IDCT only
# by the same factor both ways, so it replicates such chroma instead.
_UNEVEN_CHROMA_MAX_REDUCTION = 4


def _reduction_limit(img: Image.Image) -> int:
    """The largest reduction allowed for this JPEG: 8, or 4 when its chroma is
    subsampled by different factors across and down (Pillow's ``layer``: one
    ``(id, horizontal, vertical, table)`` per component)."""
    layers = getattr(img, "layer", None) or ()
    if not layers:
        return 8
    widest = max(layer[1] for layer in layers)
    tallest = max(layer[2] for layer in layers)
    if all(widest * layer[2] == tallest * layer[1] for layer in layers):
        return 8
    return _UNEVEN_CHROMA_MAX_REDUCTION


def _turbo_reduction(header: turbo_decode.JpegHeader, reduction: int) -> int:
    """``reduction`` within the limit ``_draft`` applies, from simplejpeg's header."""
    if header.subsampling in turbo_decode.UNEVEN_SUBSAMPLING:
        return min(reduction, _UNEVEN_CHROMA_MAX_REDUCTION)
    return reduction


def _draft(img: Image.Image, reduction: int) -> int:
    """Ask the decoder for ``1/reduction`` scale (at most ``_reduction_limit``); return
    the reduction it will actually apply."""
    reduction = min(reduction, _reduction_limit(img))
    if reduction == 1:
        return 1
    full_width = img.width
    # Pillow picks the largest of 8, 4, 2, 1 that divides the size into at least
    # the requested size; asking for floor(size / reduction) yields exactly `reduction`.
    drafted = img.draft("RGB", (img.width // reduction, img.height // reduction))
    if drafted is None:  # not a JPEG (or already configured): full decode
        return 1
    _, full_box_in_reduced_pixels = drafted
    return round(full_width / full_box_in_reduced_pixels[2])
