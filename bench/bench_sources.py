"""A Hugging Face dataset through fastload's DataLoader and torch's, same object, same run.

The data: ``--rows`` rows (default 200,000) of an int64 ``label``, float32
``features`` of shape (256,) and ``ids``, int64 token ids of lognormal length
(median 64, clipped to [1, 1024]); saved with ``save_to_disk`` and loaded back,
so the Arrow files are memory-mapped as a user's are, then
``with_format("numpy")``.  Batch 256, 2 workers, shuffled, one epoch or
``--batches`` batches per round; rounds alternate between the loaders and each
figure is the median over ``--rounds`` of samples/s after the first batch
(worker start-up left out), with the CPU time per batch of the main process
and its workers together (which depends far less than samples/s on how much
of a loaded machine each process is given).

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

WebDataset shards (``--images`` JPEGs of 500x375, default 20,000, in
``--shards`` shards, default 40, written by webdataset's ``ShardWriter``; 500
distinct synthetic photos, repeated, as making one costs more than decoding it),
PIL decode, then ``RandomResizedCrop(224)``, ``RandomHorizontalFlip()``,
``ToArray()`` (fastload.vision's, for both), batch 64, 2 workers:

* ``tar: fastload TarShards``: an exact global shuffle by sample index;
* ``tar: webdataset``: webdataset's own pipeline (shard shuffle, a 1,000-sample
  shuffle buffer, ``decode("pil")``) in torch's DataLoader;
* ``tar: fastload TarShards over https, +30 ms``: the same shards served by
  a threaded Range server on 127.0.0.1 (tests/range_server.py) that holds
  every request ``--latency`` seconds (default 0.03) before answering; the
  member index is built once beforehand (in an ``index_dir``), and each
  batch's samples are read concurrently (``RemoteClient.stage``).  Printed
  as a fraction of the local ``TarShards`` run.
* ``images``: the same JPEGs in the ``Image()`` column of a Hugging Face
  dataset (``save_to_disk`` + ``load_from_disk``) with
  ``with_transform(ImageColumnTransform(...))`` of the same transforms:
  torch's DataLoader (``datasets`` decodes a PIL image per sample, then the
  transform) against fastload's (the bytes read from Arrow and decoded by
  the vision pipeline, crops decoded at reduced size where they allow).
* ``tar index``: the member index of all shards built from their headers
  (``tar_index.read_members``) from page cache, GB of shards per second.

    python bench/bench_sources.py --rows 200000 --rounds 3
    python bench/bench_sources.py --only tar --images 20000 --shards 40 --rounds 3
    python bench/bench_sources.py --only remote-tar --images 4000 --shards 8 --rounds 3
    python bench/bench_sources.py --only tar-index --images 20000 --shards 40
    python bench/bench_sources.py --only hf-images --images 4000 --rounds 3
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
DISTINCT_IMAGES = 500


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


def _cpu_seconds() -> dict[int, float]:
    """CPU time (user + system) of this process and of each live child (the workers), by pid."""
    import psutil

    me = psutil.Process()
    found = {}
    for process in [me] + me.children(recursive=True):
        try:
            times = process.cpu_times()
        except psutil.NoSuchProcess:
            continue
        found[process.pid] = times.user + times.system
    return found


def _cpu_since(before: dict[int, float]) -> float:
    """CPU seconds the processes of ``before`` (the loader's, alive all along) used since."""
    after = _cpu_seconds()
    return sum(after[pid] - seconds for pid, seconds in before.items() if pid in after)


# CPU per batch of the last timed() run, main process and workers together: unlike
# samples/s, it hardly depends on how much of a loaded machine each process gets.
LAST_CPU_PER_BATCH: list[float] = []


def timed(make, batches: int) -> float:
    loader = make()
    iterator = iter(loader)  # kept until the CPU is read: its workers stop with it
    start, seen, counted, cpu = None, 0, 0, {}
    for i, batch in enumerate(iterator):
        if start is None:  # steady state: from the first batch on (workers started)
            start, cpu = time.perf_counter(), _cpu_seconds()
        else:
            seen += len(batch["label"])
            counted += 1
        if i + 1 == batches:
            break
    elapsed = time.perf_counter() - start
    LAST_CPU_PER_BATCH.append(_cpu_since(cpu) / max(counted, 1))
    del iterator, loader
    return seen / elapsed


def write_shards(root: str, images: int, shards: int) -> list[str]:
    import io

    import webdataset as wds
    from PIL import Image

    from fastload.cli.synthetic import synthetic_image

    rng = np.random.default_rng(0)
    per_shard = -(-images // shards)
    encoded: list[bytes] = []
    with wds.ShardWriter(os.path.join(root, "shard-%04d.tar"), maxcount=per_shard,
                         verbose=0) as sink:
        for i in range(images):
            if len(encoded) < DISTINCT_IMAGES:  # making one costs more than decoding it
                out = io.BytesIO()
                Image.fromarray(synthetic_image(500, 375, rng)).save(out, format="JPEG",
                                                                    quality=90)
                encoded.append(out.getvalue())
            sink.write({"__key__": f"{i:07d}", "jpg": encoded[i % len(encoded)],
                        "cls": str(i % 1000)})
    return sorted(os.path.join(root, name) for name in os.listdir(root) if name.endswith(".tar"))


def tar_loaders(paths: list[str]):
    import torch
    import webdataset as wds

    import fastload as fl
    from fastload.sources import TarShards
    from fastload.cli.pipelines import standard_transform

    transform = standard_transform()

    def ours():
        shards = TarShards(paths, transform=lambda s: {"label": s["cls"],
                                                       "image": transform(s["jpg"])})
        return fl.DataLoader(shards, batch_size=64, shuffle=True, num_workers=WORKERS)

    def theirs():
        pipeline = (wds.WebDataset(paths, shardshuffle=len(paths), empty_check=False)
                    .shuffle(1000).decode("pil")
                    .map(lambda s: {"label": s["cls"], "image": transform(s["jpg"])}))
        return torch.utils.data.DataLoader(pipeline, batch_size=64, num_workers=WORKERS)

    return {"tar: fastload TarShards": ours, "tar: webdataset": theirs}


def remote_tar_loaders(paths: list[str], url: str, index_dir: str):
    import fastload as fl
    from fastload.sources import TarShards
    from fastload.cli.pipelines import standard_transform

    transform = standard_transform()
    urls = [f"{url}/{os.path.basename(path)}" for path in paths]

    def make(shards):
        return fl.DataLoader(TarShards(shards, index_dir=index_dir,
                                       transform=lambda s: {"label": s["cls"],
                                                            "image": transform(s["jpg"])}),
                             batch_size=64, shuffle=True, num_workers=WORKERS)

    return {"tar: fastload TarShards local": lambda: make(paths),
            "tar: fastload TarShards over http, +latency": lambda: make(urls)}


def index_rate(paths: list[str], rounds: int) -> float:
    from fastload.sources.tar_index import read_members

    total = sum(os.path.getsize(path) for path in paths)
    for path in paths:  # page cache
        with open(path, "rb") as file:
            while file.read(1 << 24):
                pass
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        for path in paths:
            read_members(path)
        times.append(time.perf_counter() - start)
    return total / statistics.median(times) / 1e9


def run_rounds(cells: dict, rounds: int, batches: int, cpu: dict[str, float] | None = None,
               per_round: dict[str, list[float]] | None = None) -> dict[str, float]:
    """Median samples/s of each cell over ``rounds`` (into ``cpu``, the median CPU
    seconds per batch of all its processes; into ``per_round``, every round's rate)."""
    rates: dict[str, list[float]] = {name: [] for name in cells}
    cpus: dict[str, list[float]] = {name: [] for name in cells}
    for round_ in range(rounds):
        for name, make in cells.items():
            rates[name].append(timed(make, batches or -1))
            cpus[name].append(LAST_CPU_PER_BATCH[-1])
            print(f"round {round_}: {name}: {rates[name][-1]:,.0f} samples/s, "
                  f"{cpus[name][-1] * 1e3:.2f} ms CPU per batch", flush=True)
    if cpu is not None:
        cpu.update({name: statistics.median(values) for name, values in cpus.items()})
    if per_round is not None:
        per_round.update(rates)
    return {name: statistics.median(values) for name, values in rates.items()}


def print_medians(medians: dict[str, float], cpu: dict[str, float] | None = None,
                  width: int = 32) -> None:
    """One line per cell: its median samples/s, and its CPU per batch when measured."""
    for name, value in medians.items():
        line = f"  {name:{width}s} {value:12,.0f} samples/s"
        if cpu is not None:
            line += f" {cpu[name] * 1e3:9.2f} ms CPU per batch"
        print(line)


def bench_hf(args) -> None:
    with tempfile.TemporaryDirectory(prefix="bench_sources_") as root:
        made = time.perf_counter()
        ds = build(args.rows, root)
        print(f"built {args.rows} rows in {time.perf_counter() - made:.1f} s "
              f"({len(ds.data.table.column('label').chunks)} Arrow chunks)", flush=True)
        cells = loaders(ds.with_format("numpy", columns=["label", "features"]),
                        ds.with_format("numpy"))
        cpu: dict[str, float] = {}
        medians = run_rounds(cells, args.rounds, args.batches, cpu)
        print(f"\nmedians over {args.rounds} rounds ({args.rows} rows, batch {BATCH}, "
              f"{WORKERS} workers; CPU: main process and workers together):")
        print_medians(medians, cpu)
        for label, ours, theirs in (
                ("fixed: fastload / torch", "fixed: fastload", "fixed: torch"),
                ("fixed: fastload / torch whole", "fixed: fastload", "fixed: torch whole batches"),
                ("ragged: fastload / torch", "ragged: fastload pad_collate",
                 "ragged: torch pad_sequence")):
            # A run of a few batches may read no CPU tick at all for fastload's side.
            less = f"{cpu[theirs] / cpu[ours]:9.1f}x less CPU per batch" if cpu[ours] \
                else "(too short a run to read its CPU)"
            print(f"  {label:32s} {medians[ours] / medians[theirs]:12.1f}x samples/s {less}")


def bench_tar(args) -> None:
    with tempfile.TemporaryDirectory(prefix="bench_sources_tar_") as root:
        made = time.perf_counter()
        paths = write_shards(root, args.images, args.shards)
        print(f"wrote {args.images} JPEGs in {len(paths)} shards in "
              f"{time.perf_counter() - made:.1f} s", flush=True)
        print(f"tar index: {index_rate(paths, 5):.2f} GB/s from page cache", flush=True)
        medians = run_rounds(tar_loaders(paths), args.rounds, args.batches)
        print(f"\nmedians over {args.rounds} rounds ({args.images} images, batch 64, "
              f"{WORKERS} workers):")
        print_medians(medians)
        print(f"  tar: fastload / webdataset       "
              f"{medians['tar: fastload TarShards'] / medians['tar: webdataset']:.2f}x")


def bench_hf_images(args) -> None:
    import datasets
    import torch

    import fastload as fl
    from fastload.cli.pipelines import standard_transform
    from fastload.sources import ImageColumnTransform

    with tempfile.TemporaryDirectory(prefix="bench_sources_images_") as root:
        paths = write_shards(root, args.images, 1)
        from fastload.sources import TarShards

        shards = TarShards(paths, decode=False)
        features = datasets.Features({"image": datasets.Image(),
                                      "label": datasets.Value("int64")})
        rows = [shards[i] for i in range(len(shards))]
        ds = datasets.Dataset.from_dict(
            {"image": [{"bytes": row["jpg"], "path": None} for row in rows],
             "label": [int(row["cls"]) for row in rows]}, features=features)
        shards.close()
        ds.save_to_disk(os.path.join(root, "hf"))
        ds = datasets.load_from_disk(os.path.join(root, "hf")).with_transform(
            ImageColumnTransform(standard_transform()))
        cells = {
            "images: fastload": lambda: fl.DataLoader(ds, batch_size=64, shuffle=True,
                                                      num_workers=WORKERS),
            "images: torch": lambda: torch.utils.data.DataLoader(ds, batch_size=64, shuffle=True,
                                                                 num_workers=WORKERS),
        }
        cpu: dict[str, float] = {}
        medians = run_rounds(cells, args.rounds, args.batches, cpu)
        print(f"\nmedians over {args.rounds} rounds ({args.images} JPEGs 500x375 in an Image() "
              f"column, batch 64, {WORKERS} workers):")
        print_medians(medians, cpu)
        ours, theirs = medians["images: fastload"], medians["images: torch"]
        print(f"  {'images: fastload / torch':32s} {ours / theirs:12.2f}x samples/s "
              f"{cpu['images: torch'] / cpu['images: fastload']:9.2f}x less CPU per batch")


def bench_remote_tar(args) -> None:
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                                    "tests"))
    from range_server import RangeServer

    from fastload.sources import TarShards

    with tempfile.TemporaryDirectory(prefix="bench_sources_remote_") as root:
        shards_dir, index_dir = os.path.join(root, "www"), os.path.join(root, "index")
        os.mkdir(shards_dir)
        os.mkdir(index_dir)
        made = time.perf_counter()
        paths = write_shards(shards_dir, args.images, args.shards)
        print(f"wrote {args.images} JPEGs in {len(paths)} shards in "
              f"{time.perf_counter() - made:.1f} s", flush=True)
        with RangeServer(shards_dir) as server:
            TarShards([f"{server.url}/{os.path.basename(p)}" for p in paths], index_dir=index_dir)
            server.latency = args.latency
            rates: dict[str, list[float]] = {}
            medians = run_rounds(remote_tar_loaders(paths, server.url, index_dir), args.rounds,
                                 args.batches, per_round=rates)
            print(f"most requests in flight at once: {server.most_in_flight}")
        local, remote = medians.values()
        # Each round's two runs are next to each other: their ratio drifts less with the load.
        paired = [r / l for l, r in zip(*rates.values())]
        print(f"\nmedians over {args.rounds} rounds ({args.images} images, batch 64, "
              f"{WORKERS} workers, {args.latency * 1000:.0f} ms per request):")
        print_medians(medians, width=44)
        print(f"  {'remote / local, of the medians':44s} {remote / local:12.2f}")
        print(f"  {'remote / local, median of the rounds':44s} {statistics.median(paired):12.2f}"
              f"   (rounds: {', '.join(f'{ratio:.2f}' for ratio in paired)})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--batches", type=int, default=0, help="per round; 0: a whole epoch")
    parser.add_argument("--images", type=int, default=20_000)
    parser.add_argument("--shards", type=int, default=40)
    parser.add_argument("--latency", type=float, default=0.03,
                        help="seconds the server adds to each request (remote-tar)")
    parser.add_argument("--only", choices=["hf", "hf-images", "tar", "remote-tar", "tar-index"],
                        default=None)
    args = parser.parse_args()
    if args.only in (None, "hf"):
        bench_hf(args)
    if args.only in (None, "hf-images"):
        bench_hf_images(args)
    if args.only in (None, "tar"):
        bench_tar(args)
    if args.only in (None, "remote-tar"):
        bench_remote_tar(args)
    if args.only == "tar-index":  # (the tar cells print it too)
        with tempfile.TemporaryDirectory(prefix="bench_sources_index_") as root:
            paths = write_shards(root, args.images, args.shards)
            print(f"tar index: {index_rate(paths, 5):.2f} GB/s from page cache "
                  f"({sum(os.path.getsize(p) for p in paths) / 1e9:.2f} GB in "
                  f"{len(paths)} shards)")


if __name__ == "__main__":
    main()
