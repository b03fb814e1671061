"""The Dataset family: torch.utils.data's datasets, with numpy arrays for tensors.

Semantics, error types and messages follow ``torch.utils.data.dataset`` (torch
2.x); messages add the offending values so a failure explains itself.  Where
fastload differs it is for memory or speed, never for results:

* ``ArrayDataset`` stands in for ``TensorDataset``.  It keeps its arrays as
  given (an ``np.memmap`` stays a memmap, nothing is copied), so the
  DataLoader can gather whole batches from ``arrays`` with one kernel call.
* ``random_split`` with a ``torch.Generator`` (or ``generator=None`` and torch
  imported: torch's default generator) is torch's own split: torch's
  ``randperm`` on that generator.  With an int seed or a numpy Generator the
  permutation comes from the ``_core`` kernel, seeded through ``SeedSource``;
  the same seed gives the same split everywhere (not the split torch would
  give for that seed).
"""

from __future__ import annotations

import bisect
import itertools
import math
import operator
import warnings
from collections.abc import Sequence
from typing import Any, Generic, Iterable, Iterator, TypeVar

import numpy as np

from fastload import _core
from fastload.rng import SeedSource

__all__ = [
    "Dataset",
    "IterableDataset",
    "ArrayDataset",
    "StackDataset",
    "ConcatDataset",
    "ChainDataset",
    "Subset",
    "random_split",
    "SizeMismatchError",
    "int64_indices",
    "is_iterable_dataset",
]

_T = TypeVar("_T")
_T_co = TypeVar("_T_co", covariant=True)


class SizeMismatchError(ValueError, AssertionError):
    """Arrays given to ``ArrayDataset`` differ in their first dimension.

    torch's ``TensorDataset`` raises ``AssertionError`` here; a bad argument is
    a ``ValueError`` by Python's conventions.  Being both, it is caught by code
    written for either.
    """


class _ScalarArrayError(ValueError, IndexError):
    # torch fails on a 0-d tensor with IndexError (from ``tensor.size(0)``);
    # being a ValueError too keeps ``except ValueError`` callers working.
    pass


class Dataset(Generic[_T_co]):
    """A map from keys (usually ``0 .. len - 1``) to samples.

    Subclasses implement ``__getitem__`` and, for samplers and the
    DataLoader's defaults, ``__len__``.  They may add
    ``__getitems__(indices) -> list`` to fetch a whole batch at once.
    """

    def __getitem__(self, index: Any) -> _T_co:
        raise NotImplementedError("Subclasses of Dataset should implement __getitem__.")

    # There is deliberately no __len__ and no __getitems__ here, as in torch:
    # a default __len__ would make every dataset look Sized, and a default
    # __getitems__ would make the loader think every dataset fetches batches.

    def __add__(self, other: Dataset[_T_co]) -> ConcatDataset[_T_co]:
        return ConcatDataset([self, other])


class IterableDataset(Dataset[_T_co], Iterable[_T_co]):
    """A stream of samples: subclasses implement ``__iter__``.

    With ``num_workers > 0`` every worker iterates its own copy; use
    ``get_worker_info()`` in ``__iter__`` (or ``worker_init_fn``) to give each
    worker its share of the stream.
    """

    # __iter__ stays abstract (from Iterable), so a subclass without one fails
    # at construction with TypeError, as torch's does.

    def __add__(self, other: Dataset[_T_co]) -> ChainDataset:  # type: ignore[override]
        return ChainDataset([self, other])


def is_iterable_dataset(dataset: Any) -> bool:
    """True for fastload's and torch's IterableDataset alike.

    Users mix the two libraries' datasets while migrating; torch's class is
    recognised by name so that torch need not be imported.
    """
    if isinstance(dataset, IterableDataset):
        return True
    return any(cls.__name__ == "IterableDataset" and cls.__module__.startswith("torch.utils.data")
               for cls in type(dataset).__mro__)


# --------------------------------------------------------------------------
# ArrayDataset


def _is_tensor(obj: Any) -> bool:
    return type(obj).__module__.startswith("torch") and hasattr(obj, "detach")


def _as_array(obj: Any) -> np.ndarray:
    """``obj`` as an ndarray, without copying where numpy can avoid it."""
    if isinstance(obj, np.ndarray):
        return obj  # memmaps and other subclasses are kept as they are
    if _is_tensor(obj):
        # np.asarray refuses tensors that require grad or live on a GPU.
        return obj.detach().cpu().numpy()
    return np.asarray(obj)


class ArrayDataset(Dataset[tuple]):
    """Rows of arrays that share their first dimension: ``TensorDataset`` for numpy.

    ``ds[i]`` is a tuple holding row ``i`` of each array: a view for arrays of
    two or more dimensions, a numpy scalar for 1-D arrays (it collates to the
    array's dtype, as torch's 0-d tensors do).

    Args:
        *arrays: numpy arrays or ``np.memmap``s, used as they are; anything
            else ``np.asarray`` accepts (lists, torch tensors) is converted once.

    Given torch tensors, ``ds[i]`` holds torch tensors (CPU, without autograd:
    views of the converted arrays), as torch's ``TensorDataset`` gives; the
    loader's batches are what its ``output=`` says either way.

    Spawn and forkserver workers map an ``np.memmap`` again from its file
    rather than receive its bytes (NOTE [ Pickled once, or per worker ] in
    ``_loading/wire/payload.py``); pickling it otherwise copies, as torch's does.
    """

    arrays: tuple[np.ndarray, ...]
    _from_tensors: tuple[bool, ...] | None = None  # also for copies made without __init__

    def __init__(self, *arrays: Any) -> None:
        if not arrays:
            raise ValueError("ArrayDataset needs at least one array")
        converted = tuple(_as_array(a) for a in arrays)
        for position, array in enumerate(converted):
            if array.ndim == 0:
                raise _ScalarArrayError(
                    f"arrays[{position}] is 0-d (shape ()); ArrayDataset indexes arrays "
                    f"along their first dimension")
        length = converted[0].shape[0]
        if any(array.shape[0] != length for array in converted):
            shapes = ", ".join(f"arrays[{i}] has shape {a.shape}" for i, a in enumerate(converted))
            raise SizeMismatchError(f"Size mismatch between arrays: {shapes}")
        self.arrays = converted
        self._length = int(length)
        # Which arrays were tensors: their rows are handed out as tensors.
        self._from_tensors = tuple(_is_tensor(a) for a in arrays) if any(map(_is_tensor, arrays)) \
            else None

    def __getitem__(self, index: Any) -> tuple:
        if self._from_tensors is None:
            return self.numpy_row(index)
        self._check_index(index)
        import torch  # a tensor was given, so torch is there (also in a spawned worker)

        # A tensor view, indexed as torch indexes (a 1-D array's row is a 0-d tensor).
        return tuple(torch.from_numpy(array)[index] if tensor else array[index]
                     for array, tensor in zip(self.arrays, self._from_tensors))

    def numpy_row(self, index: Any) -> tuple:
        """``ds[index]`` with numpy rows, whatever the arrays were given as."""
        self._check_index(index)
        return tuple(array[index] for array in self.arrays)

    def _check_index(self, index: Any) -> None:
        if isinstance(index, (int, np.integer)) and not -self._length <= index < self._length:
            # numpy's own message names the axis, not the dataset; say which is which.
            raise IndexError(f"index {index} is out of range for ArrayDataset of length {self._length}")

    def __len__(self) -> int:
        return self._length


# --------------------------------------------------------------------------
# Combinations of datasets


class StackDataset(Dataset[_T_co]):
    """Datasets side by side: sample ``i`` is the ``i``-th of each.

    ``StackDataset(a, b)[i] == (a[i], b[i])``;
    ``StackDataset(x=a, y=b)[i] == {"x": a[i], "y": b[i]}``.
    """

    datasets: tuple | dict

    def __init__(self, *args: Dataset[_T_co], **kwargs: Dataset[_T_co]) -> None:
        if args and kwargs:
            raise ValueError(
                "Supported either ``tuple``- (via ``args``) or ``dict``- (via ``kwargs``) like "
                f"input/output, but both types are given ({len(args)} args, kwargs {list(kwargs)})")
        if not args and not kwargs:
            raise ValueError("At least one dataset should be passed")
        parts = args if args else tuple(kwargs.values())
        lengths = [len(d) for d in parts]  # type: ignore[arg-type]
        if any(n != lengths[0] for n in lengths):
            names = range(len(args)) if args else list(kwargs)
            detail = ", ".join(f"{name!r}: {n}" for name, n in zip(names, lengths))
            raise ValueError(f"Size mismatch between datasets (lengths {{{detail}}})")
        self._length = lengths[0]
        self.datasets = args if args else kwargs

    def __getitem__(self, index: Any) -> Any:
        if isinstance(self.datasets, dict):
            return {key: dataset[index] for key, dataset in self.datasets.items()}
        return tuple(dataset[index] for dataset in self.datasets)

    def __getitems__(self, indices: list) -> list:
        # Each part is fetched as a batch when it can be, then the batches are
        # zipped into samples, so stacked ArrayDatasets stay batch-at-a-time.
        keyed = isinstance(self.datasets, dict)
        parts = self.datasets.items() if keyed else enumerate(self.datasets)
        columns = {}
        for key, dataset in parts:
            if callable(getattr(dataset, "__getitems__", None)):
                items = dataset.__getitems__(indices)
                if len(items) != len(indices):
                    raise ValueError("Nested dataset's output size mismatch."
                                     f" Expected {len(indices)}, got {len(items)}")
                columns[key] = items
            else:
                columns[key] = [dataset[i] for i in indices]
        if keyed:
            keys = list(columns)
            return [dict(zip(keys, row)) for row in zip(*columns.values())]
        return [tuple(row) for row in zip(*columns.values())]

    def __len__(self) -> int:
        return self._length


class ConcatDataset(Dataset[_T_co]):
    """Datasets end to end: indices run through the first, then the second, ...

    Args:
        datasets: the map-style datasets to concatenate (at least one).
    """

    datasets: list[Dataset[_T_co]]
    cumulative_sizes: list[int]

    @staticmethod
    def cumsum(sequence: Iterable[Any]) -> list[int]:
        """Running totals of the lengths of ``sequence``'s datasets."""
        return list(itertools.accumulate(len(d) for d in sequence))

    def __init__(self, datasets: Iterable[Dataset]) -> None:
        super().__init__()
        self.datasets = list(datasets)
        # torch raises AssertionError for both checks; kept so callers' except
        # clauses keep working.
        if not self.datasets:
            raise AssertionError("datasets should not be an empty iterable")
        for position, dataset in enumerate(self.datasets):
            if is_iterable_dataset(dataset):
                raise AssertionError(f"ConcatDataset does not support IterableDataset "
                                     f"(datasets[{position}] is a {type(dataset).__name__})")
        self.cumulative_sizes = self.cumsum(self.datasets)

    def __len__(self) -> int:
        return self.cumulative_sizes[-1]

    def __getitem__(self, idx: int) -> _T_co:
        length = self.cumulative_sizes[-1]
        if idx < 0:
            if -idx > length:
                raise ValueError("absolute value of index should not exceed dataset length "
                                 f"(index {idx}, length {length})")
            idx = length + idx
        elif idx >= length:
            raise IndexError(f"index {idx} is out of range for ConcatDataset of length {length}")
        # bisect_right skips empty datasets: their cumulative size equals the
        # previous one, so an index never lands in them.
        dataset_idx = bisect.bisect_right(self.cumulative_sizes, idx)
        sample_idx = idx - self.cumulative_sizes[dataset_idx - 1] if dataset_idx else idx
        return self.datasets[dataset_idx][sample_idx]

    @property
    def cummulative_sizes(self) -> list[int]:
        # The misspelt name torch still answers to, with its deprecation warning.
        warnings.warn("`cummulative_sizes` attribute is renamed to `cumulative_sizes`",
                      FutureWarning, stacklevel=2)
        return self.cumulative_sizes


class ChainDataset(IterableDataset):
    """IterableDatasets one after another, chained lazily as they are iterated.

    Args:
        datasets: the IterableDatasets; checked as they are reached, as in torch.
    """

    def __init__(self, datasets: Iterable[Dataset]) -> None:
        super().__init__()
        self.datasets = datasets

    def _checked(self) -> Iterator[Any]:
        for position, dataset in enumerate(self.datasets):
            if not is_iterable_dataset(dataset):
                raise AssertionError(f"ChainDataset only supports IterableDataset "
                                     f"(datasets[{position}] is a {type(dataset).__name__})")
            yield dataset

    def __iter__(self) -> Iterator[Any]:
        for dataset in self._checked():
            yield from dataset

    def __len__(self) -> int:
        return sum(len(dataset) for dataset in self._checked())


def int64_indices(indices: Any) -> np.ndarray | None:
    """``indices`` as a 1-D int64 array when they are all integers that fit in
    int64 (a range without building it), else None: the caller then keeps them
    as given (strings, tuples, bools, ... are legal indices and targets)."""
    if isinstance(indices, range):
        return np.arange(indices.start, indices.stop, indices.step, dtype=np.int64)
    try:
        array = np.asarray(indices)
    except (TypeError, ValueError, OverflowError):
        return None
    if array.size == 0:
        return np.empty(0, dtype=np.int64)
    if array.ndim != 1 or array.dtype.kind not in "iu" or (
            array.dtype.kind == "u" and array.max() > np.iinfo(np.int64).max):
        return None
    return array.astype(np.int64, copy=False)


class Subset(Dataset[_T_co]):
    """The samples of ``dataset`` at ``indices``, in that order.

    ``indices`` is kept as given (a list stays a list, as in torch); keys
    reach ``dataset`` as Python ints even from a numpy array, since user
    datasets may check ``isinstance(i, int)``.  An int64 array is the compact
    choice for a large subset: a forked worker that reads ints from a list
    updates their reference counts, and so copies the pages they sit on,
    where an array stays one shared buffer.  A subclass that overrides
    ``__getitem__`` must override ``__getitems__`` too, as in torch, or the
    DataLoader's batch path would bypass its ``__getitem__``.
    """

    dataset: Dataset[_T_co]
    indices: Sequence[int]

    def __init__(self, dataset: Dataset[_T_co], indices: Sequence[int]) -> None:
        self.dataset = dataset
        self.indices = indices
        if (type(self).__getitem__ is not Subset.__getitem__
                and type(self).__getitems__ is Subset.__getitems__):
            raise NotImplementedError(
                f"{type(self).__name__} overrides __getitem__ but not __getitems__. "
                "When subclassing Subset and overriding __getitem__, you must also override "
                "__getitems__ to ensure DataLoader works correctly with your custom logic. "
                "A simple implementation:\n\n"
                "def __getitems__(self, indices):\n"
                "    return [self.__getitem__(idx) for idx in indices]")

    def _key(self, position: Any) -> Any:
        try:
            key = self.indices[position]
        except IndexError:
            raise IndexError(f"Subset index {position} is out of range "
                             f"(the Subset has {len(self.indices)} samples)") from None
        # np.int64 -> int, and an array (from a slice) -> a list of ints.
        return key.tolist() if isinstance(key, (np.ndarray, np.generic)) else key

    def __getitem__(self, idx: Any) -> Any:
        if isinstance(idx, list):
            return self.dataset[[self._key(i) for i in idx]]
        return self.dataset[self._key(idx)]

    def __getitems__(self, indices: list[int]) -> list:
        if isinstance(self.indices, np.ndarray):
            positions = np.asarray(indices)
            if positions.dtype.kind not in "iu":
                if positions.size and positions.dtype.kind != "b":
                    raise TypeError(f"Subset indices must be integers, got {indices!r}")
                positions = positions.astype(np.int64)  # [] or bools, which torch treats as 0/1
            keys = self.indices[positions].tolist()
        else:
            try:
                keys = [self.indices[i] for i in indices]
            except IndexError:
                keys = [self._key(i) for i in indices]  # raises, naming the position
        if callable(getattr(self.dataset, "__getitems__", None)):
            return self.dataset.__getitems__(keys)
        return [self.dataset[key] for key in keys]

    def __len__(self) -> int:
        return len(self.indices)


# --------------------------------------------------------------------------
# random_split


def _split_lengths(length: int, lengths: Sequence[int | float]) -> list[int]:
    """Integer split lengths from ``lengths`` (counts, or fractions summing to 1)."""
    total = sum(lengths)
    if math.isclose(total, 1) and total <= 1:
        # Fractions.  (A single [1] lands here too and means "everything", as in torch.)
        counts = []
        for i, fraction in enumerate(lengths):
            if fraction < 0 or fraction > 1:
                raise ValueError(f"Fraction at index {i} is not between 0 and 1 (got {fraction})")
            counts.append(math.floor(length * fraction))
        # floor() leaves a remainder smaller than the number of splits; hand it
        # out one by one from the first split on.
        for i in range(length - sum(counts)):
            counts[i % len(counts)] += 1
        for i, count in enumerate(counts):
            if count == 0:
                warnings.warn(f"Length of split at index {i} is 0. "
                              f"This might result in an empty dataset.", stacklevel=3)
        return counts

    # torch's order: the sum first, then (via randperm) the type of the counts.
    if total != length:
        raise ValueError("Sum of input lengths does not equal the length of the input dataset! "
                         f"(lengths {list(lengths)} sum to {total}, dataset length is {length})")
    counts = []
    for i, n in enumerate(lengths):
        try:
            count = operator.index(n)  # an int, a numpy integer, a 0-d integer tensor
        except TypeError:
            raise TypeError(f"lengths must be integers, or fractions summing to 1; "
                            f"lengths[{i}] is {n!r}") from None
        if count < 0:
            # torch slices with a negative length and returns overlapping splits.
            raise ValueError(f"Length of split at index {i} is negative ({count})")
        counts.append(count)
    return counts


def random_split(dataset: Dataset[_T], lengths: Sequence[int | float],
                 generator: Any = None) -> list[Subset[_T]]:
    """Split ``dataset`` at random into non-overlapping Subsets of ``lengths``.

    Args:
        dataset: the map-style dataset to split.
        lengths: split sizes summing to ``len(dataset)``, or fractions summing
            to 1 (each split gets ``floor(fraction * len)``, and the remainder
            is given out one at a time starting with the first split).
        generator: ``None`` (torch's default generator if torch is imported,
            else fresh entropy), an int seed, a ``numpy.random.Generator`` or a
            ``torch.Generator`` (torch's split for it: its ``randperm`` on it).
    """
    counts = _split_lengths(len(dataset), lengths)  # type: ignore[arg-type]
    source = SeedSource(generator)
    # With a torch.Generator, or None and torch imported, torch's own randperm on
    # that generator (NOTE [ torch's global seed ] in rng.py): the split torch makes.
    order = source.run_on_torch(lambda torch, g: torch.randperm(sum(counts), generator=g))
    order = (_core.permutation(sum(counts), source.draw()) if order is None else order).tolist()
    bounds = list(itertools.accumulate(counts))
    # Lists, as torch gives: callers join, compare and save them as lists.
    return [Subset(dataset, order[end - n:end]) for end, n in zip(bounds, counts)]
