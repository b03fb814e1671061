"""What Arrow- and Parquet-backed datasets share: paths, column choice, samples, batches.

A sample is the dict ``{column: value}`` of one row (values as ``row_value``
gives them); a batch of rows is gathered column by column when every column
is fixed-width (``WholeBatch``, the DataLoader's whole-batch path), else made
sample by sample.
"""

from __future__ import annotations

import operator
import os
from typing import Any, Callable, Sequence

import numpy as np
import pyarrow as pa

from fastload.vision.image_batches import WholeBatch

__all__ = ["as_paths", "select_columns", "checked_index", "rows_in_range", "whole_batch"]


def as_paths(paths: Any, what: str) -> list[str]:
    """One path or a sequence of them, as strings; TypeError/ValueError naming ``what``."""
    if isinstance(paths, (str, os.PathLike)):
        paths = [paths]
    try:
        found = [os.fspath(path) for path in paths]
    except TypeError:
        raise TypeError(f"{what}: paths should be a path or a sequence of paths, "
                        f"but got {type(paths).__name__}") from None
    if not found:
        raise ValueError(f"{what}: no paths given")
    return found


def select_columns(schema: pa.Schema, columns: Sequence[str] | None, where: str) -> list[str]:
    """The column names to read, in the order asked; KeyError naming one missing."""
    if columns is None:
        return list(schema.names)
    if isinstance(columns, str):
        raise TypeError(f"columns should be a sequence of column names, not the string {columns!r}")
    names = list(columns)
    for name in names:
        if name not in schema.names:
            raise KeyError(f"column {name!r} is not in {where} (columns: {schema.names})")
    return names


def checked_index(index: Any, length: int) -> int:
    """``index`` as a row number (negatives wrapped); TypeError / IndexError as a list's."""
    try:
        row = operator.index(index)
    except TypeError:
        raise TypeError(f"dataset indices must be integers, not {type(index).__name__}") from None
    if row < 0:
        row += length
    if not 0 <= row < length:
        raise IndexError(f"index {index} is out of range for a dataset of length {length}")
    return row


def rows_in_range(rows: np.ndarray, length: int) -> bool:
    """Every row in ``[0, length)`` (else the batch is made sample by sample, which
    wraps negatives and names a row out of range)."""
    return rows.size > 0 and int(rows.min()) >= 0 and int(rows.max()) < length


def whole_batch(names: Sequence[str], columns: Sequence[tuple[np.dtype, tuple[int, ...]]],
                count: int, fill: Callable[[Sequence[np.ndarray]], None]) -> WholeBatch:
    """The dict batch ``{name: (count, *row_shape) array}`` that ``fill`` writes."""
    shapes = tuple((np.dtype(dtype), (count,) + tuple(row_shape)) for dtype, row_shape in columns)
    return WholeBatch(shapes, fill, tuple(names))
