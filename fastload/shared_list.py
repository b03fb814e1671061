"""SharedList: per-sample records that worker processes read without copying them.

NOTE [ Copy-on-read ]
A dataset that keeps a Python list of records (file paths, COCO-style
annotation dicts) is copied into every forked worker page by page: reading
a record touches its reference count, and every object it holds, which
writes the page it lives on.  With 8 GPUs x 4 workers that replicates the
list 32 times (torch issue 13246).  ``SharedList`` pickles the records once
into one flat byte buffer and an offsets array, two numpy arrays whose data
pages nothing ever writes: forked workers share them with the main process
for good, and ``records[i]`` unpickles a fresh copy of record ``i``.
Pickled for spawn or forkserver workers, it travels as those two buffers.
"""

from __future__ import annotations

import io
import operator
import pickle
from typing import Any, Iterable, Iterator

import numpy as np

__all__ = ["SharedList"]


class SharedList:
    """A read-only list of picklable records, kept as one flat buffer.

    ``len``, ``records[i]`` (negative ``i`` too; ``IndexError`` past the end),
    slices (a list of records), iteration.  Each access unpickles a fresh
    copy, so changing a record changes nothing stored.
    """

    __slots__ = ("_buffer", "_offsets", "_bytes", "_starts")

    def __init__(self, records: Iterable[Any] = ()) -> None:
        if isinstance(records, SharedList):
            self._adopt(records._buffer, records._offsets)
            return
        stream = io.BytesIO()
        ends = []
        for record in records:
            pickle.dump(record, stream, protocol=pickle.HIGHEST_PROTOCOL)
            ends.append(stream.tell())
        offsets = np.zeros(len(ends) + 1, dtype=np.int64)
        offsets[1:] = ends
        self._adopt(np.frombuffer(stream.getbuffer(), dtype=np.uint8).copy(), offsets)

    def _adopt(self, buffer: np.ndarray, offsets: np.ndarray) -> None:
        self._buffer, self._offsets = buffer, offsets
        # Indexing a memoryview gives Python ints and bytes views without
        # numpy's scalar machinery: a record costs one slice and one loads.
        self._bytes = memoryview(buffer)
        self._starts = memoryview(offsets)

    @classmethod
    def _from_buffers(cls, buffer: np.ndarray, offsets: np.ndarray) -> "SharedList":
        shared = cls.__new__(cls)
        shared._adopt(buffer, offsets)
        return shared

    def __reduce__(self):
        return (SharedList._from_buffers, (self._buffer, self._offsets))

    def __len__(self) -> int:
        return len(self._starts) - 1

    def __getitem__(self, index: Any) -> Any:
        if isinstance(index, slice):
            return [self[i] for i in range(*index.indices(len(self)))]
        try:
            i = operator.index(index)
        except TypeError:
            raise TypeError(f"list indices must be integers or slices, "
                            f"not {type(index).__name__}") from None
        n = len(self._starts) - 1
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError("list index out of range")
        starts = self._starts
        return pickle.loads(self._bytes[starts[i]:starts[i + 1]])

    def __iter__(self) -> Iterator[Any]:
        view, starts = self._bytes, self._starts
        for i in range(len(starts) - 1):
            yield pickle.loads(view[starts[i]:starts[i + 1]])

    @property
    def nbytes(self) -> int:
        """Bytes the records take, pickled, with their offsets."""
        return self._buffer.nbytes + self._offsets.nbytes

    def __repr__(self) -> str:
        return f"SharedList({len(self)} records, {self.nbytes} bytes)"
