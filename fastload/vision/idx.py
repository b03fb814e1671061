"""The IDX format of MNIST's files (LeCun's "SN3 Pascal Vincent" format), read with checks.

A file is a 4-byte magic number (two zero bytes, a type code, the number of
dimensions), one big-endian int32 per dimension, then the values, big-endian,
row-major.  Plain or gzip-compressed (``.gz``).  Anything that disagrees with
itself (magic, type, dimensions against the bytes present) raises a
``ValueError`` naming the file.
"""

from __future__ import annotations

import gzip
import os
import zlib

import numpy as np

__all__ = ["read_idx", "read_image_file", "read_label_file"]

# Type code -> element type (big-endian where it has more than one byte).
_IDX_TYPES = {0x08: np.dtype(np.uint8), 0x09: np.dtype(np.int8), 0x0B: np.dtype(">i2"),
              0x0C: np.dtype(">i4"), 0x0D: np.dtype(">f4"), 0x0E: np.dtype(">f8")}


def _open(path: str):
    return gzip.open(path, "rb") if path.endswith(".gz") else open(path, "rb")


def _stored_size(path: str) -> tuple[int, int]:
    """``(size, modulus)``: the file's (decompressed) size, known modulo ``modulus``
    (gzip keeps it mod 2**32 in its last four bytes)."""
    if not path.endswith(".gz"):
        return os.path.getsize(path), 0
    with open(path, "rb") as f:
        f.seek(0, os.SEEK_END)
        if f.tell() < 18:  # a gzip header and trailer at least
            raise ValueError(f"{path}: truncated gzip file ({f.tell()} bytes)")
        f.seek(-4, os.SEEK_END)
        return int.from_bytes(f.read(4), "little"), 1 << 32


def _read_exactly(f, count: int, path: str, what: str) -> bytes:
    data = f.read(count)
    if len(data) != count:
        raise ValueError(f"{path}: truncated IDX file: {what} needs {count} bytes, "
                         f"found {len(data)}")
    return data


def read_idx(path: str | os.PathLike) -> np.ndarray:
    """The array stored in an IDX file (``.gz`` read through gzip), in native byte order."""
    path = os.fspath(path)
    try:
        with _open(path) as f:
            magic = _read_exactly(f, 4, path, "the magic number")
            if magic[0] != 0 or magic[1] != 0 or magic[2] not in _IDX_TYPES or not 1 <= magic[3] <= 4:
                raise ValueError(f"{path}: not an IDX file: magic number 0x{magic.hex()} (expected "
                                 f"0x0000TTDD with a type code TT in 08, 09, 0b-0e and 1-4 "
                                 f"dimensions DD)")
            dtype, ndim = _IDX_TYPES[magic[2]], magic[3]
            dims = tuple(int(d) for d in np.frombuffer(
                _read_exactly(f, 4 * ndim, path, f"{ndim} dimensions"), dtype=">i4"))
            if any(d < 0 for d in dims):
                raise ValueError(f"{path}: negative dimension in IDX header {dims}")
            # Checked before allocating, so a corrupt header cannot ask for terabytes.
            expected = 4 + 4 * ndim + int(np.prod(dims, dtype=object)) * dtype.itemsize
            size, modulus = _stored_size(path)
            if (expected % modulus if modulus else expected) != size:
                raise ValueError(f"{path}: IDX dimensions {dims} of {dtype.name} disagree with the "
                                 f"file's size: {expected} bytes expected, "
                                 f"{'the gzip trailer records' if modulus else 'found'} {size}")
            array = np.empty(dims, dtype=dtype)
            view = memoryview(array.reshape(-1).view(np.uint8))
            filled = 0
            while filled < array.nbytes:
                got = f.readinto(view[filled:])
                if not got:
                    break
                filled += got
            if filled != array.nbytes:
                raise ValueError(f"{path}: truncated IDX file: dimensions {dims} of {dtype.name} "
                                 f"need {array.nbytes} bytes of data, found {filled}")
            if f.read(1):
                raise ValueError(f"{path}: IDX file longer than its dimensions {dims} say "
                                 f"({array.nbytes} bytes of data)")
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
