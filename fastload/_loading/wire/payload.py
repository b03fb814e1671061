"""What spawn and forkserver workers are sent: the dataset, the batch settings
and ``worker_init_fn``.

NOTE [ Pickled once, or per worker ]
torch's workers each pickle the dataset as they start (it is an argument of
their ``Process``).  fastload pickles it once for all of them and hands every
worker the same bytes, so start-up does not grow with ``num_workers``.  The
bytes are made as ``Process.start`` would make them: with multiprocessing's
``ForkingPickler`` (whose reductions torch extends: a tensor in shared memory
is sent as a handle, not copied), while a process is being started.  Some
objects cannot be pickled once for several processes: a
``multiprocessing.Value``, a ``Queue``, a torch tensor shared by file
descriptor each hand a descriptor to the one child being started.  Then, and
only then, the objects go to the workers as torch's do, pickled per worker.

Arrays mapped from a file (``np.memmap``, ``np.load(..., mmap_mode=...)`` and
views of them) are reopened from their file in the worker instead of being
copied, unless the file at that path is no longer the one mapped (replaced,
deleted) or the mapping is copy-on-write (its edits are not in the file):
those are sent by value, so a worker always sees what the main process sees.
"""

from __future__ import annotations

import io
import mmap
import os
import pickle
from multiprocessing import context as mp_context
from multiprocessing.reduction import ForkingPickler
from typing import Any, Sequence

import numpy as np

__all__ = ["unpickle_payload", "pickle_for_workers", "PickledPayload", "TruncatedFileError"]


class PickledPayload:
    """The payload's bytes, in a holder the worker empties once it has unpickled
    them: the arguments of a process stay referenced while it runs (by its
    ``Process`` object and the call into its target), and the bytes alone
    would keep a second copy of the dataset in every worker.  (A ``bytearray``
    could be emptied too, but multiprocessing pickles a process's arguments
    with protocol 4, which copies a bytearray once more, per worker.)"""

    __slots__ = ("data",)

    def __init__(self, data: bytes) -> None:
        self.data = data

    def __reduce__(self) -> tuple:
        return (PickledPayload, (self.data,))

    def take(self) -> bytes:
        data, self.data = self.data, b""
        return data


class _NeedsEachWorker(Exception):
    """An object hands a file descriptor to the one process being started."""


class _StartingAll:
    """Stands in for the ``Popen`` of the process being started while the payload
    is pickled once for all workers (multiprocessing's objects check that one is).

    ``strict``: an object that would hand it a descriptor raises
    ``_NeedsEachWorker``; otherwise a placeholder stands in (to find out
    whether the rest pickles at all)."""

    def __init__(self, strict: bool) -> None:
        self.strict = strict

    def duplicate_for_child(self, fd: int) -> int:
        if self.strict:
            raise _NeedsEachWorker
        return fd

    def DupFd(self, fd: int) -> None:  # noqa: N802 - multiprocessing's name
        return None


def pickle_for_workers(named_objects: Sequence[tuple[str, Any]], method: str
                       ) -> PickledPayload | tuple:
    """The payload for spawn/forkserver workers: bytes pickled once for all of
    them, or the objects themselves when they must be pickled per worker (see
    NOTE [ Pickled once, or per worker ]).

    A failure names the object that cannot be pickled and what to do; the
    error keeps the type the pickling raised.
    """
    objects = tuple(obj for _, obj in named_objects)
    try:
        return PickledPayload(_dumps(objects, strict=True))
    except _NeedsEachWorker:
        per_worker = True
    except TruncatedFileError:
        raise  # picklable, but not as it is now: no advice on pickling applies
    except Exception:
        per_worker = False
    # Find which object fails, and why (a descriptor-holding object is fine).
    for name, obj in named_objects:
        try:
            _dumps(obj, strict=False)
        except Exception as error:
            raise _unpicklable(name, error, method) from error
    if per_worker:
        return objects
    return PickledPayload(_dumps(objects, strict=True))  # pragma: no cover - each part pickled


def _dumps(obj: Any, strict: bool) -> bytes:
    buffer = io.BytesIO()
    previous = mp_context.get_spawning_popen()
    mp_context.set_spawning_popen(_StartingAll(strict))
    try:
        _PayloadPickler(buffer, pickle.HIGHEST_PROTOCOL).dump(obj)
    finally:
        mp_context.set_spawning_popen(previous)
    return buffer.getvalue()


def _unpicklable(name: str, error: Exception, method: str) -> Exception:
    message = (f"DataLoader with multiprocessing_context={method!r} must pickle the {name} to "
               f"send it to the workers, but it cannot be pickled: {error}. Define it at module "
               f"level (not as a lambda, local function or class), or use "
               f"multiprocessing_context='fork'.")
    try:
        rebuilt = type(error)(message)
    except Exception:
        rebuilt = None
    if rebuilt is not None and str(rebuilt) == message:
        return rebuilt
    # A type that does not take one message: the original, with the advice as a note.
    error.add_note(message)
    return error


# -- arrays mapped from a file ---------------------------------------------

class _PayloadPickler(ForkingPickler):
    """``ForkingPickler``, with file-mapped arrays sent as a way to map them again."""

    def __init__(self, file: Any, protocol: int) -> None:
        super().__init__(file, protocol)
        self._mappings: list | None = None  # /proc/self/maps, read once if needed
        self.dispatch_table[np.ndarray] = self._reduce_array
        self.dispatch_table[np.memmap] = self._reduce_array

    def _reduce_array(self, array: np.ndarray) -> Any:
        reopen = self._reopening(array)
        if reopen is not None:
            return reopen
        return array.__reduce_ex__(pickle.HIGHEST_PROTOCOL)

    def _reopening(self, array: np.ndarray) -> tuple | None:
        """``(_map_again, args)`` for an array whose bytes the worker can map from
        their file, else None."""
        root = array
        while isinstance(root.base, np.ndarray):
            root = root.base
        if not isinstance(root, np.memmap) or not isinstance(root.base, mmap.mmap) \
                or root.filename is None or array.size == 0 or array.dtype.hasobject:
            return None
        root_start = root.__array_interface__["data"][0]
        mapped = self._mapped_file(root_start)
        start = array.__array_interface__["data"][0]
        low, high = _byte_bounds(start, array)
        file_offset = int(root.offset) + (low - root_start)
        if mapped is not None and mapped[2] is not None and mapped[2] < file_offset + (high - low):
            # Its pages past the file's end are gone: reading them (to send
            # them, or in a worker) is a SIGBUS, whatever the mode.
            raise _truncated(root.filename, mapped[2], file_offset + (high - low))
        if root.mode == "c":
            return None  # its pages may differ from the file's: send the bytes
        try:
            status = os.stat(root.filename)
        except OSError:
            return None
        if mapped is None or mapped[:2] != (status.st_dev, status.st_ino):
            return None  # not the file mapped any more: send the bytes
        if status.st_size < file_offset + (high - low):
            raise _truncated(root.filename, status.st_size, file_offset + (high - low))
        order = "C" if array.flags.c_contiguous else "F" if array.flags.f_contiguous else None
        # A writable mapping reopens as "r+": "w+" would truncate the file.
        mode = "r+" if root.mode == "w+" else root.mode
        return (_map_again, (root.filename, mapped[:2], mode, file_offset, high - low,
                             start - low, array.dtype, array.shape, array.strides, order,
                             isinstance(array, np.memmap)))

    def _mapped_file(self, address: int) -> tuple[int, int, int | None] | None:
        """``(st_dev, st_ino, st_size)`` of the file mapped at ``address`` (a
        deleted one too; its size None where /proc does not show the file)."""
        if self._mappings is None:
            self._mappings = []
            with open("/proc/self/maps") as maps:
                for line in maps:
                    fields = line.split(maxsplit=5)
                    if len(fields) < 6 or fields[4] == "0":
                        continue  # not a file
                    start, end = (int(x, 16) for x in fields[0].split("-"))
                    self._mappings.append((start, end, fields[0], fields[3], int(fields[4])))
        for start, end, address_range, device, inode in self._mappings:
            if start <= address < end:
                try:
                    # The file itself, as stat() on its path would see it
                    # (overlayfs shows another device and inode in maps).
                    status = os.stat(f"/proc/self/map_files/{address_range}")
                    return status.st_dev, status.st_ino, status.st_size
                except OSError:
                    major, minor = (int(x, 16) for x in device.split(":"))
                    return os.makedev(major, minor), inode, None
        return None


def _byte_bounds(start: int, array: np.ndarray) -> tuple[int, int]:
    """The lowest address ``array`` reads, and one past the highest."""
    low = high = start
    for extent, stride in zip(array.shape, array.strides):
        if stride < 0:
            low += stride * (extent - 1)
        else:
            high += stride * (extent - 1)
    return low, high + array.itemsize


class TruncatedFileError(RuntimeError):
    """A file that an array of the dataset maps is shorter than the array."""


def _truncated(filename: str, size: int, needed: int) -> TruncatedFileError:
    return TruncatedFileError(
        f"the file {os.fspath(filename)!r}, mapped by an array of the dataset, is {size} bytes "
        f"long, but the array reads up to byte {needed}: the file was truncated after the array "
        f"was mapped; map it again (np.memmap, np.load(..., mmap_mode=...)) once it is complete")


def _map_again(filename: str, identity: tuple[int, int], mode: str, file_offset: int,
               nbytes: int, start: int, dtype: np.dtype, shape: tuple, strides: tuple,
               order: str | None, was_memmap: bool) -> np.ndarray:
    """In the worker: the array's bytes mapped from its file, as the main process had them."""
    try:
        status = os.stat(filename)
        replaced = (status.st_dev, status.st_ino) != identity
    except FileNotFoundError:
        replaced = True
    if not replaced and status.st_size < file_offset + nbytes:
        raise _truncated(filename, status.st_size, file_offset + nbytes)
    if replaced:
        raise RuntimeError(
            f"the file {os.fspath(filename)!r}, mapped by an array of the dataset, was replaced "
            f"or removed after the DataLoader sent the dataset to its workers; keep the file in "
            f"place while the loader starts its workers, or use multiprocessing_context='fork'")
    if was_memmap and order is not None:  # a memmap of its own, as np.memmap makes them
        return np.memmap(filename, dtype=dtype, mode=mode, offset=file_offset + start,
                         shape=shape, order=order)
    region = np.memmap(filename, dtype=np.uint8, mode=mode, offset=file_offset, shape=(nbytes,))
    array = np.ndarray(shape, dtype=dtype, buffer=region, offset=start, strides=strides)
    return array.view(np.memmap) if was_memmap else array


def unpickle_payload(payload: PickledPayload, worker_id: int) -> Any:
    """The dataset, batch settings and worker_init_fn, unpickled from their bytes.

    A failure here (a class the worker cannot import) is a ``RuntimeError``,
    the type torch raises: its worker dies unpickling them, and the main
    process reports the death.
    """
    try:
        return pickle.loads(payload.take())  # the bytes go once unpickled
    except Exception as error:
        raise RuntimeError(
            f"DataLoader worker process {worker_id} could not unpickle the dataset, collate_fn "
            f"and worker_init_fn the main process sent it ({type(error).__name__}: {error}); "
            f"under spawn or forkserver each must be importable by the worker: defined at "
            f"module level of a module it can import, not inside a function or an "
            f"`if __name__ == '__main__':` block") from error
