"""The bench's fidelity line: the default decode's PSNR against torchvision's steps."""

from __future__ import annotations

import numpy as np
import pytest
from PIL import Image

from fastload.cli.fidelity import decode_psnr, psnr
from fastload.cli.pipelines import image_folder
from fastload.rng import seed_transform_rng
from fastload.vision import transforms as T


def test_psnr_of_known_errors():
    zeros = np.zeros((3, 4, 4), dtype=np.uint8)
    assert psnr(zeros, zeros) == float("inf")
    ones = np.ones_like(zeros)
    assert psnr(ones, zeros) == pytest.approx(20 * np.log10(255.0))
    half = zeros.copy()
    half[0] = 10  # a third of the values off by 10: MSE 100 / 3
    assert psnr(half, zeros) == pytest.approx(10 * np.log10(255.0 ** 2 * 3 / 100))


def test_small_images_are_never_reduced_so_nothing_differs(tiny_folder):
    found = decode_psnr(tiny_folder, probe=12)
    assert found.probed == 12 and found.differing == 0 and found.mean_psnr_db is None


def test_photo_crops_are_compared_with_a_full_decode_of_the_same_crop(photo_folder):
    found = decode_psnr(photo_folder, probe=4)
    assert found.probed == 4 and found.differing >= 1
    assert 38.0 <= found.min_psnr_db <= found.mean_psnr_db < 80.0
    # The reference, written here: each probed file's crop, drawn with the same
    # seed, from a full decode; the lowest PSNR is one of them.
    folder = image_folder(photo_folder)
    crop = T.RandomResizedCrop(224)
    values = []
    for index in np.random.default_rng(0).choice(len(folder), size=4, replace=False):
        path = folder.samples.path(int(index))
        full = Image.open(path).convert("RGB")
        seed_transform_rng(0, int(index))
        top, left, height, width = crop.get_params(full, crop.scale, crop.ratio)
        expected = np.asarray(full.crop((left, top, left + width, top + height)).resize(
            (224, 224), Image.Resampling.BILINEAR)).transpose(2, 0, 1)
        seed_transform_rng(0, int(index))
        got = folder.__class__(photo_folder, transform=T.Compose([crop, T.ToArray()]))[int(index)][0]
        values.append(psnr(got, expected))
    differing = [value for value in values if value != float("inf")]
    assert found.differing == len(differing)
    assert found.mean_psnr_db == pytest.approx(np.mean(differing))
