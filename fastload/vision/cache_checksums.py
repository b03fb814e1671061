"""The decoded-image cache's checksums: of an entry's bytes, and of each index record.

An entry's bytes are checked with XXH3-64 (the ``xxhash`` package, the
``cache`` extra), or, without it, zlib's CRC32: a hash made to catch damage,
where the word sum used before let swapped words, +-1 in two words and
swapped pages pass.  Which one is in use is part of every entry's key
(``checksum_name``), so a process only ever meets entries its own hash checks.
Index records are checked by ``record_checks``, vectorised over a whole index.
"""

from __future__ import annotations

import zlib

import numpy as np

try:
    from xxhash import xxh3_64_intdigest as _xxh3_64
except ImportError:  # the ``cache`` extra is not installed: zlib's CRC32 stands in
    _xxh3_64 = None

__all__ = ["checksum_name", "data_checksum", "record_checks"]

# The record checksum: its first 15 32-bit words times 15 odd 64-bit constants
# (no two alike in their low 8 bits), summed mod 2^64 and mixed (the finaliser
# of MurmurHash3), low 32 bits kept.  Unlike a weighted sum, swapped words or
# small changes in two words do not cancel; it is vectorised over a whole index
# file (a hash per record would be a Python loop).
_MULTIPLIERS = np.array([
    0x55dacb8f8c773fe7, 0x21b8c26bc02373ab, 0x5728e6bebf4f7e61, 0x276fbc83dd7398f1,
    0x6e858f374931300f, 0x408ccec5f72fc1dd, 0x0fd2dcec9115dfe5, 0x8697ca55bf54e44f,
    0xdce05de7c1410415, 0xccca9f1fede003f5, 0xa7244dd0462c37f3, 0xce2f7ecc5ddaed5b,
    0xeb60fe56b7a3e3b5, 0xee46748c95d6007f, 0x18c22cfcc0181bf9], dtype=np.uint64)


def record_checks(records: np.ndarray) -> np.ndarray:
    """The check of each index record (``RECORD``s): what its ``check`` field holds."""
    words = records.view(np.uint32).reshape(len(records), 16)[:, :15].astype(np.uint64)
    mixed = (words * _MULTIPLIERS).sum(axis=1, dtype=np.uint64)
    for shift, factor in ((33, 0xff51afd7ed558ccd), (33, 0xc4ceb9fe1a85ec53)):
        mixed ^= mixed >> np.uint64(shift)
        mixed *= np.uint64(factor)
    mixed ^= mixed >> np.uint64(33)
    return mixed & np.uint64(0xFFFFFFFF)


def checksum_name() -> str:
    """Which hash ``data_checksum`` is in this process: ``"xxh3_64"`` (the ``xxhash``
    package, the ``cache`` extra) or ``"crc32"`` (zlib's, without it).  Part of
    every entry's key, so a process never checks an entry with another hash."""
    return "xxh3_64" if _xxh3_64 is not None else "crc32"


def data_checksum(data: bytes | memoryview | np.ndarray) -> int:
    """The checksum of an entry's bytes: XXH3-64 (``xxhash``), else zlib's CRC32.

    What it must catch is what a crash of the machine, or a bad disk, does to a
    file: pages of zeros, stale or swapped pages, changed words, flipped bits.
    XXH3 does, at memory speed (faster than summing the words, which let
    swapped words and +-1 in two words pass); CRC32 as well, at about a tenth
    of the speed (bench/RESULTS.md, "cache checksum").
    """
    if _xxh3_64 is not None:
        return _xxh3_64(data)
    return zlib.crc32(data)
