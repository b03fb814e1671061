"""The worker process: read tasks, make batches into ring slots, answer.

What travels on the two pipes is listed in ``wire/messages.py``.  A worker
also exits by itself when the main process dies (it watches for that, see
``parent_watch.py``), so a killed main process leaves no orphan behind; the
ring's files are anonymous, and go with the last process that maps them.
"""

from __future__ import annotations

import os
import pickle
import select
import signal
import time
from time import perf_counter
from typing import Any

import numpy as np

from fastload.dataset_state import is_stateful, restore_copy, snapshot
from fastload._ring import Segment, SlotInfo, SlotWriter
from fastload._ring.segments import read_and_discard
from fastload._lifetime import pipe_ends
from fastload._lifetime.interrupts import restore_callers_handlers
from fastload._loading.errors import ExceptionWrapper
from fastload._loading.fetch import BatchSource
from fastload._loading.parent_watch import LIVENESS_INTERVAL, ParentWatch, die_of_sigterm
from fastload._loading.stage_clock import IDLE, SEND
from fastload._loading.wire.frames import FrameReader, send_frame
from fastload._loading.wire.layouts import LayoutSender
from fastload._loading.wire.messages import BATCH, BATCH_NO, CREATED, EPOCH, INDIRECT, KIND, \
    RESEND_LAYOUTS, RETIRE, SLOT_ID, SNAPSHOT_REQUEST, STOP, STOP_BYTES, batch_reply, \
    failed_reply, snapshot_reply, start_failed_reply, stream_ended_reply, with_snapshot, with_times
from fastload._loading.wire.payload import PickledPayload, unpickle_payload
from fastload._loading.worker_info import seed_for_batch, start_as_worker

__all__ = ["worker_loop"]

# Tasks read longer ago than this (seconds) are checked for a stop sent since.
_STOP_CHECK_AGE = 0.002


def worker_loop(worker_id: int, num_workers: int, payload: Any, task_conn: Any,
                result_conn: Any, base_seed: int, parent_pid: int,
                inherited_slots: dict[int, Segment] | None = None) -> None:
    """Entry point of a worker process (``payload`` is pickled bytes under spawn,
    see ``wire/payload.py``).  ``inherited_slots`` (fork only): slots whose
    mappings came with the fork (see ``SlotWriter``).
    """
    restore_callers_handlers()  # before the SIGTERM take-over looks at them
    pipe_ends.let_go_of_inherited((task_conn.fileno(), result_conn.fileno()))
    parent = ParentWatch(parent_pid)
    die_of_sigterm()
    try:
        _serve(worker_id, num_workers, payload, task_conn, result_conn, base_seed, parent,
               inherited_slots)
    finally:
        parent.close()


class _MainProcessGone(Exception):
    """The main process died: nobody will read this worker's batches."""


class _Pipes:
    """A worker's two pipes, each waited on together with the main process's liveness.

    One poll object per wait for the life of the worker: ``Connection.poll()``
    would build a selector on every call, on the per-batch path.
    """

    __slots__ = ("parent", "tasks", "task_fd", "result_conn", "result_fd", "read_at",
                 "stop_while_sending", "_tasks_ready", "_answer_room", "_liveness_ms")

    def __init__(self, task_conn: Any, result_conn: Any, parent: ParentWatch) -> None:
        self.parent = parent
        self.task_fd = task_conn.fileno()
        self.tasks = FrameReader(self.task_fd)
        self.read_at = 0.0  # when the task pipe was last read
        self._tasks_ready = select.poll()
        self._tasks_ready.register(self.task_fd, select.POLLIN)
        if parent.fd is not None:
            self._tasks_ready.register(parent.fd, select.POLLIN)
        self._liveness_ms = None if parent.fd is not None else int(LIVENESS_INTERVAL * 1000)
        # An answer larger than what the pipe holds waits for the main process
        # to read it; if that process is killed, nobody will, and other
        # processes that inherited the pipe's read end (workers of other
        # loaders) keep the write from failing.  So the answer pipe is written
        # without blocking, and a full pipe is waited on together with the
        # main process's liveness.  A stop sent meanwhile (the caller left the
        # epoch) is seen too: the main process would otherwise wait out the
        # grace period for this worker.
        self.result_conn = result_conn
        self.result_fd = result_conn.fileno()
        os.set_blocking(self.result_fd, False)
        self._answer_room = select.poll()
        self._answer_room.register(self.result_fd, select.POLLOUT)
        self._answer_room.register(self.task_fd, select.POLLIN)
        if parent.fd is not None:
            self._answer_room.register(parent.fd, select.POLLIN)
        self.stop_while_sending = False

    def wait_for_task(self) -> bool:
        """Until a task can be read: True, or False if the main process is gone."""
        task_fd = self.task_fd
        while not any(fd == task_fd for fd, _ in self._tasks_ready.poll(self._liveness_ms)):
            if self.parent.gone():
                return False
        return True

    def next_task(self) -> Any:
        """The next whole task, waiting for it; ``STOP`` also when a stop waits
        behind it.  Raises ``EOFError``/``OSError`` when the pipe is closed,
        ``_MainProcessGone`` when the main process died."""
        tasks = self.tasks
        while True:
            data = tasks.pending()  # tasks sent together arrive in one read
            if data is not None:
                break
            if not self.wait_for_task():
                raise _MainProcessGone
            tasks.fill()
            self.read_at = time.monotonic()
            # (None again: part of a long task, the rest is on its way.)
        message = _decode_task(data)
        return STOP if message is STOP or self._told_to_stop() else message

    def _told_to_stop(self) -> bool:
        """Whether a stop message waits behind the task about to be made.

        A task read a while ago (ahead of a slow batch) may have a stop sent
        since behind it, so the pipe is read again first (without waiting),
        and the main process may have died meanwhile (``_MainProcessGone``).
        After quick batches it is not: a stop then costs at most
        ``prefetch_factor`` of them, and the steady state makes no system call.
        """
        tasks = self.tasks
        if time.monotonic() - self.read_at > _STOP_CHECK_AGE:
            events = self._tasks_ready.poll(0)
            parent = self.parent
            if any(fd == parent.fd for fd, _ in events) and parent.gone():
                raise _MainProcessGone
            if any(fd == self.task_fd for fd, _ in events):
                try:
                    tasks.fill()
                except (EOFError, OSError):
                    return True  # the main process closed our pipe: nobody will read the batch
                self.read_at = time.monotonic()
        return tasks.has_leftover and tasks.holds(STOP_BYTES)

    def wait_writable(self) -> bool:
        """Until the answer pipe has room: True; False if the main process is gone or
        has told this worker to stop (``stop_while_sending``)."""
        result_fd, task_fd = self.result_fd, self.task_fd
        while True:
            events = self._answer_room.poll(self._liveness_ms)
            if any(fd == result_fd for fd, _ in events):
                return True
            if any(fd == task_fd for fd, _ in events):
                try:
                    self.tasks.fill()
                except (EOFError, OSError):
                    return False  # the main process closed our pipes
                if self.tasks.holds(STOP_BYTES):
                    self.stop_while_sending = True
                    return False
            elif self.parent.gone():
                return False

    def send(self, reply: tuple, where: str = "") -> bool:
        """Send a reply; one that cannot be pickled (an odd exception) becomes an
        error reply.  False when the main process is gone.

        A batch's own values were pickled already, by ``LayoutSender.encode``."""
        fd = self.result_fd
        try:
            send_frame(fd, pickle.dumps(reply, protocol=pickle.HIGHEST_PROTOCOL),
                       self.wait_writable)
            return True
        except (BrokenPipeError, ConnectionResetError, EOFError):
            return False  # the main process is gone
        except Exception:
            # e.g. an exception (in an error reply) that cannot be pickled
            error = ExceptionWrapper(f"{where} (sending the batch to the main process)")
            failed = failed_reply(reply[BATCH_NO], reply[SLOT_ID], reply[CREATED], error)
            try:
                send_frame(fd, pickle.dumps(failed, protocol=pickle.HIGHEST_PROTOCOL),
                           self.wait_writable)
                return True
            except Exception:
                return False


def _decode_task(data: bytes) -> Any:
    message = pickle.loads(data)
    if message is not STOP and message[KIND] == INDIRECT:
        # A task too large for the pipe: it waits in a memory file (see pool.py).
        _, name, size = message
        message = pickle.loads(read_and_discard(name, size))
    return message


def _serve(worker_id: int, num_workers: int, payload: Any, task_conn: Any,
           result_conn: Any, base_seed: int, parent: ParentWatch,
           inherited_slots: dict[int, Segment] | None) -> bool:
    """Answer tasks until told to stop; True if the main process went away instead."""
    # Ctrl-C reaches the whole process group; the main process decides what
    # happens (it shuts the workers down), so workers ignore it.
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    where = f"in DataLoader worker process {worker_id}"
    pipes = _Pipes(task_conn, result_conn, parent)
    # Nothing of the caller's (dataset, worker_init_fn) runs before the first
    # message: a main process that stops during start-up never sends one.
    if not pipes.wait_for_task():
        return True
    try:
        if isinstance(payload, PickledPayload):
            payload = unpickle_payload(payload, worker_id)
        dataset, batch_settings, worker_init_fn = payload
        start_as_worker(worker_id, num_workers, base_seed + worker_id, dataset)
        if worker_init_fn is not None:
            worker_init_fn(worker_id)
        source = BatchSource(dataset, batch_settings)
        # A stream's copy (or its iterator) may have state; a map-style one has its own or none.
        stateful = batch_settings.iterable or is_stateful(dataset)
    except Exception:
        # The main process re-raises it and stops the pool.
        return not pipes.send(start_failed_reply(ExceptionWrapper(where)))
    worker = _Worker(dataset, source, stateful, where, SlotWriter(inherited_slots), pipes)
    return worker.answer_tasks()


class _Worker:
    """A started worker: its dataset, batch source, slot writer and layout numbering."""

    __slots__ = ("dataset", "source", "where", "writer", "layouts", "pipes", "stateful",
                 "snapshot_every", "made", "seed_per_batch")

    def __init__(self, dataset: Any, source: BatchSource, stateful: bool, where: str,
                 writer: SlotWriter, pipes: _Pipes) -> None:
        self.dataset = dataset
        self.source = source
        self.where = where
        self.writer = writer
        self.layouts = LayoutSender()
        self.pipes = pipes
        self.stateful = stateful
        self.snapshot_every = 1
        self.made = 0  # batches made this epoch, for the snapshots' cadence
        self.seed_per_batch = False  # num_workers="auto": see seed_for_batch

    def answer_tasks(self) -> bool:
        """Until told to stop (False) or the main process is gone (True)."""
        pipes = self.pipes
        seconds = self.source.totals.seconds
        # When the last answer was sent: from then until the next task, this
        # worker waited for a free ring slot (None: a new epoch, or the first task).
        answered_at = None
        while True:
            try:
                message = pipes.next_task()
            except (EOFError, OSError, _MainProcessGone):
                break  # the main process closed our task pipe without a word, or died
            if message is STOP:
                pipes.result_conn.close()
                return False
            if message[KIND] == BATCH:
                now = perf_counter()
                if answered_at is not None:
                    seconds[IDLE] += now - answered_at
                self.source.totals.sample_cpu(now)
                reply = self.make_batch(message)
            elif self.obey(message):
                if message[KIND] == EPOCH:
                    answered_at = None
                continue
            else:
                break
            sending = perf_counter()
            if not pipes.send(reply, self.where):
                if pipes.stop_while_sending:
                    pipes.result_conn.close()
                    return False
                break
            answered_at = perf_counter()
            seconds[SEND] += answered_at - sending
        pipes.result_conn.close()
        return True

    def obey(self, message: tuple) -> bool:
        """Carry out a control message; False if the main process is gone."""
        kind = message[KIND]
        if kind == EPOCH:
            self.source.start_epoch(message[1])
            self.snapshot_every, self.made, self.seed_per_batch = message[2], 0, message[3]
            # num_workers="auto" weighs its workers' memory against its budget.
            self.source.totals.watch_memory = message[3]
            self.source.totals.memory_hint = message[4]
        elif kind == RETIRE:
            self.writer.forget(message[1], message[2])
        elif kind == RESEND_LAYOUTS[KIND]:
            self.layouts = LayoutSender()
        elif kind == SNAPSHOT_REQUEST[KIND]:
            try:
                reply = snapshot_reply(snapshot(self.dataset, self.source,
                                                self.source.stream_ended))
            except Exception:
                reply = start_failed_reply(ExceptionWrapper(
                    f"{self.where} (taking the dataset's state_dict() at the epoch's end)"))
            return self.pipes.send(reply)
        else:  # DATASET_STATE
            try:
                restore_copy(self.dataset, self.source, *message[1:])
            except Exception:
                # As a worker that could not start: the main process re-raises it.
                error = ExceptionWrapper(f"{self.where} (loading the dataset's state_dict)")
                return self.pipes.send(start_failed_reply(error))
        return True

    def make_batch(self, message: tuple) -> tuple:
        """Make a batch task's batch into its slot; the reply to send."""
        _, batch_no, slot, kernel_batch, indices = message
        layout = None
        slot_info = SlotInfo(*slot)
        if kernel_batch:  # our BatchSampler kernel's int64 index array, sent as its bytes
            indices = np.frombuffer(indices, dtype=np.int64)
        allocation = self.writer.allocator(slot_info)
        where, slot_id = self.where, slot_info.slot_id
        if self.seed_per_batch:
            seed_for_batch(self.source.base_seed, batch_no)
        try:
            layout = self.source.make_into(batch_no, indices, kernel_batch, allocation)
            error = None
        except StopIteration:
            # The end of this worker's IterableDataset replica.  From a map-style
            # dataset it is an error that the main process re-raises, as torch does
            # (ending the caller's loop there).
            error = None if self.source.iterable else ExceptionWrapper(where)
        except Exception:
            error = ExceptionWrapper(where)
        # A grown slot is reported even for a failed batch, so the main
        # process maps it whole.
        created = allocation.created
        if error is not None:
            reply = failed_reply(batch_no, slot_id, created, error)
        elif layout is None:
            reply = stream_ended_reply(batch_no, slot_id, created)
        else:
            try:
                reply = batch_reply(batch_no, slot_id, created, self.layouts.encode(layout))
            except Exception:
                # e.g. a non-array leaf of the batch that cannot be pickled
                reply = failed_reply(batch_no, slot_id, created, ExceptionWrapper(
                    f"{where} (sending the batch to the main process)"))
        reply = with_times(reply, self.source.totals.packed())
        self.made += 1
        every = self.snapshot_every
        if self.stateful and (layout is None and error is None or every and self.made % every == 0):
            try:
                snap = snapshot(self.dataset, self.source, self.source.stream_ended)
                if snap is not None:
                    reply = with_snapshot(reply, snap)
            except Exception:
                reply = failed_reply(batch_no, slot_id, created, ExceptionWrapper(
                    f"{where} (taking the dataset's state_dict() after batch {batch_no})"))
        return reply
