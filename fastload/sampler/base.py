"""The sampler protocol and the plain samplers: sequential, random, random over a subset.

Part of the sampler family (``fastload.sampler``): which dataset indices an
epoch visits, and in what order.

torch.utils.data's sampler family with the same arguments, validation and
iteration results, as thin Python over ``fastload._core``: every random index
stream is one kernel call per epoch, never a Python loop over indices.

The loader's fast path rests on two small protocols, kept private because
user samplers need not implement them:

* ``_epoch_indices()``: the whole epoch as a C-contiguous int64 array.  It
  draws exactly one seed from ``_seed_source``, as one ``__iter__`` does, and
  ``__iter__`` yields exactly these indices as Python ints.  It returns None
  instead (drawing nothing) when this epoch's indices are not integers (a
  SubsetRandomSampler of strings): then it is iterated.
* ``_seed_source``: the ``SeedSource`` behind a random sampler, so the loader
  can snapshot it before an epoch and replay that epoch on resume.

Given a ``torch.Generator``, a sampler draws its order with torch's own ops on
it, as torch's sampler does, so the order is torch's.  Given an int or a numpy
Generator, the kernels draw it (we do not reproduce torch's Mersenne Twister);
everything else (lengths, padding, batching, errors) matches.  With no
generator and torch imported, the seeds come from torch's default generator,
drawn as torch draws them (NOTE [ torch's global seed ] in rng.py).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence, Sized
from typing import Any, Generic, TypeVar

import numpy as np

from fastload import _core
from fastload.dataset import int64_indices
from fastload.rng import SeedSource, _is_torch_generator

__all__ = ["Sampler", "SequentialSampler", "RandomSampler", "SubsetRandomSampler"]

_T_co = TypeVar("_T_co", covariant=True)

# Indices become Python ints this many at a time: one .tolist() per chunk
# costs little, while a whole-epoch list of 10**8 ints would cost gigabytes.
_TOLIST_CHUNK = 1 << 16


def _permutation(source: SeedSource, n: int) -> np.ndarray:
    """A random order of ``range(n)``: torch's own ``randperm`` on the caller's
    torch.Generator, or on torch's default generator when ``source`` follows it
    (as torch's samplers draw theirs, NOTE [ torch's global seed ] in rng.py),
    else the kernel's, from one seed."""
    order = source.run_on_torch(lambda torch, g: torch.randperm(n, generator=g))
    return _core.permutation(n, source.draw()) if order is None else order.numpy()


def _torch_random_epoch(torch: Any, generator: Any, n: int, count: int,
                        replacement: bool) -> np.ndarray:
    """torch's RandomSampler epoch on ``generator``, made by the same calls in
    the same order (so the generator ends where torch's leaves it)."""
    if replacement:
        parts = [torch.randint(high=n, size=(32,), dtype=torch.int64, generator=generator)
                 for _ in range(count // 32)]
        parts.append(torch.randint(high=n, size=(count % 32,), dtype=torch.int64,
                                   generator=generator))
    else:
        parts = [torch.randperm(n, generator=generator) for _ in range(count // n)]
        parts.append(torch.randperm(n, generator=generator)[:count % n])
    return torch.cat(parts).numpy()


def _iter_ints(indices: np.ndarray) -> Iterator[int]:
    for start in range(0, indices.shape[0], _TOLIST_CHUNK):
        yield from indices[start:start + _TOLIST_CHUNK].tolist()


class Sampler(Generic[_T_co]):
    """Base class of all samplers: subclasses provide ``__iter__`` and usually ``__len__``.

    No default ``__len__``, on purpose (as torch): ``list(sampler)`` and the
    loader fall back to plain iteration when it is missing, which a default
    that raised would prevent.
    """

    def __iter__(self) -> Iterator[_T_co]:
        raise NotImplementedError


class _SeededSampler(Sampler[_T_co]):
    """A sampler with a random stream: ``generator`` feeds ``_seed_source``."""

    _seed_source: SeedSource

    @property
    def generator(self) -> Any:
        # The caller's generator (None if none), as torch's samplers keep it;
        # also when the stream is a DataLoader's (shuffle=True), passed in to
        # be shared.  Libraries seed or snapshot it (accelerate's
        # prepare_data_loader: ``sampler.generator.manual_seed``).
        return self._seed_source.given

    @generator.setter
    def generator(self, value: Any) -> None:
        # Reassigning the generator (as torch allows) starts the stream from it.
        self._seed_source = SeedSource(value)

    def _epoch_indices(self) -> np.ndarray:
        raise NotImplementedError

    def __iter__(self) -> Iterator[int]:
        # A generator function, so the seed is drawn at the first next(), as
        # torch's samplers draw theirs.
        yield from _iter_ints(self._epoch_indices())


class SequentialSampler(Sampler[int]):
    """``0, 1, ..., len(data_source) - 1``, every epoch."""

    data_source: Sized

    def __init__(self, data_source: Sized) -> None:
        self.data_source = data_source

    def __iter__(self) -> Iterator[int]:
        return iter(range(len(self.data_source)))

    def __len__(self) -> int:
        return len(self.data_source)

    def _epoch_indices(self) -> np.ndarray:
        return np.arange(len(self.data_source), dtype=np.int64)


class RandomSampler(_SeededSampler[int]):
    """Random order: a permutation, or ``num_samples`` draws with replacement.

    Without replacement and ``num_samples > len(data_source)``, the epoch is
    whole permutations followed by the head of one more, as torch.
    """

    data_source: Sized
    replacement: bool

    def __init__(
        self,
        data_source: Sized,
        replacement: bool = False,
        num_samples: int | None = None,
        generator: Any = None,
    ) -> None:
        self.data_source = data_source
        self.replacement = replacement
        self._num_samples = num_samples
        self.generator = generator
        if not isinstance(self.replacement, bool):
            raise TypeError(
                f"replacement should be a boolean value, but got replacement={self.replacement}"
            )
        # As torch: a bool passes this check (True means one sample).
        if not isinstance(self.num_samples, int) or self.num_samples <= 0:
            raise ValueError(
                f"num_samples should be a positive integer value, but got num_samples={self.num_samples}"
            )

    @property
    def num_samples(self) -> int:
        # Read the length each time: the dataset may change size between epochs.
        if self._num_samples is None:
            return len(self.data_source)
        return self._num_samples

    def __len__(self) -> int:
        return self.num_samples

    def _epoch_indices(self) -> np.ndarray:
        n = len(self.data_source)
        count = int(self.num_samples)
        if n == 0:
            how = "with" if self.replacement else "without"
            error = RuntimeError if self.replacement else ValueError
            raise error(f"cannot draw num_samples={count} indices {how} replacement "
                        f"from an empty data_source")
        source = self._seed_source
        if _is_torch_generator(source.stream):
            # The caller's torch.Generator: torch's own order for it.
            return source.run_on_torch(lambda torch, generator: _torch_random_epoch(
                torch, generator, n, count, self.replacement))
        seed = source.draw()
        if self.replacement:
            return _core.randint(n, count, seed)
        return _core.permutation_stream(n, count, seed)


class SubsetRandomSampler(_SeededSampler[int]):
    """The given ``indices`` in random order, without replacement.

    ``indices`` is read at every epoch, so changing it in place between
    epochs takes effect, as in torch.  Integer indices are permuted by the
    kernel; any others (strings, tuples, ...) are yielded as they are, in
    the order of a kernel permutation of their positions.
    """

    indices: Sequence[int]

    def __init__(self, indices: Sequence[int], generator: Any = None) -> None:
        self.indices = indices
        self.generator = generator

    def __len__(self) -> int:
        return len(self.indices)

    def _epoch_indices(self) -> np.ndarray | None:
        indices = int64_indices(self.indices)
        if indices is None:
            return None  # not integers: iterate (see the module notes)
        return indices[_permutation(self._seed_source, indices.shape[0])]

    def __iter__(self) -> Iterator[Any]:
        epoch = self._epoch_indices()
        if epoch is not None:
            yield from _iter_ints(epoch)
            return
        for position in _permutation(self._seed_source, len(self.indices)).tolist():
            yield self.indices[position]
