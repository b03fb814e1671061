"""``WeightedRandomSampler``, and how its weights are read as torch reads them
(a sequence of numbers, a numpy array or a tensor)."""

from __future__ import annotations

import ctypes
import numbers
import reprlib
import sys
from collections.abc import Sequence
from typing import Any

import numpy as np

from fastload import _core
from fastload.sampler.base import _SeededSampler

__all__ = ["WeightedRandomSampler"]

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
        # On the caller's torch.Generator, or following torch's default one,
        # torch's own draw (NOTE [ torch's global seed ] in rng.py): torch's
        # order, and torch's errors for bad weights.
        drawn = self._seed_source.run_on_torch(
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
