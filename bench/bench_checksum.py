"""The decoded-image cache's entry checksum: cost per image of each candidate.

One cached image of the ``images`` workload is 500x375 RGB, 549 KiB of raw
pixels.  Each candidate checks those bytes (a ``memoryview``, as the cache
hands it a mapped entry): the 64-bit word sum the cache used before (numpy),
XXH3-64 (``xxhash``, what ``cache_checksums.data_checksum`` uses), zlib's CRC32
(its fallback without ``xxhash``), and CRC32C (the ``crc32c`` package, if
installed).  Per candidate: the median over rounds of the mean time of
``--calls`` calls, in rotated order; microseconds per image and GB/s.

    python bench/bench_checksum.py                 # 5 rounds of 200 calls
    python bench/bench_checksum.py --rounds 9 --calls 500
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import zlib
from typing import Callable

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from fastload.vision import cache_checksums  # noqa: E402

IMAGE_BYTES = 500 * 375 * 3


def word_sum(data: memoryview) -> int:
    """The checksum the cache used before: the bytes' sum as 64-bit words, plus the length."""
    whole = len(data) // 8 * 8
    total = int(np.add.reduce(np.frombuffer(data[:whole], np.uint64))) if whole else 0
    total += int.from_bytes(bytes(data[whole:]), "little") + len(data)
    return total & 0xFFFFFFFFFFFFFFFF


def candidates() -> dict[str, Callable[[memoryview], int]]:
    found: dict[str, Callable[[memoryview], int]] = {"word sum (before)": word_sum}
    try:
        import xxhash
        found["xxh3_64 (xxhash)"] = xxhash.xxh3_64_intdigest
    except ImportError:
        print("xxhash is not installed: no XXH3 row")
    found["crc32 (zlib)"] = zlib.crc32
    try:
        import crc32c
        found["crc32c (crc32c)"] = crc32c.crc32c
    except ImportError:
        print("crc32c is not installed: no CRC32C row")
    return found


def mean_seconds(check: Callable[[memoryview], int], data: memoryview, calls: int) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        check(data)
    return (time.perf_counter() - start) / calls


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--calls", type=int, default=200)
    args = parser.parse_args(argv)
    data = memoryview(np.random.default_rng(0).integers(0, 256, IMAGE_BYTES, dtype=np.uint8))
    found = candidates()
    names = list(found)
    times: dict[str, list[float]] = {name: [] for name in names}
    for round_number in range(args.rounds):
        shift = round_number % len(names)
        for name in names[shift:] + names[:shift]:
            times[name].append(mean_seconds(found[name], data, args.calls))
    print(f"load average {os.getloadavg()[0]:.2f}; {IMAGE_BYTES / 1024:.0f} KiB per image; "
          f"the cache uses {cache_checksums.checksum_name()}")
    before = statistics.median(times[names[0]])
    for name in names:
        seconds = statistics.median(times[name])
        print(f"{name:20s} {seconds * 1e6:8.1f} us/image  {IMAGE_BYTES / seconds / 1e9:6.2f} GB/s"
              f"  ({seconds / before:.2f}x the word sum)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
