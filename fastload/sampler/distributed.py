"""``DistributedSampler``: each replica's share of an epoch, as torch splits it,
and where the replica count and rank come from (the process group, else
``WORLD_SIZE``/``RANK``)."""

from __future__ import annotations

import math
import numbers
import os
import sys
from collections.abc import Iterator, Sized
from typing import Any

import numpy as np

from fastload import _core
from fastload.sampler.base import Sampler, _iter_ints, _T_co

__all__ = ["DistributedSampler"]

_NO_GROUP_MESSAGE = (
    "Default process group has not been initialized, please make sure to call "
    "init_process_group. (fastload also reads {name} from the environment, as "
    "torchrun sets it, or takes num_replicas and rank as arguments.)"
)
# PyTorch Lightning's launcher sets WORLD_SIZE, LOCAL_RANK and NODE_RANK, and
# starts the process group only inside Trainer.fit.
_LAUNCHED_WITHOUT_RANK = (
    " WORLD_SIZE is set but RANK is not, as PyTorch Lightning's launcher leaves it: build "
    "the sampler once the process group has started (in Lightning, inside train_dataloader())."
)


def _initialized_group() -> Any:
    """``torch.distributed`` if it holds an initialised default group, else None.

    Never imports torch: a process group can only exist once the program has
    imported ``torch.distributed`` itself.
    """
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        return dist
    return None


def _from_environment(name: str) -> int:
    value = os.environ.get(name)
    if value is None:
        message = _NO_GROUP_MESSAGE.format(name=name)
        if name == "RANK" and "WORLD_SIZE" in os.environ:
            message += _LAUNCHED_WITHOUT_RANK
        raise ValueError(message)
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"{name}={value!r} in the environment is not an integer") from None


class DistributedSampler(Sampler[_T_co]):
    """This rank's share of the dataset, for data-parallel training.

    Each epoch orders the dataset (a permutation seeded by ``seed + epoch``,
    the same on every rank, or in order), pads it by repeating from its start
    to a multiple of ``num_replicas`` (or, with ``drop_last``, cuts the tail),
    and keeps every ``num_replicas``-th index from ``rank`` on.  Call
    ``set_epoch`` before each epoch, or every epoch has the same order.

    ``num_replicas`` and ``rank`` default to the initialised torch process
    group, else to the ``WORLD_SIZE`` and ``RANK`` environment variables.
    """

    def __init__(
        self,
        dataset: Sized,
        num_replicas: int | None = None,
        rank: int | None = None,
        shuffle: bool = True,
        seed: int = 0,
        drop_last: bool = False,
    ) -> None:
        group = _initialized_group() if num_replicas is None or rank is None else None
        if num_replicas is None:
            num_replicas = group.get_world_size() if group is not None else _from_environment("WORLD_SIZE")
        if rank is None:
            rank = group.get_rank() if group is not None else _from_environment("RANK")
        for name, value in (("num_replicas", num_replicas), ("rank", rank)):
            if not isinstance(value, numbers.Integral):
                # torch slices the order with them and fails only when iterated.
                raise TypeError(f"DistributedSampler: {name} should be an integer, but got "
                                f"{type(value).__name__} {value!r}")
        if rank >= num_replicas or rank < 0:
            raise ValueError(
                f"Invalid rank {rank}, rank should be in the interval [0, {num_replicas - 1}]"
            )
        self.dataset = dataset
        self.num_replicas = num_replicas
        self.rank = rank
        self.epoch = 0
        self.drop_last = drop_last
        n = len(self.dataset)
        if self.drop_last and n % self.num_replicas != 0:
            # Largest multiple of num_replicas below n, so every rank gets as
            # many indices and none is repeated.
            self.num_samples = math.ceil((n - self.num_replicas) / self.num_replicas)
        else:
            self.num_samples = math.ceil(n / self.num_replicas)
        self.total_size = self.num_samples * self.num_replicas
        self.shuffle = shuffle
        self.seed = seed

    def _epoch_indices(self) -> np.ndarray:
        n = len(self.dataset)
        if self.shuffle:
            # Every rank must build the same order: it depends on seed + epoch
            # only (torch's manual_seed takes the same value modulo 2**64).
            seed = self.seed + self.epoch
            if not isinstance(seed, numbers.Integral):
                # torch's type: its manual_seed raises RuntimeError here.
                raise RuntimeError(f"DistributedSampler shuffles with seed + epoch, which must "
                                   f"be an integer, but got seed={self.seed!r}, "
                                   f"epoch={self.epoch!r}")
            order = _core.permutation(n, seed % (1 << 64))
        else:
            order = np.arange(n, dtype=np.int64)
        # total_size and num_samples were fixed at construction.  torch pads the
        # order, slices this rank's share, and asserts both lengths against them,
        # so a dataset that has changed size, or num_replicas or rank set since,
        # fails here instead of giving ranks unequal or overlapping shares.  The
        # same checks in the same order, on lengths alone:
        padded = self._padded_length(n)
        if padded != self.total_size:
            raise AssertionError(
                f"Number of indices ({padded}) does not match total_size ({self.total_size}): "
                f"the dataset has {n} samples now, which this DistributedSampler was not "
                f"sized for when built; build a new one")
        # A range slices exactly as torch's list does (a zero step, a rank past the end, ...).
        share = range(padded)[self.rank:self.total_size:self.num_replicas]
        if len(share) != self.num_samples:
            raise AssertionError(
                f"Number of subsampled indices ({len(share)}) does not match num_samples "
                f"({self.num_samples}): num_replicas={self.num_replicas} and rank={self.rank} "
                f"are not what this DistributedSampler was sized for when built; build a new one")
        if n == 0:
            return order  # then the share is empty too
        # Padding repeats the order from its start, i.e. position p holds
        # order[p % n]: gather this rank's positions directly.
        positions = np.arange(share.start, share.stop, share.step, dtype=np.int64)
        return order[positions % n]

    def _padded_length(self, n: int) -> int:
        """The length of torch's order of ``n`` indices once padded or cut to ``total_size``."""
        if self.drop_last:
            return len(range(n)[:self.total_size])
        padding = self.total_size - n
        if padding <= n:
            # Negative once the dataset has grown: torch's list slicing then
            # appends all but the last -padding indices.
            return n + len(range(n)[:padding])
        if n == 0:
            # torch repeats the order ceil(padding / n) times.
            raise ZeroDivisionError(f"DistributedSampler cannot pad an empty dataset to "
                                    f"total_size ({self.total_size}): it was not empty when "
                                    f"this DistributedSampler was built; build a new one")
        return self.total_size

    # Typed as torch's: generic in what it yields, though it yields ints, so that
    # annotations written for torch's (DistributedSampler[int]) hold for ours.
    def __iter__(self) -> Iterator[_T_co]:
        return _iter_ints(self._epoch_indices())  # type: ignore[return-value]

    def __len__(self) -> int:
        return self.num_samples

    def set_epoch(self, epoch: int) -> None:
        """Set the epoch, so that shuffling differs between epochs (same on all ranks)."""
        self.epoch = epoch
