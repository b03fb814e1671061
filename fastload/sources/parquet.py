"""``ParquetDataset``: rows of Parquet files by global index, through a row-group index.

Parquet is read a row group at a time (decompressed, decoded), so each is
decoded once and kept in a small per-process LRU cache (``cached_row_groups``
groups: every worker has its own).  The index is built from the files'
footers only: each row group's first global row.  ``ds[i]`` is
``{column: value}`` as ``ArrowDataset``'s; a batch of fixed-width columns is
gathered from the decoded groups, one copy per row group and column.

Over a URL, the column chunks of the row groups a batch needs (and the cache
lacks) are read first, all at once (``RemoteClient.stage``: at most
``max_concurrency`` requests in flight), then decoded.

A random order over files much larger than the cache decodes a row group for
nearly every row: write the files with small row groups, or shuffle within
row groups (a sampler over ``row_group_bounds``).
"""

from __future__ import annotations

import collections
from typing import Any, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from fastload.dataset import Dataset
from fastload.sources.arrow_columns import fixed_width_rows, row_value
from fastload.sources.remote import RemoteClient, RemoteObject, RemoteReader, is_url
from fastload.sources.tables import as_paths, checked_index, rows_in_range, select_columns, \
    whole_batch
from fastload.vision.image_batches import WholeBatch

__all__ = ["ParquetDataset"]


def _open(path: str, client: RemoteClient) -> pq.ParquetFile:
    try:
        if is_url(path):  # row groups read by ranges, retried, through a block cache
            return pq.ParquetFile(RemoteReader(RemoteObject(path, client=client)))
        return pq.ParquetFile(path)
    except FileNotFoundError:
        raise FileNotFoundError(f"No such Parquet file: {path!r}") from None
    except PermissionError:
        raise  # refused access, already named: not a malformed file
    except (pa.ArrowInvalid, OSError) as error:
        raise ValueError(f"{path!r} is not a readable Parquet file: {error}") from None


def _chunk_spans(metadata: Any, group: int, columns: list[str]) -> list[tuple[int, int]]:
    """``(start, end)`` in the file of each column chunk of ``columns`` in row group ``group``
    (every leaf of a nested column: its path in the schema starts with the name)."""
    row_group = metadata.row_group(group)
    spans = []
    for leaf in range(row_group.num_columns):
        chunk = row_group.column(leaf)
        root = chunk.path_in_schema
        if not any(root == name or root.startswith(name + ".") for name in columns):
            continue
        start = chunk.data_page_offset
        if chunk.has_dictionary_page and chunk.dictionary_page_offset is not None:
            start = min(start, chunk.dictionary_page_offset)
        spans.append((start, start + chunk.total_compressed_size))
    return spans


def _column_types(schema: pa.Schema, columns: list[str]) -> list | None:
    if not set(columns) <= set(schema.names):
        return None
    return [schema.field(name).type for name in columns]


class ParquetDataset(Dataset):
    """``ParquetDataset(paths, columns=None, cached_row_groups=8, *, storage_options=None,
    timeout=30.0, max_concurrency=32)``: see the module; a path may be a URL (``remote``)."""

    def __init__(self, paths: Any, columns: Sequence[str] | None = None,
                 cached_row_groups: int = 8, *, storage_options: dict | None = None,
                 timeout: float = 30.0, max_concurrency: int = 32) -> None:
        if isinstance(cached_row_groups, bool) or not isinstance(cached_row_groups, int) \
                or cached_row_groups < 1:
            raise ValueError(f"cached_row_groups should be a positive integer, "
                             f"but got {cached_row_groups!r}")
        self._paths = as_paths(paths, "ParquetDataset")
        self._asked_columns = None if columns is None else list(columns)
        self.cached_row_groups = cached_row_groups
        self._client = RemoteClient(storage_options, timeout, max_concurrency=max_concurrency)
        files = [_open(path, self._client) for path in self._paths]
        schema = files[0].schema_arrow
        self.columns = select_columns(schema, self._asked_columns, repr(self._paths[0]))
        groups = []  # (file number, row group, rows)
        for number, (path, file) in enumerate(zip(self._paths, files)):
            wanted = _column_types(schema, self.columns)
            if _column_types(file.schema_arrow, self.columns) != wanted:
                raise ValueError(f"{path!r} has another schema than {self._paths[0]!r} "
                                 f"for columns {self.columns}")
            for group in range(file.metadata.num_row_groups):
                groups.append((number, group, file.metadata.row_group(group).num_rows))
        self._group_file = np.array([g[0] for g in groups], dtype=np.int64)
        self._group_number = np.array([g[1] for g in groups], dtype=np.int64)
        self.row_group_bounds = np.zeros(len(groups) + 1, dtype=np.int64)
        np.cumsum([g[2] for g in groups], out=self.row_group_bounds[1:])
        self._open_per_process()

    def _open_per_process(self) -> None:
        self._files: dict[int, pq.ParquetFile] = {}
        self._decoded: collections.OrderedDict = collections.OrderedDict()

    def __len__(self) -> int:
        return int(self.row_group_bounds[-1])

    def __repr__(self) -> str:
        return (f"ParquetDataset({self._paths!r}, columns={self.columns!r}, rows={len(self)}, "
                f"row_groups={len(self._group_file)})")

    def _row_group(self, group: int) -> tuple[pa.Table, list]:
        """Row group ``group`` (global number) decoded, with its fixed-width columns."""
        found = self._decoded.get(group)
        if found is not None:
            self._decoded.move_to_end(group)
            return found
        number = int(self._group_file[group])
        file = self._files.get(number)
        if file is None:
            file = self._files[number] = _open(self._paths[number], self._client)
        table = file.read_row_group(int(self._group_number[group]), columns=self.columns)
        found = (table, [fixed_width_rows(column) for column in table.columns])
        self._decoded[group] = found
        while len(self._decoded) > self.cached_row_groups:
            self._decoded.popitem(last=False)
        return found

    def _stage(self, groups: Any) -> None:
        """Read the column chunks of the remote row groups ``groups`` that the cache
        lacks, concurrently, before they are decoded one by one."""
        spans: dict[str, list[tuple[int, int]]] = {}
        for group in groups:
            path = self._paths[int(self._group_file[group])]
            if group in self._decoded or not is_url(path):
                continue
            number = int(self._group_file[group])
            file = self._files.get(number)
            if file is None:
                file = self._files[number] = _open(path, self._client)
            spans.setdefault(path, []).extend(
                _chunk_spans(file.metadata, int(self._group_number[group]), self.columns))
        if spans:
            self._client.stage(spans)

    def __getitems__(self, indices: list) -> list:
        """The rows ``indices`` (a batch): remote row groups read together first."""
        rows = [checked_index(index, len(self)) for index in indices]
        self._stage(np.unique(self._group_of(np.array(rows, dtype=np.int64))).tolist())
        return [self[row] for row in rows]

    def _group_of(self, rows: Any) -> Any:
        return np.searchsorted(self.row_group_bounds, rows, side="right") - 1

    def __getitem__(self, index: Any) -> dict:
        row = checked_index(index, len(self))
        group = int(self._group_of(row))
        table, fixed = self._row_group(group)
        local = row - int(self.row_group_bounds[group])
        return {name: row_value(column, rows, local)
                for name, column, rows in zip(self.columns, table.columns, fixed)}

    def _fastload_batch(self, rows: np.ndarray) -> WholeBatch | None:
        if not rows_in_range(rows, len(self)):
            return None
        groups = self._group_of(rows)
        decoded = {}  # held for this batch, whatever the cache keeps
        self._stage(np.unique(groups).tolist())
        for group in np.unique(groups).tolist():
            decoded[group] = self._row_group(group)[1]
        first = next(iter(decoded.values()))
        for fixed in decoded.values():
            if any(f is None or f.dtype != f0.dtype or f.row_shape != f0.row_shape
                   for f, f0 in zip(fixed, first)):
                return None

        def fill(outs: Sequence[np.ndarray]) -> None:
            for group, fixed in decoded.items():
                positions = np.flatnonzero(groups == group)
                local = np.ascontiguousarray(rows[positions] - self.row_group_bounds[group])
                for column, out in zip(fixed, outs):
                    if len(positions) == len(rows):
                        column.gather(local, out)
                    else:
                        out[positions] = column.gather(
                            local, np.empty((len(local),) + column.row_shape, column.dtype))

        return whole_batch(self.columns, [(f.dtype, f.row_shape) for f in first], len(rows), fill)

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        del state["_files"], state["_decoded"]  # file handles and decoded groups: per process
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._open_per_process()
