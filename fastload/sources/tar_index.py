"""Where each member of a tar shard is: read from the tar headers, kept on disk.

A tar file is a run of 512-byte header blocks, each followed by its member's
data rounded up to 512 bytes, ended by zero blocks.  ``read_members`` walks
the headers only (POSIX ustar with its ``prefix``, GNU ``L`` long names, pax
``x`` records for ``path`` and ``size``), seeking over the data, and returns
the regular files' names, data offsets and sizes.  Nothing in a header is
trusted: a size or a long name that reaches past the end of the file is a
truncated shard (ValueError naming it), never an allocation.

``shard_members`` keeps that index beside the shard (``<shard>.fastload-idx.npz``)
or in ``index_dir`` when given (a URL's only there), written to a temporary
name and renamed, and keyed on the shard's size and modification time (a
URL's ETag or Last-Modified; an object with neither is indexed every time):
a changed shard is indexed again, a half-written index is never read.
"""

from __future__ import annotations

import hashlib
import os
import tempfile

from typing import Any

import numpy as np

from fastload.sources.remote import is_url

__all__ = ["LocalFile", "read_members", "shard_members", "index_path"]

_BLOCK = 512
_INDEX_VERSION = 2


def _number(field: bytes, shard: str, offset: int) -> int:
    """A header's numeric field: octal text, or GNU base-256 (high bit of the first byte)."""
    if field and field[0] & 0x80:
        value = int.from_bytes(field[1:], "big") | ((field[0] & 0x3F) << (8 * (len(field) - 1)))
        return -value if field[0] & 0x40 else value
    text = field.split(b"\0", 1)[0].strip(b" \0")
    try:
        return int(text, 8) if text else 0
    except ValueError:
        raise ValueError(f"{shard}: the tar header at byte {offset} has a bad number "
                         f"{field!r}: not a tar file, or a damaged one") from None


def _pax_records(data: bytes, shard: str, offset: int) -> dict[str, str]:
    """``length key=value\\n`` records of a pax extended header."""
    records, at = {}, 0
    while at < len(data):
        space = data.find(b" ", at)
        try:
            length = int(data[at:space])
        except ValueError:
            raise ValueError(f"{shard}: bad pax header at byte {offset}") from None
        if space < 0 or length <= 0 or at + length > len(data):
            raise ValueError(f"{shard}: bad pax header at byte {offset}")
        key, _, value = data[space + 1:at + length - 1].partition(b"=")
        records[key.decode("utf-8", "replace")] = value.decode("utf-8", "surrogateescape")
        at += length
    return records


class LocalFile:
    """A local file read by ranges (``os.pread``), as ``RemoteObject`` reads a URL's."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._fd: int | None = None
        self._pid = os.getpid()

    def _descriptor(self) -> int:
        if self._fd is None or self._pid != os.getpid():  # a descriptor per process
            self._pid = os.getpid()
            try:
                self._fd = os.open(self.path, os.O_RDONLY)
            except FileNotFoundError:
                raise FileNotFoundError(f"No such tar shard: {self.path!r}") from None
        return self._fd

    @property
    def length(self) -> int:
        return os.fstat(self._descriptor()).st_size

    def read(self, offset: int, size: int) -> bytes:
        return os.pread(self._descriptor(), size, offset)

    def close(self) -> None:
        if self._fd is not None and self._pid == os.getpid():
            os.close(self._fd)
        self._fd = None

    def __getstate__(self) -> dict:
        return {"path": self.path}

    def __setstate__(self, state: dict) -> None:
        self.__init__(state["path"])


def read_members(shard: str, source: Any = None) -> tuple[list[str], np.ndarray, np.ndarray]:
    """``(names, data offsets, sizes)`` of the regular files in the tar ``shard``
    (read through ``source``, a ``LocalFile`` or ``RemoteObject``, when given)."""
    owned = source is None
    if owned:
        source = LocalFile(shard)
    try:
        return _walk_headers(shard, source)
    finally:
        if owned:
            source.close()


# Read at a header: the header, and usually a pax record and the next header with it.
_WINDOW = 4096
_ZERO_BLOCK = bytes(_BLOCK)
_EXTENDED = (ord("L"), ord("x"), ord("g"))
_REGULAR = (ord("0"), 0, ord("7"))


def _walk_headers(shard: str, source: Any) -> tuple[list[str], np.ndarray, np.ndarray]:
    """The walk from header to header.  Checksums are checked all at once at the end
    (and before any error the walk meets, so a damaged header is called that)."""
    names: list[str] = []
    offsets: list[int] = []
    sizes: list[int] = []
    header_offsets: list[int] = []
    headers: list[bytes] = []
    length = source.length
    at = window_at = 0
    window = b""
    long_name = None
    pax: dict[str, str] = {}
    try:
        while True:
            within = at - window_at
            if within + _BLOCK > len(window):
                window, window_at, within = source.read(at, _WINDOW), at, 0
            header = window[within:within + _BLOCK]
            if len(header) < _BLOCK:
                if not header and at == length and names:
                    break  # no end-of-archive blocks: tolerated, as Python's tarfile does
                raise ValueError(f"{shard}: truncated tar file: a header ends at byte "
                                 f"{at + len(header)} of {length}")
            if header == _ZERO_BLOCK:
                break  # end of archive
            header_offsets.append(at)
            headers.append(header)
            size = _size(header, shard, at)
            kind = header[156]
            data_at = at + _BLOCK
            if size < 0 or data_at + size > length:
                raise ValueError(f"{shard}: truncated tar file: the member at byte {at} "
                                 f"needs {size} bytes of data, the file ends at {length}")
            if kind in _EXTENDED:
                within = data_at - window_at
                data = window[within:within + size] if within + size <= len(window) \
                    else source.read(data_at, size)  # bounded by the length, checked above
                if kind == _EXTENDED[0]:
                    long_name = data.split(b"\0", 1)[0].decode("utf-8", "surrogateescape")
                elif kind == _EXTENDED[1] and (b" path=" in data or b" size=" in data):
                    pax = _pax_records(data, shard, at)  # (records naming neither: skipped)
            else:
                if kind in _REGULAR:
                    name = long_name if long_name is not None else _ustar_name(header)
                    name = pax.get("path", name)
                    if "size" in pax:
                        size = int(pax["size"])
                        if size < 0 or data_at + size > length:
                            raise ValueError(f"{shard}: truncated tar file: the member "
                                             f"{name!r} needs {size} bytes, the file ends "
                                             f"at {length}")
                    names.append(name)
                    offsets.append(data_at)
                    sizes.append(size)
                long_name, pax = None, {}
            at = data_at + ((size + _BLOCK - 1) & -_BLOCK)
    except ValueError:
        _check_sums(shard, header_offsets, headers)  # a damaged header is the cause, if any
        raise
    _check_sums(shard, header_offsets, headers)
    return names, np.array(offsets, dtype=np.int64), np.array(sizes, dtype=np.int64)


def _size(header: bytes, shard: str, offset: int) -> int:
    """A header's size field (octal text, the usual case, parsed at once; else ``_number``)."""
    field = header[124:136]
    try:
        return int(field.rstrip(b"\0 ").lstrip(b" \0") or b"0", 8) if field[0] < 0x80 \
            else _number(field, shard, offset)
    except ValueError:
        return _number(field, shard, offset)


def _check_sums(shard: str, offsets: list[int], headers: list[bytes]) -> None:
    """Every header's stored checksum against the sum of its bytes (the checksum field
    counted as spaces), summed for all headers at once."""
    if not headers:
        return
    blocks = np.frombuffer(b"".join(headers), dtype=np.uint8).reshape(len(headers), _BLOCK)
    sums = blocks.sum(axis=1, dtype=np.int64) - blocks[:, 148:156].sum(axis=1, dtype=np.int64) \
        + 8 * 32
    for number, (header, computed) in enumerate(zip(headers, sums.tolist())):
        field = header[148:156]
        try:
            stored = int(field.rstrip(b"\0 ").lstrip(b" \0") or b"0", 8)
        except ValueError:
            stored = _number(field, shard, offsets[number])
        if stored != computed:
            raise ValueError(f"{shard}: the tar header at byte {offsets[number]} fails its "
                             f"checksum: not a tar file, or a damaged one")


def _ustar_name(header: bytes) -> str:
    name = header[0:100].split(b"\0", 1)[0]
    if header[257:262] == b"ustar":
        prefix = header[345:500].split(b"\0", 1)[0]
        if prefix:
            name = prefix + b"/" + name
    return name.decode("utf-8", "surrogateescape")


def index_path(shard: str, index_dir: str | None) -> str | None:
    """Where the index of ``shard`` is kept: beside it, or in ``index_dir``
    (a URL's only there: None without one)."""
    if index_dir is None:
        return None if is_url(shard) else shard + ".fastload-idx.npz"
    name = shard.rstrip("/").rsplit("/", 1)[-1]
    where = shard if is_url(shard) else os.path.abspath(shard)
    digest = hashlib.sha1(where.encode()).hexdigest()[:16]
    return os.path.join(index_dir, f"{name}.{digest}.fastload-idx.npz")


def _identity(shard: str, source: Any) -> np.ndarray | None:
    if isinstance(source, LocalFile):
        try:
            stat = os.stat(shard)
        except FileNotFoundError:
            raise FileNotFoundError(f"No such tar shard: {shard!r}") from None
        key = f"{stat.st_size}:{stat.st_mtime_ns}"
    else:
        key = source.identity()
        if key is None:
            return None  # an object that cannot be told apart from its next version
    return np.array([f"{_INDEX_VERSION}:{key}"])


def shard_members(shard: str, source: Any, index_dir: str | None = None
                  ) -> tuple[list[str], np.ndarray, np.ndarray]:
    """``read_members(shard)``, from its kept index when that is the shard's, else
    read and kept (a directory that cannot be written: read each time)."""
    identity = _identity(shard, source)
    path = index_path(shard, index_dir)
    if identity is None or path is None:
        return read_members(shard, source)
    try:
        with np.load(path, allow_pickle=False) as kept:
            if np.array_equal(kept["identity"], identity):
                return kept["names"].tolist(), kept["offsets"], kept["sizes"]
    except (OSError, ValueError, KeyError):
        pass  # none yet, or not ours: index again
    names, offsets, sizes = read_members(shard, source)
    _keep(path, identity, names, offsets, sizes)
    return names, offsets, sizes


def _keep(path: str, identity: np.ndarray, names: list[str], offsets: np.ndarray,
          sizes: np.ndarray) -> None:
    """Written to a temporary name, then renamed: never read half written."""
    try:
        handle, temporary = tempfile.mkstemp(dir=os.path.dirname(path) or ".",
                                             prefix=".fastload-idx-", suffix=".npz")
    except OSError:
        return
    try:
        with os.fdopen(handle, "wb") as out:
            np.savez(out, identity=identity, names=np.array(names, dtype=str),
                     offsets=offsets, sizes=sizes)
        os.replace(temporary, path)
    except OSError:
        pass
    finally:
        if os.path.exists(temporary):
            os.unlink(temporary)
