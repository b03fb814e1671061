"""How close the reduced-size JPEG decode comes to torchvision's decode-then-crop-then-resize.

The reference is written here from torchvision's behaviour: Pillow decodes
the file in full, crops the box the transform drew, resizes it (BILINEAR),
then flips and copies to channels-first.  fastload's default path draws the
same box (same random numbers) but may decode at 1/2, 1/4 or 1/8 scale; the
stated fidelity is a PSNR of at least 38 dB against that reference, on
photo-like JPEGs (gradients, shapes, texture and sensor grain) of every
chroma subsampling, quality 85-95, baseline, progressive and with restart
markers, and on crops at every edge and corner at every scale; no single
crop below 30 dB (the worst are crops whose reduced region is exactly the
output size, over fine stripes).  Where no reduction applies, and with a
full-decode loader, the result is the reference bit for bit.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
from PIL import Image

from decode_spy import record_reductions
from fastload.cli import synthetic_image
from fastload.cli.fidelity import psnr  # its arithmetic is checked in tests/cli
from fastload.cli.pipelines import full_decode_loader
from fastload.rng import seed_transform_rng
from fastload.vision import ImageFolder
from fastload.vision import transforms as T
from fastload.vision.cache import cached_size
from fastload.vision.decode import decode_planned, pil_loader
from fastload.vision.transforms import RegionPlan

PSNR_GOAL = 38.0  # the mean over each file's crops
PSNR_FLOOR = 30.0  # any single crop (fine texture where the reduced region is the output size)
BILINEAR = Image.Resampling.BILINEAR

# (name, size, Pillow save options, mode): the corpus.
CORPUS = [
    ("q90_420.jpg", (1024, 768), dict(quality=90, subsampling=2), "RGB"),
    ("q85_422.jpg", (1001, 757), dict(quality=85, subsampling=1), "RGB"),
    ("q95_444.jpg", (768, 1024), dict(quality=95, subsampling=0), "RGB"),
    ("progressive.jpg", (1200, 900), dict(quality=90, progressive=True), "RGB"),
    ("restarts.jpg", (999, 641), dict(quality=88, restart_marker_blocks=3), "RGB"),
    ("restart_rows.jpg", (640, 960), dict(quality=92, restart_marker_rows=1,
                                          subsampling=1), "RGB"),
    ("gray.jpg", (1100, 800), dict(quality=90), "L"),
    ("cmyk.jpg", (900, 700), dict(quality=90), "CMYK"),
]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("photos")
    os.makedirs(root / "a")
    for seed, (name, (width, height), options, mode) in enumerate(CORPUS):
        photo = Image.fromarray(synthetic_image(width, height, np.random.default_rng(seed)))
        photo.convert(mode).save(root / "a" / name, "JPEG", **options)
    return str(root)


def torchvision_reference(path: str, box, size, flip: bool = False) -> np.ndarray:
    """Full decode, crop, BILINEAR resize, flip, channels first: torchvision's steps."""
    img = pil_loader(path).crop(box).resize(size, BILINEAR)
    if flip:
        img = img.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
    return np.asarray(img).transpose(2, 0, 1)


class FixedRegion:
    """A transform head whose plan is a given box and output size."""

    def __init__(self, box, size):
        self.plan = RegionPlan(box, size, BILINEAR)

    def plan_region(self, width, height):
        return self.plan


def test_random_resized_crops_of_the_corpus_keep_the_stated_psnr(corpus):
    reduced, scales = [], set()
    for size in (48, 112, 400):  # large and small outputs: every scale is drawn
        crop, flip = T.RandomResizedCrop(size), T.RandomHorizontalFlip()
        ds = ImageFolder(corpus, transform=T.Compose([crop, flip, T.ToArray()]))
        for index, (path, _) in enumerate(ds.samples):
            width, height = Image.open(path).size
            for draw in range(4):
                seed_transform_rng(size, 100 * index + draw)
                got = ds[index][0]
                seed_transform_rng(size, 100 * index + draw)
                plan = crop.plan_region(width, height)
                expected = torchvision_reference(path, plan.box, plan.size, flip.flips())
                scale = plan.max_reduction()
                scales.add(scale)
                if scale == 1:
                    assert np.array_equal(got, expected), (path, draw)
                else:
                    reduced.append(psnr(got, expected))
    assert scales == {1, 2, 4, 8}
    assert np.mean(reduced) >= PSNR_GOAL and min(reduced) >= PSNR_FLOOR, reduced


def boxes_at_edges_and_corners(width: int, height: int, side: int):
    """Boxes of ``side`` pixels (clamped to the image) in the four corners, at the
    middle of each edge, in the centre, and the full frame."""
    w, h = min(side, width), min(side, height)
    lefts = (0, (width - w) // 2, width - w)
    tops = (0, (height - h) // 2, height - h)
    boxes = [(left, top, left + w, top + h) for left in lefts for top in tops]
    return boxes + [(0, 0, width, height)]


@pytest.mark.parametrize("scale", [2, 4, 8])
def test_crops_at_every_edge_and_corner_at_every_scale(corpus, scale):
    for name, *_ in CORPUS:
        path = os.path.join(corpus, "a", name)
        width, height = Image.open(path).size
        values = []
        for box in boxes_at_edges_and_corners(width, height, side=8 * 37):
            # The output exactly the reduced region: the least headroom a plan has.
            out = ((box[2] - box[0]) // scale, (box[3] - box[1]) // scale)
            assert RegionPlan(box, out, BILINEAR).max_reduction() == scale
            got, _ = decode_planned(path, FixedRegion(box, out), [T.ToArray()])
            assert got.shape == (3, out[1], out[0])
            values.append(psnr(got, torchvision_reference(path, box, out)))
        assert np.mean(values) >= PSNR_GOAL and min(values) >= PSNR_FLOOR, (name, values)


@pytest.mark.parametrize("box_and_size", [
    ((0, 0, 1, 1), (1, 1)),            # a 1x1 crop: no reduction, exact
    ((5, 3, 6, 4), (7, 9)),            # a 1x1 crop enlarged: exact
    ("full", (1, 1)),                  # the full frame to one pixel: 1/8
    ("full", "same"),                  # the full frame at its own size: exact
    ((3, 2, 500, 301), (61, 37)),      # odd sizes and offsets: 1/8
])
def test_one_pixel_and_full_frame_crops(corpus, box_and_size):
    box, size = box_and_size
    for name, *_ in CORPUS:
        path = os.path.join(corpus, "a", name)
        width, height = Image.open(path).size
        frame = (0, 0, width, height) if box == "full" else box
        out = (width, height) if size == "same" else size
        got, _ = decode_planned(path, FixedRegion(frame, out), [T.ToArray()])
        expected = torchvision_reference(path, frame, out)
        if RegionPlan(frame, out, BILINEAR).max_reduction() == 1:
            assert np.array_equal(got, expected), (name, frame, out)
        else:
            assert psnr(got, expected) >= PSNR_FLOOR, (name, frame, out)


def test_a_full_decode_loader_is_bit_exact(corpus):
    crop = T.RandomResizedCrop(112)
    ds = ImageFolder(corpus, transform=T.Compose([crop, T.ToArray()]), loader=full_decode_loader)
    for index, (path, _) in enumerate(ds.samples):
        width, height = Image.open(path).size
        for draw in range(3):
            seed_transform_rng(5, 10 * index + draw)
            got = ds[index][0]
            seed_transform_rng(5, 10 * index + draw)
            plan = crop.plan_region(width, height)
            assert np.array_equal(got, torchvision_reference(path, plan.box, plan.size))


@pytest.mark.parametrize("reduced", [True, False])
def test_truncated_and_corrupt_jpegs_raise_naming_path_and_index(corpus, tmp_path, reduced):
    with open(os.path.join(corpus, "a", "q90_420.jpg"), "rb") as f:
        jpeg = f.read()
    os.makedirs(tmp_path / "a")
    (tmp_path / "a" / "0_truncated.jpg").write_bytes(jpeg[: len(jpeg) * 2 // 3])
    # Entropy-coded data overwritten after the headers: a marker where none may be.
    corrupt = bytearray(jpeg)
    corrupt[len(jpeg) // 2: len(jpeg) // 2 + 64] = b"\xff\xd9" * 32
    (tmp_path / "a" / "1_corrupt.jpg").write_bytes(bytes(corrupt))
    crop = T.RandomResizedCrop(64, scale=(0.9, 1.0)) if reduced else T.RandomResizedCrop(
        900, scale=(0.9, 1.0))
    ds = ImageFolder(str(tmp_path), transform=T.Compose([crop, T.ToArray()]))
    for index, (path, _) in enumerate(ds.samples):
        without_plan = None
        try:
            pil_loader(path)
        except OSError as error:
            without_plan = type(error)
        if without_plan is None:
            continue  # libjpeg recovered (warnings only): nothing to raise, as torchvision
        with pytest.raises(without_plan) as raised:
            ds[index]
        assert path in str(raised.value) and f"sample {index}" in str(raised.value)


def test_the_cache_fills_from_a_reduced_decode_within_the_stated_psnr(corpus, tmp_path):
    side = 200
    ds = ImageFolder(corpus, cache=tmp_path / "cache", cache_max_side=side)
    values = []
    for index, (path, _) in enumerate(ds.samples):
        img = ds[index][0]
        full = pil_loader(path)
        size = cached_size(*full.size, side)
        assert img.size == size
        values.append(psnr(np.asarray(img), np.asarray(full.resize(size, Image.Resampling.LANCZOS))))
    assert np.mean(values) >= PSNR_GOAL and min(values) >= PSNR_FLOOR, values


def test_chroma_subsampled_unevenly_is_decoded_at_most_at_a_quarter(corpus, monkeypatch):
    scales = record_reductions(monkeypatch)
    for name, expected in (("q85_422.jpg", 4), ("q90_420.jpg", 8), ("q95_444.jpg", 8),
                           ("gray.jpg", 8), ("cmyk.jpg", 8)):
        path = os.path.join(corpus, "a", name)
        width, height = Image.open(path).size
        scales.clear()
        got, _ = decode_planned(path, FixedRegion((0, 0, width, height), (50, 50)), [T.ToArray()])
        assert scales == [expected], name
        assert psnr(got, torchvision_reference(path, (0, 0, width, height), (50, 50))) >= PSNR_GOAL
