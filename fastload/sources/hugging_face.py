"""A Hugging Face ``datasets.Dataset`` gathered a batch at a time from its Arrow table.

Through torch's loader, a ``datasets.Dataset`` makes each batch with its own
``__getitems__`` (an Arrow query, its formatter, then one dict per row) and
``default_collate`` stacks the rows again.  When the result is known without
doing that, the DataLoader gathers it column by column from the memory-mapped
Arrow buffers instead, one kernel call per column (``_core.ChunkedRows``),
straight into the ring slot.  That is when:

* the format is ``"numpy"`` or ``"torch"`` without format arguments (the
  formatters' rules are mirrored: integers become int64, floats float32,
  booleans stay bool; ``"torch"`` gives tensors);
* every column output is fixed-width and numeric without nulls (see
  ``arrow_columns``) and needs no decoding (no ``Image()``, ``Audio()``);
  with ``pad_collate`` (numpy format), lists of numbers of any length too,
  padded straight from the Arrow buffers (``padded_columns``);
* no transform is set (``set_transform`` makes the format ``"custom"``).

Anything else is made sample by sample, through the dataset's own
``__getitems__``, as torch makes it.  An ``indices`` mapping (after
``shuffle()``, ``select()``, ``filter()``) maps the batch's rows first.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np

from fastload._core import RaggedRows
from fastload.collate import BatchLayout, PadCollate
from fastload.sources.arrow_columns import fixed_width_rows, ragged_rows
from fastload.sources.padded_columns import gather_cast, padded_batch
from fastload.vision.image_batches import WholeBatch

__all__ = ["ArrowColumnBatches", "formatted_dtype"]


def formatted_dtype(dtype: np.dtype) -> np.dtype | None:
    """The dtype the numpy and torch formatters give an array of ``dtype``
    (None where the two differ or torch has none: uint64)."""
    if dtype.kind == "b":
        return dtype
    if dtype.kind == "i" or (dtype.kind == "u" and dtype.itemsize < 8):
        return np.dtype(np.int64)
    if dtype.kind == "f":
        return np.dtype(np.float32)
    return None


class ArrowColumnBatches:
    """Makes a Hugging Face dataset's batches (``_fastload_batch``, see fetch.py)."""

    def __init__(self, names: tuple[str, ...], columns: list, dtypes: list[np.dtype],
                 indices: np.ndarray | None, length: int, tensors: bool) -> None:
        self.names = names
        self.columns = columns
        self.dtypes = dtypes
        self.indices = indices
        self.length = length
        self.tensors = tensors

    @classmethod
    def of(cls, dataset: Any) -> "ArrowColumnBatches | None":
        """The batches of ``dataset`` when its format allows gathering them, else None."""
        format_type = getattr(dataset, "_format_type", None)
        if format_type not in ("numpy", "torch") or dataset._format_kwargs:
            return None
        table = dataset.data.table
        wanted = dataset._format_columns
        if wanted is not None and dataset._output_all_columns \
                and set(wanted) != set(table.column_names):
            return None  # the other columns come out unformatted
        from datasets.features.features import require_decoding

        features = dataset.features
        names, columns, dtypes = [], [], []
        for name in table.column_names:  # the formatter keeps the table's order
            if wanted is not None and name not in wanted:
                continue
            if require_decoding(features[name]):
                return None
            rows = fixed_width_rows(table.column(name))
            if rows is None:
                # Ragged (token ids): gathered padded with pad_collate, else sample by sample.
                rows = ragged_rows(table.column(name))
                if rows is None:
                    return None
            dtype = formatted_dtype(rows.dtype)
            if dtype is None:
                return None
            names.append(name)
            columns.append(rows)
            dtypes.append(dtype)
        if not columns:
            return None
        indices = None
        if dataset._indices is not None:
            indices = np.ascontiguousarray(
                dataset._indices.column(0).to_numpy().astype(np.int64, copy=False))
        return cls(tuple(names), columns, dtypes, indices, len(dataset), format_type == "torch")

    def _table_rows(self, rows: np.ndarray) -> np.ndarray | None:
        if rows.size == 0 or rows.min() < 0 or rows.max() >= self.length:
            return None  # the dataset's own indexing answers (and raises)
        return rows if self.indices is None else self.indices[rows]

    def _fastload_batch(self, rows: np.ndarray) -> WholeBatch | None:
        rows = self._table_rows(rows)
        if rows is None or any(isinstance(column, RaggedRows) for column in self.columns):
            return None  # ragged rows stack only if equal: torch's collate decides
        count = rows.shape[0]
        shapes = tuple((dtype, (count,) + column.row_shape)
                       for dtype, column in zip(self.dtypes, self.columns))

        def fill(outs: Sequence[np.ndarray]) -> None:
            for column, out in zip(self.columns, outs):
                gather_cast(column, rows, out)

        return WholeBatch(shapes, fill, self.names, self.tensors)

    def _fastload_padded_batch(self, rows: np.ndarray, pad: PadCollate
                               ) -> tuple[BatchLayout, Callable[[np.ndarray], None]] | None:
        """The batch ``pad`` makes of these rows, laid out, and the fill that writes it
        into a buffer of ``layout.nbytes``; None for sample by sample."""
        rows = self._table_rows(rows)
        if rows is None or self.tensors:
            return None
        return padded_batch(self.names, self.columns, self.dtypes, rows, pad)
