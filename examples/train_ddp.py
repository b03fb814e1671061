"""Train a small convolutional network with DistributedDataParallel, fed by fastload.

Run it under torchrun (CPU, gloo)::

    torchrun --standalone --nproc_per_node 2 examples/train_ddp.py --epochs 2 \\
        --checkpoint ckpt.pt --checkpoint-every 20

and after a pre-emption, on any number of processes::

    torchrun --standalone --nproc_per_node 3 examples/train_ddp.py --epochs 2 \\
        --checkpoint ckpt.pt --checkpoint-every 20 --resume

Without ``--data`` it trains on the synthetic image folder ``python -m fastload bench``
uses (generated once and cached; ``--images`` and ``--image-size`` make a small one).
Every ``--checkpoint-every`` steps, and at the end of each epoch, rank 0 writes the model,
the optimizer and every rank's ``loader.state_dict()`` (to a temporary file, then
``os.replace``: a checkpoint is whole or absent).  ``--resume`` continues from it: on the
same number of ranks each rank takes its own loader state (exact to the batch); on another
number, every rank takes rank 0's, and fastload splits the samples the epoch has not yet
seen over the new ranks, each once (elastic resume).

``--loader torch`` runs the same training on ``torch.utils.data.DataLoader`` with torch's
``DistributedSampler``; it resumes mid-epoch only on the same number of ranks (by skipping
the batches each rank had trained on), since torch's loader keeps no state.

``--log-indices FILE`` appends, per rank, one JSON line per step with the dataset indices
the step trained on (``FILE`` gets ``.rank<N>`` appended).  Rank 0 prints a JSON summary
line at the end (images/s, step time, time spent waiting for data).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from typing import Any

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel

import fastload as fl
from fastload.cli import synthetic_image_folder
from fastload.vision import ImageFolder
from fastload.vision import transforms as T


class IndexedImages(fl.Dataset):
    """An image folder whose samples also carry their index, so that a run can log
    which samples each rank trained on."""

    def __init__(self, folder: ImageFolder) -> None:
        self.folder = folder

    def __len__(self) -> int:
        return len(self.folder)

    def __getitem__(self, index: int) -> tuple[Any, int, int]:
        image, target = self.folder[index]
        return image, target, index


class SmallConvNet(nn.Module):
    def __init__(self, classes: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 16, 3, stride=2, padding=1)
        self.conv2 = nn.Conv2d(16, 32, 3, stride=2, padding=1)
        self.conv3 = nn.Conv2d(32, 64, 3, stride=2, padding=1)
        self.head = nn.Linear(64, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.conv1(x))
        x = F.relu(self.conv2(x))
        x = F.relu(self.conv3(x))
        return self.head(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", help="an image folder (class subfolders); default: synthetic")
    parser.add_argument("--images", type=int, default=2000, help="synthetic folder: images")
    parser.add_argument("--image-size", type=int, default=128, help="synthetic folder: side")
    parser.add_argument("--classes", type=int, default=10, help="synthetic folder: classes")
    parser.add_argument("--crop", type=int, default=64, help="training crop side")
    parser.add_argument("--loader", choices=("fastload", "torch"), default="fastload")
    parser.add_argument("--batch-size", type=int, default=32, help="per rank")
    parser.add_argument("--workers", type=int, default=2, help="loader workers per rank")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--max-steps", type=int, default=0, help="stop after this many steps "
                        "(counted over the whole training), without a checkpoint there")
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--checkpoint", help="checkpoint file to write (and --resume from)")
    parser.add_argument("--checkpoint-every", type=int, default=0, help="steps; 0: epoch ends")
    parser.add_argument("--resume", action="store_true", help="continue from --checkpoint")
    parser.add_argument("--log-indices", help="per-rank JSON lines of the indices trained on")
    options = parser.parse_args(argv)
    if options.resume and not options.checkpoint:
        parser.error("--resume needs --checkpoint")
    return options


def init_distributed() -> tuple[int, int]:
    """The process group torchrun describes; a group of one when run without torchrun."""
    if "RANK" in os.environ:
        dist.init_process_group("gloo")
    else:
        # A group of one needs no rendezvous: an in-process store, no port to race for.
        dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    return dist.get_rank(), dist.get_world_size()


def image_root(options: argparse.Namespace) -> str:
    """``--data``, or the cached synthetic folder: each node's first process builds it
    (once: later runs find it cached), the others wait and then find it."""
    if options.data:
        return options.data
    side = options.image_size

    def build() -> str:
        return synthetic_image_folder(options.images, (side, side), options.classes, workers=1)

    first_on_node = int(os.environ.get("LOCAL_RANK", "0")) == 0
    root = build() if first_on_node else None
    dist.barrier()
    return root if root is not None else build()


def build_loader(options: argparse.Namespace, dataset: Any) -> tuple[Any, Any]:
    """The loader and the sampler whose ``set_epoch`` to call."""
    if options.loader == "fastload":
        sampler = fl.DistributedSampler(dataset, seed=options.seed)
        loader = fl.DataLoader(dataset, batch_size=options.batch_size, sampler=sampler,
                               num_workers=options.workers, output="torch",
                               persistent_workers=options.workers > 0)
        return loader, sampler
    sampler = torch.utils.data.DistributedSampler(dataset, seed=options.seed)
    loader = torch.utils.data.DataLoader(dataset, batch_size=options.batch_size, sampler=sampler,
                                         num_workers=options.workers,
                                         persistent_workers=options.workers > 0)
    return loader, sampler


class SkipBatches(torch.utils.data.Sampler):
    """torch's DistributedSampler without the first ``skip`` batches of one epoch: how
    torch's loader resumes mid-epoch (it keeps no state of its own)."""

    def __init__(self, sampler: Any, skip_samples: int) -> None:
        self.sampler, self.skip_samples = sampler, skip_samples

    def __iter__(self):
        iterator = iter(self.sampler)
        for _ in range(self.skip_samples):
            next(iterator, None)
        self.skip_samples = 0  # once: the next epochs are whole
        return iterator

    def __len__(self) -> int:
        return len(self.sampler)

    def set_epoch(self, epoch: int) -> None:
        self.sampler.set_epoch(epoch)


def save_checkpoint(path: str, rank: int, world: int, model: Any, optimizer: Any, loader: Any,
                    progress: dict) -> None:
    """Every rank's loader state gathered; rank 0 writes the file atomically."""
    loader_state = loader.state_dict() if hasattr(loader, "state_dict") else None
    states = [None] * world
    dist.all_gather_object(states, loader_state)
    if rank == 0:
        checkpoint = {"model": model.module.state_dict(), "optimizer": optimizer.state_dict(),
                      "loader_states": states, "world_size": world, **progress}
        temporary = f"{path}.tmp{os.getpid()}"
        try:
            with open(temporary, "wb") as f:
                torch.save(checkpoint, f)
                f.flush()
                os.fsync(f.fileno())  # on disk before it takes the checkpoint's name
            os.replace(temporary, path)
        except BaseException:
            if os.path.exists(temporary):
                os.remove(temporary)
            raise
    dist.barrier()


def restore(options: argparse.Namespace, rank: int, world: int, model: Any, optimizer: Any,
            loader: Any, sampler: Any) -> tuple[dict, Any]:
    """Load the checkpoint into model, optimizer and loader; the progress it recorded
    and the loader to iterate (torch's may be rebuilt to skip batches)."""
    # weights_only: the checkpoint holds tensors, numbers, strings, lists, tuples and
    # dicts only (a loader's state_dict is such), so loading it runs no pickled code.
    checkpoint = torch.load(options.checkpoint, map_location="cpu", weights_only=True)
    model.module.load_state_dict(checkpoint["model"])
    optimizer.load_state_dict(checkpoint["optimizer"])
    progress = {k: checkpoint[k] for k in ("epoch", "step", "epoch_step")}
    states = checkpoint["loader_states"]
    if options.loader == "fastload":
        if states[0] is None and progress["epoch_step"]:
            raise SystemExit("this checkpoint was written mid-epoch with --loader torch, which "
                             "keeps no loader state; resume it with --loader torch")
        if states[0] is None:
            return progress, loader  # at an epoch's end: nothing of the loader to restore
        # Same world size: this rank's own state, exact to the batch; another: any
        # rank's state says which samples the whole job has seen (elastic resume).
        loader.load_state_dict(states[rank] if checkpoint["world_size"] == world else states[0])
        return progress, loader
    if progress["epoch_step"] and checkpoint["world_size"] != world:
        raise SystemExit(f"--loader torch cannot resume mid-epoch on {world} ranks from a "
                         f"checkpoint of {checkpoint['world_size']} ranks (torch's loader keeps "
                         f"no state); use --loader fastload, or a checkpoint at an epoch's end")
    skipping = SkipBatches(sampler, progress["epoch_step"] * options.batch_size)
    loader = torch.utils.data.DataLoader(loader.dataset, batch_size=options.batch_size,
                                         sampler=skipping, num_workers=options.workers,
                                         persistent_workers=options.workers > 0)
    return progress, loader


def train(options: argparse.Namespace) -> dict:
    rank, world = init_distributed()
    torch.manual_seed(options.seed)
    transform = T.Compose([T.RandomResizedCrop(options.crop, scale=(0.25, 1.0)),
                           T.RandomHorizontalFlip(), T.ToArray()])
    folder = ImageFolder(image_root(options), transform=transform)
    dataset = IndexedImages(folder)
    loader, sampler = build_loader(options, dataset)
    model = DistributedDataParallel(SmallConvNet(len(folder.classes)))
    optimizer = torch.optim.SGD(model.parameters(), lr=options.lr, momentum=0.9)
    progress = {"epoch": 0, "step": 0, "epoch_step": 0}
    if options.resume and os.path.exists(options.checkpoint):
        progress, loader = restore(options, rank, world, model, optimizer, loader, sampler)
    log = open(f"{options.log_indices}.rank{rank}", "a") if options.log_indices else None
    timing = {"steps": [], "waits": [], "images": 0, "start": time.perf_counter()}
    try:
        run_epochs(options, rank, world, model, optimizer, loader, sampler, progress, log, timing)
    finally:
        if log is not None:
            log.close()
    summary = summarize(options, world, timing, progress)
    dist.barrier()
    dist.destroy_process_group()
    return summary


def run_epochs(options, rank, world, model, optimizer, loader, sampler, progress, log,
               timing) -> None:
    mean = torch.tensor([0.485, 0.456, 0.406]).view(1, 3, 1, 1) * 255
    std = torch.tensor([0.229, 0.224, 0.225]).view(1, 3, 1, 1) * 255
    while progress["epoch"] < options.epochs:
        sampler.set_epoch(progress["epoch"])  # a loaded fastload state sets its own epoch
        waited = time.perf_counter()
        for images, targets, indices in loader:
            began = time.perf_counter()
            x = (images.float() - mean) / std
            loss = F.cross_entropy(model(x), targets)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            progress["step"] += 1
            progress["epoch_step"] += 1
            if log is not None:
                log.write(json.dumps({"epoch": progress["epoch"], "step": progress["step"],
                                      "indices": indices.tolist()}) + "\n")
                log.flush()
            now = time.perf_counter()
            timing["waits"].append(began - waited)
            timing["steps"].append(now - waited)
            timing["images"] += len(indices) * world
            if options.checkpoint and options.checkpoint_every \
                    and progress["step"] % options.checkpoint_every == 0:
                save_checkpoint(options.checkpoint, rank, world, model, optimizer, loader,
                                progress)
            if options.max_steps and progress["step"] >= options.max_steps:
                return
            waited = time.perf_counter()
        progress["epoch"] += 1
        progress["epoch_step"] = 0
        if options.checkpoint:
            save_checkpoint(options.checkpoint, rank, world, model, optimizer, loader, progress)


def summarize(options, world, timing, progress) -> dict:
    seconds = time.perf_counter() - timing["start"]
    steps = timing["steps"][1:] or timing["steps"]  # the first step includes start-up
    waits = timing["waits"][1:] or timing["waits"]
    return {"loader": options.loader, "ranks": world, "workers": options.workers,
            "batch_size": options.batch_size, "steps": len(timing["steps"]),
            "last_step": progress["step"], "seconds": round(seconds, 3),
            "images_per_s": round(timing["images"] / seconds, 1) if seconds else 0.0,
            "step_ms": round(1000 * statistics.median(steps), 2) if steps else None,
            "data_wait_ms": round(1000 * statistics.median(waits), 2) if waits else None}


def main(argv: list[str] | None = None) -> int:
    options = parse_args(argv)
    rank = int(os.environ.get("RANK", "0"))
    summary = train(options)
    if rank == 0:
        print(json.dumps(summary), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
