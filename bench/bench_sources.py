"""A Hugging Face dataset through fastload's DataLoader and torch's, same object, same run.

The data: ``--rows`` rows (default 200,000) of an int64 ``label``, float32
``features`` of shape (256,) and ``ids``, int64 token ids of lognormal length
(median 64, clipped to [1, 1024]); saved with ``save_to_disk`` and loaded back,
so the Arrow files are memory-mapped as a user's are, then
``with_format("numpy")``.  Batch 256, 2 workers, shuffled, one epoch or
``--batches`` batches per round; rounds alternate between the loaders and each
figure is the median over ``--rounds`` of samples/s after the first batch
(worker start-up left out).

Cells:

* ``fixed``: ``label`` and ``features`` only (``with_format("numpy",
  columns=...)``), default collate: fastload gathers each column from the
  memory-mapped Arrow buffers; torch calls the dataset's ``__getitems__``
  (one Arrow query, then a dict per row) and ``default_collate`` stacks them.
* ``fixed, torch whole batches``: torch given the batch of indices at once
  (``sampler=BatchSampler(...)``, ``batch_size=None``, so ``ds[indices]``
  returns the stacked columns and nothing is split into rows).
* ``ragged``: all three columns with a padding collate (fastload's
  ``pad_collate``; for torch ``pad_sequence`` beside ``default_collate``):
  both go sample by sample through the dataset's ``__getitems__``.

    python bench/bench_sources.py --rows 200000 --rounds 3
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

BATCH = 256
WORKERS = 2


def build(rows: int, root: str):
    import datasets

    rng = np.random.default_rng(0)
    lengths = np.clip(rng.lognormal(np.log(64), 0.8, rows), 1, 1024).astype(np.int64)

    def chunks(size=10_000):
        for start in range(0, rows, size):
            n = min(size, rows - start)
            yield datasets.Dataset.from_dict({
                "label": np.arange(start, start + n, dtype=np.int64) % 1000,
                "features": rng.standard_normal((n, 256), dtype=np.float32),
                "ids": [rng.integers(0, 50_000, k) for k in lengths[start:start + n]],
            })

    datasets.concatenate_datasets(list(chunks())).save_to_disk(root)
    return datasets.load_from_disk(root)


def torch_pad(batch):
    import torch
    from torch.nn.utils.rnn import pad_sequence
    from torch.utils.data import default_collate

    ids = [torch.from_numpy(np.array(sample.pop("ids"))) for sample in batch]
    out = default_collate(batch)
    out["ids"] = pad_sequence(ids, batch_first=True)
    out["lengths"] = torch.tensor([len(i) for i in ids])
    return out


def whole_batch(batch):
    import torch
    return {key: torch.as_tensor(value) for key, value in batch.items()}


def loaders(ds_fixed, ds_all):
    import torch
    import fastload as fl
    from fastload.collate import pad_collate

    def torch_batches():
        sampler = torch.utils.data.BatchSampler(torch.utils.data.RandomSampler(ds_fixed), BATCH,
                                                False)
        return torch.utils.data.DataLoader(ds_fixed, sampler=sampler, batch_size=None,
                                           num_workers=WORKERS, collate_fn=whole_batch)

    return {
        "fixed: fastload": lambda: fl.DataLoader(ds_fixed, batch_size=BATCH, shuffle=True,
                                                 num_workers=WORKERS),
        "fixed: torch": lambda: torch.utils.data.DataLoader(ds_fixed, batch_size=BATCH,
                                                            shuffle=True, num_workers=WORKERS),
        "fixed: torch whole batches": torch_batches,
        "ragged: fastload pad_collate": lambda: fl.DataLoader(
            ds_all, batch_size=BATCH, shuffle=True, num_workers=WORKERS, collate_fn=pad_collate()),
        "ragged: torch pad_sequence": lambda: torch.utils.data.DataLoader(
            ds_all, batch_size=BATCH, shuffle=True, num_workers=WORKERS, collate_fn=torch_pad),
    }


def timed(make, batches: int) -> float:
    loader = make()
    start, seen = None, 0
    for i, batch in enumerate(loader):
        if start is None:  # steady state: from the first batch on (workers started)
            start = time.perf_counter()
        else:
            seen += len(batch["label"])
        if i + 1 == batches:
            break
    elapsed = time.perf_counter() - start
    del loader
    return seen / elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--batches", type=int, default=0, help="per round; 0: a whole epoch")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench_sources_") as root:
        made = time.perf_counter()
        ds = build(args.rows, root)
        print(f"built {args.rows} rows in {time.perf_counter() - made:.1f} s "
              f"({len(ds.data.table.column('label').chunks)} Arrow chunks)", flush=True)
        cells = loaders(ds.with_format("numpy", columns=["label", "features"]),
                        ds.with_format("numpy"))
        rates: dict[str, list[float]] = {name: [] for name in cells}
        for round_ in range(args.rounds):
            for name, make in cells.items():
                rates[name].append(timed(make, args.batches or -1))
                print(f"round {round_}: {name}: {rates[name][-1]:,.0f} samples/s", flush=True)
        medians = {name: statistics.median(values) for name, values in rates.items()}
        print(f"\nmedians over {args.rounds} rounds ({args.rows} rows, batch {BATCH}, "
              f"{WORKERS} workers):")
        for name, value in medians.items():
            print(f"  {name:32s} {value:12,.0f} samples/s")
        print(f"  fixed: fastload / torch          {medians['fixed: fastload'] / medians['fixed: torch']:.1f}x")
        print(f"  fixed: fastload / torch whole    "
              f"{medians['fixed: fastload'] / medians['fixed: torch whole batches']:.1f}x")
        print(f"  ragged: fastload / torch         "
              f"{medians['ragged: fastload pad_collate'] / medians['ragged: torch pad_sequence']:.1f}x")


if __name__ == "__main__":
    main()
