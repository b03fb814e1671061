"""Per-image CPU time of the decoded-image cache in one process (issue #31's figures).

``ImageFolder(root, transform=standard_transform(), cache=DIR)``, ``ds[i]`` in a
loop over the ``images`` folder (500x375 JPEGs, RandomResizedCrop(224) + flip
+ ToArray), timed with ``time.process_time()`` (what a loaded machine changes
least): uncached, filling a new cache, then twice from it (each by a new
dataset, so each reader checks every entry's checksum once).  Prints
milliseconds per image and filling / uncached as a rate ratio.

To compare two trees, alternate them in one session::

    for tree in OLD NEW OLD NEW; do PYTHONPATH=$tree python bench/cache_per_image.py 300; done
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time

import numpy as np

from fastload import cli as fb
from fastload.rng import seed_transform_rng
from fastload.vision import ImageFolder


def per_image_ms(root: str, order: list[int], cache: str | None) -> float:
    dataset = ImageFolder(root, transform=fb.standard_transform(), cache=cache,
                          cache_max_side=512)
    seed_transform_rng(0, 0)
    start = time.process_time()
    for index in order:
        dataset[index]
    return (time.process_time() - start) / len(order) * 1e3


def main(argv: list[str]) -> int:
    count = int(argv[0]) if argv else 300
    root = fb.synthetic_image_folder(2000, (500, 375), 10, progress=False)
    order = [int(i) for i in np.random.default_rng(0).permutation(2000)[:count]]
    scratch = tempfile.mkdtemp(prefix="bench-cache-per-image-", dir=fb.default_cache_dir())
    try:
        cache = os.path.join(scratch, "cache")
        plain = per_image_ms(root, order, None)
        filling = per_image_ms(root, order, cache)
        cached = [per_image_ms(root, order, cache) for _ in range(2)]
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    import fastload
    print(f"{os.path.dirname(os.path.dirname(fastload.__file__))}: {count} images, ms/image: "
          f"uncached {plain:.3f}, filling {filling:.3f} (filling/uncached {plain / filling:.2f}), "
          f"from the cache {cached[0]:.3f} {cached[1]:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
