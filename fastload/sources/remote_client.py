"""What the objects of one dataset share: a client per process, retries, concurrent ranges.

``RemoteClient(storage_options, timeout, retries, backoff, max_concurrency)``
holds one fsspec filesystem per protocol and process (after a fork the
child opens its own: a client belongs to the process that made it).  A
single request (``call``) that fails for a transient reason (an HTTP 5xx,
a reset or dropped connection, a timeout) is tried again after an
exponential backoff, up to ``retries`` times; then, and for 404 / 403 at
once, the error names the object.

``fetch([(url, start, end), ...])`` reads many byte ranges at once: through
the filesystem's own concurrent ``cat_ranges`` (fsspec's HTTP and S3
clients run them on their event loop), at most ``max_concurrency`` in
flight; the ranges that failed transiently are asked again, together, after
the backoff.  Each request gives up after ``timeout`` seconds, and the whole
call waits no longer than its requests' rounds could take.

``stream([...])`` asks for every range at once in the same way and yields
their bytes in order as they arrive, so the first can be used (a sample
decoded) while the rest are on their way; the order of use, hence of any
random draws made with them, stays the order asked.

``stage(...)`` keeps the ranges a batch is about to read (its samples' byte
spans, its row groups' column chunks), fetched in one concurrent call,
until the next batch stages its own: ``staged(url, offset, size)`` answers
reads that fall inside them.
"""

from __future__ import annotations

import asyncio
import bisect
import concurrent.futures
import math
import os
import time
from typing import Any, Callable, Iterable, Iterator

__all__ = ["RemoteClient", "merge_spans"]

_TRANSIENT_ERRORS = ("ServerDisconnectedError", "ClientOSError", "ClientPayloadError",
                     "ServerTimeoutError", "ClientConnectorError", "ConnectionTimeoutError",
                     "SocketTimeoutError", "FSTimeoutError")

# Ranges closer than this are read as one: a request costs more than a few KiB more.
MERGE_GAP = 16 << 10


def _status(error: BaseException) -> int | None:
    status = getattr(error, "status", None)
    return status if isinstance(status, int) else None


def _transient(error: BaseException) -> bool:
    status = _status(error)
    if status is not None:
        return 500 <= status < 600
    return isinstance(error, (ConnectionError, TimeoutError, asyncio.TimeoutError)) \
        or type(error).__name__ in _TRANSIENT_ERRORS


def merge_spans(spans: Iterable[tuple[int, int]], gap: int = MERGE_GAP) -> list[tuple[int, int]]:
    """``(start, end)`` spans sorted, with those overlapping or closer than ``gap`` joined."""
    merged: list[list[int]] = []
    for start, end in sorted(spans):
        if end <= start:
            continue
        if merged and start <= merged[-1][1] + gap:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return [(start, end) for start, end in merged]


class RemoteClient:
    """Shared by the ``RemoteObject``s of a dataset: see the module."""

    def __init__(self, storage_options: dict | None = None, timeout: float = 30.0,
                 retries: int = 4, backoff: float = 0.25, max_concurrency: int = 32) -> None:
        if isinstance(max_concurrency, bool) or not isinstance(max_concurrency, int) \
                or max_concurrency < 1:
            raise ValueError(f"max_concurrency should be a positive integer, "
                             f"but got {max_concurrency!r}")
        self.storage_options = dict(storage_options or {})
        self.timeout = float(timeout)
        self.retries = int(retries)
        self.backoff = float(backoff)
        self.max_concurrency = max_concurrency
        self._reset()

    def _reset(self) -> None:
        self._pid = os.getpid()
        self._filesystems: dict[str, tuple[Any, str]] = {}
        self._staged: dict[str, tuple[list[int], list[bytes]]] = {}

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        for name in ("_pid", "_filesystems", "_staged"):
            del state[name]
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._reset()

    def filesystem(self, url: str) -> tuple[Any, str]:
        """``(fsspec filesystem, path in it)`` of ``url``, the filesystem made once per process."""
        if self._pid != os.getpid():
            self._reset()
        # Objects of one scheme share a filesystem, so a batch's ranges go out in one
        # concurrent call; a chained URL (``simplecache::s3://``) has its own.
        chained = "::" in url
        key = url if chained else url.partition("://")[0]
        found = self._filesystems.get(key)
        if found is not None:
            return found if chained else (found[0], found[0]._strip_protocol(url))
        import fsspec

        options = dict(self.storage_options)
        if url.startswith(("http://", "https://")):
            import aiohttp

            client = dict(options.get("client_kwargs", {}))
            client.setdefault("timeout", aiohttp.ClientTimeout(total=self.timeout))
            options["client_kwargs"] = client
            options.setdefault("skip_instance_cache", True)
        found = self._filesystems[key] = fsspec.core.url_to_fs(url, **options)
        return found

    def _fatal(self, url: str, what: str, error: BaseException) -> BaseException | None:
        """The error to raise for ``error`` at once, or None when it is worth retrying."""
        if isinstance(error, FileNotFoundError) and error.__cause__ is not None:
            error = error.__cause__  # fsspec's http info() says so of any failure
        status = _status(error)
        if status == 404 or (isinstance(error, FileNotFoundError) and status is None):
            return FileNotFoundError(f"No such object: {url!r}")
        if status in (401, 403):
            return PermissionError(f"Access to {url!r} was refused (HTTP {status})")
        if isinstance(error, PermissionError):  # s3fs's translation of a 403 (AccessDenied)
            return PermissionError(f"Access to {url!r} was refused: {error}")
        if not _transient(error):
            failure = OSError(f"{what} {url!r} failed: {error!r}")
            failure.__cause__ = error
            return failure
        return None

    def _gave_up(self, url: str, what: str, attempts: int, error: BaseException) -> OSError:
        failure = OSError(f"{what} {url!r} failed {attempts} times, the last with {error!r}")
        failure.__cause__ = error
        return failure

    def call(self, url: str, what: str, request: Callable[[Any, str], Any]) -> Any:
        """``request(fs, path)``, retried as the module says."""
        for attempt in range(self.retries + 1):
            try:
                return request(*self.filesystem(url))
            except Exception as error:  # fsspec's clients raise their own types
                fatal = self._fatal(url, what, error)
                if fatal is not None:
                    raise fatal from None
                if attempt == self.retries:
                    raise self._gave_up(url, what, attempt + 1, error) from None
                time.sleep(self.backoff * 2 ** attempt)
        raise AssertionError("unreachable")

    def fetch(self, ranges: list[tuple[str, int, int]]) -> list[bytes]:
        """The bytes of each ``(url, start, end)``, read concurrently (see the module)."""
        results: list[bytes | None] = [None] * len(ranges)
        pending = list(range(len(ranges)))
        for attempt in range(self.retries + 1):
            answers = self._fetch_once([ranges[i] for i in pending])
            failed = []
            for number, answer in zip(pending, answers):
                if not isinstance(answer, BaseException):
                    results[number] = answer
                    continue
                fatal = self._fatal(ranges[number][0], "Reading", answer)
                if fatal is not None:
                    raise fatal from None
                failed.append(number)
            if not failed:
                return results  # type: ignore[return-value]
            url, error = ranges[failed[0]][0], answers[pending.index(failed[0])]
            if attempt == self.retries:
                raise self._gave_up(url, "Reading", attempt + 1, error) from None
            time.sleep(self.backoff * 2 ** attempt)
            pending = failed
        raise AssertionError("unreachable")

    def _fetch_once(self, ranges: list[tuple[str, int, int]]) -> list[Any]:
        """One try at every range: its bytes, or the exception it met."""
        if len(ranges) == 1:
            url, start, end = ranges[0]
            try:
                fs, path = self.filesystem(url)
                return [fs.cat_file(path, start=start, end=end)]
            except Exception as error:
                return [error]
        by_filesystem: dict[int, list[int]] = {}
        located = []
        for number, (url, _, _) in enumerate(ranges):
            fs, path = self.filesystem(url)
            located.append((fs, path))
            by_filesystem.setdefault(id(fs), []).append(number)
        answers: list[Any] = [None] * len(ranges)
        for numbers in by_filesystem.values():
            fs = located[numbers[0]][0]
            paths = [located[n][1] for n in numbers]
            starts = [ranges[n][1] for n in numbers]
            ends = [ranges[n][2] for n in numbers]
            try:
                if getattr(fs, "async_impl", False):
                    # One request per range on the client's event loop, a bounded
                    # window of them in flight; sync() waits no longer than the
                    # rounds of per-request timeouts that window allows.
                    rounds = math.ceil(len(numbers) / self.max_concurrency)
                    got = fs.cat_ranges(paths, starts, ends, on_error="return",
                                        batch_size=self.max_concurrency,
                                        timeout=self.timeout * (rounds + 1))
                else:  # a synchronous filesystem reads them in turn
                    got = fs.cat_ranges(paths, starts, ends, on_error="return")
            except Exception as error:  # the whole call timed out, or the client broke
                got = [error] * len(numbers)
            for number, answer in zip(numbers, got):
                answers[number] = answer
        return answers

    def stream(self, ranges: list[tuple[str, int, int]]) -> Iterator[bytes]:
        """The bytes of each ``(url, start, end)``, in order, as they arrive (see the module)."""
        located = [self.filesystem(url) for url, _, _ in ranges]
        if not all(getattr(fs, "async_impl", False) for fs, _ in located):
            yield from self.fetch(ranges)  # a synchronous client: all read first
            return
        window = asyncio.Semaphore(self.max_concurrency)  # bound to the client's loop on use

        async def bounded(fs: Any, path: str, start: int, end: int) -> bytes:
            async with window:
                return await fs._cat_file(path, start=start, end=end)

        futures = [asyncio.run_coroutine_threadsafe(bounded(fs, path, start, end), fs.loop)
                   for (fs, path), (_, start, end) in zip(located, ranges)]
        # No longer than the rounds of per-request timeouts the window allows.
        deadline = time.monotonic() + self.timeout * (
            math.ceil(len(ranges) / self.max_concurrency) + 1)
        try:
            for future, (url, start, end) in zip(futures, ranges):
                try:
                    data = future.result(timeout=max(deadline - time.monotonic(), 0.0))
                except concurrent.futures.CancelledError:
                    raise
                except Exception as error:  # fsspec's clients raise their own types
                    fatal = self._fatal(url, "Reading", error)
                    if fatal is not None:
                        raise fatal from None
                    data = self.fetch([(url, start, end)])[0]  # again, with the backoff
                yield data
        finally:  # the consumer stopped (an error, a break): nothing left in flight for it
            for future in futures:
                future.cancel()

    # -- the ranges a batch is about to read ---------------------------------

    def stage(self, spans: dict[str, list[tuple[int, int]]]) -> None:
        """Fetch ``{url: [(start, end), ...]}`` concurrently (merged, see ``merge_spans``)
        and keep them in place of what the last batch staged."""
        if self._pid != os.getpid():
            self._reset()
        self._staged = {}  # the last batch's, dropped before this one's arrive
        wanted = [(url, start, end) for url, url_spans in spans.items()
                  for start, end in merge_spans(url_spans)]
        if not wanted:
            return
        fetched = self.fetch(wanted)
        staged: dict[str, tuple[list[int], list[bytes]]] = {}
        for (url, start, _), data in zip(wanted, fetched):
            starts, chunks = staged.setdefault(url, ([], []))
            starts.append(start)
            chunks.append(data)
        self._staged = staged

    def staged(self, url: str, offset: int, size: int) -> bytes | None:
        """``size`` bytes of ``url`` from ``offset`` when a staged range holds them all."""
        if self._pid != os.getpid():
            self._reset()
        found = self._staged.get(url)
        if found is None:
            return None
        starts, chunks = found
        at = bisect.bisect_right(starts, offset) - 1
        if at < 0:
            return None
        start, chunk = starts[at], chunks[at]
        if offset + size > start + len(chunk):
            return None
        return chunk[offset - start:offset - start + size]
