"""The decoded-image cache's checksums (fastload.vision.cache_checksums): an entry's bytes
(``data_checksum``: XXH3-64, or zlib's CRC32 without the ``xxhash`` package) and
each index record (``record_checks``).  Damage a word sum lets pass -- swapped words,
+-1 in two words, swapped pages -- and a flipped bit are each caught: the entry is
refused and its image decoded again."""

from __future__ import annotations

import os
import zlib

import numpy as np
import pytest
import xxhash
from PIL import Image

from fastload.vision import ImageFolder, cache_checksums, cache_store

SIDE = 64
PAGE = 4096


@pytest.fixture
def folder(tmp_path):
    """Two noise PNGs of 64x64 (12 KiB of raw pixels each, stored as they are)."""
    rng = np.random.default_rng(35)
    for name in ("0.png", "1.png"):
        img = Image.fromarray(rng.integers(0, 256, (SIDE, SIDE, 3), dtype=np.uint8))
        path = tmp_path / "images" / "a" / name
        os.makedirs(path.parent, exist_ok=True)
        img.save(path)
    return str(tmp_path / "images")


def file_pixels(path: str) -> np.ndarray:
    return np.asarray(Image.open(path).convert("RGB"))


def swap_words(data: bytearray) -> None:
    first, second = bytes(data[0:8]), bytes(data[8:16])
    assert first != second
    data[0:8], data[8:16] = second, first


def plus_and_minus_one(data: bytearray) -> None:
    # +1 in one 64-bit word, -1 in another (low bytes chosen so no carry): the sum stays.
    up = next(i for i in range(0, 4000, 8) if data[i] < 255)
    down = next(i for i in range(up + 8, 8000, 8) if data[i] > 0)
    data[up] += 1
    data[down] -= 1


def swap_pages(data: bytearray) -> None:
    first, second = bytes(data[0:PAGE]), bytes(data[PAGE:2 * PAGE])
    data[0:PAGE], data[PAGE:2 * PAGE] = second, first


def flip_a_bit(data: bytearray) -> None:
    data[5000] ^= 0x10


@pytest.mark.parametrize("damage", [swap_words, plus_and_minus_one, swap_pages, flip_a_bit])
def test_damaged_entry_bytes_are_refused_and_decoded_again(folder, tmp_path, damage):
    cache = tmp_path / "c"
    ds = ImageFolder(folder, cache=cache, cache_max_side=SIDE)
    for index in range(len(ds)):
        ds[index]
    data_file, = (cache / name for name in os.listdir(cache) if name.endswith(".data"))
    data = bytearray(data_file.read_bytes())
    assert len(data) >= SIDE * SIDE * 3 > 2 * PAGE  # the first entry, at offset 0, is damaged
    damage(data)
    data_file.write_bytes(bytes(data))
    reader = ImageFolder(folder, cache=cache, cache_max_side=SIDE, cache_max_bytes=0)
    for _ in range(2):
        for index, (path, _) in enumerate(reader.samples):
            assert np.array_equal(np.asarray(reader[index][0]), file_pixels(path)), path
    stats = reader.image_cache.stats()
    assert stats["hits"] == 2 * (len(ds) - 1) and stats["not_cached"] == 2


def test_the_checksum_is_xxh3_64_of_the_bytes():
    data = np.random.default_rng(1).integers(0, 256, 100_003, dtype=np.uint8)
    assert cache_checksums.checksum_name() == "xxh3_64"
    assert cache_checksums.data_checksum(data) == xxhash.xxh3_64_intdigest(data.tobytes())
    assert cache_checksums.data_checksum(memoryview(data.tobytes())[3:77]) == \
        xxhash.xxh3_64_intdigest(data.tobytes()[3:77])


def test_without_xxhash_crc32_checks_entries_and_is_part_of_their_key(folder, tmp_path,
                                                                       monkeypatch):
    cache = tmp_path / "c"
    ImageFolder(folder, cache=cache, cache_max_side=SIDE)[0]  # an XXH3 entry
    monkeypatch.setattr(cache_checksums, "_xxh3_64", None)
    assert cache_checksums.checksum_name() == "crc32"
    assert cache_checksums.data_checksum(b"pixels") == zlib.crc32(b"pixels")
    crc = ImageFolder(folder, cache=cache, cache_max_side=SIDE)
    for _ in range(2):
        for index, (path, _) in enumerate(crc.samples):
            assert np.array_equal(np.asarray(crc[index][0]), file_pixels(path))
    # Its own entries, never the XXH3 one (which it could not check).
    assert crc.image_cache.stats()["stored"] == 2 and crc.image_cache.stats()["hits"] == 2
    reader = ImageFolder(folder, cache=cache, cache_max_side=SIDE)
    for index in range(len(reader)):
        reader[index]
    assert reader.image_cache.stats()["hits"] == 2


def check_of(words: np.ndarray) -> int:
    """The record check of a record whose 16 words are ``words`` (read as an index
    file is read: every byte as written, the two between format and data_sum too)."""
    records = np.frombuffer(words.tobytes(), cache_store.RECORD)
    return int(cache_checksums.record_checks(records)[0])


@pytest.mark.parametrize("seed", range(20))
def test_record_checks_catch_swapped_words_and_small_changes_in_two(seed):
    record = np.zeros(16, np.uint32)
    record[:15] = np.random.default_rng(seed).integers(1, 2**31, 15, dtype=np.uint32)
    check = check_of(record)
    for first, second in [(0, 1), (2, 9), (4, 14)]:
        swapped = record.copy()
        swapped[first], swapped[second] = record[second], record[first]
        assert check_of(swapped) != check, (first, second)
    for first, up, second, down in [(0, 3, 1, 1), (0, 1, 1, 1), (5, 2, 6, 2), (3, 1, 12, 1)]:
        changed = record.copy()
        changed[first] += up
        changed[second] -= down
        assert check_of(changed) != check, (first, up, second, down)
