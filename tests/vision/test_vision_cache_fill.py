"""The decoded-image cache's fill (pixels out of Pillow in one copy) and its reads'
checksum (paid once per entry per process)."""

from __future__ import annotations

import os

import numpy as np
import pytest
from PIL import Image

from fastload.vision import ImageFolder
from fastload.vision import cache as cache_module
from fastload.vision.cache_store import Entry, data_checksum
from fastload.vision.cache_verified import VerifiedEntries
from images import save_folder

SIDE = 64
FILES = [("a", "0.jpg", (40, 30)), ("a", "1.png", (64, 48)), ("a", "2.jpg", (150, 100)),
         ("b", "3.jpg", (90, 200)), ("b", "4.png", (1, 1)), ("b", "5.jpg", (63, 1))]


@pytest.fixture
def folder(tmp_path):
    return save_folder(tmp_path / "images", FILES)


def data_files(cache) -> dict[str, bytes]:
    return {name: (cache / name).read_bytes() for name in sorted(os.listdir(cache))
            if name.endswith(".data")}


@pytest.mark.parametrize("size", [(1, 1), (7, 3), (53, 37), (1, 300), (640, 480)])
def test_packed_pixels_are_tobytes_and_their_checksum(size):
    rng = np.random.default_rng(size[0])
    img = Image.fromarray(rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8))
    packed = cache_module._packed_rgb(img)
    if not hasattr(img, "__arrow_c_array__"):
        assert packed is None  # an older Pillow: the cache uses tobytes
        return
    pixels, checksum = packed
    assert pixels.tobytes() == img.tobytes()
    assert checksum == data_checksum(img.tobytes())


def test_the_store_holds_the_same_bytes_with_or_without_the_one_copy_fill(
        folder, tmp_path, monkeypatch):
    fast = tmp_path / "fast"
    ds = ImageFolder(folder, cache=fast, cache_max_side=SIDE)
    first = [ds[index][0] for index in range(len(ds))]
    monkeypatch.setattr(cache_module, "_packed_rgb", lambda img: None)  # tobytes only
    slow = tmp_path / "slow"
    ds = ImageFolder(folder, cache=slow, cache_max_side=SIDE)
    second = [ds[index][0] for index in range(len(ds))]
    assert list(data_files(fast).values()) == list(data_files(slow).values())
    assert all(np.array_equal(np.asarray(a), np.asarray(b)) for a, b in zip(first, second))
    # Both stores read back whole (their checksums match their bytes).
    for cache in (fast, slow):
        again = ImageFolder(folder, cache=cache, cache_max_side=SIDE)
        for index in range(len(again)):
            again[index]
        assert again.image_cache.stats()["hits"] == len(FILES)


def test_an_entry_is_summed_once_per_process(folder, tmp_path, monkeypatch):
    cache = tmp_path / "c"
    writer = ImageFolder(folder, cache=cache, cache_max_side=SIDE)
    for index in range(len(writer)):
        writer[index]
    sums = []

    def counting(data):
        sums.append(len(data))
        return data_checksum(data)

    monkeypatch.setattr(cache_module, "data_checksum", counting)
    for _ in range(2):  # the writer knows its own entries' bytes: it never sums them
        for index in range(len(writer)):
            writer[index]
    assert sums == [] and writer.image_cache.stats()["hits"] == 2 * len(FILES)
    reader = ImageFolder(folder, cache=cache, cache_max_side=SIDE)
    for _ in range(3):
        for index in range(len(reader)):
            reader[index]
    assert len(sums) == len(FILES)  # a new reader sums each entry once
    assert reader.image_cache.stats()["hits"] == 3 * len(FILES)


def test_a_damaged_entry_is_refused_every_time(folder, tmp_path):
    cache = tmp_path / "c"
    ds = ImageFolder(folder, cache=cache, cache_max_side=SIDE)
    for index in range(len(ds)):
        ds[index]
    (name, data), = data_files(cache).items()
    damaged = bytearray(data)
    damaged[3] ^= 0xFF  # the first entry's first pixel
    (cache / name).write_bytes(bytes(damaged))
    reader = ImageFolder(folder, cache=cache, cache_max_side=SIDE, cache_max_bytes=0)
    for _ in range(2):  # never verified, so never trusted (and, bounded at 0, not stored again)
        for index in range(len(reader)):
            reader[index]
    assert reader.image_cache.stats()["hits"] == 2 * (len(FILES) - 1)


def test_verified_entries_hold_what_was_added_and_nothing_else():
    def entry(number: int) -> Entry:
        return Entry(f"w{number % 3}.data", 64 * number, 100 + number, 8, 4, 1, 0, number * 7)

    verified = VerifiedEntries()
    for number in range(5000):  # several growths
        verified.add(entry(number))
        verified.add(entry(number))  # adding twice counts once
    assert len(verified) == 5000
    assert all(entry(number) in verified for number in range(5000))
    assert not any(entry(number) in verified for number in range(5000, 6000))
    moved = Entry("w0.data", 0, 100, 8, 4, 1, 0, 1)  # entry(0) with another checksum
    assert moved not in verified


def test_images_pillow_cannot_lend_are_stored_through_tobytes(folder, tmp_path):
    core = Image.core
    previous = core.get_block_size()
    core.set_block_size(4096)  # rows in many blocks: no Arrow export
    try:
        img = Image.new("RGB", (100, 100), (1, 2, 3))
        assert cache_module._packed_rgb(img) is None
        cache = tmp_path / "c"
        ds = ImageFolder(folder, cache=cache, cache_max_side=SIDE)
        first = [np.asarray(ds[index][0]) for index in range(len(ds))]
    finally:
        core.set_block_size(previous)
    again = ImageFolder(folder, cache=cache, cache_max_side=SIDE)
    for index in range(len(again)):
        assert np.array_equal(np.asarray(again[index][0]), first[index])
    assert again.image_cache.stats()["hits"] == len(FILES)
