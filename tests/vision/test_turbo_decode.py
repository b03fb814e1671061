"""simplejpeg's decode (fastload.vision.turbo_decode): Pillow's pixels, bit for bit, or Pillow.

The reference is Pillow itself: ``Image.open`` (with ``draft`` at 1/2, 1/4,
1/8) then ``convert("RGB")``, and ``ImageFolder`` with the simplejpeg path
switched off.  Every file simplejpeg may not decode as Pillow does (other
colour spaces, damaged data, huge images, other formats) must go to Pillow,
which then decodes it, or raises, exactly as without this path.
"""

from __future__ import annotations

import io
import os

import numpy as np
import pytest
from PIL import Image

from decode_spy import record_reductions
from fastload.cli import synthetic_image
from fastload.rng import seed_transform_rng
from fastload.vision import ImageFolder, turbo_decode
from fastload.vision import transforms as T

pytestmark = pytest.mark.skipif(not turbo_decode.available(),
                                reason="simplejpeg is not installed: Pillow decodes every JPEG")

# (name, (width, height), Pillow save options, mode)
FILES = [
    ("444.jpg", (301, 203), dict(quality=95, subsampling=0), "RGB"),
    ("422.jpg", (298, 211), dict(quality=85, subsampling=1), "RGB"),
    ("420.jpg", (333, 250), dict(quality=90, subsampling=2), "RGB"),
    ("progressive.jpg", (257, 255), dict(quality=90, progressive=True), "RGB"),
    ("restarts.jpg", (263, 199), dict(quality=90, restart_marker_blocks=2), "RGB"),
    ("gray.jpg", (277, 190), dict(quality=90), "L"),
]


def jpeg_bytes(size, options, mode, seed=0) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(synthetic_image(*size, np.random.default_rng(seed))).convert(mode).save(
        buffer, "JPEG", **options)
    return buffer.getvalue()


def pillow_rgb(data: bytes, reduction: int) -> np.ndarray:
    img = Image.open(io.BytesIO(data))
    if reduction > 1:
        img.draft("RGB", (img.width // reduction, img.height // reduction))
    return np.asarray(img.convert("RGB"))


@pytest.mark.parametrize("name,size,options,mode", FILES)
def test_pixels_are_pillows_at_every_scale(name, size, options, mode):
    data = jpeg_bytes(size, options, mode)
    header = turbo_decode.read_header(data)
    assert (header.width, header.height) == size
    for reduction in (1, 2, 4, 8):
        pixels = turbo_decode.decode_rgb(data, header, reduction)
        assert np.array_equal(pixels, pillow_rgb(data, reduction)), (name, reduction)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    root = tmp_path_factory.mktemp("jpegs")
    os.makedirs(root / "a")
    for seed, (name, size, options, mode) in enumerate(FILES):
        # Twice the size: crops large enough for 1/2 and 1/4 from RandomResizedCrop(64).
        data = jpeg_bytes((2 * size[0], 2 * size[1]), options, mode, seed)
        (root / "a" / name).write_bytes(data)
    Image.fromarray(synthetic_image(300, 200, np.random.default_rng(9))).convert("CMYK").save(
        root / "a" / "cmyk.jpg")
    Image.fromarray(synthetic_image(300, 200, np.random.default_rng(9))).save(root / "a" / "x.png")
    return str(root)


def loads(root: str, draws: int = 4) -> list[np.ndarray]:
    ds = ImageFolder(root, transform=T.Compose([T.RandomResizedCrop(64), T.RandomHorizontalFlip(),
                                                T.ToArray()]))
    out = []
    for index in range(len(ds)):
        for draw in range(draws):
            seed_transform_rng(3, 10 * index + draw)
            out.append(ds[index][0])
    return out


def test_the_folder_gives_the_pillow_paths_arrays_bit_for_bit(folder, monkeypatch):
    scales = record_reductions(monkeypatch)
    used = []
    decode_rgb = turbo_decode.decode_rgb
    monkeypatch.setattr(turbo_decode, "decode_rgb",
                        lambda *args: used.append(1) or decode_rgb(*args))
    fast = loads(folder)
    assert len(used) == 4 * len(FILES)  # every JPEG but the CMYK one, every draw
    assert {2, 4} <= set(scales)
    monkeypatch.setattr(turbo_decode, "simplejpeg", None)
    assert not turbo_decode.available()
    used.clear()
    pillow = loads(folder)
    assert used == []
    assert all(np.array_equal(a, b) for a, b in zip(fast, pillow, strict=True))


def test_files_it_cannot_decode_as_pillow_does_are_left_to_pillow(folder, monkeypatch):
    with open(os.path.join(folder, "a", "cmyk.jpg"), "rb") as f:
        assert turbo_decode.read_header(f.read()) is None
    with open(os.path.join(folder, "a", "x.png"), "rb") as f:
        assert turbo_decode.read_header(f.read()) is None
    data = jpeg_bytes((64, 48), dict(quality=90), "RGB")
    assert turbo_decode.read_header(data[:3] + b"garbage") is None
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 64 * 48 - 1)  # Pillow warns: let it
    assert turbo_decode.read_header(data) is None


def test_damaged_jpegs_raise_or_recover_as_pillow_does(tmp_path):
    data = jpeg_bytes((400, 300), dict(quality=90), "RGB")
    os.makedirs(tmp_path / "a")
    (tmp_path / "a" / "0_truncated.jpg").write_bytes(data[: len(data) // 2])
    # A stray restart marker: libjpeg warns and Pillow recovers; a damaged table: both fail.
    middle = len(data) // 2
    damaged = data[:middle] + b"\xff\xd3" + data[middle:]
    (tmp_path / "a" / "1_stray_marker.jpg").write_bytes(damaged)
    (tmp_path / "a" / "2_bad_table.jpg").write_bytes(data[:middle] + b"\xff\xc4" + data[middle + 2:])
    header = turbo_decode.read_header(damaged)
    assert turbo_decode.decode_rgb(damaged, header, 1) is None  # strict: any warning
    # No crop of a 400x300 image is twice 200 pixels: a full decode, comparable bit for bit.
    transform = T.Compose([T.RandomResizedCrop(200), T.ToArray()])
    ds = ImageFolder(str(tmp_path), transform=transform)
    outcomes = []
    for index, (path, _) in enumerate(ds.samples):
        try:
            with open(path, "rb") as f:
                expected = Image.open(f).convert("RGB")
        except OSError as error:
            with pytest.raises(type(error)) as raised:
                ds[index]
            assert path in str(raised.value) and f"sample {index}" in str(raised.value)
            outcomes.append("raised")
            continue
        seed_transform_rng(1, index)
        got = ds[index][0]
        seed_transform_rng(1, index)
        assert np.array_equal(got, transform(expected))
        outcomes.append("recovered")
    assert outcomes == ["raised", "recovered", "raised"]


@pytest.mark.parametrize("name,size,options,mode", FILES)
def test_the_caches_covering_decode_is_pillows(name, size, options, mode, monkeypatch):
    from fastload.vision.decode import decode_covering

    data = jpeg_bytes(size, options, mode)
    for side in (size[0], size[0] // 2, size[0] // 5, 20):
        def out_size(width, height):
            return side, max(1, round(height * side / width))

        fast, full_size, reduction = decode_covering(io.BytesIO(data), out_size)
        with monkeypatch.context() as patch:
            patch.setattr(turbo_decode, "simplejpeg", None)
            pillow, pillow_full, pillow_reduction = decode_covering(io.BytesIO(data), out_size)
        assert (full_size, reduction) == (pillow_full, pillow_reduction) == (size, reduction)
        assert fast.mode == pillow.mode == "RGB"
        assert np.array_equal(np.asarray(fast), np.asarray(pillow)), (name, side)
