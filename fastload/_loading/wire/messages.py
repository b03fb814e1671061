"""Every message between the main process and a worker, by name.

A worker receives tasks on its task pipe and answers on its result pipe;
array bytes never travel through either (they go into ring slots).  Both
pipes carry frames (``frames.py``: a length, then a pickle).  Messages are
plain tuples, built only by the constructors below and read through the
field names below: a plain tuple pickles and unpickles several times faster
than a tuple subclass, on the per-batch path of both processes.

Tasks, main process -> worker (field 0 is the kind):

* ``epoch_task(base_seed, snapshot_every, seed_per_batch, memory_hint)``: a
  new epoch starts (new transform seeds, an IterableDataset starts over); a
  dataset copy with state is snapshotted with every ``snapshot_every``-th
  batch (0: never) and with its stream's end; with ``seed_per_batch``
  (``num_workers="auto"``) every generator is seeded for each batch from
  ``(base_seed, batch number)``, and the worker weighs its memory, counting
  itself from ``memory_hint`` (a sibling's PSS and resident size, or None)
  until it reads its own PSS (``stage_clock``);
* ``batch_task(batch_no, slot, kernel_batch, indices)``: make batch
  ``batch_no`` in ``slot`` (a ``SlotInfo`` as a tuple).  ``kernel_batch``:
  ``indices`` is the bytes of our BatchSampler kernel's int64 array (the
  dataset is given it as a list of keys); otherwise it is any other
  sampler's batch as it was yielded;
* ``retire_task(slot_id, name)``: the main process retired that slot
  (``name`` its handle); unmap it;
* ``RESEND_LAYOUTS``: the main process lost a layout; number them afresh
  (``layouts.py``);
* ``dataset_state_task(snapshot, replay, next_epoch)``: resuming, before
  the epoch's first batch: load it into this worker's copy of the dataset
  (None: the copy has no state), make the batches ``replay`` names again
  and drop them, and with ``next_epoch`` leave the stream to start over
  (``fastload/dataset_state.py``);
* ``SNAPSHOT_REQUEST``: answer with a snapshot of this worker's copy now
  (``SNAPSHOT_TAKEN``): at the end of a persistent worker's epoch, when its
  last snapshot is older than its last batch;
* ``indirect_task(name, size)``: the real task waits in a memory file
  (``name`` its handle), being too large for its share of the pipe (``pool.py``);
* ``STOP`` (``None``, sent as ``STOP_BYTES``): exit, without making the
  batches still queued (torch's workers skip them too, once told to stop),
  so stopping never waits for more than the batch in hand.

Replies, worker -> main process: ``(kind, batch_no, slot_id, created,
payload)``, where ``created`` is the size the worker grew the slot's file to
(or None; the main process maps that much, also for a failed batch); an
answer to a batch task then has a sixth field ``TIMES``, the worker's
seconds per stage so far (``stage_clock.py``, for ``loader.report()``), and,
when it is time for one (``epoch_task``), a seventh ``SNAPSHOT``: the
worker's copy's state after the batch (``dataset_state``).  The kinds:

* ``BATCH_MADE``: ``payload`` is the batch's layout, encoded by
  ``layouts.LayoutSender`` (a layout travels once per worker, then by number);
* ``STREAM_ENDED``: the worker's IterableDataset replica is exhausted;
* ``BATCH_FAILED``: ``payload`` is the error (``errors.ExceptionWrapper``);
* ``SNAPSHOT_TAKEN``: ``payload`` is the snapshot ``SNAPSHOT_REQUEST`` asked for;
* ``START_FAILED``: the worker could not start (``worker_init_fn``,
  unpickling its payload) or load a dataset state; ``payload`` is the error.
"""

from __future__ import annotations

import pickle
from typing import Any

__all__ = ["EPOCH", "BATCH", "RETIRE", "RESEND_LAYOUTS", "DATASET_STATE", "INDIRECT", "STOP",
           "SNAPSHOT_REQUEST", "SNAPSHOT_TAKEN", "snapshot_reply",
           "STOP_BYTES", "epoch_task", "batch_task", "retire_task", "dataset_state_task",
           "indirect_task", "BATCH_MADE", "STREAM_ENDED", "BATCH_FAILED", "START_FAILED",
           "KIND", "BATCH_NO", "SLOT_ID", "CREATED", "PAYLOAD", "TIMES", "SNAPSHOT", "batch_reply",
           "stream_ended_reply", "failed_reply", "start_failed_reply", "with_times",
           "with_snapshot"]

# -- tasks -------------------------------------------------------------------

EPOCH = "epoch"
BATCH = "batch"
RETIRE = "retire"
DATASET_STATE = "dataset_state"
INDIRECT = "indirect"
# Told to a worker whose layout was lost: it numbers its layouts afresh and so
# sends each again with its next use.  Batches it made before reading this
# still refer to the old numbers; those the main process has stay valid,
# since a worker's answers arrive in the order it sends them.
RESEND_LAYOUTS = ("resend_layouts",)
SNAPSHOT_REQUEST = ("snapshot",)
STOP = None
STOP_BYTES = pickle.dumps(STOP)  # as the main process sends it, and a worker looks for it


def epoch_task(base_seed: int, snapshot_every: int, seed_per_batch: bool = False,
               memory_hint: tuple[float, float] | None = None) -> tuple:
    return (EPOCH, base_seed, snapshot_every, seed_per_batch, memory_hint)


def batch_task(batch_no: int, slot: tuple, kernel_batch: bool, indices: Any) -> tuple:
    return (BATCH, batch_no, slot, kernel_batch, indices)


def retire_task(slot_id: int, name: str) -> tuple:
    return (RETIRE, slot_id, name)


def dataset_state_task(snapshot: dict | None, replay: Any, next_epoch: bool) -> tuple:
    return (DATASET_STATE, snapshot, replay, next_epoch)


def indirect_task(name: str, size: int) -> tuple:
    return (INDIRECT, name, size)


# -- replies -----------------------------------------------------------------

BATCH_MADE = "batch"
STREAM_ENDED = "end"
BATCH_FAILED = "error"
START_FAILED = "init_error"
SNAPSHOT_TAKEN = "snapshot"

# A reply's fields.
KIND, BATCH_NO, SLOT_ID, CREATED, PAYLOAD, TIMES, SNAPSHOT = range(7)


def batch_reply(batch_no: int, slot_id: int, created: int | None, encoded_layout: Any) -> tuple:
    return (BATCH_MADE, batch_no, slot_id, created, encoded_layout)


def stream_ended_reply(batch_no: int, slot_id: int, created: int | None) -> tuple:
    return (STREAM_ENDED, batch_no, slot_id, created, None)


def failed_reply(batch_no: int, slot_id: int, created: int | None, error: Any) -> tuple:
    return (BATCH_FAILED, batch_no, slot_id, created, error)


def snapshot_reply(snapshot: dict | None) -> tuple:
    return (SNAPSHOT_TAKEN, -1, -1, None, snapshot)


def start_failed_reply(error: Any) -> tuple:
    return (START_FAILED, -1, -1, None, error)


def with_times(reply: tuple, times: tuple) -> tuple:
    """An answer to a batch task carrying its worker's stage totals (field ``TIMES``)."""
    return reply + (times,)


def with_snapshot(reply: tuple, snapshot: dict) -> tuple:
    """``reply`` (``with_times``) carrying its worker's dataset snapshot (field ``SNAPSHOT``)."""
    return reply + (snapshot,)
