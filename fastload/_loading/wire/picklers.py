"""The custom picklers of the wire, in one place.

* ``WirePickler`` (answers: a batch's values and layouts; tasks that may
  hold tensors): plain pickling plus ``ForkingPickler``'s reductions where
  torch registered one (NOTE [ Pickled as torch's workers pickle ] in
  ``layouts.py``);
* ``_PlainUnlessUnrebuilt`` (``dumps_task``): plain pickling that gives up
  at a tensor plain pickling would not rebuild (NOTE [ Tasks that may hold
  tensors ]);
* ``PayloadPickler`` (the spawn/forkserver workers' payload, ``payload.py``):
  ``ForkingPickler`` with arrays mapped from a file sent as a way to map
  them again.
"""

from __future__ import annotations

import io
import mmap
import os
import pickle
import sys
import warnings
from multiprocessing.reduction import ForkingPickler
from typing import Any

import numpy as np

__all__ = ["WirePickler", "dumps_with_reductions", "dumps_task", "PayloadPickler",
           "TruncatedFileError"]

# -- answers, and tasks that may hold tensors --------------------------------

class WirePickler(pickle.Pickler):
    """A pickler with ``ForkingPickler``'s reductions (NOTE [ Pickled as torch's
    workers pickle ] in ``layouts.py``); ``handed_over`` tells whether one of them was used."""

    def __init__(self, file: Any) -> None:
        super().__init__(file, pickle.HIGHEST_PROTOCOL)
        self.handed_over = False

    def reducer_override(self, obj: Any) -> Any:
        reduce = ForkingPickler._extra_reducers.get(type(obj))
        if reduce is None or _rebuilt_wrong_by_torch(obj):
            return NotImplemented
        self.handed_over = True
        return reduce(obj)


def _rebuilt_wrong_by_torch(obj: Any) -> bool:
    """A tensor that torch's reduction would rebuild from its storage and
    strides alone, losing what else makes its values."""
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(obj, torch.Tensor) \
        and (obj.is_quantized or obj.is_conj() or obj.is_neg())


def dumps_with_reductions(obj: Any) -> tuple[bytes, bool]:
    """``obj`` pickled by ``WirePickler``, and whether a reduction of
    ``ForkingPickler``'s was used."""
    buffer = io.BytesIO()
    pickler = WirePickler(buffer)
    pickler.dump(obj)
    return buffer.getvalue(), pickler.handed_over


def dumps_task(task: Any) -> bytes:
    """A task holding a sampler's batch as it was yielded, pickled for a worker.

    NOTE [ Tasks that may hold tensors ]
    torch's workers get their tasks through multiprocessing queues, which
    pickle with ``ForkingPickler``'s reductions: a tensor goes as a handle
    to shared memory.  Plain pickling does not always do: in torch 2.13 a
    uint16, uint32, uint64, float8 or complex32 tensor so pickled does not
    unpickle, and a batch sampler yielding such index tensors killed every
    worker at its first task.  A task holding such a tensor is pickled with
    the reductions, as in torch; any other is pickled plainly, as before:
    handing int64 index tensors over by descriptor made an epoch of 157
    batches of them 30 % longer (`dict`'s sizes, persistent workers, a
    trivial dataset), and a plain list of ints never reaches the check.
    """
    buffer = io.BytesIO()
    try:
        _PlainUnlessUnrebuilt(buffer).dump(task)
    except _NeedsReductions:
        return dumps_with_reductions(task)[0]
    return buffer.getvalue()


class _NeedsReductions(Exception):
    """Plain pickling met a tensor that it would not rebuild."""


class _PlainUnlessUnrebuilt(pickle.Pickler):
    """Plain pickling that stops at a tensor whose dtype it would not rebuild."""

    def __init__(self, file: Any) -> None:
        super().__init__(file, pickle.HIGHEST_PROTOCOL)

    def reducer_override(self, obj: Any) -> Any:
        torch = sys.modules.get("torch")
        if torch is not None and isinstance(obj, torch.Tensor) \
                and not _plain_pickling_rebuilds(torch, obj.dtype):
            raise _NeedsReductions
        return NotImplemented


# dtype -> whether a tensor of it survives pickle.dumps then pickle.loads.
_REBUILT_PLAINLY: dict[Any, bool] = {}


def _plain_pickling_rebuilds(torch: Any, dtype: Any) -> bool:
    """Tried once per dtype (a few hundred microseconds): which dtypes fail
    depends on the torch release."""
    rebuilt = _REBUILT_PLAINLY.get(dtype)
    if rebuilt is None:
        try:
            with warnings.catch_warnings():  # "ComplexHalf support is experimental"
                warnings.simplefilter("ignore")
                pickle.loads(pickle.dumps(torch.zeros(1, dtype=dtype),
                                          protocol=pickle.HIGHEST_PROTOCOL))
            rebuilt = True
        except Exception:
            rebuilt = False
        _REBUILT_PLAINLY[dtype] = rebuilt
    return rebuilt


# -- the workers' payload: arrays mapped from a file ------------------------

class PayloadPickler(ForkingPickler):
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
