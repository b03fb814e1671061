"""JPEG decode alone: images per second per core, fastload's path against Pillow's.

For photo-like JPEGs of two sizes (500x375 as in ImageNet, 4000x3000 as from
a camera; quality 90, 4:2:0) this times, in one process on one core, the
decode each way makes of the same bytes held in memory:

* *Pillow full*: ``Image.open(...).convert("RGB")``, what torchvision does;
* *Pillow draft 1/s*: the same after ``draft("RGB", size / s)``, libjpeg's
  DCT-scaled decode at 1/2, 1/4, 1/8 (no pixel is skipped, only resolution);
* *fastload*: what ``ImageFolder`` does for ``RandomResizedCrop(224),
  ToArray()``: the crop drawn from the header, the decode at the smallest
  scale that still covers it (simplejpeg's libjpeg-turbo when installed,
  else Pillow's draft), and the fused crop + resize to the output array,
  crops drawn with a fixed seed: more work than the decode-only rows;
  without simplejpeg too (``Pillow decode``);
* *simplejpeg full*: its full decode alone (packed RGB array).

The 1/8 draft is the floor of any decode that must read every row: libjpeg
has to Huffman-decode the entropy-coded data of each row above a crop's
bottom whatever else it skips, so ``1/8 draft / full`` says how much of a
decode a region-of-interest decode could save at most.  Median of rounds;
rows rotate within a round; CPU time of this process (``time.process_time``),
which other load on the machine moves less than wall time.

``--per-sample`` adds where a 500x375 sample's time goes: fastload's whole
sample (``ImageFolder`` with RandomResizedCrop(224), flip, ToArray) and
torch's (``fastload.cli.TorchvisionStylePipeline``, torch imported), beside
the decode rows, from files on disk.

    python bench/bench_decode.py --rounds 5 --per-sample
"""

from __future__ import annotations

import argparse
import io
import os
import statistics
import time
from collections.abc import Callable

import numpy as np
from PIL import Image

from fastload.cli import synthetic_image
from fastload.rng import seed_transform_rng
from fastload.vision import turbo_decode
from fastload.vision.decode import decode_planned_stream
from fastload.vision.transforms import RandomResizedCrop, ToArray
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


_HEAD = RandomResizedCrop(CROP)
_TO_ARRAY = [ToArray()]


def fastload_path(data: bytes) -> None:
    decode_planned_stream(io.BytesIO(data), _HEAD, _TO_ARRAY)


def fastload_pillow_path(data: bytes) -> None:
    kept, turbo_decode.simplejpeg = turbo_decode.simplejpeg, None
    try:
        fastload_path(data)
    finally:
        turbo_decode.simplejpeg = kept


def rows() -> dict[str, Callable[[bytes], None]]:
    out = {"Pillow full": pillow_full}
    for reduction in (2, 4, 8):
        out[f"Pillow draft 1/{reduction}"] = pillow_draft(reduction)
    out[f"fastload: decode + crop/resize to array (RandomResizedCrop({CROP}))"] = fastload_path
    out["fastload, Pillow decode (no simplejpeg)"] = fastload_pillow_path
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
            start = time.process_time()
            for data in images:
                decode(data)
            timings[name].append(len(images) / (time.process_time() - start))
    return {name: statistics.median(values) for name, values in timings.items()}


def per_sample(images: list[bytes], rounds: int) -> dict[str, float]:
    """Milliseconds of CPU per 500x375 sample: fastload's and torch's whole pipelines."""
    import tempfile

    import torch

    from fastload.cli import TorchvisionStylePipeline, standard_transform
    from fastload.vision import ImageFolder

    torch.set_num_threads(1)  # as in a loader's worker
    with tempfile.TemporaryDirectory(prefix="bench-decode-") as root:
        os.makedirs(os.path.join(root, "a"))
        for index, data in enumerate(images):
            with open(os.path.join(root, "a", f"{index:04d}.jpg"), "wb") as f:
                f.write(data)
        folder = ImageFolder(root, transform=standard_transform())
        theirs = TorchvisionStylePipeline(list(folder.samples), CROP)
        sides = {"fastload sample (decode + fused crop/resize/flip/ToArray)": (folder, True),
                 "fastload sample, Pillow decode (no simplejpeg)": (folder, False),
                 "torch sample (decode, crop, resize, flip, to tensor)": (theirs, True)}
        timings: dict[str, list[float]] = {name: [] for name in sides}
        kept = turbo_decode.simplejpeg
        for round_index in range(rounds):
            for name, (dataset, turbo) in sides.items():
                seed_transform_rng(0, round_index)
                torch.manual_seed(round_index)
                turbo_decode.simplejpeg = kept if turbo else None
                try:
                    start = time.process_time()
                    for index in range(len(dataset)):
                        dataset[index]
                    timings[name].append(1e3 * (time.process_time() - start) / len(dataset))
                finally:
                    turbo_decode.simplejpeg = kept
    return {name: statistics.median(values) for name, values in timings.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--small", type=int, default=100, help="500x375 images (default 100)")
    parser.add_argument("--large", type=int, default=4, help="4000x3000 images (default 4)")
    parser.add_argument("--per-sample", action="store_true",
                        help="also time whole 500x375 samples, fastload's and torch's")
    parser.add_argument("--write", action="store_true", help="replace the section in RESULTS.md")
    options = parser.parse_args()
    lines = ["| decode | " + " | ".join(f"{w}x{h} images/s/core" for w, h in SIZES) +
             " | time / full decode's |", "|---|---:|---:|---:|"]
    small = corpus(*SIZES[0], options.small)
    results = [measure(small, options.rounds),
               measure(corpus(*SIZES[1], options.large), options.rounds)]
    for name in results[0]:
        cells = [f"{result[name]:,.0f}" if result[name] >= 100 else f"{result[name]:.1f}"
                 for result in results]
        shares = " / ".join(f"{result['Pillow full'] / result[name]:.2f}" for result in results)
        lines.append(f"| {name} | " + " | ".join(cells) + f" | {shares} |")
    if options.per_sample:
        full_ms = 1e3 / results[0]["Pillow full"]
        lines += ["", "| 500x375 sample | ms of CPU | / Pillow full decode |", "|---|---:|---:|"]
        for name, ms in per_sample(small, options.rounds).items():
            lines.append(f"| {name} | {ms:.2f} | {ms / full_ms:.2f} |")
    table = "\n".join(lines)
    print(table)
    if options.write:
        flags = " --per-sample" if options.per_sample else ""
        write_section("bench_decode", "### JPEG decode alone (`python bench/bench_decode.py "
                      f"--rounds {options.rounds}{flags} --write`)\n\n" + table)


if __name__ == "__main__":
    main()
