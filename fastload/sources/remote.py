"""Objects behind URLs (``https://``, ``s3://``, anything fsspec reads): ranged reads.

``RemoteObject(url, storage_options, timeout, retries)`` reads byte ranges
through fsspec (``storage_options`` passed through to it), in blocks kept in
a small per-process LRU cache (``cached_blocks`` of ``block_size`` bytes), so
neighbouring reads (a tar shard's headers) cost one request.  A request that
fails for a transient reason (an HTTP 5xx, a reset or dropped connection, a
timeout) is tried again after an exponential backoff, up to ``retries``
times; then, and for 404 / 403 at once, the error names the object.  Each
request gives up after ``timeout`` seconds.  After a fork the child opens
its own client (an fsspec client belongs to the process that made it).
"""

from __future__ import annotations

import asyncio
import io
import collections
import os
import time
from typing import Any, Callable

__all__ = ["RemoteObject", "RemoteReader", "is_url"]

_TRANSIENT_ERRORS = ("ServerDisconnectedError", "ClientOSError", "ClientPayloadError",
                     "ServerTimeoutError", "ClientConnectorError", "ConnectionTimeoutError",
                     "SocketTimeoutError")


def is_url(path: str) -> bool:
    """A URL fsspec reads (not a local path, nor ``file://``)."""
    scheme, sep, _ = path.partition("://")
    return bool(sep) and scheme.isidentifier() and scheme != "file"


def _status(error: BaseException) -> int | None:
    status = getattr(error, "status", None)
    return status if isinstance(status, int) else None


def _transient(error: BaseException) -> bool:
    status = _status(error)
    if status is not None:
        return 500 <= status < 600
    return isinstance(error, (ConnectionError, TimeoutError, asyncio.TimeoutError)) \
        or type(error).__name__ in _TRANSIENT_ERRORS


class RemoteObject:
    """One object behind a URL: its size, its identity, and byte ranges of it."""

    def __init__(self, url: str, storage_options: dict | None = None, timeout: float = 30.0,
                 retries: int = 4, backoff: float = 0.25, block_size: int = 1 << 20,
                 cached_blocks: int = 16) -> None:
        self.url = url
        self.storage_options = dict(storage_options or {})
        self.timeout = float(timeout)
        self.retries = int(retries)
        self.backoff = float(backoff)
        self.block_size = int(block_size)
        self.cached_blocks = int(cached_blocks)
        self._reset()

    def _reset(self) -> None:
        self._pid = os.getpid()
        self._fs = None
        self._path = None
        self._info: dict | None = None
        self._blocks: collections.OrderedDict = collections.OrderedDict()

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        for name in ("_fs", "_path", "_info", "_blocks", "_pid"):
            del state[name]
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._reset()

    def _filesystem(self) -> Any:
        if self._pid != os.getpid():
            self._reset()
        if self._fs is None:
            import fsspec

            options = dict(self.storage_options)
            if self.url.startswith(("http://", "https://")):
                import aiohttp

                client = dict(options.get("client_kwargs", {}))
                client.setdefault("timeout", aiohttp.ClientTimeout(total=self.timeout))
                options["client_kwargs"] = client
                options.setdefault("skip_instance_cache", True)
            self._fs, self._path = fsspec.core.url_to_fs(self.url, **options)
        return self._fs

    def _call(self, what: str, request: Callable[[Any, str], Any]) -> Any:
        for attempt in range(self.retries + 1):
            try:
                return request(self._filesystem(), self._path)
            except Exception as error:  # fsspec's clients raise their own types
                if isinstance(error, FileNotFoundError) and error.__cause__ is not None:
                    error = error.__cause__  # fsspec's http info() says so of any failure
                status = _status(error)
                if status == 404 or (isinstance(error, FileNotFoundError) and status is None):
                    raise FileNotFoundError(f"No such object: {self.url!r}") from None
                if status in (401, 403):
                    raise PermissionError(f"Access to {self.url!r} was refused "
                                          f"(HTTP {status})") from None
                if not _transient(error):
                    raise OSError(f"{what} {self.url!r} failed: {error!r}") from error
                if attempt == self.retries:
                    raise OSError(f"{what} {self.url!r} failed {attempt + 1} times, the last "
                                  f"with {error!r}") from error
                time.sleep(self.backoff * 2 ** attempt)
        raise AssertionError("unreachable")

    def info(self) -> dict:
        if self._info is None or self._pid != os.getpid():
            self._info = self._call("Reading the size of", lambda fs, path: fs.info(path))
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
        first, last = offset // self.block_size, (offset + size - 1) // self.block_size
        data = b"".join(self._block(number) for number in range(first, last + 1))
        start = offset - first * self.block_size
        return data[start:start + size]

    def _block(self, number: int) -> bytes:
        if self._pid != os.getpid():
            self._reset()
        found = self._blocks.get(number)
        if found is not None:
            self._blocks.move_to_end(number)
            return found
        start = number * self.block_size
        end = min(start + self.block_size, self.length)
        found = self._call("Reading", lambda fs, path: fs.cat_file(path, start=start, end=end)) \
            if start < end else b""
        self._blocks[number] = found
        while len(self._blocks) > self.cached_blocks:
            self._blocks.popitem(last=False)
        return found


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
