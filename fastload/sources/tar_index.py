"""Where each member of a tar shard is: read from the tar headers, kept on disk.

A tar file is a run of 512-byte header blocks, each followed by its member's
data rounded up to 512 bytes, ended by zero blocks.  ``read_members`` walks
the headers only (POSIX ustar with its ``prefix``, GNU ``L`` long names, pax
``x`` records for ``path`` and ``size``), seeking over the data, and returns
the regular files' names, data offsets and sizes.  Nothing in a header is
trusted: a size or a long name that reaches past the end of the file is a
truncated shard (ValueError naming it), never an allocation.

``shard_members`` keeps that index beside the shard (``<shard>.fastload-idx.npz``)
or in ``index_dir`` when given, written to a temporary name and renamed, and
keyed on the shard's size and modification time: a changed shard is indexed
again, a half-written index is never read.
"""

from __future__ import annotations

import hashlib
import os
import tempfile

import numpy as np

__all__ = ["read_members", "shard_members", "index_path"]

_BLOCK = 512
_INDEX_VERSION = 1


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


def _checked(header: bytes, shard: str, offset: int) -> None:
    stored = _number(header[148:156], shard, offset)
    unsigned = sum(header[:148]) + 8 * 32 + sum(header[156:])
    if stored != unsigned:
        raise ValueError(f"{shard}: the tar header at byte {offset} fails its checksum: "
                         f"not a tar file, or a damaged one")


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


def read_members(shard: str) -> tuple[list[str], np.ndarray, np.ndarray]:
    """``(names, data offsets, sizes)`` of the regular files in the tar ``shard``."""
    names: list[str] = []
    offsets: list[int] = []
    sizes: list[int] = []
    with open(shard, "rb") as file:
        length = os.fstat(file.fileno()).st_size
        at = 0
        long_name = None
        pax: dict[str, str] = {}
        while True:
            header = file.read(_BLOCK)
            if len(header) < _BLOCK:
                if not header and at == length and names:
                    break  # no end-of-archive blocks: tolerated, as Python's tarfile does
                raise ValueError(f"{shard}: truncated tar file: a header ends at byte "
                                 f"{at + len(header)} of {length}")
            if header == bytes(_BLOCK):
                break  # end of archive
            _checked(header, shard, at)
            size = _number(header[124:136], shard, at)
            kind = header[156:157]
            data_at = at + _BLOCK
            if size < 0 or data_at + size > length:
                raise ValueError(f"{shard}: truncated tar file: the member at byte {at} "
                                 f"needs {size} bytes of data, the file ends at {length}")
            if kind in (b"L", b"x", b"g"):
                data = file.read(size)  # bounded by the file's length, checked above
                if kind == b"L":
                    long_name = data.split(b"\0", 1)[0].decode("utf-8", "surrogateescape")
                elif kind == b"x":
                    pax = _pax_records(data, shard, at)
            else:
                if kind in (b"0", b"\0", b"7"):
                    name = long_name if long_name is not None else _ustar_name(header)
                    name = pax.get("path", name)
                    if "size" in pax:
                        size = int(pax["size"])
                        if size < 0 or data_at + size > length:
                            raise ValueError(f"{shard}: truncated tar file: the member {name!r} "
                                             f"needs {size} bytes, the file ends at {length}")
                    names.append(name)
                    offsets.append(data_at)
                    sizes.append(size)
                long_name, pax = None, {}
            at = data_at + -(-size // _BLOCK) * _BLOCK
            file.seek(at)
    return names, np.array(offsets, dtype=np.int64), np.array(sizes, dtype=np.int64)


def _ustar_name(header: bytes) -> str:
    name = header[0:100].split(b"\0", 1)[0]
    if header[257:262] == b"ustar":
        prefix = header[345:500].split(b"\0", 1)[0]
        if prefix:
            name = prefix + b"/" + name
    return name.decode("utf-8", "surrogateescape")


def index_path(shard: str, index_dir: str | None) -> str:
    if index_dir is None:
        return shard + ".fastload-idx.npz"
    digest = hashlib.sha1(os.path.abspath(shard).encode()).hexdigest()[:16]
    return os.path.join(index_dir, f"{os.path.basename(shard)}.{digest}.fastload-idx.npz")


def _identity(shard: str) -> np.ndarray:
    stat = os.stat(shard)
    return np.array([_INDEX_VERSION, stat.st_size, stat.st_mtime_ns], dtype=np.int64)


def shard_members(shard: str, index_dir: str | None = None
                  ) -> tuple[list[str], np.ndarray, np.ndarray]:
    """``read_members(shard)``, from its kept index when that is the shard's, else
    read and kept (a directory that cannot be written: read each time)."""
    try:
        identity = _identity(shard)
    except FileNotFoundError:
        raise FileNotFoundError(f"No such tar shard: {shard!r}") from None
    path = index_path(shard, index_dir)
    try:
        with np.load(path, allow_pickle=False) as kept:
            if np.array_equal(kept["identity"], identity):
                return kept["names"].tolist(), kept["offsets"], kept["sizes"]
    except (OSError, ValueError, KeyError):
        pass  # none yet, or not ours: index again
    names, offsets, sizes = read_members(shard)
    try:
        handle, temporary = tempfile.mkstemp(dir=os.path.dirname(path) or ".",
                                             prefix=".fastload-idx-", suffix=".npz")
    except OSError:
        return names, offsets, sizes
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
    return names, offsets, sizes
