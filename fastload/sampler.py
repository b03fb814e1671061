"""Samplers: which dataset indices an epoch visits, and in what order.

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

Random streams differ from torch's (we do not reproduce torch's Mersenne
Twister); everything else (lengths, padding, batching, errors) matches.  With
no generator and torch imported, the seeds come from torch's default generator,
drawn as torch draws them (NOTE [ torch's global seed ] in rng.py).
"""

from __future__ import annotations

import ctypes
import itertools
import math
import numbers
import os
import reprlib
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence, Sized
from typing import Any, Generic, TypeVar

import numpy as np

from fastload import _core
from fastload.dataset import int64_indices
from fastload.rng import SeedSource

__all__ = [
    "BatchSampler",
    "BucketBatchSampler",
    "DistributedSampler",
    "RandomSampler",
    "Sampler",
    "SequentialSampler",
    "SubsetRandomSampler",
    "WeightedRandomSampler",
]

_T_co = TypeVar("_T_co", covariant=True)

# Indices become Python ints this many at a time: one .tolist() per chunk
# costs little, while a whole-epoch list of 10**8 ints would cost gigabytes.
_TOLIST_CHUNK = 1 << 16


def _permutation(source: SeedSource, n: int) -> np.ndarray:
    """A random order of ``range(n)``: torch's own ``randperm`` on its default
    generator when ``source`` follows it (as torch's samplers draw theirs,
    NOTE [ torch's global seed ] in rng.py), else the kernel's, from one seed."""
    order = source.run_on_torch_default(lambda torch, g: torch.randperm(n, generator=g))
    return _core.permutation(n, source.draw()) if order is None else order.numpy()


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
        seed = self._seed_source.draw()
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


# The numpy dtypes torch wraps as tensors (torch/csrc/utils/tensor_numpy.cpp); it refuses others.
_TORCH_NUMPY_DTYPES = tuple(np.dtype(name) for name in (
    "float64", "float32", "float16", "complex64", "complex128", "int64", "int32", "int16",
    "int8", "uint64", "uint32", "uint16", "uint8", "bool"))

_MAX_DIMS = 64  # torch's limit on a tensor's dimensions

# CPython's own test, which torch uses to read a shape: lists, tuples, strings, numpy
# arrays and classes with __getitem__ pass; dicts and torch tensors do not (a list of
# one-element tensors is a list of numbers to torch).  No Python-level test agrees
# with it on all of these.
# (A private prototype: setting argtypes on ctypes.pythonapi's would change it for everyone.)
_is_sequence = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.py_object)(
    ("PySequence_Check", ctypes.pythonapi))

# Numbers whose float() numpy's float64 conversion computes too, so a list of them
# converts in one call.  Exact types only: a subclass may define its own __float__,
# and numpy's timedelta64, an integer type to issubclass, has none.
_PLAIN_NUMBER_TYPES = frozenset({float, int, bool, np.bool_}) | frozenset(
    np.dtype(code).type for code in np.typecodes["AllInteger"] + np.typecodes["Float"])


def _float64_weights(value: Any) -> np.ndarray:
    """``value`` as a float64 array, taken and refused as ``torch.as_tensor(value,
    dtype=torch.double)`` takes and refuses it, by the same three paths.

    A float64 array or tensor is shared, not copied, so the caller's later edits
    count (torch's sampler sees them too); anything else is converted.
    """
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(value, torch.Tensor):
        return _tensor_weights(value)
    if isinstance(value, np.ndarray):
        return _numpy_weights(value)
    if isinstance(value, (str, bytes)):
        # torch refuses these whole, though it would read a bytes inside a list as its ints.
        raise TypeError(f"weights should be a sequence of real numbers, but got {reprlib.repr(value)}")
    converted = _nested_numbers(value, _sequence_shape(value), ())
    return np.asarray(converted, dtype=np.float64)


def _tensor_weights(tensor: Any) -> np.ndarray:
    # torch converts with the tensor's own .to(double): any dtype (complex keeps its
    # real part, with torch's warning), any device, requires_grad or not.  numpy()
    # needs it detached, on the CPU, dense, without a lazy negation; each of these
    # returns the tensor itself when there is nothing to do, so float64 stays shared.
    return tensor.detach().cpu().double().resolve_neg().to_dense().numpy()


def _numpy_weights(array: np.ndarray) -> np.ndarray:
    # torch wraps the array's memory as it is, so it refuses what a tensor cannot
    # describe, in this order; then converts as from a tensor (complex: real part).
    itemsize = array.dtype.itemsize
    if itemsize and any(stride % itemsize for stride in array.strides):
        raise ValueError("given numpy array strides not a multiple of the element byte size. "
                         "Copy the numpy array to reallocate the memory.")
    if any(stride < 0 for stride in array.strides):
        raise ValueError("At least one stride in the given numpy array is negative, and tensors "
                         "with negative strides are not currently supported. (You can probably "
                         "work around this by making a copy of your array with array.copy().)")
    if not array.dtype.isnative:
        raise ValueError("given numpy array has byte order different from the native byte "
                         "order. Conversion between byte orders is currently not supported.")
    if array.dtype not in _TORCH_NUMPY_DTYPES:
        raise TypeError(f"can't convert np.ndarray of type numpy.{array.dtype.type.__name__}. "
                        "The only supported types are: float64, float32, float16, complex64, "
                        "complex128, int64, int32, int16, int8, uint64, uint32, uint16, uint8, "
                        "and bool.")
    return np.asarray(array, dtype=np.float64)


def _sequence_shape(value: Any) -> list[int]:
    """The shape torch gives nested sequences: the lengths down their first elements."""
    shape: list[int] = []
    while _is_sequence(value):
        length = len(value)
        shape.append(length)
        if len(shape) > _MAX_DIMS:
            # A string's first element is a string again: torch's ValueError.
            raise ValueError(f"too many dimensions '{type(value).__name__}'")
        if length == 0:
            break
        try:
            value = value[0]
        except Exception as error:  # torch turns whatever indexing raised into this
            raise ValueError(f"could not determine the shape of object type "
                             f"'{type(value).__name__}'") from error
    return shape


def _nested_numbers(value: Any, shape: list[int], where: tuple[int, ...]) -> np.ndarray | float:
    """``value``, of torch's ``shape``, as floats: each entry at depth ``len(shape)``
    must be a number (a one-element tensor is one), each above it an iterable of
    ``shape[depth]`` entries; ``where`` is ``value``'s position, for errors."""
    depth = len(where)
    if depth == len(shape):
        return _real_number(value, where)
    items = value if isinstance(value, (list, tuple)) else list(value)
    if len(items) != shape[depth]:
        raise ValueError(f"expected sequence of length {shape[depth]} at dim {depth} "
                         f"(got {len(items)})")
    if depth == len(shape) - 1 and set(map(type, items)) <= _PLAIN_NUMBER_TYPES:
        # The common case, a long list of Python or numpy numbers: one numpy call,
        # not a Python step per entry.
        return np.array(items, dtype=np.float64)
    return np.array([_nested_numbers(item, shape, (*where, position))
                     for position, item in enumerate(items)], dtype=np.float64)


def _real_number(value: Any, where: tuple[int, ...]) -> float:
    # torch reads a number through __float__ or __index__ (PyFloat_AsDouble), so
    # Fractions, Decimals and one-element tensors pass, while a string is not parsed.
    kind = type(value)
    if hasattr(kind, "__float__") or hasattr(kind, "__index__"):
        return float(value)
    if not where:
        raise TypeError(f"weights should be a sequence of real numbers, but got {reprlib.repr(value)}")
    position = "".join(f"[{index}]" for index in where)
    raise TypeError(f"weights should be real numbers, but weights{position} is "
                    f"{reprlib.repr(value)} ({kind.__name__})")


class WeightedRandomSampler(_SeededSampler[int]):
    """``num_samples`` indices of ``range(len(weights))``, drawn proportionally to ``weights``.

    With replacement each draw is O(1) from an alias table, built on the
    first epoch and again whenever ``weights`` has changed since (reassigned
    or edited in place, which torch's sampler also sees).  ``weights`` may be
    whatever ``torch.as_tensor(weights, dtype=torch.double)`` takes (lists of
    one-element tensors, tensors that require grad, ...); what it refuses raises
    the same error type here.  Invalid weights raise on the first epoch, as
    torch.multinomial does then.
    """

    weights: np.ndarray
    num_samples: int
    replacement: bool

    def __init__(
        self,
        weights: Sequence[float],
        num_samples: int,
        replacement: bool = True,
        generator: Any = None,
    ) -> None:
        if not isinstance(num_samples, int) or isinstance(num_samples, bool) or num_samples <= 0:
            raise ValueError(
                f"num_samples should be a positive integer value, but got num_samples={num_samples}"
            )
        if not isinstance(replacement, bool):
            raise ValueError(
                f"replacement should be a boolean value, but got replacement={replacement}"
            )
        self.weights = weights
        self.num_samples = num_samples
        self.replacement = replacement
        self.generator = generator

    @property
    def weights(self) -> np.ndarray:
        return self._weights

    @weights.setter
    def weights(self, value: Sequence[float]) -> None:
        array = _float64_weights(value)
        if not array.flags.writeable:
            array = array.copy()  # the kernels write nothing, but take writable buffers
        if array.ndim != 1:
            raise ValueError(
                "weights should be a 1d sequence but given "
                f"weights have shape {tuple(array.shape)}"
            )
        self._weights = array
        self._alias: np.ndarray | None = None
        self._alias_weights: np.ndarray | None = None  # what the alias table was built from

    def __len__(self) -> int:
        return self.num_samples

    def _epoch_indices(self) -> np.ndarray:
        # Following torch's default generator, torch's own draw (NOTE [ torch's
        # global seed ] in rng.py): it raises torch's errors for bad weights.
        drawn = self._seed_source.run_on_torch_default(
            lambda torch, g: torch.multinomial(torch.from_numpy(self._weights), self.num_samples,
                                               self.replacement, generator=g))
        if drawn is not None:
            return drawn.numpy()
        if self.replacement:
            # Comparing costs a fraction of rebuilding (one pass, no division).
            if self._alias is None or not np.array_equal(self._weights, self._alias_weights):
                self._alias = _core.alias_table(self._weights)
                self._alias_weights = self._weights.copy()
            return _core.alias_draw(self._alias, self.num_samples, self._seed_source.draw())
        seed = self._seed_source.draw()
        zero = self._weights == 0
        drawable = zero.shape[0] - int(np.count_nonzero(zero))  # invalid weights raise below
        if 0 < drawable < self.num_samples <= zero.shape[0]:
            # Without replacement torch draws the zero-weight indices last, once
            # the others are used up (in a fixed order; here, ascending).
            head = _core.weighted_sample(self._weights, drawable, False, seed)
            return np.concatenate([head, np.flatnonzero(zero)[:self.num_samples - drawable]])
        return _core.weighted_sample(self._weights, self.num_samples, False, seed)


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


_NO_GROUP_MESSAGE = (
    "Default process group has not been initialized, please make sure to call "
    "init_process_group. (fastload also reads {name} from the environment, as "
    "torchrun sets it, or takes num_replicas and rank as arguments.)"
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
        raise ValueError(_NO_GROUP_MESSAGE.format(name=name))
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


# Its own module (one concept), re-exported here beside the other samplers; imported
# last because it builds on this module's Sampler and replica defaults.
from fastload.bucket_sampler import BucketBatchSampler  # noqa: E402
