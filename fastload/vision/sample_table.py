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
import sys
from array import array
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, overload

import numpy as np

__all__ = ["SampleTable", "SampleTableBuilder", "TargetList"]

_FS_ENCODING = sys.getfilesystemencoding()
_FS_ERRORS = sys.getfilesystemencodeerrors()
# Whether an ASCII str encodes to its own code points (true of UTF-8 and every
# other ASCII-compatible file system encoding); lets the builder skip per-name encoding.
_ASCII_FS = "".join(map(chr, range(128))).encode(_FS_ENCODING, _FS_ERRORS) == bytes(range(128))


# list's methods that change it in place.
_LIST_MUTATORS = frozenset({"append", "extend", "insert", "pop", "remove", "sort", "reverse",
                            "clear"})


class _ReadOnlyRows:
    """Tells code written for torchvision's lists, which it changes in place
    (``targets[i] = t``, ``random.shuffle(samples)``), what to do instead."""

    __slots__ = ()
    _instead = ""

    def _refusal(self, what: str) -> str:
        return f"{type(self).__name__} cannot be changed in place ({what}): {self._instead}"

    def __setitem__(self, index: Any, value: Any) -> None:
        raise TypeError(self._refusal("item assignment"))

    def __delitem__(self, index: Any) -> None:
        raise TypeError(self._refusal("item deletion"))

    # Concatenated and repeated as lists are, into a new list: merging two
    # folders' samples is ``a.samples + b.samples`` in torchvision code.
    def __add__(self, other: Any) -> list:
        if isinstance(other, (list, _ReadOnlyRows)):
            return [*self, *other]
        return NotImplemented

    def __radd__(self, other: Any) -> list:
        if isinstance(other, list):
            return [*other, *self]
        return NotImplemented

    def __mul__(self, times: Any) -> list:
        try:
            return list(self) * operator.index(times)  # an int, a numpy integer
        except TypeError:
            return NotImplemented

    __rmul__ = __mul__

    def __getattr__(self, name: str) -> Any:
        if name in _LIST_MUTATORS:
            raise AttributeError(self._refusal(f".{name}()"))
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")


class SampleTable(_ReadOnlyRows, Sequence):
    """An immutable sequence of ``(path, target)`` tuples stored as numpy arrays.

    Paths are kept as bytes (``os.fsencode``), so file names that are not valid
    UTF-8 survive the round trip exactly as ``os.walk`` produced them.  A common
    leading directory (the dataset root) is stored once rather than per path.
    """

    __slots__ = ("_blob", "_count", "_ends", "_labels", "_offsets", "_prefix", "_targets")
    _instead = ("a folder dataset keeps its samples in a compact table that forked workers "
                "share without copying; assign a new list instead, e.g. dataset.samples = "
                "[(path, target), ...] (targets and imgs follow it)")

    def __init__(self, prefix: str, path_bytes: np.ndarray | bytes, offsets: np.ndarray,
                 targets: np.ndarray) -> None:
        offsets = np.ascontiguousarray(offsets, dtype=np.int64)
        targets = np.ascontiguousarray(targets, dtype=np.int64)
        if offsets.ndim != 1 or targets.ndim != 1 or len(offsets) != len(targets) + 1:
            raise ValueError(f"SampleTable needs len(offsets) == len(targets) + 1, got "
                             f"{len(offsets)} offsets and {len(targets)} targets")
        blob = _as_bytes(path_bytes)
        self._prefix = prefix
        self._blob = blob  # sliced per item: one bytes slice, no numpy scalar
        self._offsets = offsets
        self._targets = targets
        # Indexing a memoryview of an int64 array gives a Python int directly;
        # reading through it writes nothing, so forked workers share every page.
        self._ends = memoryview(offsets)
        self._labels = memoryview(targets)
        self._count = len(targets)

    def __reduce__(self):
        return type(self), (self._prefix, self._blob, self._offsets, self._targets)

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
        return cls(os.fsdecode(prefix_bytes), bytes(path_bytes),
                   offsets, np.frombuffer(targets, dtype=np.int64).copy())

    # -- the list interface -------------------------------------------------

    def __len__(self) -> int:
        return self._count

    def item(self, index: int) -> tuple[str, int]:
        """``(path, target)`` of sample ``index`` (negative counts from the end); the fast path."""
        count = self._count
        if type(index) is not int:
            index = self._row(index)
        elif index < 0:
            index += count
            if index < 0:
                raise IndexError(f"sample index {index - count} is out of range for {count} samples")
        elif index >= count:
            raise IndexError(f"sample index {index} is out of range for {count} samples")
        ends = self._ends
        return (self._prefix + self._blob[ends[index]:ends[index + 1]].decode(_FS_ENCODING, _FS_ERRORS),
                self._labels[index])

    def path(self, index: int) -> str:
        """The path of sample ``index`` (negative counts from the end)."""
        return self.item(index)[0]

    def target(self, index: int) -> int:
        """The target of sample ``index`` as a Python int."""
        return self._labels[self._row(index)]

    @overload
    def __getitem__(self, index: int) -> tuple[str, int]: ...
    @overload
    def __getitem__(self, index: slice) -> list[tuple[str, int]]: ...

    def __getitem__(self, index):
        if isinstance(index, slice):
            # A slice of a list is a list; so is ours (a copy, as list slicing is).
            return [self.item(row) for row in range(*index.indices(self._count))]
        return self.item(index)

    def __iter__(self) -> Iterator[tuple[str, int]]:
        prefix, blob, ends, labels = self._prefix, self._blob, self._ends, self._labels
        for row in range(self._count):
            yield (prefix + blob[ends[row]:ends[row + 1]].decode(_FS_ENCODING, _FS_ERRORS),
                   labels[row])

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
        count = self._count
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
        """Bytes the table's storage occupies (paths, offsets, targets)."""
        return len(self._blob) + self._offsets.nbytes + self._targets.nbytes


class TargetList(_ReadOnlyRows, Sequence):
    """A read-only list-like view of int64 targets that yields Python ints.

    ``np.asarray(targets)`` is a zero-copy view of the underlying array.
    """

    __slots__ = ("_targets",)
    _instead = ("assign a new list instead, e.g. dataset.targets = [...]; to change the "
                "targets __getitem__ returns, assign new samples: dataset.samples = "
                "[(path, target), ...] (as in torchvision, __getitem__ reads samples)")

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


class SampleTableBuilder:
    """Builds a ``SampleTable`` a directory at a time, without per-file numpy or tuples.

    ``add(relative_dir, names, target)`` appends the paths ``prefix +
    relative_dir + name`` (``relative_dir`` already ends with a separator, or is
    empty) with one target.  The per-file work is a ``len`` and, for non-ASCII
    directories only, one encode; offsets and targets are computed with numpy
    at ``build()``.
    """

    __slots__ = ("_buffer", "_counts", "_dir_lengths", "_dir_targets", "_name_lengths", "_prefix")

    def __init__(self, prefix: str = "") -> None:
        self._prefix = prefix
        self._buffer = bytearray()  # one growing buffer: no per-directory blocks left on the heap
        self._name_lengths = array("q")
        self._dir_lengths = array("q")
        self._counts = array("q")
        self._dir_targets = array("q")

    def add(self, relative_dir: str, names: Sequence[str], target: int) -> None:
        """Append ``relative_dir + name`` for each of ``names``, all with ``target``."""
        if not names:
            return
        try:
            target = operator.index(target)
        except TypeError:
            raise TypeError(f"{relative_dir!r} has a target that is not an integer: "
                            f"{target!r}") from None
        block = relative_dir + relative_dir.join(names)
        if _ASCII_FS and block.isascii():
            self._buffer += block.encode("ascii")
            self._name_lengths.extend(map(len, names))
            dir_length = len(relative_dir)
        else:
            encoded = [name.encode(_FS_ENCODING, _FS_ERRORS) for name in names]
            encoded_dir = relative_dir.encode(_FS_ENCODING, _FS_ERRORS)
            self._buffer += encoded_dir
            self._buffer += encoded_dir.join(encoded)
            self._name_lengths.extend(map(len, encoded))
            dir_length = len(encoded_dir)
        self._dir_lengths.append(dir_length)
        self._counts.append(len(names))
        self._dir_targets.append(target)

    def build(self) -> SampleTable:
        counts = np.frombuffer(self._counts, dtype=np.int64) if self._counts else np.zeros(0, np.int64)
        lengths = np.frombuffer(self._name_lengths, dtype=np.int64) if self._name_lengths \
            else np.zeros(0, np.int64)
        dir_lengths = np.frombuffer(self._dir_lengths, dtype=np.int64) if self._dir_lengths \
            else np.zeros(0, np.int64)
        dir_targets = np.frombuffer(self._dir_targets, dtype=np.int64) if self._dir_targets \
            else np.zeros(0, np.int64)
        offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
        np.cumsum(lengths + np.repeat(dir_lengths, counts), out=offsets[1:])
        blob = bytes(self._buffer)
        self._buffer = bytearray()
        return SampleTable(self._prefix, blob, offsets, np.repeat(dir_targets, counts))


def _as_bytes(path_bytes: Any) -> bytes:
    """The packed path bytes as one ``bytes`` object, reusing it when an array already views one."""
    if isinstance(path_bytes, bytes):
        return path_bytes
    if isinstance(path_bytes, np.ndarray):
        base = path_bytes.base
        if (isinstance(base, bytes) and path_bytes.dtype == np.uint8 and path_bytes.ndim == 1
                and path_bytes.nbytes == len(base) and path_bytes.flags.c_contiguous
                and path_bytes.ctypes.data == np.frombuffer(base, dtype=np.uint8).ctypes.data):
            return base
        return np.ascontiguousarray(path_bytes, dtype=np.uint8).tobytes()
    return bytes(path_bytes)


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
