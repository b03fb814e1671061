"""JPEG decode alone: images per second per core, fastload's path against Pillow's.

For photo-like JPEGs of two sizes (500x375 as in ImageNet, 4000x3000 as from
a camera; quality 90, 4:2:0) this times, in one process on one core, the
decode each way makes of the same bytes held in memory:

* *Pillow full*: ``Image.open(...).convert("RGB")``, what torchvision does;
* *Pillow draft 1/s*: the same after ``draft("RGB", size / s)``, libjpeg's
  DCT-scaled decode at 1/2, 1/4, 1/8 (no pixel is skipped, only resolution);
* *fastload*: the decode ``ImageFolder`` makes for ``RandomResizedCrop(224)``:
  the crop drawn from the header, then the smallest scale that still covers
  it (``decode_planned``'s first half), crops drawn with a fixed seed;
* *simplejpeg*: the pip-installable libjpeg-turbo binding measured as a
  candidate for a faster decoder (full decode, RGB array), when installed.

The 1/8 draft is the floor of any decode that must read every row: libjpeg
has to Huffman-decode the entropy-coded data of each row above a crop's
bottom whatever else it skips, so ``1/8 draft / full`` says how much of a
decode a region-of-interest decode could save at most.  Median of rounds;
rows rotate within a round.

    python bench/bench_decode.py --rounds 5
"""

from __future__ import annotations

import argparse
import io
import statistics
import time
from collections.abc import Callable

import numpy as np
from PIL import Image

from fastload.cli import synthetic_image
from fastload.rng import seed_transform_rng
from fastload.vision.decode import _decode_for_plan
from fastload.vision.transforms import RandomResizedCrop
from results import write_section

SIZES = ((500, 375), (4000, 3000))
CROP = 224


def corpus(width: int, height: int, count: int) -> list[bytes]:
    out = []
    for seed in range(count):
        buffer = io.BytesIO()
        Image.fromarray(synthetic_image(width, height, np.random.default_rng(seed))).save(
            buffer, "JPEG", quality=90)
        out.append(buffer.getvalue())
    return out


def pillow_full(data: bytes) -> None:
    Image.open(io.BytesIO(data)).convert("RGB")


def pillow_draft(reduction: int) -> Callable[[bytes], None]:
    def decode(data: bytes) -> None:
        img = Image.open(io.BytesIO(data))
        img.draft("RGB", (img.width // reduction, img.height // reduction))
        img.convert("RGB")
    return decode


def fastload_path(data: bytes) -> None:
    _decode_for_plan(io.BytesIO(data), _HEAD, _NO_ERRORS)


_HEAD = RandomResizedCrop(CROP)


class _NoErrors:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


_NO_ERRORS = _NoErrors()


def rows() -> dict[str, Callable[[bytes], None]]:
    out = {"Pillow full": pillow_full}
    for reduction in (2, 4, 8):
        out[f"Pillow draft 1/{reduction}"] = pillow_draft(reduction)
    out[f"fastload (RandomResizedCrop({CROP}) plan)"] = fastload_path
    try:
        import simplejpeg
    except ImportError:
        return out
    out["simplejpeg full"] = lambda data: simplejpeg.decode_jpeg(data, colorspace="RGB")
    return out


def measure(images: list[bytes], rounds: int) -> dict[str, float]:
    """Images per second of each row (median over rounds, one core)."""
    ways = rows()
    names = list(ways)
    timings: dict[str, list[float]] = {name: [] for name in names}
    for round_index in range(rounds):
        order = names[round_index % len(names):] + names[:round_index % len(names)]
        for name in order:
            seed_transform_rng(0, round_index)  # the same crops for the fastload row
            decode = ways[name]
            start = time.perf_counter()
            for data in images:
                decode(data)
            timings[name].append(len(images) / (time.perf_counter() - start))
    return {name: statistics.median(values) for name, values in timings.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--small", type=int, default=100, help="500x375 images (default 100)")
    parser.add_argument("--large", type=int, default=4, help="4000x3000 images (default 4)")
    parser.add_argument("--write", action="store_true", help="replace the section in RESULTS.md")
    options = parser.parse_args()
    lines = ["| decode | " + " | ".join(f"{w}x{h} images/s/core" for w, h in SIZES) +
             " | share of full decode's time |", "|---|---:|---:|---:|"]
    results = [measure(corpus(w, h, count), options.rounds)
               for (w, h), count in zip(SIZES, (options.small, options.large))]
    for name in results[0]:
        cells = [f"{result[name]:,.0f}" if result[name] >= 100 else f"{result[name]:.1f}"
                 for result in results]
        shares = "/".join(f"{result['Pillow full'] / result[name]:.2f}" for result in results)
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {shares} |")
    table = "\n".join(lines)
    print(table)
    if options.write:
        write_section("bench_decode", "### JPEG decode alone (`python bench/bench_decode.py "
                      f"--rounds {options.rounds} --write`)\n\n" + table)


if __name__ == "__main__":
    main()
