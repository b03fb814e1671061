"""MNIST loading: fastload's MNIST + DataLoader against torch's DataLoader over torchvision's way.

The data: 60,000 x 28 x 28 random bytes and labels, written as the four IDX
files of ``MNIST/raw`` in a temporary directory (the test split small).  The
pipeline: ``ToArray()`` then ``Normalize((0.1307,), (0.3081,))``, batch 256,
shuffled, ``num_workers`` 0 and 2 (new workers every epoch, as by default).

* **fastload**: ``fastload.vision.MNIST(root, transform=Compose([ToArray(),
  Normalize(...)]))`` under ``fastload.DataLoader``: each batch is gathered
  straight from ``data`` by one kernel call (no PIL image per sample).
* **torch**: ``torch.utils.data.DataLoader`` over a dataset doing what
  torchvision's MNIST does (torchvision is not installed): ``data`` and
  ``targets`` as tensors, ``Image.fromarray(data[i].numpy(), mode="L")`` per
  sample, then ``ToTensor`` (the PIL image to a uint8 tensor, channels first,
  ``.to(float32).div(255)``) and ``Normalize`` (``sub_(mean).div_(std)``, the
  mean and std made into tensors at each call), written with torch ops as
  torchvision writes them; ``int(targets[i])``.

Both give the same batches bit for bit (checked on the first batch before
timing).  Rounds alternate (fastload, torch, then torch, fastload, ...) in one
process; one epoch each per round; medians of samples/s.

    python bench/bench_classic.py                    # 3 rounds, workers 0 and 2
    python bench/bench_classic.py --rounds 5 --workers 2 --no-write
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import tempfile
import time

import numpy as np
from PIL import Image
from results import write_section  # bench/results.py; this script owns "bench_classic"

import fastload as fl
from fastload.vision import MNIST
from fastload.vision import transforms as T

MEAN, STD = (0.1307,), (0.3081,)


def write_idx(path: str, array: np.ndarray) -> None:
    with open(path, "wb") as f:
        f.write(bytes([0, 0, 0x08, array.ndim]))
        f.write(np.asarray(array.shape, dtype=">i4").tobytes())
        f.write(np.ascontiguousarray(array, np.uint8).tobytes())


def make_mnist(root: str, count: int) -> None:
    rng = np.random.default_rng(0)
    raw = os.path.join(root, "MNIST", "raw")
    os.makedirs(raw, exist_ok=True)
    for prefix, n in (("train", count), ("t10k", 100)):
        write_idx(os.path.join(raw, f"{prefix}-images-idx3-ubyte"),
                  rng.integers(0, 256, (n, 28, 28), dtype=np.uint8))
        write_idx(os.path.join(raw, f"{prefix}-labels-idx1-ubyte"),
                  rng.integers(0, 10, n, dtype=np.uint8))


def torchvision_style_dataset(torch, data: np.ndarray, targets: np.ndarray):
    """torchvision's MNIST.__getitem__ with ToTensor and Normalize, in torch ops."""

    class TorchvisionStyleMNIST(torch.utils.data.Dataset):
        def __init__(self):
            self.data = torch.from_numpy(data.copy())
            self.targets = torch.from_numpy(targets.copy())

        def __len__(self):
            return len(self.data)

        def __getitem__(self, index):
            img, target = self.data[index], int(self.targets[index])
            img = Image.fromarray(img.numpy(), mode="L")
            # ToTensor
            tensor = torch.from_numpy(np.array(img, np.uint8, copy=True))
            tensor = tensor.view(img.size[1], img.size[0], 1).permute((2, 0, 1)).contiguous()
            tensor = tensor.to(dtype=torch.float32).div(255)
            # Normalize
            mean = torch.as_tensor(MEAN, dtype=tensor.dtype).view(-1, 1, 1)
            std = torch.as_tensor(STD, dtype=tensor.dtype).view(-1, 1, 1)
            return tensor.sub_(mean).div_(std), target

    return TorchvisionStyleMNIST()


def epoch_rate(loader) -> float:
    start = time.perf_counter()
    count = 0
    for images, _ in loader:
        count += len(images)
    return count / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--workers", type=int, nargs="+", default=[0, 2])
    parser.add_argument("--samples", type=int, default=60_000)
    parser.add_argument("--no-write", action="store_true", help="do not update bench/RESULTS.md")
    args = parser.parse_args()
    import torch

    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory(prefix="fastload-bench-mnist-") as root:
        make_mnist(root, args.samples)
        ours = MNIST(root, transform=T.Compose([T.ToArray(), T.Normalize(MEAN, STD)]))
        theirs = torchvision_style_dataset(torch, ours.data, ours.targets)
        rows = []
        for workers in args.workers:
            make_ours = lambda: fl.DataLoader(ours, batch_size=256, shuffle=True,  # noqa: E731
                                              num_workers=workers)
            make_theirs = lambda: torch.utils.data.DataLoader(  # noqa: E731
                theirs, batch_size=256, shuffle=True, num_workers=workers)
            check = fl.DataLoader(ours, batch_size=256)
            reference = torch.utils.data.DataLoader(theirs, batch_size=256)
            (a, a_t), (b, b_t) = next(iter(check)), next(iter(reference))
            assert a.tobytes() == b.numpy().tobytes() and a_t.tolist() == b_t.tolist()
            rates = {"fastload": [], "torch": []}
            for r in range(args.rounds):
                order = ("fastload", "torch") if r % 2 == 0 else ("torch", "fastload")
                for name in order:
                    loader = make_ours() if name == "fastload" else make_theirs()
                    rates[name].append(epoch_rate(loader))
            fast, slow = statistics.median(rates["fastload"]), statistics.median(rates["torch"])
            rows.append((workers, fast, slow))
            print(f"workers={workers}: fastload {fast:,.0f} samples/s, torch {slow:,.0f} "
                  f"samples/s, {fast / slow:.2f}x", flush=True)

    load = (load_before, os.getloadavg()[0])
    command = "python bench/bench_classic.py" + (
        f" --rounds {args.rounds}" if args.rounds != 3 else "") + (
        f" --workers {' '.join(map(str, args.workers))}" if args.workers != [0, 2] else "")
    table = ["| workers | fastload samples/s | torch samples/s | fastload / torch |",
             "|---:|---:|---:|---:|"]
    table += [f"| {w} | {f:,.0f} | {s:,.0f} | **{f / s:.1f}x** |" for w, f, s in rows]
    text = (f"## MNIST (classic datasets)\n\n`{command}` ({platform.machine()}, "
            f"{os.cpu_count()} CPUs): {args.samples:,} random 28x28 images in IDX files, "
            f"`ToArray()` + `Normalize((0.1307,), (0.3081,))`, batch 256, shuffled, new workers "
            f"every epoch; fastload's `MNIST` + `DataLoader` (whole batches gathered from `data` "
            f"by one kernel call) against torch's `DataLoader` over a dataset doing what "
            f"torchvision's MNIST does (a PIL image per sample, `ToTensor` and `Normalize` in "
            f"torch ops); the same batches, bit for bit. Medians of {args.rounds} alternating "
            f"rounds of one epoch each, in one process. The 1-minute load average was "
            f"{load[0]:.1f} at the start and {load[1]:.1f} at the end (other jobs shared the "
            f"machine).\n\n" + "\n".join(table))
    print()
    print(text)
    if not args.no_write:
        write_section("bench_classic", text)


if __name__ == "__main__":
    main()
