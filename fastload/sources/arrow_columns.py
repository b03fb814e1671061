"""Fixed-width columns of an Arrow table, as rows the gather kernel reads in place.

A column whose every row has the same shape (a number; a fixed-size list; a
list whose rows all have the same length, as ``datasets`` stores a 2-D numpy
array) and no nulls is a sequence of record-batch chunks, each a contiguous
``(rows, *row_shape)`` block of one dtype.  ``fixed_width_rows`` views each
chunk's buffer as a numpy array without copying (a memory-mapped file stays
memory-mapped) and hands them to ``_core.ChunkedRows``, which gathers a
batch's rows from all chunks in one call.  Anything else (strings, nulls,
ragged lists, structs) answers None: those columns are read row by row.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa

from fastload import _core

__all__ = ["fixed_width_rows", "ragged_rows", "chunk_rows", "row_value"]


def fixed_width_rows(column: pa.ChunkedArray) -> _core.ChunkedRows | None:
    """The column's chunks as one gatherable ``ChunkedRows``, or None when a chunk
    is not fixed-width (or the rows' shapes differ between chunks)."""
    views = []
    for chunk in column.chunks:
        if len(chunk) == 0:
            continue
        view = chunk_rows(chunk)
        if view is None or (views and (view.shape[1:] != views[0].shape[1:]
                                       or view.dtype != views[0].dtype)):
            return None
        views.append(view)
    if not views:
        return None
    return _core.ChunkedRows(views, views[0].dtype, views[0].shape[1:])


def chunk_rows(chunk: pa.Array) -> np.ndarray | None:
    """``chunk`` as a ``(len(chunk), *row_shape)`` array over its own buffer
    (a bool chunk, bit-packed in Arrow, is unpacked once), or None."""
    if chunk.null_count:
        return None
    kind = chunk.type
    if pa.types.is_integer(kind) or pa.types.is_floating(kind):
        return chunk.to_numpy(zero_copy_only=True)
    if pa.types.is_boolean(kind):
        return chunk.to_numpy(zero_copy_only=False)
    if pa.types.is_fixed_size_list(kind):
        width = kind.list_size
    elif pa.types.is_list(kind) or pa.types.is_large_list(kind):
        widths = np.diff(chunk.offsets.to_numpy())
        if widths.size == 0 or (widths != widths[0]).any():
            return None
        width = int(widths[0])
    else:
        return None
    if width == 0:
        return None
    # flatten() keeps a sliced chunk's offset: the values of exactly these rows.
    inner = chunk_rows(chunk.flatten())
    if inner is None or inner.shape[0] != len(chunk) * width:
        return None
    return inner.reshape((len(chunk), width) + inner.shape[1:])


def row_value(column: pa.ChunkedArray, fixed: _core.ChunkedRows | None, index: int) -> Any:
    """Row ``index`` of ``column`` as a sample holds it: a numpy scalar or array
    for a fixed-width column (what its batches gather), a numpy array for a
    list of numbers without nulls (ragged token ids: ``pad_collate`` pads
    them), else Arrow's Python value (strings, nulls, structs)."""
    if fixed is not None:
        out = np.empty((1,) + fixed.row_shape, fixed.dtype)
        return fixed.gather(np.array([index], dtype=np.int64), out)[0]
    scalar = column[index]
    kind = column.type
    if (pa.types.is_list(kind) or pa.types.is_large_list(kind)
            or pa.types.is_fixed_size_list(kind)) and scalar.is_valid:
        values = scalar.values
        if (pa.types.is_integer(values.type) or pa.types.is_floating(values.type)) \
                and not values.null_count:
            return values.to_numpy(zero_copy_only=False)
    return scalar.as_py()


def ragged_rows(column: pa.ChunkedArray) -> _core.RaggedRows | None:
    """A list column of numbers (rows of any length, no nulls) as ``RaggedRows``, else None."""
    if not (pa.types.is_list(column.type) or pa.types.is_large_list(column.type)):
        return None
    values, offsets = [], []
    for chunk in column.chunks:
        if chunk.null_count:
            return None
        items = chunk_rows(chunk.flatten()) if len(chunk) else None
        if items is None:
            if len(chunk):
                return None
            continue
        if values and (items.dtype != values[0].dtype or items.shape[1:] != values[0].shape[1:]):
            return None
        starts = chunk.offsets.to_numpy().astype(np.int64)
        values.append(items)
        offsets.append(starts - starts[0])  # flatten() starts at this chunk's first row
    if not values:
        return None
    return _core.RaggedRows(values, offsets, values[0].dtype, values[0].shape[1:])
