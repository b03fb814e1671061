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
import pickle
from multiprocessing import context as mp_context
from typing import Any, Sequence

from fastload._loading.wire.picklers import PayloadPickler, TruncatedFileError

__all__ = ["unpickle_payload", "pickle_for_workers", "PickledPayload"]


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
        PayloadPickler(buffer, pickle.HIGHEST_PROTOCOL).dump(obj)
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
