"""The batch ``pad_collate`` makes of table rows, gathered column by column.

Over samples ``{column: value}`` (numpy scalars, fixed-width arrays, ragged
arrays), ``pad_collate`` gives: a scalar column stacked, ``(B,)``; an array
column padded, ``Padded(values (B, L, ...), lengths, mask)`` (or ``values``
alone without lengths and mask), ``L`` the batch's longest rounded up to
``pad_to_multiple_of``.  Here the same layout is built from the columns'
shapes and each column is written from the table's buffers: fixed-width
rows by ``ChunkedRows.gather``, ragged ones by ``RaggedRows.gather_padded``.
"""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from fastload._core import ChunkedRows, RaggedRows
from fastload.collate import (ArraySlot, BatchLayout, MappingNode, NamedTupleNode, PadCollate,
                              Padded, Value)

__all__ = ["padded_batch", "gather_cast"]


def _rounded(longest: int, pad: PadCollate) -> int:
    multiple = pad.pad_to_multiple_of
    return longest if multiple is None else -(-longest // multiple) * multiple


def _padded_node(values: ArraySlot, pad: PadCollate) -> object:
    if not (pad.return_lengths or pad.return_mask):
        return values
    count, longest = values.shape[:2]
    lengths = ArraySlot(np.int64, (count,)) if pad.return_lengths else Value(None)
    mask = ArraySlot(np.bool_, (count, longest)) if pad.return_mask else Value(None)
    return NamedTupleNode(Padded, [values, lengths, mask])


def padded_batch(names: Sequence[str], columns: Sequence[ChunkedRows | RaggedRows],
                 dtypes: Sequence[np.dtype], rows: np.ndarray, pad: PadCollate
                 ) -> tuple[BatchLayout, Callable[[np.ndarray], None]]:
    """``(layout, fill)``: ``fill(buffer)`` writes the batch of ``rows`` laid out by ``layout``."""
    count = rows.shape[0]
    children, writers = [], []
    for name, column, dtype in zip(names, columns, dtypes):
        if isinstance(column, ChunkedRows) and not column.row_shape:
            slot = ArraySlot(dtype, (count,))
            children.append(slot)
            writers.append((column, slot, None, None))
            continue
        if isinstance(column, RaggedRows):
            lengths = column.lengths(rows)
            trailing = column.item_shape
        else:
            lengths = np.full(count, column.row_shape[0], dtype=np.int64)
            trailing = column.row_shape[1:]
        longest = _rounded(int(lengths.max()), pad)
        values = ArraySlot(dtype, (count, longest) + trailing)
        children.append(_padded_node(values, pad))
        writers.append((column, values, lengths, pad._padding(np.dtype(dtype), (name,))))
    layout = BatchLayout(MappingNode(dict.fromkeys(names), children))
    layout.assign_offsets()

    def fill(buffer: np.ndarray) -> None:
        for (column, slot, lengths, padding), node in zip(writers, children):
            out = slot.view(buffer)
            if lengths is None:
                gather_cast(column, rows, out)
                continue
            if isinstance(column, RaggedRows):
                if out.dtype == column.dtype:
                    column.gather_padded(rows, out, padding)
                else:  # the formatter's cast (int32 ids to int64), then the padding
                    padded = column.gather_padded(rows, np.empty(out.shape, column.dtype),
                                                  np.zeros(1, column.dtype))
                    np.copyto(out, padded, casting="unsafe")
                    out[np.arange(out.shape[1]) >= lengths[:, None]] = padding[0]
            else:
                width = column.row_shape[0]
                if out.shape[1] == width:
                    gather_cast(column, rows, out)
                else:
                    out[:, :width] = column.gather(
                        rows, np.empty((count,) + column.row_shape, column.dtype))
                    out[:, width:] = padding[0]
            if isinstance(node, NamedTupleNode):
                length_leaf, mask_leaf = node.children[1], node.children[2]
                if isinstance(length_leaf, ArraySlot):
                    length_leaf.view(buffer)[:] = lengths
                if isinstance(mask_leaf, ArraySlot):
                    np.less(np.arange(out.shape[1]), lengths[:, None], out=mask_leaf.view(buffer))

    return layout, fill


def gather_cast(column: ChunkedRows, rows: np.ndarray, out: np.ndarray) -> None:
    """``out[i] = row rows[i]``, cast to ``out``'s dtype as a ``datasets`` formatter casts."""
    if out.dtype == column.dtype:
        column.gather(rows, out)
    else:  # the formatter's cast, after the gather
        np.copyto(out, column.gather(rows, np.empty(out.shape, column.dtype)), casting="unsafe")
