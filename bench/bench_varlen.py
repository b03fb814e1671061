"""Variable-length batches: fastload's BucketBatchSampler + pad_collate against torch's
DataLoader with a plain Python padding collate over random batches, same run.

The data: 100,000 int32 sequences with lognormal lengths (median 100, clipped to
[1, 2000]), kept as one flat array; sample ``i`` is ``(ids, i % 10)``, ``ids`` a view of
its slice.  Batch 64, 2 workers, new workers every epoch (both loaders' default).

* fastload: ``DataLoader(batch_sampler=BucketBatchSampler(lengths, 64),
  collate_fn=pad_collate())``: similar lengths batched together, padded in place in
  the shared-memory ring.
* torch: ``DataLoader(shuffle=True, batch_size=64, collate_fn=<pad_sequence collate>)``,
  the everyday way: random batches padded in the worker, then sent to the main
  process through torch's shared-memory tensors.
* torch-bucket: torch's DataLoader given the very batches fastload's
  ``BucketBatchSampler`` draws (as a ``batch_sampler`` list, made in the child
  before its clock starts) and the same Python padding collate: the same work as
  fastload's row, so ``fastload / torch-bucket`` is the loader's own ratio and
  ``fastload / torch`` mixes in the batching policy.

Each round is a fresh child process that imports only its own library and loads
``--epochs`` epochs; samples/s is the median over rounds of each round's best epoch
after the first, the rounds alternating fastload, torch, fastload, ...  *Waste* is
the share of padding in the padded batches (padding / all tokens of the batches).
*CPU per batch* is the child's CPU time (user + system, its workers included, once
reaped) over all its epochs, divided by the batches: what a batch costs the machine,
which a loaded machine changes far less than it changes the rates.

    python bench/bench_varlen.py --rounds 3 --epochs 2
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import time

import numpy as np

SAMPLES = 100_000
BATCH = 64
WORKERS = 2


def make_lengths(count: int = SAMPLES, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.clip(rng.lognormal(np.log(100), 0.8, count), 1, 2000).astype(np.int64)


class Sequences:
    """Sample ``i``: ``(int32 ids of lengths[i] tokens, i % 10)``; both loaders take it."""

    def __init__(self, lengths: np.ndarray) -> None:
        self.lengths = lengths
        self.offsets = np.concatenate([[0], np.cumsum(lengths)])
        self.tokens = np.random.default_rng(1).integers(0, 30000, size=int(self.offsets[-1]),
                                                        dtype=np.int32)

    def __len__(self) -> int:
        return len(self.lengths)

    def __getitem__(self, i: int):
        return self.tokens[self.offsets[i]:self.offsets[i + 1]], i % 10


def torch_pad_collate(batch):
    """The usual collate for variable-length samples, written plainly."""
    import torch
    from torch.nn.utils.rnn import pad_sequence

    sequences = [torch.from_numpy(ids) for ids, _ in batch]
    lengths = torch.tensor([len(s) for s in sequences], dtype=torch.int64)
    padded = pad_sequence(sequences, batch_first=True, padding_value=0)
    labels = torch.tensor([label for _, label in batch], dtype=torch.int64)
    return padded, lengths, labels


def fastload_loader(dataset: Sequences):
    import fastload as fl
    from fastload.collate import pad_collate

    sampler = fl.BucketBatchSampler(dataset.lengths, BATCH, generator=0)
    loader = fl.DataLoader(dataset, batch_sampler=sampler, collate_fn=pad_collate(),
                           num_workers=WORKERS)

    def counts(batch):
        padded, labels = batch
        return padded.values.size, int(padded.lengths.sum()), len(labels)

    return loader, counts


def torch_loader(dataset: Sequences):
    import torch

    loader = torch.utils.data.DataLoader(dataset, batch_size=BATCH, shuffle=True,
                                         collate_fn=torch_pad_collate, num_workers=WORKERS,
                                         generator=torch.Generator().manual_seed(0))

    def counts(batch):
        padded, lengths, labels = batch
        return padded.numel(), int(lengths.sum()), len(labels)

    return loader, counts


def bucket_batches(lengths: np.ndarray, epochs: int) -> list[list[list[int]]]:
    """Each epoch's batches as fastload's BucketBatchSampler draws them (for torch-bucket)."""
    from fastload.sampler import BucketBatchSampler

    sampler = BucketBatchSampler(lengths, BATCH, generator=0)
    epochs_batches = []
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        epochs_batches.append([[int(i) for i in batch] for batch in sampler])
    return epochs_batches


def torch_bucket_loaders(dataset: Sequences, epochs: int):
    """One torch DataLoader per epoch over that epoch's bucketed batches."""
    import torch

    loaders = [torch.utils.data.DataLoader(dataset, batch_sampler=batches,
                                           collate_fn=torch_pad_collate, num_workers=WORKERS)
               for batches in bucket_batches(dataset.lengths, epochs)]

    def counts(batch):
        padded, lengths, labels = batch
        return padded.numel(), int(lengths.sum()), len(labels)

    return loaders, counts


LIBRARIES = ("fastload", "torch", "torch-bucket")


def child(library: str, epochs: int) -> None:
    dataset = Sequences(make_lengths())
    if library == "torch-bucket":
        loaders, counts = torch_bucket_loaders(dataset, epochs)
    else:
        loader, counts = (fastload_loader if library == "fastload" else torch_loader)(dataset)
        loaders = [loader] * epochs
    start_times = os.times()
    rates, padded_total, real_total, batches = [], 0, 0, 0
    for epoch, loader in enumerate(loaders):
        if hasattr(loader.batch_sampler, "set_epoch"):
            loader.batch_sampler.set_epoch(epoch)
        start = time.perf_counter()
        samples = 0
        for batch in loader:
            padded, real, count = counts(batch)
            padded_total += padded
            real_total += real
            samples += count
            batches += 1
        rates.append(samples / (time.perf_counter() - start))
    del loader, loaders, batch
    gc.collect()  # the last epoch's workers are reaped, so os.times() counts them
    end_times = os.times()
    cpu = sum(end_times[i] - start_times[i] for i in range(4))  # user, system; self, children
    print(json.dumps({"rates": rates, "waste": 1 - real_total / padded_total,
                      "cpu_us_per_batch": cpu / batches * 1e6}))


def run_round(library: str, epochs: int) -> dict:
    out = subprocess.run([sys.executable, __file__, "--child", library, "--epochs", str(epochs)],
                         capture_output=True, text=True, timeout=900, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=2, help="epochs per round (the first "
                        "is not timed)")
    parser.add_argument("--child", choices=LIBRARIES, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        child(args.child, args.epochs)
        return 0
    if args.epochs < 2:
        parser.error("--epochs must be at least 2 (the first epoch is not timed)")
    load_at_start = os.getloadavg()
    results: dict[str, list[dict]] = {library: [] for library in LIBRARIES}
    for round_no in range(args.rounds):
        shift = round_no % len(LIBRARIES)
        for library in LIBRARIES[shift:] + LIBRARIES[:shift]:
            results[library].append(run_round(library, args.epochs))
            best = max(results[library][-1]["rates"][1:])
            print(f"round {round_no + 1} {library:12s} {best:>10,.0f} samples/s", flush=True)
    rate = {lib: statistics.median(max(r["rates"][1:]) for r in runs)
            for lib, runs in results.items()}
    waste = {lib: statistics.median(r["waste"] for r in runs) for lib, runs in results.items()}
    cpu = {lib: statistics.median(r["cpu_us_per_batch"] for r in runs)
           for lib, runs in results.items()}
    print()
    print("| loader | samples/s | CPU per batch (us) | padded-token waste |")
    print("|---|---:|---:|---:|")
    print(f"| fastload BucketBatchSampler + pad_collate | {rate['fastload']:,.0f} | "
          f"{cpu['fastload']:,.0f} | {waste['fastload']:.1%} |")
    print(f"| torch random batches + pad_sequence collate | {rate['torch']:,.0f} | "
          f"{cpu['torch']:,.0f} | {waste['torch']:.1%} |")
    print(f"| torch, fastload's bucketed batches + pad_sequence collate | "
          f"{rate['torch-bucket']:,.0f} | {cpu['torch-bucket']:,.0f} | "
          f"{waste['torch-bucket']:.1%} |")
    print(f"\nfastload / torch-bucket (the same batches: the loader alone): "
          f"**{rate['fastload'] / rate['torch-bucket']:.2f}x** samples/s, "
          f"{cpu['torch-bucket'] / cpu['fastload']:.2f}x less CPU per batch")
    print(f"fastload / torch (bucketing policy and loader together): "
          f"**{rate['fastload'] / rate['torch']:.2f}x** samples/s, "
          f"{cpu['torch'] / cpu['fastload']:.2f}x less CPU per batch")
    print(f"({os.cpu_count()} CPUs, {args.rounds} rounds of {args.epochs} epochs, rotated; "
          f"load average {load_at_start[0]:.1f} at the start, "
          f"{os.getloadavg()[0]:.1f} at the end)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
