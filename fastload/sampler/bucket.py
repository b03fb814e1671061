"""Batches of samples of similar length, so that padding them wastes little.

``BucketBatchSampler`` is a batch sampler (give it to ``DataLoader`` as
``batch_sampler=``).  An epoch:

1. orders the indices (a kernel permutation of ``range(len(lengths))``; in
   order with ``shuffle=False``);
2. with ``drop_last``, leaves out the last ``len(lengths) % batch_size`` of
   that order;
3. cuts it into chunks of ``batch_size * bucket_size_multiplier`` and sorts
   each chunk by length (stably);
4. cuts each sorted chunk into batches: ``batch_size`` each (so only the
   epoch's last batch can be short), or, with ``max_tokens``, as many
   samples as fit ``len(batch) * longest <= max_tokens``, at most
   ``batch_size``;
5. shuffles the batches (a second kernel permutation; not with
   ``shuffle=False``);
6. with several replicas, pads the batch list by repeating it from its start
   to a multiple of ``num_replicas`` (cuts it, with ``drop_last``), and keeps
   every ``num_replicas``-th batch from ``rank`` on, as torch's
   ``DistributedSampler`` does with indices.

The epoch's seed is one draw from the ``generator`` stream (as fastload's
``RandomSampler`` draws one per epoch) mixed with ``set_epoch``'s epoch, so a
loader's ``state_dict`` replays it (the stream's state and the epoch are
saved), and ranks given the same ``generator`` build the same batch list.
"""

from __future__ import annotations

import numbers
import os
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np

from fastload import _core
from fastload.rng import SeedSource
from fastload.sampler.base import _SeededSampler
from fastload.sampler.distributed import _from_environment, _initialized_group

__all__ = ["BucketBatchSampler"]

_MASK64 = (1 << 64) - 1
_EPOCH_STEP = 0x9E3779B97F4A7C15   # the golden-ratio odd constant: epochs far apart in seed space
_BATCH_ORDER_SALT = 0xD1B54A32D192ED03  # the batch permutation's seed, apart from the indices'


def _positive_int(name: str, value: Any) -> int:
    if not isinstance(value, numbers.Integral) or isinstance(value, bool) or value <= 0:
        raise ValueError(f"{name} should be a positive integer value, but got {name}={value!r}")
    return int(value)


def _boolean(name: str, value: Any) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise ValueError(f"{name} should be a boolean value, but got {name}={value!r}")
    return bool(value)


def _lengths_array(lengths: Any) -> np.ndarray:
    """``lengths`` as a read-only int64 copy; TypeError/ValueError naming the bad entry."""
    array = np.asarray(lengths)
    if array.ndim != 1:
        raise ValueError(f"lengths should be a 1-d sequence of non-negative integers, but got "
                         f"shape {array.shape}")
    if array.size and array.dtype.kind not in "iu":
        if isinstance(lengths, np.ndarray):
            raise TypeError(f"lengths should be non-negative integers, but got an array of "
                            f"dtype {array.dtype}")
        bad = next((i for i, value in enumerate(lengths) if isinstance(value, (bool, np.bool_))
                    or not isinstance(value, numbers.Integral)), 0)
        raise TypeError(f"lengths should be non-negative integers, but lengths[{bad}] is "
                        f"{lengths[bad]!r} ({type(lengths[bad]).__name__})")
    array = array.astype(np.int64)  # a copy: the caller's list or array may change later
    if array.size and array.min() < 0:
        bad = int(np.argmax(array < 0))
        raise ValueError(f"lengths should be non-negative integers, but lengths[{bad}] = "
                         f"{array[bad]}")
    array.flags.writeable = False
    return array


def _replicas(num_replicas: Any, rank: Any) -> tuple[int, int]:
    """``num_replicas`` and ``rank`` as ``DistributedSampler`` defaults them, except
    that with neither given and no process group or ``WORLD_SIZE``/``RANK``
    environment, the sampler is not sharded (one replica)."""
    group = _initialized_group() if num_replicas is None or rank is None else None
    if num_replicas is None and rank is None and group is None \
            and "WORLD_SIZE" not in os.environ and "RANK" not in os.environ:
        return 1, 0
    if num_replicas is None:
        num_replicas = group.get_world_size() if group is not None \
            else _from_environment("WORLD_SIZE")
    if rank is None:
        rank = group.get_rank() if group is not None else _from_environment("RANK")
    for name, value in (("num_replicas", num_replicas), ("rank", rank)):
        if not isinstance(value, numbers.Integral) or isinstance(value, bool):
            raise TypeError(f"BucketBatchSampler: {name} should be an integer, but got "
                            f"{type(value).__name__} {value!r}")
    if num_replicas <= 0:
        raise ValueError(f"num_replicas should be a positive integer value, but got "
                         f"num_replicas={num_replicas}")
    if rank >= num_replicas or rank < 0:
        raise ValueError(f"Invalid rank {rank}, rank should be in the interval "
                         f"[0, {num_replicas - 1}]")
    return int(num_replicas), int(rank)


class BucketBatchSampler(_SeededSampler[list[int]]):
    """Batches of indices whose ``lengths`` are close (see the module's notes).

    ``lengths[i]`` is the length of sample ``i`` (tokens, frames).  Each index
    appears once per epoch (once per rank's share, bar the repeated batches
    that even out the ranks).  ``batch_size`` caps every batch; with
    ``max_tokens``, a batch also holds no more samples than fit
    ``len(batch) * max(lengths in batch) <= max_tokens`` (a sample longer than
    ``max_tokens`` is a ValueError at construction, naming it).  Without
    ``max_tokens`` at most one batch per epoch is short (none with
    ``drop_last``).  ``drop_last`` leaves out the last ``len(lengths) %
    batch_size`` indices of the epoch's order, with or without
    ``max_tokens`` (token-budget batches are short by design).

    ``generator``: None, an int seed, a ``numpy.random.Generator`` or a
    ``torch.Generator``, as fastload's other samplers take it.  Sharded (more
    than one replica) with ``generator=None``, the stream is seeded with 0 (as
    ``DistributedSampler``'s ``seed=0``), so that every rank builds the same
    batches; call ``set_epoch`` every epoch then.

    ``len()`` is exact: the number of batches of the epoch being iterated, or,
    between epochs, of the next one (with ``max_tokens`` it depends on the
    epoch's order, which it then computes from the seed the epoch will draw,
    seen on private copies of the streams: ``len()`` draws from no generator).
    """

    def __init__(
        self,
        lengths: Sequence[int] | np.ndarray,
        batch_size: int,
        drop_last: bool = False,
        shuffle: bool = True,
        bucket_size_multiplier: int = 100,
        max_tokens: int | None = None,
        generator: Any = None,
        num_replicas: int | None = None,
        rank: int | None = None,
    ) -> None:
        self.batch_size = _positive_int("batch_size", batch_size)
        self.drop_last = _boolean("drop_last", drop_last)
        self.shuffle = _boolean("shuffle", shuffle)
        self.bucket_size_multiplier = _positive_int("bucket_size_multiplier",
                                                    bucket_size_multiplier)
        self.max_tokens = None if max_tokens is None else _positive_int("max_tokens", max_tokens)
        self.lengths = _lengths_array(lengths)
        if self.max_tokens is not None and self.lengths.size \
                and int(self.lengths.max()) > self.max_tokens:
            index = int(np.argmax(self.lengths > self.max_tokens))
            raise ValueError(f"sample {index} has length {int(self.lengths[index])}, more than "
                             f"max_tokens={self.max_tokens}: no batch can hold it (raise "
                             f"max_tokens, or leave the sample out of lengths and the dataset)")
        self.num_replicas, self.rank = _replicas(num_replicas, rank)
        if generator is None and self.num_replicas > 1:
            generator = 0  # every rank must draw the same order
        self._seed_source = SeedSource(generator)
        self.epoch = 0
        self._current: tuple | None = None  # (key, batches) of the epoch being iterated
        self._peeked: tuple | None = None   # (key, batches, count) len() planned for the next seed

    @property
    def _length_from_draws(self) -> bool:
        # resume.py asks len() with a state's streams in place when this holds.
        return self.max_tokens is not None and self.shuffle

    def set_epoch(self, epoch: int) -> None:
        """Set the epoch: its order mixes it in (the same on every rank)."""
        if not isinstance(epoch, numbers.Integral) or isinstance(epoch, bool):
            raise TypeError(f"epoch should be an integer, but got {type(epoch).__name__} {epoch!r}")
        self.epoch = int(epoch)

    # -- one epoch -----------------------------------------------------------

    def _epoch_seed(self, drawn: int) -> int:
        return (drawn + self.epoch * _EPOCH_STEP) & _MASK64

    def _settings_key(self, drawn: int | None) -> tuple:
        return (drawn, self.epoch, self.batch_size, self.drop_last, self.shuffle,
                self.bucket_size_multiplier, self.max_tokens, self.num_replicas, self.rank,
                id(self.lengths))

    def _global_batches(self, seed: int) -> tuple[np.ndarray, np.ndarray]:
        """``(order, starts)``: the sorted order of the epoch's indices and where
        each batch starts in it, batches in the epoch's (shuffled) order;
        batch k is ``order[starts[k]:ends[k]]`` with ``ends`` from ``_batch_ends``."""
        n = self.lengths.shape[0]
        order = _core.permutation(n, seed) if self.shuffle else np.arange(n, dtype=np.int64)
        if self.drop_last:
            order = order[:n - n % self.batch_size]
        m = order.shape[0]
        chunk = self.batch_size * self.bucket_size_multiplier
        chunk_of = np.arange(m, dtype=np.int64) // chunk
        order_lengths = self.lengths[order]
        # lexsort is stable: equal lengths keep the shuffled order.
        within = np.lexsort((order_lengths, chunk_of))
        order = order[within]
        if self.max_tokens is None:
            starts = np.arange(0, m, self.batch_size, dtype=np.int64)
        else:
            sorted_lengths = np.ascontiguousarray(order_lengths[within])
            starts = _core.token_batch_starts(sorted_lengths, chunk, self.batch_size,
                                              self.max_tokens)
        ends = np.append(starts[1:], m)[:starts.shape[0]].astype(np.int64)
        if self.shuffle and starts.shape[0] > 1:
            batch_order = _core.permutation(starts.shape[0], seed ^ _BATCH_ORDER_SALT)
            starts, ends = starts[batch_order], ends[batch_order]
        return order, np.stack([starts, ends], axis=1)

    def _rank_share(self, bounds: np.ndarray) -> np.ndarray:
        """This rank's batches of ``bounds``, padded or cut as DistributedSampler pads indices."""
        replicas = self.num_replicas
        count = bounds.shape[0]
        if replicas == 1 or count == 0:
            return bounds
        total = count - count % replicas if self.drop_last else -(-count // replicas) * replicas
        positions = np.arange(self.rank, total, replicas, dtype=np.int64) % count
        return bounds[positions]

    def _plan(self, drawn: int | None) -> tuple[np.ndarray, np.ndarray]:
        seed = self._epoch_seed(drawn) if drawn is not None else 0
        order, bounds = self._global_batches(seed)
        return order, self._rank_share(bounds)

    def _draw_plan(self) -> tuple[np.ndarray, np.ndarray]:
        """Draw this epoch's seed and plan it (or take the plan ``len()`` made for that seed)."""
        drawn = self._seed_source.draw() if self.shuffle else None
        key = self._settings_key(drawn)
        peeked, self._peeked = self._peeked, None
        if peeked is not None and peeked[0] == key:
            return peeked[1]
        return self._plan(drawn)

    def __iter__(self) -> Iterator[list[int]]:
        # A generator, so the seed is drawn at the first next(), as
        # BatchSampler's is (a set_epoch between iter() and next() counts).
        order, bounds = self._draw_plan()
        self._current = (bounds.shape[0],)
        try:
            for start, end in bounds.tolist():
                yield order[start:end].tolist()
        finally:
            self._current = None

    def __len__(self) -> int:
        return self._length()

    def _len_after(self, first: SeedSource, quiet: bool = False) -> int:
        """``len()`` once ``first`` has drawn (``draw_quiet`` with ``quiet``):
        a loader draws its epoch's base seed before its batch sampler's seed,
        so ``len(loader)`` asks this, to count the epoch the loader will give."""
        return self._length(first, quiet)

    def _length(self, first: SeedSource | None = None, quiet: bool = False) -> int:
        if self.max_tokens is None:
            n = self.lengths.shape[0]
            count = n // self.batch_size if self.drop_last else -(-n // self.batch_size)
        elif self._current is not None:
            return self._current[0]
        else:
            count = self._peek_global_count(first, quiet)
        replicas = self.num_replicas
        if replicas == 1 or count == 0:
            return count
        return count // replicas if self.drop_last else -(-count // replicas)

    def _peek_global_count(self, first: SeedSource | None, quiet: bool) -> int:
        """The next epoch's number of batches (all ranks), from the seed it will
        draw, seen on private copies of the streams: ``len()`` draws nothing,
        from torch's global generator least of all, so calling it (tqdm does)
        changes neither the batches nor any later draw."""
        drawn = self._seed_source.peek(first, quiet) if self.shuffle else None
        key = self._settings_key(drawn)
        if self._peeked is None or self._peeked[0] != key:
            order, bounds = self._global_batches(self._epoch_seed(drawn) if drawn is not None
                                                 else 0)
            self._peeked = (key, (order, self._rank_share(bounds)), bounds.shape[0])
        return self._peeked[2]

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(lengths=<{self.lengths.shape[0]} lengths>, "
                f"batch_size={self.batch_size}, drop_last={self.drop_last}, "
                f"shuffle={self.shuffle}, bucket_size_multiplier={self.bucket_size_multiplier}, "
                f"max_tokens={self.max_tokens}, num_replicas={self.num_replicas}, "
                f"rank={self.rank})")
