"""Objects behind URLs (``https://``, ``s3://``, anything fsspec reads): ranged reads.

``RemoteObject(url, storage_options, timeout, retries)`` reads byte ranges
through fsspec (``storage_options`` passed through to it), in blocks kept in
a small per-process LRU cache (``cached_blocks`` of ``block_size`` bytes), so
neighbouring reads (a tar shard's headers) cost one request.  A read that
spans several missing blocks asks for them concurrently.  The objects of a
dataset share a ``RemoteClient`` (``remote_client``: the fsspec client, the
retries with backoff, errors naming the object, the concurrency bound), and
a dataset that knows the ranges a batch will read stages them first, all at
once (``RemoteClient.stage``): a read inside a staged range is answered from
it.  After a fork the child opens its own client.
"""

from __future__ import annotations

import collections
import io
import os
from typing import Any

from fastload.sources.remote_client import RemoteClient

__all__ = ["RemoteObject", "RemoteReader", "RemoteClient", "is_url"]


def is_url(path: str) -> bool:
    """A URL fsspec reads (not a local path, nor ``file://``)."""
    scheme, sep, _ = path.partition("://")
    return bool(sep) and scheme.isidentifier() and scheme != "file"


class RemoteObject:
    """One object behind a URL: its size, its identity, and byte ranges of it."""

    def __init__(self, url: str, storage_options: dict | None = None, timeout: float = 30.0,
                 retries: int = 4, backoff: float = 0.25, block_size: int = 1 << 20,
                 cached_blocks: int = 16, *, client: RemoteClient | None = None) -> None:
        self.url = url
        self.client = client if client is not None else \
            RemoteClient(storage_options, timeout, retries, backoff)
        self.block_size = int(block_size)
        self.cached_blocks = int(cached_blocks)
        self._reset()

    def _reset(self) -> None:
        self._pid = os.getpid()
        self._info: dict | None = None
        self._blocks: collections.OrderedDict = collections.OrderedDict()

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        for name in ("_info", "_blocks", "_pid"):
            del state[name]
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._reset()

    def info(self) -> dict:
        if self._info is None or self._pid != os.getpid():
            if self._pid != os.getpid():
                self._reset()
            self._info = self.client.call(self.url, "Reading the size of",
                                          lambda fs, path: fs.info(path))
        return self._info

    @property
    def length(self) -> int:
        return int(self.info()["size"])

    def identity(self) -> str | None:
        """What tells this object's versions apart (ETag, else Last-Modified), or None."""
        info = self.info()
        for key in ("ETag", "etag", "ETAG", "Last-Modified", "LastModified", "mtime"):
            if info.get(key):
                return f"{info['size']}:{info[key]}"
        return None

    def read(self, offset: int, size: int) -> bytes:
        """``size`` bytes from ``offset`` (fewer at the end of the object)."""
        if size <= 0:
            return b""
        staged = self.client.staged(self.url, offset, size)
        if staged is not None:
            return staged
        first, last = offset // self.block_size, (offset + size - 1) // self.block_size
        data = b"".join(self._blocks_of(range(first, last + 1)))
        start = offset - first * self.block_size
        return data[start:start + size]

    def _blocks_of(self, numbers: range) -> list[bytes]:
        """Blocks ``numbers``, from the cache or read (the missing ones concurrently)."""
        if self._pid != os.getpid():
            self._reset()
        found = {number: self._blocks.get(number) for number in numbers}
        missing = [number for number, block in found.items() if block is None]
        if missing:
            length = self.length
            spans = [(number * self.block_size,
                      min((number + 1) * self.block_size, length)) for number in missing]
            wanted = [(self.url, start, end) for start, end in spans if start < end]
            fetched = iter(self.client.fetch(wanted) if wanted else ())
            for number, (start, end) in zip(missing, spans):
                found[number] = next(fetched) if start < end else b""
        for number in numbers:
            self._blocks[number] = found[number]
            self._blocks.move_to_end(number)
        while len(self._blocks) > self.cached_blocks:
            self._blocks.popitem(last=False)
        return [found[number] for number in numbers]


class RemoteReader(io.RawIOBase):
    """A ``RemoteObject`` as a read-only, seekable binary file (pyarrow reads one)."""

    def __init__(self, source: RemoteObject) -> None:
        super().__init__()
        self.source = source
        self.name = source.url
        self._position = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._position

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self._position,
                io.SEEK_END: self.source.length}[whence]
        self._position = max(0, base + offset)
        return self._position

    def readinto(self, buffer: Any) -> int:
        data = self.source.read(self._position, len(buffer))
        buffer[:len(data)] = data
        self._position += len(data)
        return len(data)

    def read(self, size: int = -1) -> bytes:
        if size is None or size < 0:
            size = max(self.source.length - self._position, 0)
        data = self.source.read(self._position, size)
        self._position += len(data)
        return data
