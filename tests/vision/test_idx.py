"""fastload.vision.idx: a crafted or damaged IDX file, plain or gzip, is refused with a
``ValueError`` naming it, and nothing is allocated that the file did not deliver.

gzip keeps the uncompressed size modulo 2**32 in its last four bytes, and that
field is not covered by the CRC: these files forge it to agree with their
headers, so only the stream itself can tell the truth.
"""

from __future__ import annotations

import gzip
import os
import struct
import tracemalloc

import numpy as np
import pytest

from fastload.vision.idx import read_idx, read_image_file
from classic_files import idx_bytes

PEAK_LIMIT = 4 << 20  # the 1 MiB read chunk, zlib's window and change


def _header(dims: tuple[int, ...], type_code: int = 0x08) -> bytes:
    return struct.pack(">BBBB", 0, 0, type_code, len(dims)) + struct.pack(f">{len(dims)}i", *dims)


def _forge_size(gz: bytes, size: int) -> bytes:
    """``gz`` with its trailer's size field set to ``size`` mod 2**32."""
    return gz[:-4] + struct.pack("<I", size % 2**32)


def _read_with_peak(path) -> tuple[Exception | None, int]:
    tracemalloc.start()
    try:
        try:
            read_idx(path)
            error = None
        except Exception as raised:  # returned, so the peak is checked whatever it is
            error = raised
        return error, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def _assert_refused(path, message: str) -> None:
    error, peak = _read_with_peak(path)
    assert peak < PEAK_LIMIT, f"{peak} bytes allocated ({error!r})"
    assert isinstance(error, ValueError), repr(error)
    assert str(path) in str(error) and message in str(error), str(error)


def test_gzip_of_16_bytes_claiming_2_to_the_34(tmp_path):
    # 16 + 2**34 is 16 modulo 2**32: the trailer of the 16 bytes really compressed agrees.
    path = tmp_path / "images.gz"
    path.write_bytes(gzip.compress(_header((16384, 1024, 1024))))
    _assert_refused(path, "more than a")


def test_huge_dims_with_a_tiny_body(tmp_path):
    dims = (1 << 20, 28, 28)
    data = _header(dims) + bytes(100)
    path = tmp_path / "images.gz"
    path.write_bytes(_forge_size(gzip.compress(data), 16 + (28 * 28 << 20)))
    _assert_refused(path, "more than a")


@pytest.mark.parametrize("forged", [False, True])
def test_stream_shorter_than_the_header_says(tmp_path, forged):
    # Large enough that deflate could hold the declared size: the stream is counted.
    dims = (60000, 28, 28)
    body = np.random.default_rng(0).integers(0, 256, 50_000, dtype=np.uint8).tobytes()
    gz = gzip.compress(_header(dims) + body)
    path = tmp_path / "images.gz"
    path.write_bytes(_forge_size(gz, 16 + 60000 * 784) if forged else gz)
    _assert_refused(path, "gzip data" if forged else "found 50000")


def test_truncated_gzip(tmp_path):
    array = np.random.default_rng(1).integers(0, 256, (200, 28, 28), dtype=np.uint8)
    gz = gzip.compress(idx_bytes(array))
    path = tmp_path / "images.gz"
    for end in (len(gz) // 2, len(gz) - 6, 12):
        path.write_bytes(gz[:end])
        _assert_refused(path, "truncated")


@pytest.mark.parametrize("tail", ["garbage", "member"])
def test_data_after_the_array(tmp_path, tail):
    array = np.arange(2 * 28 * 28, dtype=np.uint8).reshape(2, 28, 28)
    gz = gzip.compress(idx_bytes(array))
    path = tmp_path / "images.gz"
    if tail == "garbage":
        path.write_bytes(gz + b"not gzip at all")
        _assert_refused(path, "corrupt or truncated gzip data")
    else:  # a second gzip member with more values
        path.write_bytes(gz + gzip.compress(b"\x01" * 784))
        _assert_refused(path, "longer than its dimensions")


def test_good_files_read_exactly(tmp_path):
    array = np.random.default_rng(2).integers(0, 256, (30, 28, 28), dtype=np.uint8)
    data = idx_bytes(array)
    (tmp_path / "plain").write_bytes(data)
    (tmp_path / "one.gz").write_bytes(gzip.compress(data))
    # Concatenated members are one gzip file (as `cat a.gz b.gz` makes).
    (tmp_path / "two.gz").write_bytes(gzip.compress(data[:5000]) + gzip.compress(data[5000:]))
    for name in ("plain", "one.gz", "two.gz"):
        read = read_image_file(tmp_path / name)
        assert read.dtype == np.uint8 and read.flags.writeable and read.flags.c_contiguous
        np.testing.assert_array_equal(read, array)
    wide = np.arange(-6, 6, dtype=">i4").reshape(3, 4)
    path = tmp_path / "wide.gz"
    path.write_bytes(gzip.compress(_header(wide.shape, 0x0C) + wide.tobytes()))
    read = read_idx(path)
    assert read.dtype == np.int32 and read.dtype.isnative
    np.testing.assert_array_equal(read, wide)
    empty = tmp_path / "empty.gz"
    empty.write_bytes(gzip.compress(_header((0, 28, 28))))
    assert read_idx(empty).shape == (0, 28, 28)


def test_plain_file_size_is_checked_before_allocating(tmp_path):
    path = tmp_path / "images"
    path.write_bytes(_header((1 << 20, 1024, 1024)) + bytes(10))
    _assert_refused(path, "disagree with the file's size")
    assert os.path.getsize(path) == 26
