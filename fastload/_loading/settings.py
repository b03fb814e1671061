"""What one epoch of a DataLoader runs with, fixed when ``iter()`` is called.

The loader's attributes may change between epochs (torch allows it for most
of them), so at each ``iter()`` the DataLoader reads them once into a
``LoaderSettings`` and hands it to the iterator it makes; iterators read
nothing of the loader's after that.  ``BatchSettings``, the part that says
how indices become a batch, is what a ``BatchSource`` is made from, in the
main process and in every worker (it travels in the workers' payload).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, NamedTuple

__all__ = ["BatchSettings", "LoaderSettings"]


class BatchSettings(NamedTuple):
    """How a batch of indices becomes a batch (a NamedTuple: it pickles as a
    tuple, into every spawned worker's payload)."""

    iterable: bool            # an IterableDataset: samples come from its stream
    auto_collation: bool      # a batch sampler gives batches of indices
    collate_fn: Callable
    batch_size: int | None
    drop_last: bool


@dataclass(frozen=True, slots=True)
class LoaderSettings:
    """Everything an iterator needs of its loader, read once at ``iter()``."""

    dataset: Any
    batch: BatchSettings
    output: str                        # "numpy" or "torch"
    num_workers: int
    prefetch_factor: Any               # checked by the worker iterator, where torch checks it
    timeout: float
    in_order: bool
    persistent_workers: bool
    snapshot_every_n_steps: int        # a worker sends its dataset copy's state every n of its batches
    multiprocessing_context: Any       # None: multiprocessing's default
    worker_init_fn: Callable[[int], None] | None
    seed_source: Any                   # the loader's SeedSource: an epoch's base seed
    rng_sources: tuple                 # every seed stream an epoch draws from (resume.seed_streams)
    epoch_sampler: Any                 # the sampler whose set_epoch shapes the epoch, or None
    index_sampler: Any                 # the batch sampler, or the sampler without auto-collation
    kept_order: tuple                  # (how, sampler): a foreign sampler's order (resume.order_keeping)
    split: Any                         # the DistributedSampler split (elastic.distributed_split)
    len_called: int | None             # len(loader) of an IterableDataset, as last asked
    pin_memory: bool                   # whether batches are pinned (NOTE [ Where batches are pinned ])
    pin_memory_device: str | None
    spare_slots: Any                   # the loader's SpareSlots (fork, new workers each epoch)
    ledger: Any                        # the loader's TimeLedger (loader.report())
    autopilot: Any = None              # num_workers="auto": its AutoOptions (autotune.py)
    auto_choice: Any = None            # a dict the climb keeps its choice in, for the loader
    auto_climb: Any = None             # the loader's HillClimb, which goes on across epochs
    seed_per_batch: bool = False       # every generator seeded per batch (auto's determinism)
