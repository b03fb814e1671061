"""The on-disk store behind the decoded-image cache: one data file and one index per writer.

A cache directory holds pairs ``<writer>.data`` / ``<writer>.index``.  Each
process that stores images owns one pair (held by ``fcntl.flock`` on the
index), so 16-128 workers, or two runs at once, append without ever sharing a
file.  A stored image is committed in two steps:

1. its bytes are written into the writer's data file, at the file's end;
2. only then is one 64-byte record appended to the index: the entry's key,
   where its bytes are, its size, mode and format, a checksum of the bytes
   (``data_checksum``), and a checksum of the record itself.

A writer killed in step 1 leaves bytes no record points to; one killed in
step 2 cannot tear a 64-byte append (one ``write`` of a block-aligned record),
and a record damaged any other way (a crash of the machine) fails its
checksum.  Readers therefore only ever see complete entries, and they check
each entry's bytes against its checksum before they first use them, once per
process (a crash of the machine can leave a record whose data pages never
reached the disk; committed bytes never change after).  When a
later process finds a pair whose owner is gone (its lock is free), it adopts
it: it cuts off the uncommitted tail of both files and appends there, so the
number of files stays that of the most writers that ever ran at once.

Taking a pair over rests on ``flock``, which only a local file system keeps
(NFS emulates it with ``fcntl`` locks that any ``close()`` of the file by the
owner releases; other network and FUSE file systems may keep it per host, or
not at all).  So a writer takes pairs over only on a local file system
(``cache_filesystems``); elsewhere it is *solo*: it makes a new pair, named
``*.solo.index``, that no writer ever takes over, cuts or rewrites, so committed
bytes never change whatever the locks do.  And a process never opens another
descriptor of an index it holds locked (closing one would drop an ``fcntl``
lock): it reads its own indexes through the writer's descriptor (``_HELD``).

Readers keep the index as numpy arrays (``IndexTable``): forked workers that
look entries up write nothing to the pages they share with their parent.
"""

from __future__ import annotations

import errno
import fcntl
import mmap
import os
import secrets
import socket
import threading
from dataclasses import dataclass

import numpy as np

from .cache_checksums import checksum_name, data_checksum, record_checks

__all__ = ["RECORD", "RECORD_SIZE", "VERSION", "Entry", "IndexTable", "StoreWriter", "DataFiles",
           "data_bytes", "data_checksum", "checksum_name", "SOLO_SUFFIX"]

RECORD_SIZE = 64
_MAGIC = int.from_bytes(b"FLC1", "little")
# The layout's version, in every record.  2: entries keyed on the loader's
# identity, the format and the checksum (``cache_key``), bytes checked by XXH3
# (or CRC32) and records by ``record_checks``' mix.  Readers skip other versions,
# so a directory an older fastload filled serves none of its entries; a
# writer taking a pair over cuts such records off with the uncommitted tail.
VERSION = 2
# The name of a solo writer's pair ends so: one no writer ever takes over.
SOLO_SUFFIX = ".solo"
RECORD = np.dtype({
    "names": ["magic", "version", "key_hi", "key_lo", "offset", "length",
              "width", "height", "mode", "format", "data_sum", "check"],
    "formats": ["<u4", "<u4", "<u8", "<u8", "<u8", "<u8", "<u4", "<u4", "u1", "u1", "<u8", "<u4"],
    "offsets": [0, 4, 8, 16, 24, 32, 40, 44, 48, 49, 52, 60],
    "itemsize": RECORD_SIZE,
})
_PENDING = 4096
_ALIGN = 64


def _valid(records: np.ndarray) -> np.ndarray:
    return ((records["magic"] == _MAGIC) & (records["version"] == VERSION)
            & (records["check"] == record_checks(records)))


# The index files this process holds locked, by (st_dev, st_ino): the writer's
# descriptor.  Reads of those go through it (``os.pread``): opening and closing
# another descriptor of the file would release an ``fcntl`` lock.  A forked
# child holds none of them (``_held_here``).
_HELD: dict[tuple[int, int], int] = {}
_HELD_LOCK = threading.Lock()
_HELD_PID = [os.getpid()]


def _held_here() -> dict[tuple[int, int], int]:
    if _HELD_PID[0] != os.getpid():
        _HELD.clear()
        _HELD_PID[0] = os.getpid()
    return _HELD


def _file_id(path: str) -> tuple[int, int] | None:
    try:
        stat = os.stat(path)
    except OSError:
        return None
    return stat.st_dev, stat.st_ino


def _read_from(fd: int, start: int) -> bytes:
    """The bytes of an open file from ``start`` to its end, by ``pread``."""
    size = os.fstat(fd).st_size
    chunks = []
    while start < size:
        chunk = os.pread(fd, size - start, start)
        if not chunk:
            break
        chunks.append(chunk)
        start += len(chunk)
    return b"".join(chunks)


def read_index_tail(path: str, start: int) -> bytes | None:
    """An index file's bytes from ``start`` on; through this process's own writer's
    descriptor when it holds the file, never a second one.  None if unreadable."""
    file_id = _file_id(path)
    with _HELD_LOCK:
        held = _held_here().get(file_id) if file_id is not None else None
        if held is not None:
            try:
                return _read_from(held, start)
            except OSError:
                return None
    try:
        with open(path, "rb") as f:
            f.seek(start)
            return f.read()
    except OSError:
        return None


@dataclass(frozen=True)
class Entry:
    """Where one stored image is, and what it is."""

    data_file: str
    offset: int
    length: int
    width: int
    height: int
    mode: int
    format: int
    data_sum: int


class IndexTable:
    """Every committed entry of a cache directory, as sorted numpy arrays, per process.

    ``refresh()`` reads what the index files gained since the last call (new
    files too).  New records go to a small sorted table merged into the main
    one when it grows past a quarter of it, so a refresh costs what it reads,
    not a re-sort of a million entries.
    """

    def __init__(self, directory: str) -> None:
        self.directory = directory
        self._read_upto: dict[str, int] = {}  # index file name -> bytes consumed
        self._file_names: list[str] = []      # data file number -> its name
        self._file_numbers: dict[str, int] = {}
        self._main = _empty_table()
        self._recent = _empty_table()
        # This process's own new entries, unsorted, searched by a vector compare
        # until there are enough to merge (a merge per entry would be quadratic).
        self._pending = np.zeros(_PENDING, RECORD)
        self._pending_numbers = np.zeros(_PENDING, np.int32)
        self._pending_count = 0

    def __len__(self) -> int:
        return len(self._main[0]) + len(self._recent[0]) + self._pending_count

    def add_own(self, record: np.ndarray, stem: str, index_offset: int) -> None:
        """Know at once of an entry this process just committed (``stem``'s ``index_offset``)."""
        name = stem + ".index"
        if self._read_upto.get(name, 0) == index_offset:
            self._read_upto[name] = index_offset + RECORD_SIZE  # refresh need not read it
        count = self._pending_count
        self._pending[count] = record[0]
        self._pending_numbers[count] = self._file_number(stem + ".data")
        self._pending_count = count + 1
        if self._pending_count == len(self._pending):
            self._flush_pending()

    def _flush_pending(self) -> None:
        count, self._pending_count = self._pending_count, 0
        if count:
            self._add(self._pending[:count].copy(), self._pending_numbers[:count].copy())

    def refresh(self) -> int:
        """Read the records appended since the last refresh; returns how many were new."""
        try:
            names = sorted(n for n in os.listdir(self.directory) if n.endswith(".index"))
        except OSError:
            return 0
        added = []
        for name in names:
            records = self._read_new_records(name)
            if records is not None and len(records):
                number = self._file_number(name[:-len(".index")] + ".data")
                added.append((records, number))
        if not added:
            return 0
        records = np.concatenate([r for r, _ in added])
        numbers = np.concatenate([np.full(len(r), n, np.int32) for r, n in added])
        self._add(records, numbers)
        return len(records)

    def _add(self, records: np.ndarray, numbers: np.ndarray) -> None:
        self._recent = _merge(self._recent, _table_of(records, numbers))
        if len(self._recent[0]) * 4 > len(self._main[0]):
            self._main = _merge(self._main, self._recent)
            self._recent = _empty_table()

    def _read_new_records(self, name: str) -> np.ndarray | None:
        start = self._read_upto.get(name, 0)
        raw = read_index_tail(os.path.join(self.directory, name), start)
        if raw is None:
            return None
        raw = raw[:len(raw) - len(raw) % RECORD_SIZE]
        if not raw:
            return None
        records = np.frombuffer(raw, dtype=RECORD)
        valid = _valid(records)
        # A damaged record at the end may be one still being written by a
        # writer on a shared file system: read it again next time.  One with
        # valid records after it is damaged for good: skip it.
        last_valid = np.flatnonzero(valid)
        consumed = (int(last_valid[-1]) + 1) if len(last_valid) else 0
        self._read_upto[name] = start + consumed * RECORD_SIZE
        return records[:consumed][valid[:consumed]]

    def _file_number(self, data_name: str) -> int:
        number = self._file_numbers.get(data_name)
        if number is None:
            number = self._file_numbers[data_name] = len(self._file_names)
            self._file_names.append(data_name)
        return number

    def find(self, key_hi: int, key_lo: int) -> Entry | None:
        """The entry stored under the 128-bit key, or None."""
        if self._pending_count:
            pending = self._pending[:self._pending_count]
            hits = np.flatnonzero((pending["key_hi"] == np.uint64(key_hi))
                                  & (pending["key_lo"] == np.uint64(key_lo)))
            if len(hits):
                at = int(hits[0])
                return self._entry(pending[at], int(self._pending_numbers[at]))
        for table in (self._recent, self._main):
            keys_hi = table[0]
            if not len(keys_hi):
                continue
            at = int(np.searchsorted(keys_hi, np.uint64(key_hi)))
            rows = table[1]
            while at < len(keys_hi) and int(keys_hi[at]) == key_hi:
                row = rows[at]
                if row.item()[3] == key_lo:
                    return self._entry(row, int(table[2][at]))
                at += 1
        return None

    def _entry(self, row: np.void, number: int) -> Entry:
        # One .item() gives every field as a Python int, far cheaper than field by field.
        (_, _, _, _, offset, length, width, height, mode, fmt, data_sum, _) = row.item()
        return Entry(self._file_names[number], offset, length, width, height, mode, fmt,
                     data_sum)


def _empty_table() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    return np.zeros(0, np.uint64), np.zeros(0, RECORD), np.zeros(0, np.int32)


def _table_of(records: np.ndarray, numbers: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    order = np.argsort(records["key_hi"], kind="stable")
    records, numbers = records[order], numbers[order]
    return np.ascontiguousarray(records["key_hi"]), records, numbers


def _merge(a: tuple, b: tuple) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    if not len(b[0]):
        return a
    if not len(a[0]):
        return b
    return _table_of(np.concatenate([a[1], b[1]]), np.concatenate([a[2], b[2]]))


class DataFiles:
    """Read-only memory maps of the data files, opened on first use, per process."""

    def __init__(self, directory: str) -> None:
        self.directory = directory
        self._maps: dict[str, mmap.mmap] = {}

    def view(self, entry: Entry) -> memoryview | None:
        """The entry's bytes (a view of the mapping), or None if the file does not hold them."""
        end = entry.offset + entry.length
        mapped = self._maps.get(entry.data_file)
        if mapped is None or len(mapped) < end:
            mapped = self._map(entry.data_file)
            if mapped is None or len(mapped) < end:
                return None
        return memoryview(mapped)[entry.offset:end]

    def _map(self, name: str) -> mmap.mmap | None:
        try:
            with open(os.path.join(self.directory, name), "rb") as f:
                size = os.fstat(f.fileno()).st_size
                if size == 0:
                    return None
                mapped = mmap.mmap(f.fileno(), size, prot=mmap.PROT_READ)
        except (OSError, ValueError):
            return None
        # The old mapping (if any) is left to the views still made from it.
        self._maps[name] = mapped
        return mapped


def data_bytes(directory: str) -> int:
    """Bytes in the data files of ``directory`` (what a size bound counts)."""
    total = 0
    try:
        with os.scandir(directory) as entries:
            for item in entries:
                if item.name.endswith(".data"):
                    try:
                        total += item.stat().st_size
                    except OSError:
                        pass
    except OSError:
        pass
    return total


class StoreWriter:
    """This process's data file and index in a cache directory (adopted or new).

    ``solo``: never take a pair over (the directory is not on a local file
    system, where ``flock`` cannot be trusted): make a new ``*.solo`` pair,
    and lock nothing.  Any ``OSError`` (no space, a read-only file system) is
    the caller's to handle; what was written before it stays uncommitted, and
    the next owner of the pair (if it may have one) cuts it off.
    """

    def __init__(self, directory: str, solo: bool = False) -> None:
        self.directory = directory
        self.pid = os.getpid()
        self._index_fd = self._data_fd = -1
        self._end = 0
        self._held: tuple[int, int] | None = None
        if solo or not self._adopt_one():
            self._create(solo)

    def _adopt_one(self) -> bool:
        try:
            names = sorted(n for n in os.listdir(self.directory) if n.endswith(".index")
                           and not n.endswith(SOLO_SUFFIX + ".index"))
        except OSError:
            return False
        for name in names:
            path = os.path.join(self.directory, name)
            file_id = _file_id(path)
            with _HELD_LOCK:
                if file_id is None or file_id in _held_here():
                    continue  # this process's own: opening it again could drop its lock
            try:
                fd = os.open(path, os.O_RDWR | os.O_APPEND)
            except OSError:
                continue
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                os.close(fd)
                continue
            try:
                self._take_over(fd, name[:-len(".index")])
                self._hold(fd)
                return True
            except OSError:
                os.close(fd)
                if self._data_fd >= 0:
                    os.close(self._data_fd)
                    self._data_fd = -1
        return False

    def _hold(self, index_fd: int) -> None:
        """Note the locked index as this process's (reads go through ``index_fd``)."""
        stat = os.fstat(index_fd)
        with _HELD_LOCK:
            self._held = (stat.st_dev, stat.st_ino)
            _held_here()[self._held] = index_fd

    def _take_over(self, index_fd: int, stem: str) -> None:
        """Cut the pair back to its last committed entry and make it this writer's."""
        raw = _read_from(index_fd, 0)
        records = np.frombuffer(raw[:len(raw) - len(raw) % RECORD_SIZE], dtype=RECORD)
        valid = _valid(records)
        kept = np.flatnonzero(valid)
        keep_records = (int(kept[-1]) + 1) if len(kept) else 0
        good = records[:keep_records][valid[:keep_records]]
        end = int((good["offset"] + good["length"]).max()) if len(good) else 0
        data_fd = os.open(os.path.join(self.directory, stem + ".data"), os.O_RDWR | os.O_CREAT,
                          0o644)
        self._data_fd = data_fd
        if os.fstat(data_fd).st_size < end:
            # The data of committed entries is missing (a crash of the machine,
            # not of a process): start this pair over rather than trust it.
            raise OSError(errno.EIO, "cache data file shorter than its index", stem)
        os.ftruncate(data_fd, end)
        os.ftruncate(index_fd, keep_records * RECORD_SIZE)
        self._index_fd, self._end = index_fd, end
        self.stem, self._index_size = stem, keep_records * RECORD_SIZE

    def _create(self, solo: bool) -> None:
        for _ in range(8):
            stem = f"{socket.gethostname()}-{os.getpid()}-{secrets.token_hex(4)}"
            stem += SOLO_SUFFIX if solo else ""
            index_path = os.path.join(self.directory, stem + ".index")
            data_fd = os.open(os.path.join(self.directory, stem + ".data"),
                              os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o644)
            try:
                index_fd = os.open(index_path, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_EXCL,
                                   0o644)
            except OSError:
                os.close(data_fd)
                raise
            try:
                if not solo:
                    fcntl.flock(index_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:  # another process adopted the new pair first: make another
                os.close(index_fd)
                os.close(data_fd)
                continue
            self._index_fd, self._data_fd, self._end = index_fd, data_fd, 0
            self.stem, self._index_size = stem, 0
            if not solo:
                self._hold(index_fd)
            return
        raise OSError(errno.EAGAIN, "could not create a cache file pair", self.directory)

    def append(self, key_hi: int, key_lo: int, payload: bytes | memoryview, width: int,
               height: int, mode: int, fmt: int, data_sum: int | None = None
               ) -> tuple[np.ndarray, int, int]:
        """Store ``payload`` under the key; returns its committed record, where in the
        index that record is, and how many bytes the data file grew by.  ``data_sum``:
        the payload's ``data_checksum`` when the caller has it already."""
        view = memoryview(payload).cast("B")
        start = self._end
        offset = -(-start // _ALIGN) * _ALIGN  # aligned words for data_checksum
        written = 0
        while written < len(view):
            count = os.pwrite(self._data_fd, view[written:], offset + written)
            if count <= 0:
                raise OSError(errno.EIO, "short write to the cache data file", self.directory)
            written += count
        self._end = offset + written
        record = np.zeros(1, RECORD)
        record["magic"], record["version"] = _MAGIC, VERSION
        record["data_sum"] = data_checksum(view) if data_sum is None else data_sum
        record["key_hi"], record["key_lo"] = key_hi, key_lo
        record["offset"], record["length"] = offset, len(view)
        record["width"], record["height"] = width, height
        record["mode"], record["format"] = mode, fmt
        record["check"] = record_checks(record)
        if os.write(self._index_fd, record.tobytes()) != RECORD_SIZE:
            raise OSError(errno.EIO, "short write to the cache index", self.directory)
        at, self._index_size = self._index_size, self._index_size + RECORD_SIZE
        return record, at, self._end - start

    def close(self) -> None:
        with _HELD_LOCK:  # no read goes through the descriptor once it is closed
            if self._held is not None and _held_here().get(self._held) == self._index_fd:
                del _HELD[self._held]
            self._held = None
        for fd in (self._index_fd, self._data_fd):
            if fd >= 0:
                try:
                    os.close(fd)
                except OSError:
                    pass
        self._index_fd = self._data_fd = -1
