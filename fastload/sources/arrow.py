"""``ArrowDataset``: the rows of Arrow IPC files (memory-mapped) or of a ``pyarrow.Table``.

``ds[i]`` is ``{column: value}`` (``arrow_columns.row_value``).  Files are
memory-mapped, never read into memory: IPC files and streams alike (a
Hugging Face cache file is a stream), several files end to end as one
table.  When every column is fixed-width, the DataLoader gathers a batch
column by column straight from the mapped buffers (``_core.ChunkedRows``).
Pickled (spawn workers) as its paths, mapped again on the other side.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import pyarrow as pa

from fastload.dataset import Dataset
from fastload.sources.arrow_columns import fixed_width_rows, row_value
from fastload.sources.remote import RemoteObject, RemoteReader, is_url
from fastload.sources.tables import as_paths, checked_index, rows_in_range, select_columns, \
    whole_batch
from fastload.vision.image_batches import WholeBatch

__all__ = ["ArrowDataset", "read_ipc"]

_FILE_MAGIC = b"ARROW1"


def read_ipc(path: str, storage_options: dict | None = None, timeout: float = 30.0) -> pa.Table:
    """The table of one Arrow IPC file or stream, memory-mapped (a URL's read into
    memory, by ranges, retried); errors name ``path``."""
    try:
        source = pa.PythonFile(RemoteReader(RemoteObject(path, storage_options, timeout)),
                               mode="r") if is_url(path) else pa.memory_map(path, "r")
    except FileNotFoundError:
        raise FileNotFoundError(f"No such Arrow file: {path!r}") from None
    try:
        is_file = source.read(len(_FILE_MAGIC)) == _FILE_MAGIC
        source.seek(0)
        reader = pa.ipc.open_file(source) if is_file else pa.ipc.open_stream(source)
        return reader.read_all()
    except (FileNotFoundError, PermissionError):
        raise  # a missing or forbidden object, already named
    except (pa.ArrowInvalid, OSError) as error:
        raise ValueError(f"{path!r} is not a readable Arrow IPC file or stream: {error}") from None


class ArrowDataset(Dataset):
    """``ArrowDataset(paths_or_table, columns=None, *, storage_options=None, timeout=30.0)``:
    see the module's docstring; a path may be a URL (``remote``), read into memory."""

    def __init__(self, paths_or_table: Any, columns: Sequence[str] | None = None, *,
                 storage_options: dict | None = None, timeout: float = 30.0) -> None:
        self._paths = None
        self._remote = (storage_options, timeout)
        self._asked_columns = None if columns is None else list(columns)
        if isinstance(paths_or_table, pa.Table):
            table = paths_or_table
            where = "the table"
        else:
            self._paths = as_paths(paths_or_table, "ArrowDataset")
            table = self._read(self._paths, self._remote)
            where = repr(self._paths[0])
        self.columns = select_columns(table.schema, self._asked_columns, where)
        self.table = table.select(self.columns)
        self._fixed: list | None = None  # per process, see _fixed_rows

    @staticmethod
    def _read(paths: list[str], remote: tuple) -> pa.Table:
        tables = [read_ipc(path, *remote) for path in paths]
        for path, table in zip(paths[1:], tables[1:]):
            if not table.schema.equals(tables[0].schema, check_metadata=False):
                raise ValueError(f"{path!r} has another schema than {paths[0]!r}:\n"
                                 f"{table.schema}\nversus\n{tables[0].schema}")
        return tables[0] if len(tables) == 1 else pa.concat_tables(tables)

    def __len__(self) -> int:
        return self.table.num_rows

    def __repr__(self) -> str:
        source = self._paths if self._paths is not None else "a pyarrow.Table"
        return f"ArrowDataset({source!r}, columns={self.columns!r}, rows={len(self)})"

    def _fixed_rows(self) -> list:
        if self._fixed is None:
            self._fixed = [fixed_width_rows(column) for column in self.table.columns]
        return self._fixed

    def __getitem__(self, index: Any) -> dict:
        row = checked_index(index, len(self))
        return {name: row_value(column, fixed, row) for name, column, fixed
                in zip(self.columns, self.table.columns, self._fixed_rows())}

    def _fastload_batch(self, rows: np.ndarray) -> WholeBatch | None:
        fixed = self._fixed_rows()
        if any(column is None for column in fixed) or not rows_in_range(rows, len(self)):
            return None

        def fill(outs: Sequence[np.ndarray]) -> None:
            for column, out in zip(fixed, outs):
                column.gather(rows, out)

        return whole_batch(self.columns, [(f.dtype, f.row_shape) for f in fixed], len(rows), fill)

    def __getstate__(self) -> dict:
        if self._paths is None:  # a table given as it is travels as it is
            return {"table": self.table, "columns": self.columns}
        return {"paths": self._paths, "columns": self._asked_columns, "remote": self._remote}

    def __setstate__(self, state: dict) -> None:
        if "table" in state:
            self.__init__(state["table"], state["columns"])
        else:
            storage_options, timeout = state["remote"]
            self.__init__(state["paths"], state["columns"], storage_options=storage_options,
                          timeout=timeout)
