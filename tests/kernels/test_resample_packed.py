"""``_core.resize_packed_to_chw``: Pillow's resize from packed pixels in place, bit for bit.

The reference is Pillow itself: the same region as a PIL image, ``resize``d
with the same filter and box, mirrored, as channel-first bytes.  Every case
runs on the AVX2 loops (where the CPU has them) and on the baseline ones.
"""

import numpy as np
import pytest
from PIL import Image

from fastload import _core
from fastload.vision.resample import pass_order

FILTERS = (Image.Resampling.BILINEAR, Image.Resampling.BICUBIC, Image.Resampling.LANCZOS,
           Image.Resampling.BOX, Image.Resampling.HAMMING)


@pytest.fixture(params=["avx2", "baseline"])
def loops(request):
    previous = _core._resample_use_avx2(request.param == "avx2")
    yield request.param
    _core._resample_use_avx2(previous)


def order_rule():
    rule = pass_order()
    if rule is None:
        pytest.skip("the installed Pillow's pass order is not one fastload reproduces")
    return rule


def pillow_chw(img, size, resample, box, flip):
    out = img.resize(size, resample, box=box)
    if flip:
        out = out.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    return np.asarray(out.convert("RGB")).transpose(2, 0, 1)


def packed(pixels, pixel_bytes):
    """(h, w, 3) pixels as packed bytes of 3, or 4 (a junk fourth byte, as RGBX's pad)."""
    if pixel_bytes == 3:
        return pixels.tobytes()
    pad = np.full(pixels.shape[:2] + (1,), 0xA5, dtype=np.uint8)
    return np.concatenate([pixels, pad], axis=2).tobytes()


def check(pixels, crop, size, resample, flip, pixel_bytes, box=None):
    """The crop (left, top, right, bottom) of ``pixels`` resized, against Pillow."""
    height, width = pixels.shape[:2]
    left, top, right, bottom = crop
    region_w, region_h = right - left, bottom - top
    data = packed(pixels, pixel_bytes)  # bytes: read-only, nothing after the last pixel
    box = box if box is not None else (0, 0, region_w, region_h)
    vertical_first = order_rule()(region_h, region_w, size[1], size[0])
    got = _core.resize_packed_to_chw(data, (top * width + left) * pixel_bytes,
                                     width * pixel_bytes, pixel_bytes, region_w, region_h, box,
                                     size[0], size[1], int(resample), vertical_first, flip)
    region = Image.fromarray(pixels).crop(crop)
    expected = pillow_chw(region, size, resample, box, flip)
    assert got.shape == expected.shape and got.dtype == np.uint8
    assert np.array_equal(got, expected), (pixels.shape, crop, size, resample, flip, box)
    return vertical_first


@pytest.mark.parametrize("pixel_bytes", [3, 4])
def test_random_crops_and_sizes_match_pillow(loops, pixel_bytes):
    rng = np.random.default_rng(11)
    orders = set()
    for case in range(120):
        width, height = (int(v) for v in rng.integers(1, 70, 2))
        pixels = rng.integers(0, 256, (height, width, 3), dtype=np.uint8)
        left, right = sorted(int(v) for v in rng.choice(width + 1, 2, replace=False)) \
            if width > 1 else (0, 1)
        top, bottom = sorted(int(v) for v in rng.choice(height + 1, 2, replace=False)) \
            if height > 1 else (0, 1)
        size = tuple(int(v) for v in rng.integers(1, 90, 2))
        resample = FILTERS[case % len(FILTERS)]
        orders.add(check(pixels, (left, top, right, bottom), size, resample, bool(case % 2),
                         pixel_bytes))
    assert orders == {False, True}  # both pass orders were exercised


@pytest.mark.parametrize("flip", [False, True])
def test_edges_one_pixel_images_and_skipped_passes(loops, flip):
    rng = np.random.default_rng(5)
    pixels = rng.integers(0, 256, (29, 41, 3), dtype=np.uint8)
    crops = [(0, 0, 41, 29), (40, 28, 41, 29), (0, 28, 41, 29), (40, 0, 41, 29),
             (33, 20, 41, 29), (0, 0, 9, 7)]
    for crop in crops:
        region_w, region_h = crop[2] - crop[0], crop[3] - crop[1]
        sizes = [(region_w, region_h), (1, 1), (17, 3), (3, 40), (64, 64), (region_w, 9),
                 (12, region_h)]
        for size in sizes:
            for resample in FILTERS:
                for pixel_bytes in (3, 4):
                    check(pixels, crop, size, resample, flip, pixel_bytes)
    one = rng.integers(0, 256, (1, 1, 3), dtype=np.uint8)
    for size in [(1, 1), (5, 1), (1, 7), (9, 4)]:
        check(one, (0, 0, 1, 1), size, Image.Resampling.LANCZOS, flip, 3)


def test_float_boxes_match_pillow(loops):
    rng = np.random.default_rng(9)
    pixels = rng.integers(0, 256, (48, 64, 3), dtype=np.uint8)
    boxes = [(0.5, 0.25, 63.5, 47.0), (10.3, 7.7, 30.1, 40.9), (0, 0, 64, 48), (0, 2, 64, 48)]
    for box in boxes:
        for size in [(64, 48), (32, 20), (100, 70), (21, 47)]:
            for resample in FILTERS:
                check(pixels, (0, 0, 64, 48), size, resample, True, 4, box=box)


def test_wide_rows_and_many_taps_match_pillow(loops):
    rng = np.random.default_rng(2)
    pixels = rng.integers(0, 256, (300, 700, 3), dtype=np.uint8)
    for size, resample in [((37, 20), Image.Resampling.LANCZOS), ((224, 224), 2),
                           ((701, 13), Image.Resampling.BICUBIC)]:
        check(pixels, (0, 0, 700, 300), size, resample, False, 3)
        check(pixels, (123, 45, 611, 299), size, resample, True, 3)


def test_bad_arguments_name_what_is_wrong():
    data = bytes(4 * 5 * 3)
    call = _core.resize_packed_to_chw
    with pytest.raises(ValueError, match="resample=0"):
        call(data, 0, 15, 3, 5, 4, (0, 0, 5, 4), 2, 2, 0, False, False)
    with pytest.raises(ValueError, match="not inside 60 bytes"):
        call(data, 3, 15, 3, 5, 4, (0, 0, 5, 4), 2, 2, 2, False, False)
    with pytest.raises(ValueError, match="box"):
        call(data, 0, 15, 3, 5, 4, (0, 0, 6, 4), 2, 2, 2, False, False)
    with pytest.raises(ValueError, match="bytes"):
        call(data, 0, 15, 2, 5, 4, (0, 0, 5, 4), 2, 2, 2, False, False)
    with pytest.raises(ValueError, match="to 0x2"):
        call(data, 0, 15, 3, 5, 4, (0, 0, 5, 4), 0, 2, 2, False, False)


@pytest.fixture
def pillow_in_many_blocks():
    """Pillow allocating images in 4 KiB blocks: rows not in one block, nothing to lend."""
    core = Image.core
    previous = core.get_block_size()
    core.set_block_size(4096)
    yield
    core.set_block_size(previous)


def test_resize_to_chw_reads_pillows_memory_and_falls_back_where_it_cannot(
        pillow_in_many_blocks):
    from fastload.vision import resample as resample_module

    rng = np.random.default_rng(4)
    pixels = rng.integers(0, 256, (70, 90, 3), dtype=np.uint8)
    Image.core.set_block_size(1 << 24)
    one_block = Image.fromarray(pixels)
    Image.core.set_block_size(4096)
    many_blocks = Image.fromarray(pixels)
    if hasattr(one_block, "__arrow_c_array__"):  # Pillow >= 11.2 lends its memory
        assert resample_module._resize_in_pillow_memory(one_block, (40, 30), 2, None,
                                                        False) is not None
    assert resample_module._resize_in_pillow_memory(many_blocks, (40, 30), 2, None,
                                                    False) is None
    for img in (one_block, many_blocks):
        for size, box, flip in [((40, 30), None, False), ((128, 91), (3.5, 2, 80, 69.5), True)]:
            got = resample_module.resize_to_chw(img, size, Image.Resampling.BICUBIC, box, flip)
            assert np.array_equal(got, pillow_chw(img, size, Image.Resampling.BICUBIC, box, flip))
