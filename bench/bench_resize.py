"""The fused resize against Pillow: RandomResizedCrop(224) + flip + ToArray on real crops.

For each image of the synthetic folder (500x375 JPEGs, decoded once up front)
a crop box is drawn as ``RandomResizedCrop(224)`` draws it, then three ways
to turn it into a flipped, channel-first uint8 array are timed:

* *fastload*: ``resize_to_chw`` (the path ``ImageFolder`` takes for this
  pipeline): Pillow crop, then both resampling passes in ``_core`` and the
  flip and channel-first copy folded in;
* *Pillow + numpy*: what the separate transforms do: Pillow crop, resize,
  transpose (flip), then ``np.asarray`` and a channel-first copy;
* *torchvision style*: what torchvision's ``RandomResizedCrop``,
  ``RandomHorizontalFlip`` and ``PILToTensor`` do on a PIL image, then the
  contiguous copy ``torch.stack`` makes (torch imported only for this row).

All three are checked to give the same pixels before timing.  The process
first sets the malloc thresholds a loader worker sets (see fastload/_loading/worker_info.py), so
every row runs as it would inside a worker.  Median of rotated rounds.

    python bench/bench_resize.py --rounds 5
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
from PIL import Image

from fastload import cli as image_bench
from fastload.vision import ImageFolder
from fastload.vision.resample import resize_to_chw
from fastload.rng import seed_transform_rng, transform_rng
from fastload.vision.transforms import RandomResizedCrop
from fastload._loading.worker_info import _tune_malloc
from results import write_section

SIZE = 224


def crops(images: list[Image.Image], seed: int) -> list[tuple[Image.Image, tuple, bool]]:
    """A RandomResizedCrop(224) box and a flip coin per image, drawn as the transforms draw them."""
    seed_transform_rng(seed, 0)
    out = []
    for img in images:
        top, left, height, width = RandomResizedCrop.get_params(img, (0.08, 1.0), (3 / 4, 4 / 3))
        out.append((img, (left, top, left + width, top + height), transform_rng().random() < 0.5))
    return out


def fused(work):
    return [resize_to_chw(img.crop(box), (SIZE, SIZE), Image.Resampling.BILINEAR, flip=flip)
            for img, box, flip in work]


def _pillow_steps(img: Image.Image, box: tuple, flip: bool) -> Image.Image:
    """Crop, resize and flip as the separate transforms (and torchvision's) do them."""
    out = img.crop(box).resize((SIZE, SIZE), Image.Resampling.BILINEAR)
    return out.transpose(Image.Transpose.FLIP_LEFT_RIGHT) if flip else out


def pillow_numpy(work):
    return [np.ascontiguousarray(np.asarray(_pillow_steps(*item)).transpose(2, 0, 1))
            for item in work]


def torchvision_style(work):
    import torch

    return [torch.from_numpy(np.array(_pillow_steps(*item), copy=True)).permute(2, 0, 1)
            .contiguous() for item in work]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--images", type=int, default=300)
    parser.add_argument("--no-write", action="store_true")
    options = parser.parse_args()
    _tune_malloc()
    root = image_bench.synthetic_image_folder(progress=False)
    images = []
    for path, _ in list(ImageFolder(root).samples)[:options.images]:
        with open(path, "rb") as handle:
            img = Image.open(handle)
            img.load()
        images.append(img.convert("RGB"))
    work = crops(images, seed=0)
    reference = pillow_numpy(work)
    for name, candidate in (("fastload", fused), ("torchvision style", torchvision_style)):
        produced = candidate(work)
        assert all(np.array_equal(np.asarray(a), b) for a, b in zip(produced, reference)), name
    candidates = {"fastload": fused, "Pillow + numpy": pillow_numpy,
                  "torchvision style": torchvision_style}
    names = list(candidates)
    times: dict[str, list[float]] = {name: [] for name in names}
    for round_no in range(options.rounds):
        shift = round_no % len(names)
        for name in names[shift:] + names[:shift]:
            start = time.perf_counter()
            candidates[name](work)
            times[name].append((time.perf_counter() - start) / len(work))
    per_image = {name: statistics.median(ts) * 1e6 for name, ts in times.items()}
    lines = ["| crop + resize to 224 + flip + channel-first | microseconds per image | "
             "fastload speed-up |", "|---|---:|---:|"]
    for name in names:
        lines.append(f"| {name} | {per_image[name]:.0f} | "
                     f"{per_image[name] / per_image['fastload']:.2f}x |")
    table = "\n".join(lines)
    print(table)
    if not options.no_write:
        write_section("bench_resize", (
            f"## Resize\n\n`python bench/bench_resize.py --rounds {options.rounds}`: "
            f"{len(work)} images of the synthetic folder (500x375 JPEGs, decoded before "
            f"timing), a `RandomResizedCrop(224)` box and a coin flip each, bilinear; the "
            f"three give the same pixels (asserted). Median per-image time over "
            f"{options.rounds} rotated rounds, with a loader worker's malloc settings.\n\n"
            + table))


if __name__ == "__main__":
    main()
