"""The compact ``(path, target)`` table behind a folder dataset's ``samples``.

torchvision keeps ``samples`` as a list of ``(str, int)`` tuples.  With a
million images that is three million Python objects, and every forked worker
that merely reads them writes their reference counts, so copy-on-write turns
the shared pages private and each worker's memory grows to a full copy.

``SampleTable`` holds the same information in three numpy arrays (the UTF-8
bytes of all paths back to back, their offsets, and the targets), which a read
never writes.  It still reads as torchvision's list: ``len``, indexing
(negative too), slicing, iteration and ``==`` against a list of tuples.
"""

from __future__ import annotations

import operator
import os
from array import array
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, overload

import numpy as np

__all__ = ["SampleTable", "TargetList"]


class SampleTable(Sequence):
    """An immutable sequence of ``(path, target)`` tuples stored as numpy arrays.

    Paths are kept as bytes (``os.fsencode``), so file names that are not valid
    UTF-8 survive the round trip exactly as ``os.walk`` produced them.  A common
    leading directory (the dataset root) is stored once rather than per path.
    """

    __slots__ = ("_prefix", "_path_bytes", "_offsets", "_targets")

    def __init__(self, prefix: str, path_bytes: np.ndarray, offsets: np.ndarray,
                 targets: np.ndarray) -> None:
        if offsets.ndim != 1 or targets.ndim != 1 or len(offsets) != len(targets) + 1:
            raise ValueError(f"SampleTable needs len(offsets) == len(targets) + 1, got "
                             f"{len(offsets)} offsets and {len(targets)} targets")
        self._prefix = prefix
        self._path_bytes = path_bytes
        self._offsets = offsets
        self._targets = targets

    @classmethod
    def from_pairs(cls, pairs: Iterable[tuple[Any, int]], prefix: str = "") -> "SampleTable":
        """Build a table from ``(path, target)`` pairs, consuming them one at a time.

        ``prefix`` is a leading directory most paths share, stored once.  A path
        that does not start with it makes the table store full paths instead,
        so any iterable of pairs is accepted.
        """
        prefix_bytes = os.fsencode(prefix)
        path_bytes = bytearray()
        ends = array("q")
        targets = array("q")
        for row, pair in enumerate(pairs):
            try:
                path, target = pair
            except (TypeError, ValueError):
                raise ValueError(f"sample {row} must be a (path, target) pair, got {pair!r}") from None
            encoded = os.fsencode(path)
            if prefix_bytes:
                if encoded.startswith(prefix_bytes):
                    encoded = encoded[len(prefix_bytes):]
                else:
                    path_bytes = _prepend_to_each(prefix_bytes, path_bytes, ends)
                    prefix_bytes = b""
            path_bytes += encoded
            ends.append(len(path_bytes))
            try:
                targets.append(operator.index(target))
            except TypeError:
                raise TypeError(f"sample {row} ({path!r}) has a target that is not an integer: "
                                f"{target!r}") from None
        offsets = np.zeros(len(ends) + 1, dtype=np.int64)
        offsets[1:] = np.frombuffer(ends, dtype=np.int64)
        return cls(os.fsdecode(prefix_bytes), np.frombuffer(path_bytes, dtype=np.uint8),
                   offsets, np.frombuffer(targets, dtype=np.int64).copy())

    # -- the list interface -------------------------------------------------

    def __len__(self) -> int:
        return len(self._targets)

    def path(self, index: int) -> str:
        """The path of sample ``index`` (negative counts from the end)."""
        row = self._row(index)
        start, stop = self._offsets[row], self._offsets[row + 1]
        return self._prefix + os.fsdecode(self._path_bytes[start:stop].tobytes())

    def target(self, index: int) -> int:
        """The target of sample ``index`` as a Python int."""
        return int(self._targets[self._row(index)])

    @overload
    def __getitem__(self, index: int) -> tuple[str, int]: ...
    @overload
    def __getitem__(self, index: slice) -> list[tuple[str, int]]: ...

    def __getitem__(self, index):
        if isinstance(index, slice):
            # A slice of a list is a list; so is ours (a copy, as list slicing is).
            return [self[row] for row in range(*index.indices(len(self)))]
        row = self._row(index)
        return self.path(row), int(self._targets[row])

    def __iter__(self) -> Iterator[tuple[str, int]]:
        for row in range(len(self)):
            yield self.path(row), int(self._targets[row])

    def __eq__(self, other: object) -> bool:
        if isinstance(other, SampleTable):
            return len(self) == len(other) and all(a == b for a, b in zip(self, other))
        if isinstance(other, Sequence) and not isinstance(other, (str, bytes)):
            return len(self) == len(other) and all(a == tuple(b) for a, b in zip(self, other))
        return NotImplemented

    __hash__ = None  # mutable-looking sequence semantics, like list

    def __repr__(self) -> str:
        shown = ", ".join(repr(pair) for pair in self[:3])
        more = ", ..." if len(self) > 3 else ""
        return f"SampleTable([{shown}{more}], len={len(self)})"

    def _row(self, index: Any) -> int:
        try:
            row = operator.index(index)
        except TypeError:
            raise TypeError(f"sample indices must be integers or slices, not "
                            f"{type(index).__name__}") from None
        count = len(self._targets)
        if row < 0:
            row += count
        if not 0 <= row < count:
            raise IndexError(f"sample index {index} is out of range for {count} samples")
        return row

    # -- numpy access -------------------------------------------------------

    @property
    def targets_array(self) -> np.ndarray:
        """The targets as a read-only int64 array (no copy)."""
        view = self._targets.view()
        view.flags.writeable = False
        return view

    @property
    def nbytes(self) -> int:
        """Bytes of numpy storage the table occupies."""
        return self._path_bytes.nbytes + self._offsets.nbytes + self._targets.nbytes


class TargetList(Sequence):
    """A read-only list-like view of int64 targets that yields Python ints.

    ``np.asarray(targets)`` is a zero-copy view of the underlying array.
    """

    __slots__ = ("_targets",)

    def __init__(self, targets: np.ndarray) -> None:
        self._targets = targets

    def __len__(self) -> int:
        return len(self._targets)

    def __getitem__(self, index):
        if isinstance(index, slice):
            return [int(t) for t in self._targets[index]]
        try:
            return int(self._targets[operator.index(index)])
        except TypeError:
            raise TypeError(f"target indices must be integers or slices, not "
                            f"{type(index).__name__}") from None
        except IndexError:
            raise IndexError(f"target index {index} is out of range for "
                             f"{len(self._targets)} targets") from None

    def __iter__(self) -> Iterator[int]:
        return iter(self._targets.tolist())

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Sequence) and not isinstance(other, (str, bytes)):
            return len(self) == len(other) and all(a == b for a, b in zip(self, other))
        return NotImplemented

    __hash__ = None

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        if copy or (dtype is not None and np.dtype(dtype) != self._targets.dtype):
            return np.array(self._targets, dtype=dtype)
        view = self._targets.view()
        view.flags.writeable = False  # a view must not let callers rewrite the labels
        return view

    def __repr__(self) -> str:
        return repr(self._targets.tolist()) if len(self) <= 20 else \
            f"TargetList({self._targets[:10].tolist()}..., len={len(self)})"


def _prepend_to_each(prefix: bytes, path_bytes: bytearray, ends: array) -> bytearray:
    """Rewrite packed paths with ``prefix`` put back in front of each; updates ``ends`` in place."""
    rebuilt = bytearray()
    start = 0
    for row, end in enumerate(ends):
        rebuilt += prefix
        rebuilt += path_bytes[start:end]
        start = end
        ends[row] = len(rebuilt)
    return rebuilt
