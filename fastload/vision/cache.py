"""A decoded-image cache behind ``ImageFolder`` / ``DatasetFolder`` (``cache=DIR``).

Decoding JPEGs is most of what loading images costs, and every epoch decodes
every file again.  With ``cache=DIR`` the first epoch decodes each image as
usual and also stores it, shrunk so its longer side is at most
``cache_max_side``, in a memory-mapped store under ``DIR``
(``fastload.vision.cache_store``: a data file and an index per writing
process).  Later epochs, and later runs, read the pixels from the store.

What the transforms see
-----------------------
The cached image stands in for the file: transforms run on it as if it were
the file.  It is the image as the loader gives it (RGB for the default
loader), then, when its longer side exceeds ``cache_max_side``, resized with
Pillow's LANCZOS filter (the sharpest antialiased filter Pillow has; it runs
once per image, at fill time) so that the longer side is exactly
``cache_max_side`` and the shorter keeps the aspect ratio (rounded, at least
1).  Images never grow.  With the default loader a JPEG at least twice the
cached size each way is decoded at 1/2, 1/4 or 1/8 scale, the smallest whose
pixels still cover the cached size (the step ``Image.thumbnail`` takes), and
the LANCZOS resize reads the whole frame from that: a camera photo fills at
about the cost of an uncached epoch, and its cached pixels differ from those
of a full decode by resampling error only (``fastload.vision.decode``).  So:

* an image within ``cache_max_side`` gives exactly the pixels a full decode
  gives, and the transforms then exactly what they give on that decode;
* a larger image is seen by the transforms at the cached size:
  ``RandomResizedCrop`` draws its box (area fraction and ratio, the same
  random numbers) on the cached size, and ``Resize`` / ``CenterCrop`` work on
  the cached pixels; the output has the size the transform asks for, made
  from fewer source pixels.
* with ``cache_format="jpeg"`` the cached image is that image re-encoded as a
  JPEG of quality 90 (Pillow's defaults otherwise), decoded again: every epoch,
  the first too, sees the re-encoded image, and a crop large enough for a
  reduced-size decode of it uses one, as it would on a file.

The first epoch sees the same cached image as later ones.  Images the cache
does not keep (past ``cache_max_bytes``, or when the directory cannot be
written) load exactly as without a cache.

What keys an entry
------------------
Everything that decides its pixels (so one directory serves several settings
and loaders side by side, none with another's pixels): the file (absolute
path, size, ``st_mtime_ns``, inode: a changed or replaced file is decoded
again), ``cache_max_side``, ``cache_format``, the checksum in use, and the
loader (``cache_key.key_for_loader``: the user's ``cache_key=``, else the loader's
identity).  A loader without a trustworthy identity and without ``cache_key``
loads uncached, with one warning.  A file that is gone raises what it raises
without the cache.  Off a local file system each writing process keeps to
files of its own (``cache_filesystems``, ``cache_store``).
"""

from __future__ import annotations

import hashlib
import io
import os
import struct
import threading
import time
import warnings
import weakref
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from typing import Any

import numpy as np
from PIL import Image

from .. import _core
from .._lifetime.hooks import at_fork
from .cache_checksums import checksum_name, data_checksum
from .cache_filesystems import writers_kept_apart
from .cache_key import UnidentifiedLoader, key_for_loader
from .cache_store import DataFiles, Entry, IndexTable, StoreWriter, data_bytes
from .cache_verified import VerifiedEntries
from .decode import (_flip_and_to_array, _render, decode_covering, decode_planned_stream,
                     default_loader, pil_loader, render_planned, split_planned_head)
from .resample import fusable, pillow_memory, resize_rgb_bytes_to_chw
from .interpolation import PIL_FILTERS

__all__ = ["DecodedImageCache", "make_image_cache", "cached_size", "CACHE_FORMATS"]

CACHE_FORMATS = ("raw", "jpeg")
JPEG_QUALITY = 90
_RAW, _JPEG = 0, 1
_MODES = ("L", "RGB", "RGBA")  # stored mode number -> Pillow mode
_MODE_NUMBERS = {mode: number for number, mode in enumerate(_MODES)}
_BYTES_PER_PIXEL = {"L": 1, "RGB": 3, "RGBA": 4}
# How often a process looks for entries other processes committed, at most,
# while it meets images it has not seen stored, and re-counts the store's size.
_REFRESH_SECONDS = 1.0
_RESIZE_FILTER = Image.Resampling.LANCZOS
# The start of every key: a new layout of keys makes every older entry a miss.
_KEY_LAYOUT = b"fastload image cache key 2"

Steps = Sequence[Callable[[Any], Any]]


def cached_size(width: int, height: int, max_side: int) -> tuple[int, int]:
    """The ``(width, height)`` an image is cached at: the longer side at most ``max_side``."""
    longer = max(width, height)
    if longer <= max_side:
        return width, height
    if width >= height:
        return max_side, max(1, round(height * max_side / width))
    return max(1, round(width * max_side / height)), max_side


def make_image_cache(cache: str | os.PathLike | None, max_side: int = 512,
                     max_bytes: int | None = None, format: str = "raw",
                     key: str | None = None,
                     loader: Callable[[str], Any] | None = None) -> "DecodedImageCache | None":
    """The folder datasets' ``cache*`` arguments checked and turned into a cache (or None).

    ``loader``: the dataset's, identified now, so that a loader the cache cannot
    identify is warned of once, in this process, rather than in every worker."""
    if not isinstance(max_side, int) or isinstance(max_side, bool) or max_side < 1:
        raise ValueError(f"cache_max_side must be a positive int, got {max_side!r}")
    if max_bytes is not None and (not isinstance(max_bytes, int) or isinstance(max_bytes, bool)
                                  or max_bytes < 0):
        raise ValueError(f"cache_max_bytes must be None or an int >= 0, got {max_bytes!r}")
    if format not in CACHE_FORMATS:
        raise ValueError(f"cache_format must be one of {CACHE_FORMATS}, got {format!r}")
    if key is not None and not isinstance(key, str):
        raise TypeError(f"cache_key must be None or a str naming the loader, got "
                        f"{type(key).__name__}")
    if key == "":
        raise ValueError("cache_key must be None or a non-empty str naming the loader")
    if cache is None:
        return None
    if not isinstance(cache, (str, os.PathLike)):
        raise TypeError(f"cache must be a directory path (str or os.PathLike), got "
                        f"{type(cache).__name__}")
    made = DecodedImageCache(cache, max_side=max_side, max_bytes=max_bytes, format=format, key=key)
    if loader is not None:
        made.loader_key(loader)
    return made


class DecodedImageCache:
    """Decoded images of a folder dataset, stored under ``directory`` and shared by processes.

    ``load`` is what the dataset calls per sample; ``stats()`` counts this
    process's hits, fills and skips.  Picklable (a spawned worker opens the
    store itself); a forked one shares its parent's index pages.  ``key``:
    the user's name for the loader (``cache_key=``), or None to identify it.
    """

    def __init__(self, directory: str | os.PathLike, max_side: int = 512,
                 max_bytes: int | None = None, format: str = "raw",
                 key: str | None = None) -> None:
        self.directory = os.path.abspath(os.path.expanduser(os.fspath(directory)))
        self.max_side, self.max_bytes, self.format = max_side, max_bytes, format
        self.key = key
        self._usable, self._warned, self._warned_loader = True, False, False
        try:
            os.makedirs(self.directory, exist_ok=True)
        except OSError as error:
            self._usable = False
            self._warn(error, "cannot be created")
        # Off a local file system, writers keep to files of their own (warned once).
        self._solo = self._usable and writers_kept_apart(self.directory)
        self._start_process()
        _LIVE_CACHES.add(self)

    def _start_process(self) -> None:
        """Per-process state: a fresh table and maps, no writer yet, zeroed stats."""
        self._pid = os.getpid()
        self._settings = struct.pack("<q", self.max_side) + b"\0".join(
            (self.format.encode(), checksum_name().encode()))
        self._loader_memo: tuple[Any, bytes | None] = (None, None)
        self._table = IndexTable(self.directory)
        self._files = DataFiles(self.directory)
        self._verified = VerifiedEntries()
        self._writer: StoreWriter | None = None
        self._writes_off = not self._usable
        self._bound_reached = False
        self._warned = not self._usable
        self._refreshed_at = float("-inf")
        self._refreshed_in = -1
        self._counted_at, self._counted_bytes = float("-inf"), 0
        self._lock = threading.Lock()
        self._stats = dict(hits=0, stored=0, stored_bytes=0, over_bound=0, not_cached=0)

    def __getstate__(self) -> dict:
        return dict(directory=self.directory, max_side=self.max_side, max_bytes=self.max_bytes,
                    format=self.format, key=self.key, usable=self._usable, solo=self._solo,
                    warned_loader=self._warned_loader)

    def __setstate__(self, state: dict) -> None:
        self.directory, self.max_side = state["directory"], state["max_side"]
        self.max_bytes, self.format, self.key = state["max_bytes"], state["format"], state["key"]
        self._usable, self._solo = state["usable"], state["solo"]
        self._warned_loader = state["warned_loader"]
        self._start_process()
        _LIVE_CACHES.add(self)

    def __repr__(self) -> str:
        return (f"DecodedImageCache({self.directory!r}, max_side={self.max_side}, "
                f"max_bytes={self.max_bytes}, format={self.format!r}, key={self.key!r})")

    def loader_key(self, loader: Callable[[str], Any]) -> bytes | None:
        """What stands for ``loader`` in its entries' keys: ``cache_key`` when given,
        else its identity (``cache_key.loader_identity``); None when it has none
        (warned once: its images load uncached)."""
        memo_loader, memo = self._loader_memo
        if memo_loader is loader and memo_loader is not None:
            return memo
        try:
            identity: bytes | None = key_for_loader(loader, self.key)
        except UnidentifiedLoader as reason:
            identity = None
            self._warn_unidentified(loader, reason)
        self._loader_memo = (loader, identity)
        return identity

    def _warn_unidentified(self, loader: Any, reason: UnidentifiedLoader) -> None:
        if self._warned_loader:
            return
        self._warned_loader = True
        warnings.warn(f"fastload image cache {self.directory!r}: the loader {loader!r} cannot "
                      f"be told apart from other loaders (it depends on {reason}), so its "
                      f"images are loaded without the cache; pass cache_key='<a name for this "
                      f"loader>' to cache them (a name that changes whenever its pixels do)",
                      RuntimeWarning, stacklevel=4)

    def stats(self) -> dict:
        """This process's counts: ``hits`` (read from the store), ``stored`` and
        ``stored_bytes`` (what the store grew by), ``over_bound`` (not stored: ``max_bytes``),
        ``not_cached`` (loaded as without a cache), and ``entries`` it knows of."""
        return dict(self._stats, entries=len(self._table))

    # -- per sample ---------------------------------------------------------

    def load(self, path: str, loader: Callable[[str], Any], transform: Any,
             reading: AbstractContextManager) -> tuple[Any, Steps] | None:
        """``(sample, steps still to apply)`` from the store, or decoded and stored now;
        None when this image is not cached (the caller loads it as without a cache).

        Reading the file (and its ``stat``) runs inside ``reading``, as the
        folder's own loading does, so errors name the sample the same way.
        """
        if not self._usable:
            return None
        if self._pid != os.getpid():
            self._after_fork()
        identity = self.loader_key(loader)
        if identity is None:
            self._stats["not_cached"] += 1
            return None
        with reading:
            stat = os.stat(path)
        key = self._key(path, stat, identity)
        entry = self._find(key)
        if entry is not None:
            done = self._from_entry(entry, transform)
            if done is not None:
                self._stats["hits"] += 1
                return done
        if self._writes_off or self._bound_reached or (
                self.max_bytes is not None and self._store_bytes() >= self.max_bytes):
            self._stats["not_cached"] += 1
            return None
        img, full_size, reduction, key = self._decode_for_fill(path, loader, identity, key, reading)
        if not isinstance(img, Image.Image) or img.mode not in _MODE_NUMBERS:
            self._stats["not_cached"] += 1  # nothing the store can hold: as it is
            return img, (() if transform is None else (transform,))
        fitted = self._fit(img, full_size, reduction)
        payload, fmt, data_sum = self._encode(fitted)
        if key is None or not self._store(key, payload, fitted, fmt, data_sum):
            # Not kept (changed while read, over the bound, a failed write):
            # loaded as without a cache, like every image not cached.
            self._stats["not_cached"] += 1
            return None
        # Every epoch, this one too, sees the stored image (a re-encoded JPEG is
        # decoded again), and raw pixels take the fast path from bytes.
        return self._from_payload(payload, fitted.width, fitted.height, fitted.mode, fmt,
                                  transform)

    def _key(self, path: str, stat: os.stat_result, identity: bytes) -> tuple[int, int]:
        """The entry's 128-bit key: the file, the settings, and the loader."""
        name = os.fsencode(os.path.abspath(path))
        digest = hashlib.blake2b(_KEY_LAYOUT, digest_size=16)
        digest.update(struct.pack("<QqqQ", len(name), stat.st_size, stat.st_mtime_ns,
                                  stat.st_ino))
        digest.update(name)
        digest.update(struct.pack("<Q", len(self._settings)) + self._settings)
        digest.update(identity)
        raw = digest.digest()
        return int.from_bytes(raw[:8], "little"), int.from_bytes(raw[8:], "little")

    def _find(self, key: tuple[int, int]) -> Entry | None:
        entry = self._table.find(*key)
        if entry is None:
            now = time.monotonic()
            if now - self._refreshed_at >= _REFRESH_SECONDS or self._refreshed_in != self._pid:
                self.refresh(now)
                entry = self._table.find(*key)
        return entry

    def refresh(self, now: float | None = None) -> None:
        """Read the entries other processes committed since the last look."""
        if not self._usable:
            return
        with self._lock:
            self._table.refresh()
            self._refreshed_at = time.monotonic() if now is None else now
            self._refreshed_in = os.getpid()

    def _after_fork(self) -> None:
        """In a forked child: keep the parent's table (shared pages), drop its writer."""
        if self._writer is not None:
            self._writer.close()  # the parent's lock stays the parent's
            self._writer = None
        self._pid = os.getpid()
        self._lock = threading.Lock()
        self._stats = dict.fromkeys(self._stats, 0)

    # -- reading ------------------------------------------------------------

    def _from_entry(self, entry: Entry, transform: Any) -> tuple[Any, Steps] | None:
        view = self._files.view(entry)
        if view is None or entry.mode >= len(_MODES):
            return None
        if entry not in self._verified:  # committed bytes never change: check once
            if data_checksum(view) != entry.data_sum:
                return None  # bytes missing or damaged (a crash of the machine): decode again
            self._verified.add(entry)
        try:
            return self._from_payload(view, entry.width, entry.height, _MODES[entry.mode],
                                      entry.format, transform)
        except (OSError, ValueError, SyntaxError):  # what Pillow raises on bad bytes
            return None

    def _from_payload(self, payload: Any, width: int, height: int, mode: str, fmt: int,
                      transform: Any) -> tuple[Any, Steps]:
        if fmt == _RAW:
            if len(payload) != width * height * _BYTES_PER_PIXEL[mode]:
                raise ValueError("stored image has the wrong length")
            if mode == "RGB" and transform is not None:
                fused = _fused_from_pixels(payload, width, height, transform)
                if fused is not None:
                    return fused
            return _apply(Image.frombytes(mode, (width, height), payload), transform)
        stream = io.BytesIO(payload)
        head, rest = split_planned_head(transform) if transform is not None else (None, ())
        if head is not None and mode == "RGB":
            return decode_planned_stream(stream, head, rest)
        img = Image.open(stream)
        img.load()
        if img.mode != mode or img.size != (width, height):
            raise ValueError("stored JPEG does not decode to the stored size and mode")
        return _apply(img.copy() if transform is None else img, transform)

    # -- filling ------------------------------------------------------------

    def _decode_for_fill(self, path: str, loader: Callable[[str], Any], identity: bytes,
                         key: tuple[int, int], reading: AbstractContextManager
                         ) -> tuple[Any, tuple[int, int], int, tuple[int, int] | None]:
        """``(image, the file's full size, the JPEG reduction it was decoded at, key)``:
        the key of the file decoded, None when it changed while being read (then
        not stored).

        The default loaders' JPEGs decode at the smallest scale that still
        covers the cached size (``decode_covering``); any other loader's image
        is what it returns.
        """
        if loader is default_loader or loader is pil_loader:
            with reading:
                f = open(path, "rb")
            with f:
                with reading:
                    stat = os.fstat(f.fileno())
                img, full_size, reduction = decode_covering(
                    f, lambda width, height: cached_size(width, height, self.max_side), reading)
            # The file decoded, even if just replaced.
            return img, full_size, reduction, self._key(path, stat, identity)
        with reading:
            img = loader(path)
        try:
            after = self._key(path, os.stat(path), identity)
        except OSError:
            after = None
        size = img.size if isinstance(img, Image.Image) else (0, 0)
        return img, size, 1, (key if after == key else None)

    def _fit(self, img: Image.Image, full_size: tuple[int, int], reduction: int) -> Image.Image:
        """``img``, decoded at ``1/reduction`` of ``full_size``, at the size it is cached at."""
        size = cached_size(*full_size, self.max_side)
        if reduction == 1:
            return img if size == img.size else img.resize(size, _RESIZE_FILTER)
        width, height = full_size
        return img.resize(size, _RESIZE_FILTER, box=(0, 0, width / reduction, height / reduction))

    def _encode(self, img: Image.Image) -> tuple[Any, int, int | None]:
        """The bytes to store, their format, and their ``data_checksum`` when known."""
        if self.format == "jpeg" and img.mode in ("L", "RGB"):
            buffer = io.BytesIO()
            img.save(buffer, "JPEG", quality=JPEG_QUALITY)
            return buffer.getvalue(), _JPEG, None
        if img.mode == "RGB":
            packed = _packed_rgb(img)
            if packed is not None:
                return packed[0], _RAW, packed[1]
        return img.tobytes(), _RAW, None

    def _store(self, key: tuple[int, int], payload: Any, img: Image.Image, fmt: int,
               data_sum: int | None = None) -> bool:
        """Commit one entry; False when it was not kept (the bound, a failed write)."""
        if self.max_bytes is not None and self._store_bytes() + len(payload) > self.max_bytes:
            self._stats["over_bound"] += 1
            self._bound_reached = True  # the store only grows: later images go uncached
            return False
        try:
            with self._lock:
                if self._writer is None:
                    self._writer = StoreWriter(self.directory, solo=self._solo)
                record, at, added = self._writer.append(key[0], key[1], payload, img.width,
                                                 img.height, _MODE_NUMBERS[img.mode], fmt,
                                                 data_sum)
                self._table.add_own(record, self._writer.stem, at)
                self._verified.add(_own_entry(record, self._writer.stem))
        except OSError as error:
            self._writes_off = True
            if self._writer is not None:
                self._writer.close()
                self._writer = None
            self._warn(error, "cannot be written")
            return False
        self._counted_bytes += added
        self._stats["stored"] += 1
        self._stats["stored_bytes"] += added
        return True

    def _store_bytes(self) -> int:
        """The store's size: re-counted at most once a second, plus what this process added."""
        now = time.monotonic()
        if now - self._counted_at >= _REFRESH_SECONDS:
            self._counted_at, self._counted_bytes = now, data_bytes(self.directory)
        return self._counted_bytes

    def _warn(self, error: OSError, what: str) -> None:
        if self._warned:
            return
        self._warned = True
        warnings.warn(f"fastload image cache {self.directory!r} {what} ({error}); images "
                      f"not cached yet are loaded from their files, without storing them",
                      RuntimeWarning, stacklevel=4)


def _apply(img: Image.Image, transform: Any) -> tuple[Any, Steps]:
    """``(sample, steps left)`` of ``transform`` on a decoded image, fused where it can be."""
    if transform is None:
        return img, ()
    head, rest = split_planned_head(transform)
    if head is None:
        return img, (transform,)
    return render_planned(img, head, rest)


def _own_entry(record: Any, stem: str) -> Entry:
    """The entry this process just committed: its bytes are the ones it summed."""
    (_, _, _, _, offset, length, width, height, mode, fmt, data_sum, _) = record[0].item()
    return Entry(stem + ".data", offset, length, width, height, mode, fmt, data_sum)


def _packed_rgb(img: Image.Image) -> tuple[np.ndarray, int] | None:
    """An RGB image's packed pixels, in one copy out of Pillow's memory
    (``_core.pack_rgb_arrow``), and their ``data_checksum``; None where Pillow
    cannot lend it (``resample.pillow_memory``)."""
    lent = pillow_memory(img)
    if lent is None:
        return None
    schema, array = lent
    pixels = img.width * img.height
    out = np.empty(3 * pixels, dtype=np.uint8)
    if _core.pack_rgb_arrow(schema, array, pixels, out) is None:
        return None
    return out, data_checksum(out)


def _fused_from_pixels(payload: Any, width: int, height: int, transform: Any
                       ) -> tuple[Any, Steps] | None:
    """``render_planned`` of stored raw RGB pixels, straight from the mapped bytes to
    the output array, when the pipeline starts ``Resize``/``RandomResizedCrop``,
    ``[RandomHorizontalFlip,] ToArray``: the same pixels and random draws (plan,
    then flip) without a PIL image.  None for any other pipeline, decided
    before a random number is drawn."""
    head, rest = split_planned_head(transform)
    flip_step, fused_steps = _flip_and_to_array(rest)
    interpolation = getattr(head, "interpolation", None)
    if not fused_steps or interpolation not in PIL_FILTERS \
            or not fusable("RGB", PIL_FILTERS[interpolation]):
        return None
    plan = head.plan_region(width, height)
    if plan.is_empty:  # only Pillow's own steps say what happens there
        return _render(Image.frombytes("RGB", (width, height), payload), plan, 1, rest)
    flip = flip_step.flips() if flip_step is not None else False
    return (resize_rgb_bytes_to_chw(payload, width, height, plan.box, plan.size, plan.resample,
                                    flip), rest[fused_steps:])


# Before a fork, each live cache reads what the store gained, so forked
# workers start with the whole index in pages they share with the parent.
_LIVE_CACHES: "weakref.WeakSet[DecodedImageCache]" = weakref.WeakSet()


def _refresh_before_fork() -> None:
    for cache in list(_LIVE_CACHES):
        try:
            if cache._pid == os.getpid() and time.monotonic() - cache._refreshed_at > 0.2:
                cache.refresh()
        except Exception:
            pass  # a fork must not fail for a cache: children refresh on their own


at_fork("image cache index", before=_refresh_before_fork)
