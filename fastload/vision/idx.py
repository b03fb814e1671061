"""The IDX format of MNIST's files (LeCun's "SN3 Pascal Vincent" format), read with checks.

A file is a 4-byte magic number (two zero bytes, a type code, the number of
dimensions), one big-endian int32 per dimension, then the values, big-endian,
row-major.  Plain or gzip-compressed (``.gz``).  Anything that disagrees with
itself (magic, type, dimensions against the bytes present) raises a
``ValueError`` naming the file.  No array is allocated before the file has
shown it holds that many bytes: an uncompressed file's size is checked
first, a gzip stream is decompressed up to what the header declares and
counted.
"""

from __future__ import annotations

import gzip
import math
import os
import zlib

import numpy as np

__all__ = ["read_idx", "read_image_file", "read_label_file"]

# Type code -> element type (big-endian where it has more than one byte).
_IDX_TYPES = {0x08: np.dtype(np.uint8), 0x09: np.dtype(np.int8), 0x0B: np.dtype(">i2"),
              0x0C: np.dtype(">i4"), 0x0D: np.dtype(">f4"), 0x0E: np.dtype(">f8")}


# Deflate codes at most 258 bytes of output per bit or so of input: no gzip stream
# inflates to more than about 1032 times its own size.
_DEFLATE_MAX_RATIO = 1032
_CHUNK = 1 << 20


def _read_exactly(f, count: int, path: str, what: str) -> bytes:
    data = f.read(count)
    if len(data) != count:
        raise ValueError(f"{path}: truncated IDX file: {what} needs {count} bytes, "
                         f"found {len(data)}")
    return data


def _read_header(f, path: str) -> tuple[np.dtype, tuple[int, ...]]:
    magic = _read_exactly(f, 4, path, "the magic number")
    if magic[0] != 0 or magic[1] != 0 or magic[2] not in _IDX_TYPES or not 1 <= magic[3] <= 4:
        raise ValueError(f"{path}: not an IDX file: magic number 0x{magic.hex()} (expected "
                         f"0x0000TTDD with a type code TT in 08, 09, 0b-0e and 1-4 "
                         f"dimensions DD)")
    ndim = magic[3]
    dims = tuple(int(d) for d in np.frombuffer(
        _read_exactly(f, 4 * ndim, path, f"{ndim} dimensions"), dtype=">i4"))
    if any(d < 0 for d in dims):
        raise ValueError(f"{path}: negative dimension in IDX header {dims}")
    return _IDX_TYPES[magic[2]], dims


def _read_plain(f, path: str, dtype: np.dtype, dims: tuple[int, ...]) -> np.ndarray:
    """The values of an uncompressed file, whose size is checked against the header
    before the array is allocated."""
    nbytes = math.prod(dims) * dtype.itemsize
    expected, size = 4 + 4 * len(dims) + nbytes, os.path.getsize(path)
    if expected != size:
        raise ValueError(f"{path}: IDX dimensions {dims} of {dtype.name} disagree with the "
                         f"file's size: {expected} bytes expected, found {size}")
    array = np.empty(dims, dtype=dtype)
    view = memoryview(array.reshape(-1).view(np.uint8))
    filled = 0
    while filled < nbytes:
        got = f.readinto(view[filled:])
        if not got:
            break
        filled += got
    _check_length(f, path, dtype, dims, filled)
    return array


def _read_gzip(f, path: str, dtype: np.dtype, dims: tuple[int, ...]) -> np.ndarray:
    """The values of a gzip file: decompressed a chunk at a time, never past what the
    header declares, and put in an array only once the stream has delivered all of it
    (gzip's own size field is modulo 2**32, so it cannot vouch for the header)."""
    nbytes = math.prod(dims) * dtype.itemsize
    bound = _DEFLATE_MAX_RATIO * os.path.getsize(path)
    if nbytes > bound:
        raise ValueError(f"{path}: IDX dimensions {dims} of {dtype.name} need {nbytes} bytes "
                         f"of data, more than a {os.path.getsize(path)}-byte gzip file can "
                         f"hold (at most {bound})")
    chunks, delivered = [], 0
    while delivered < nbytes:
        chunk = f.read(min(_CHUNK, nbytes - delivered))
        if not chunk:
            break
        chunks.append(chunk)
        delivered += len(chunk)
    _check_length(f, path, dtype, dims, delivered)
    array = np.empty(dims, dtype=dtype)
    flat, filled = array.reshape(-1).view(np.uint8), 0
    for i, chunk in enumerate(chunks):  # each chunk freed once copied
        flat[filled:filled + len(chunk)] = np.frombuffer(chunk, np.uint8)
        filled += len(chunk)
        chunks[i] = None
    return array


def _check_length(f, path: str, dtype: np.dtype, dims: tuple[int, ...], found: int) -> None:
    nbytes = math.prod(dims) * dtype.itemsize
    if found != nbytes:
        raise ValueError(f"{path}: truncated IDX file: dimensions {dims} of {dtype.name} "
                         f"need {nbytes} bytes of data, found {found}")
    if f.read(1):
        raise ValueError(f"{path}: IDX file longer than its dimensions {dims} say "
                         f"({nbytes} bytes of data)")


def read_idx(path: str | os.PathLike) -> np.ndarray:
    """The array stored in an IDX file (``.gz`` read through gzip), in native byte order."""
    path = os.fspath(path)
    compressed = path.endswith(".gz")
    try:
        with (gzip.open(path, "rb") if compressed else open(path, "rb")) as f:
            dtype, dims = _read_header(f, path)
            array = (_read_gzip if compressed else _read_plain)(f, path, dtype, dims)
    except (gzip.BadGzipFile, EOFError, zlib.error) as error:
        raise ValueError(f"{path}: corrupt or truncated gzip data ({error})") from error
    return array.astype(dtype.newbyteorder("="), copy=False)


def read_image_file(path: str | os.PathLike) -> np.ndarray:
    """A uint8 ``(N, H, W)`` IDX file of images."""
    array = read_idx(path)
    if array.dtype != np.uint8 or array.ndim != 3:
        raise ValueError(f"{os.fspath(path)}: expected uint8 images (3 dimensions), got "
                         f"{array.dtype} with {array.ndim} dimension(s) {array.shape}")
    return array


def read_label_file(path: str | os.PathLike) -> np.ndarray:
    """A uint8 ``(N,)`` IDX file of labels, as int64."""
    array = read_idx(path)
    if array.dtype != np.uint8 or array.ndim != 1:
        raise ValueError(f"{os.fspath(path)}: expected uint8 labels (1 dimension), got "
                         f"{array.dtype} with {array.ndim} dimension(s) {array.shape}")
    return array.astype(np.int64)
