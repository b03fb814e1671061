"""The worker process: its loop, ``WorkerInfo``, seeding, and error wrapping.

A worker receives small messages on its task pipe and answers on its result
pipe; array bytes never travel through either (they go into ring slots):

* ``("epoch", base_seed)``: a new epoch starts (new transform seeds, an
  IterableDataset starts over);
* ``("batch", batch_no, slot, packed, indices)``: make batch ``batch_no`` in
  the slot (``packed``: the indices are an int64 array's bytes); the answer
  is ``("batch" | "end" | "error", batch_no, slot_id,
  created_segment_name, layout_or_error)``;
* ``("retire", slot_id, name)``: the main process unlinked that slot; unmap it;
* ``("indirect", name, size)``: the real message waits in shared memory;
* ``None``: exit.

A worker also exits by itself when its parent dies (it polls for that while
idle), so a killed main process leaves no orphan.
"""

from __future__ import annotations

import os
import pickle
import random
import select
import signal
import sys
import traceback
from dataclasses import dataclass
from typing import Any

import numpy as np

from fastload.fetch import BatchSource
from fastload.ring import Segment, SlotInfo, SlotWriter

__all__ = ["WorkerInfo", "get_worker_info", "ExceptionWrapper", "worker_loop",
           "LIVENESS_INTERVAL"]

# How often an idle worker checks that its parent is still alive (seconds).
LIVENESS_INTERVAL = 0.5


@dataclass(frozen=True)
class WorkerInfo:
    """What ``get_worker_info()`` returns inside a worker (as torch's)."""

    id: int
    num_workers: int
    seed: int
    dataset: Any


_worker_info: WorkerInfo | None = None


def get_worker_info() -> WorkerInfo | None:
    """This worker's ``WorkerInfo``; ``None`` in the main process."""
    return _worker_info


class ExceptionWrapper:
    """An exception caught in a worker, carried to the main process and re-raised there
    with the same type where possible, the worker id and the worker's traceback."""

    def __init__(self, where: str, exc_info: tuple | None = None) -> None:
        exc_type, exc_value, exc_tb = exc_info or sys.exc_info()
        self.exc_type = exc_type
        self.where = where
        self.text = "".join(traceback.format_exception(exc_type, exc_value, exc_tb))

    def __reduce__(self):
        # The type must unpickle in the main process; fall back to RuntimeError.
        try:
            pickle.dumps(self.exc_type)
            exc_type = self.exc_type
        except Exception:
            exc_type = RuntimeError
        return (_rebuild_wrapper, (exc_type, self.where, self.text))

    def reraise(self) -> None:
        message = f"Caught {self.exc_type.__name__} {self.where}.\nOriginal {self.text}"
        if self.exc_type is KeyError:
            # KeyError repr()s its argument, which would mangle the traceback.
            message = _KeyErrorMessage(message)
        try:
            exception = self.exc_type(message)
        except Exception:
            # Some exception types need other arguments.
            raise RuntimeError(message) from None
        try:
            raise exception
        finally:
            # The traceback holds this frame: without this, exception -> traceback
            # -> frame -> exception would keep the iterator (and its workers)
            # alive until the garbage collector runs.
            del exception


class _KeyErrorMessage(str):
    def __repr__(self) -> str:
        return self


def _rebuild_wrapper(exc_type: type, where: str, text: str) -> ExceptionWrapper:
    wrapper = ExceptionWrapper.__new__(ExceptionWrapper)
    wrapper.exc_type, wrapper.where, wrapper.text = exc_type, where, text
    return wrapper


def _seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch = sys.modules.get("torch")
    if torch is not None:  # a dataset that uses torch's RNG gets torch's per-worker seeding
        torch.manual_seed(seed)


def _read_task(task_conn: Any) -> Any:
    message = pickle.loads(task_conn.recv_bytes())
    if message is not None and message[0] == "indirect":
        # A task too large for the pipe: it waits in shared memory (see pool.py).
        _, name, size = message
        segment = Segment(name)
        data = segment.array[:size].tobytes()
        segment.unlink()
        message = pickle.loads(data)
    return message


def worker_loop(worker_id: int, num_workers: int, payload: Any, task_conn: Any,
                result_conn: Any, base_seed: int, parent_pid: int) -> None:
    """Entry point of a worker process (``payload`` is pickled bytes under spawn)."""
    global _worker_info
    # Ctrl-C reaches the whole process group; the main process decides what
    # happens (it shuts the workers down), so workers ignore it.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    where = f"in DataLoader worker process {worker_id}"
    try:
        if isinstance(payload, bytes):
            payload = pickle.loads(payload)
        dataset, source_args, worker_init_fn = payload
        seed = base_seed + worker_id
        _seed_everything(seed)
        _worker_info = WorkerInfo(id=worker_id, num_workers=num_workers, seed=seed,
                                  dataset=dataset)
        if worker_init_fn is not None:
            worker_init_fn(worker_id)
        source = BatchSource(dataset, *source_args)
    except BaseException:
        _send(result_conn, ("init_error", -1, -1, None, ExceptionWrapper(where)))
        return
    writer = SlotWriter()
    # One poll object for the life of the worker: Connection.poll() would
    # build a selector on every call, on the per-batch path.
    tasks_ready = select.poll()
    tasks_ready.register(task_conn.fileno(), select.POLLIN)
    liveness_ms = int(LIVENESS_INTERVAL * 1000)
    while True:
        try:
            if not tasks_ready.poll(liveness_ms):
                if os.getppid() != parent_pid:
                    break  # the main process is gone: nobody will read our batches
                continue
            message = _read_task(task_conn)
        except (EOFError, OSError):
            break  # the main process closed our task pipe (or died)
        if message is None:
            break
        kind = message[0]
        if kind == "epoch":
            source.start_epoch(message[1])
            continue
        if kind == "retire":
            writer.forget(message[1], message[2])
            continue
        _, batch_no, slot, packed, indices = message
        slot_info = SlotInfo(*slot)
        if packed:  # an int64 index array, sent as its bytes
            indices = np.frombuffer(indices, dtype=np.int64)
        allocation = writer.allocator(slot_info)
        try:
            kind, payload = "batch", source.make_into(batch_no, indices, allocation)
        except StopIteration:
            kind, payload = "end", None
        except BaseException:
            kind, payload = "error", ExceptionWrapper(where)
        # The created segment is reported even for a failed batch, so the main
        # process adopts (and later unlinks) it.
        reply = (kind, batch_no, slot_info.slot_id, allocation.created_name, payload)
        if not _send(result_conn, reply, where):
            break
    result_conn.close()


def _send(conn: Any, reply: tuple, where: str = "") -> bool:
    """Send a reply; a batch that cannot be pickled becomes an error reply."""
    try:
        conn.send(reply)
        return True
    except (BrokenPipeError, ConnectionResetError, EOFError):
        return False  # the main process is gone
    except Exception:
        # e.g. a non-array leaf of the batch that cannot be pickled
        error = ExceptionWrapper(f"{where} (sending the batch to the main process)")
        try:
            conn.send(("error",) + reply[1:4] + (error,))
            return True
        except Exception:
            return False
