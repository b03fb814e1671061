"""The warning for a loader that gives every rank the same samples.

A trainer that runs data-parallel ranks (PyTorch Lightning's
``strategy="ddp"``) gives a ``DistributedSampler`` only to torch's own
``DataLoader``: a fastload loader keeps the sampler it was built with, and
without one that shards, every rank trains on the whole dataset, silently.
So each ``iter(loader)`` looks at how many ranks this process is one of and,
with more than one, at whether the loader's samplers shard; if not, it warns,
once per loader.  The initialised ``torch.distributed`` group is read first:
Lightning's launcher sets no ``RANK``, and its teardown deletes
``WORLD_SIZE`` after each ``fit`` while the group lives on; else ``WORLD_SIZE``.

A sampler shards when it says which share it takes: ``num_replicas`` above 1
and a ``rank`` (fastload's and torch's ``DistributedSampler``, fastload's
``BucketBatchSampler`` on several replicas, and look-alikes), found on the
loader's ``sampler`` or ``batch_sampler`` or anything they wrap
(``.sampler`` / ``.batch_sampler``).  An ``IterableDataset`` splits itself
over ranks, as torch expects it to (``get_worker_info``, the rank), which
cannot be seen from outside: it is never warned about.
"""

from __future__ import annotations

import numbers
import os
import warnings
from typing import Any

from fastload.sampler.distributed import _initialized_group

__all__ = ["warn_if_unsharded", "world_size"]

_WARNED_ATTRIBUTE = "_warned_unsharded"
_MAX_DEPTH = 8  # wrappers of wrappers; a cycle of attributes stops here too

_MESSAGE = (
    "fastload DataLoader: this process is one of {world} ranks ({source}), but the loader's "
    "sampler ({sampler}) does not shard the dataset, so every rank loads the same samples. "
    "Give it a fastload.DistributedSampler(dataset, seed=...) built once the ranks have started "
    "(in PyTorch Lightning: inside train_dataloader(); Lightning adds a DistributedSampler only "
    "to torch's own DataLoader, and calls set_epoch on this one's sampler each epoch), and pass "
    "generator=<seed> to the DataLoader so that a checkpoint resumes later epochs exactly "
    "(Lightning does not save torch's global generator). If each rank's dataset already is its "
    "own share, silence this with warnings.filterwarnings('ignore', "
    "message='fastload DataLoader: this process is one of')."
)


def world_size() -> tuple[int, str]:
    """How many ranks this process is one of, and where that was read.

    The initialised default process group decides (it exists only if the
    program imported ``torch.distributed``; torch is never imported here),
    else ``WORLD_SIZE``; a value that is not an integer counts as one rank.
    """
    group = _initialized_group()
    if group is not None:
        return group.get_world_size(), "the initialised torch.distributed process group"
    try:
        return int(os.environ.get("WORLD_SIZE", "1")), "WORLD_SIZE in the environment"
    except ValueError:
        return 1, "WORLD_SIZE in the environment"


def _declares_share(sampler: Any) -> bool:
    replicas = getattr(sampler, "num_replicas", None)
    rank = getattr(sampler, "rank", None)
    return _is_int(replicas) and replicas > 1 and _is_int(rank)


def _is_int(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _is_sharded(samplers: list) -> bool:
    """Whether any of ``samplers``, or what they wrap, takes a share."""
    seen: set[int] = set()
    for _ in range(_MAX_DEPTH):
        wrapped = []
        for sampler in samplers:
            if sampler is None or id(sampler) in seen:
                continue
            seen.add(id(sampler))
            if _declares_share(sampler):
                return True
            wrapped += [getattr(sampler, "sampler", None), getattr(sampler, "batch_sampler", None)]
        if not wrapped:
            return False
        samplers = wrapped
    return False


def warn_if_unsharded(loader: Any, stacklevel: int) -> None:
    """Warn (once per loader) when this process is one of several ranks and
    ``loader``'s samplers give it the whole dataset."""
    if getattr(loader, _WARNED_ATTRIBUTE, False) or getattr(loader, "_iterable", False):
        return
    world, source = world_size()
    if world <= 1:
        return
    # With a batch_sampler, loader.sampler is the unused default: only the batch sampler counts.
    top = loader.batch_sampler if loader.batch_sampler is not None else loader.sampler
    if _is_sharded([top]):
        return
    setattr(loader, _WARNED_ATTRIBUTE, True)
    warnings.warn(_MESSAGE.format(world=world, source=source, sampler=_describe(top)),
                  UserWarning, stacklevel=stacklevel + 1)


def _describe(sampler: Any) -> str:
    """``BatchSampler over RandomSampler``: the sampler and what it wraps."""
    names = []
    while sampler is not None and len(names) < _MAX_DEPTH:
        names.append(type(sampler).__name__)
        inner = getattr(sampler, "sampler", None)
        sampler = inner if inner is not None else getattr(sampler, "batch_sampler", None)
    return " over ".join(names)
