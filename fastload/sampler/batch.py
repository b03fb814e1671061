"""``BatchSampler``: an index sampler's epoch cut into batches (by a kernel when
the sampler gives its whole epoch as an array)."""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import numpy as np

from fastload.sampler.base import Sampler

__all__ = ["BatchSampler"]

def _epoch_source(sampler: Any) -> Callable[[], np.ndarray] | None:
    """The sampler's whole-epoch kernel, or None when it must be iterated.

    A subclass that overrides ``__iter__`` without ``_epoch_indices`` has
    its own order; then the kernel would be wrong, so it is not used.
    """
    if type(sampler) is range:
        r = sampler
        return lambda: np.arange(r.start, r.stop, r.step, dtype=np.int64)
    epoch = getattr(sampler, "_epoch_indices", None)
    if epoch is None:
        return None
    cls = type(sampler)
    for owner in cls.__mro__:
        if "_epoch_indices" in vars(owner):
            return epoch if cls.__iter__ is owner.__iter__ else None
    return None


class BatchSampler(Sampler[list[int]]):
    """Groups the indices of ``sampler`` into lists of ``batch_size``.

    ``drop_last`` drops a final short batch.  When ``sampler`` is one of ours
    (or a ``range``), the epoch comes from one kernel call and batches are
    slices of it, instead of one Python-level step per index.
    """

    def __init__(
        self,
        sampler: Sampler[int] | Iterable[int],
        batch_size: int,
        drop_last: bool,
    ) -> None:
        # No isinstance(sampler, Iterable) check: an object may be iterable
        # through __getitem__ alone, which that check would miss (as torch).
        if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size <= 0:
            raise ValueError(
                f"batch_size should be a positive integer value, but got batch_size={batch_size}"
            )
        if not isinstance(drop_last, bool):
            raise ValueError(
                f"drop_last should be a boolean value, but got drop_last={drop_last}"
            )
        self.sampler = sampler
        self.batch_size = batch_size
        self.drop_last = drop_last

    def _slices(self, epoch: np.ndarray) -> Iterator[np.ndarray]:
        size = self.batch_size
        stop = epoch.shape[0]
        if self.drop_last:
            stop -= stop % size
        for start in range(0, stop, size):
            yield epoch[start:start + size]

    def _kernel_epoch(self) -> np.ndarray | None:
        """This epoch of the sampler, from its kernel (drawing its seed); None: iterate it."""
        source = _epoch_source(getattr(self, "sampler", None))
        epoch = source() if source is not None else None
        return None if epoch is None else np.ascontiguousarray(epoch, dtype=np.int64)

    def __iter__(self) -> Iterator[list[int]]:
        epoch = self._kernel_epoch()
        if epoch is not None:
            for batch in self._slices(epoch):
                yield batch.tolist()
            return
        sampler_iter = iter(self.sampler)
        if self.drop_last:
            # zip over batch_size references to one iterator stops at the
            # first incomplete group: exactly the drop_last batches.
            for batch in zip(*([sampler_iter] * self.batch_size)):
                yield [*batch]
        else:
            batch = [*itertools.islice(sampler_iter, self.batch_size)]
            while batch:
                yield batch
                batch = [*itertools.islice(sampler_iter, self.batch_size)]

    def __len__(self) -> int:
        # Only for samplers with a length; see Sampler's docstring.
        if self.drop_last:
            return len(self.sampler) // self.batch_size  # type: ignore[arg-type]
        return (len(self.sampler) + self.batch_size - 1) // self.batch_size  # type: ignore[arg-type]
