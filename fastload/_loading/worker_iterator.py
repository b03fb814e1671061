"""The iterator whose batches worker processes make: dispatch, receive, hand out in order.

``_MultiProcessIter`` keeps ``num_workers * prefetch_factor`` batches in
flight in a ``WorkerPool``, each written by a worker into a slot of the
shared-memory ``Ring``, and hands them out in batch order as views of their
slot.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import numbers
import os
import sys
import time
from time import perf_counter
from typing import Any, Iterator

import numpy as np

from fastload.dataset_state import WorkerSnapshots, is_stateful, warn_of_replay
from fastload._ring import Ring, near_open_file_limit, too_many_open_files, uses_memfd
from fastload._lifetime.forks import forking_workers
from fastload._lifetime.hooks import at_fork
from fastload._lifetime.weak_registry import WeakRegistry
from fastload._loading.autotune import MAX_PREFETCH, AutoWorkers
from fastload._loading.errors import ArrivalError, IterArgumentError, WorkerDied
from fastload._loading.iterators import _BaseIter
from fastload._loading.pool import WorkerPool
from fastload._loading.reaping import running, show_workers, shown_workers
from fastload._loading.settings import LoaderSettings
from fastload._loading.copy_on_read import warn_of_large_containers
from fastload._loading.teardown import tear_down_when_gone
from fastload._loading.wire.layouts import LayoutLost, LayoutReceiver
from fastload._loading.wire.messages import BATCH_FAILED, BATCH_MADE, BATCH_NO, RESEND_LAYOUTS, \
    SLOT_ID, SNAPSHOT, SNAPSHOT_REQUEST, SNAPSHOT_TAKEN, START_FAILED, STREAM_ENDED, TIMES, \
    batch_task, dataset_state_task, epoch_task, retire_task
from fastload._loading.wire.payload import pickle_for_workers

__all__ = ["_MultiProcessIter"]


def _may_hold_tensors(indices: Any) -> bool:
    """Whether a sampler's batch may hold tensors (NOTE [ Tasks that may hold
    tensors ] in wire/picklers.py): it is not an ndarray, and torch is loaded."""
    return type(indices) is not np.ndarray and "torch" in sys.modules


# How long reading a finished iterator's ``_workers`` waits for its idle
# workers to exit (they were told to; the pool stops any that outstay this).
_WORKERS_EXIT_WAIT = 5.0


def _checked_prefetch_factor(prefetch_factor: Any) -> int:
    """Batches each worker may have on its way; checked at ``iter()``, where torch checks it.

    The loader accepts 0 (torch's "non-negative" check), and the attribute can
    be set between epochs, so only now is it known that workers need it.
    """
    if not isinstance(prefetch_factor, numbers.Integral):  # True is 1, as torch takes it
        raise TypeError(f"prefetch_factor must be an int when num_workers > 0, "
                        f"but got {prefetch_factor!r}")
    if prefetch_factor < 1:
        raise IterArgumentError(f"prefetch_factor must be greater than 0 when num_workers > 0 "
                                f"(it is how many batches each worker loads ahead), "
                                f"but got {prefetch_factor}")
    return int(prefetch_factor)


# Every worker-backed iterator of this process, for the fork hook below.
_worker_iterators = WeakRegistry()


def _disown_inherited_iterators() -> None:
    """In a forked child: the iterators it inherited are its parent's.

    Their workers answer the parent: a child that asked them for batches
    took the parent's answers (and the parent then waited forever for them),
    as a child of torch's loader does.  So the copy is closed: ``next()`` on
    it raises, and a persistent loader's ``iter()`` starts workers of the
    child's own.  Its teardown, when dropped, leaves the parent's workers and
    ring alone (``teardown.release_workers_and_ring``).
    """
    for iterator in _worker_iterators.live():
        iterator.closed = True
        iterator.inherited_from = iterator.owner_pid
    _worker_iterators.clear()


at_fork("inherited iterators", after_in_child=_disown_inherited_iterators)


class _MultiProcessIter(_BaseIter):
    """Batches made by worker processes into ring slots, handed out in order."""

    _DELIVER_DEPTH = 4  # __next__, _next_batch, _next, _deliver
    # The process whose workers these are, in a child that inherited this
    # iterator by fork (``_disown_inherited_iterators``).
    inherited_from: int | None = None

    def __init__(self, settings: LoaderSettings, resume: dict | None = None) -> None:
        self._prefetch = _checked_prefetch_factor(settings.prefetch_factor)
        super().__init__(settings)
        context = settings.multiprocessing_context or multiprocessing.get_context()
        method = context.get_start_method()
        self._num_workers = settings.num_workers
        self._timeout = settings.timeout if settings.timeout > 0 else None
        self._in_order = settings.in_order
        self._persistent = settings.persistent_workers
        self._snapshot_every = settings.snapshot_every_n_steps
        self._batch_size = settings.batch.batch_size
        # New workers every epoch, forked: they can write into the slots the
        # last epoch left, through the mappings they inherit.
        self._spares = settings.spare_slots \
            if method == "fork" and not self._persistent and uses_memfd() else None
        self._ring = Ring(in_flight=self._num_workers * self._prefetch,
                          spares=self._spares.take() if self._spares is not None else ())
        self._tasks: dict[int, tuple[int, int]] = {}     # batch_no -> (worker, slot)
        self._layouts = [LayoutReceiver() for _ in range(self._num_workers)]
        named = [("dataset", settings.dataset), ("batch settings and collate_fn", settings.batch),
                 ("worker_init_fn", settings.worker_init_fn)]
        payload: Any = tuple(obj for _, obj in named)
        warn_of_large_containers(settings.dataset, method)
        if method != "fork":
            payload = pickle_for_workers(named, method)
        base_seed = self._begin_epoch(resume)
        auto = settings.autopilot
        # Tasks are sized for the deepest ring prefetch_factor="auto" may reach.
        self._pool = WorkerPool(context, self._num_workers, payload, base_seed,
                                MAX_PREFETCH if auto and auto.auto_prefetch else self._prefetch,
                                ring_prefix=self._ring.prefix, inherited_slots=self._ring.inherited)
        self._seed_per_batch = settings.seed_per_batch
        self._auto = AutoWorkers(self, auto, settings.auto_choice, settings.auto_climb) \
            if auto is not None else None
        self.owner_pid = os.getpid()
        self._finalizer = tear_down_when_gone(self, self._pool, self._ring)
        _worker_iterators.add(self)
        self._workers_key = show_workers(self)
        try:
            # The first tasks wait in the pipes before the workers exist (see WorkerPool).
            self._start_dispatch(base_seed)
            with forking_workers(self._ring, self._spares):
                self._pool.start()
        except BaseException:
            self.shutdown()
            raise
        shown_workers(self._workers_key).extend(self._pool.processes)

    # -- epochs --------------------------------------------------------------

    def _start_dispatch(self, base_seed: int) -> None:
        self._base_seed = base_seed
        hint = self._auto.memory_hint(self._num_workers) if self._auto is not None else None
        self._pool.broadcast(epoch_task(base_seed, self._snapshot_every, self._seed_per_batch, hint))
        self._tasks.clear()
        self._replies: dict[int, tuple] = {}             # batch_no -> (worker, reply), not yet handed out
        self._load = [0] * self._num_workers
        self._active = [worker not in self._pool.retired for worker in range(self._num_workers)]
        # Batch k goes to worker k % num_workers, also when resuming at k.
        self._rotation = self._next_batch_no % self._num_workers
        self._next_to_yield = self._next_batch_no
        self._indices_exhausted = False
        self._resume_datasets()
        if self._auto is not None:
            self._auto.top_up()
            return
        for _ in range(self._num_workers * self._prefetch):
            self._dispatch()

    def _begin_epoch(self, resume: dict | None, **how: Any) -> int:
        """The base's, and the dataset copies' snapshots for this epoch (an
        IterableDataset, or a map-style one with ``state_dict``: see ``dataset_state``)."""
        base_seed = super()._begin_epoch(resume, **how)
        self._dataset_resume = resume.get("dataset") if resume is not None else None
        self._snapshots: WorkerSnapshots | None = None
        if self._iterable or is_stateful(self._dataset):
            section = self._dataset_resume
            if section is not None:
                self._snapshots = WorkerSnapshots(section["workers"], section, self._iterable,
                                                  section.get("replays"))
            else:  # persistent workers' copies carry their state into the next epoch
                previous = getattr(self, "_carried", None)
                self._snapshots = WorkerSnapshots.next_epoch(
                    previous.workers if previous else [None] * self._num_workers,
                    previous.replays if previous else None, self._iterable)
            self._carried = self._snapshots
            self.progress.datasets = self._snapshots
        return base_seed

    def _resume_datasets(self) -> None:
        """Resuming: each worker's copy takes its state (and replays what it made
        since) before its first task, and an IterableDataset's round-robin goes on
        from the worker after the last one handed out, the exhausted ones skipped."""
        section, self._dataset_resume = self._dataset_resume, None
        if section is None:
            return
        replays = section.get("replays") or [0 if self._iterable else []] * self._num_workers
        next_epoch = bool(section.get("next_epoch", False))
        for worker, (snap, replay) in enumerate(zip(section["workers"], replays)):
            if snap is not None or replay:
                self._pool.send(worker, dataset_state_task(snap, replay, next_epoch),
                                may_hold_tensors="torch" in sys.modules)
            if snap is not None and snap["ended"] and self._iterable:
                self._active[worker] = False
        if self._iterable:
            replayed = sum(replays)
            if replayed and not is_stateful(self._dataset) \
                    and all(snap is None for snap in section["workers"]):
                # iter(loader): DataLoader.__iter__, _get_iterator, __init__, _start_dispatch.
                warn_of_replay(self._dataset, replayed * (self._batch_size or 1), stacklevel=7)
            for worker in section["exhausted"]:
                self._active[worker] = False
            self._rotation = section["next_worker"]
            self._next_batch_no = self._next_to_yield = section["next_batch_no"]

    def reset(self, len_called: int | None, resume: dict | None = None) -> None:
        """A new epoch on the same workers (persistent_workers); ``len_called``:
        the loader's ``len()`` of an IterableDataset, as last asked."""
        self._len_called = len_called
        self._handed_at, self._first_batch = None, True  # loader.report()'s account
        blocked = self._ledger.blocked  # draining is no wait of the consumer's
        with self._worker_death_raises():
            self._drain()
            self._ledger.blocked = blocked
            self._refresh_snapshots()
            base_seed = self._begin_epoch(resume, same_workers=True)
            self._start_dispatch(base_seed)

    def _drain(self) -> None:
        """Collect the answers of an abandoned epoch, so its slots come back."""
        worker_of = {batch_no: worker for batch_no, (worker, _) in
                     [*self._replies.items(), *self._tasks.items()]}
        for _, reply in self._replies.values():
            self._ring.release(reply[SLOT_ID])
        self._replies.clear()
        while self._tasks:
            _, reply = self._receive()
            self._tasks.pop(reply[BATCH_NO], None)
            self._ring.release(reply[SLOT_ID])
        if self._snapshots is not None:
            self._snapshots.absorb_unhanded(worker_of)

    def _refresh_snapshots(self) -> None:
        """Persistent workers, between epochs: a worker whose last snapshot is older
        than its last batch (``snapshot_every_n_steps``) sends one now, so a state of
        the next epoch's start holds its copy as it is (batches of a past epoch
        cannot be replayed: its seeds are gone)."""
        snapshots = self._snapshots
        if snapshots is None:
            return
        stale = [w for w, replay in enumerate(snapshots.replays) if replay]
        for worker in stale:
            self._pool.send(worker, SNAPSHOT_REQUEST)
        for worker in stale:
            while True:
                got = self._pool.receive(self._timeout, worker)
                if got is None:
                    self._pool.exit_grace = 0.0
                    raise RuntimeError(f"DataLoader timed out after {self._timeout} seconds "
                                       f"waiting for worker {worker}'s dataset state_dict()")
                kind, payload = got[1][0], got[1][4]
                if kind == START_FAILED:
                    self.shutdown()
                    payload.reraise()
                if kind == SNAPSHOT_TAKEN:
                    break
            snapshots.workers[worker] = payload
            snapshots.replays[worker] = 0 if self._iterable else []

    # -- tasks ---------------------------------------------------------------

    def _pick_worker(self) -> int | None:
        """The worker for the next batch: the next active one in turn, as torch picks it.

        In order, batch ``k`` goes to worker ``k % num_workers`` (skipping the
        workers whose IterableDataset replica is exhausted) however fast each
        worker is: which worker makes a batch decides what a dataset that draws
        from a per-worker generator (numpy's global one, seeded per worker)
        returns, so the same seed must give the same assignment in every run.
        Out of order, a worker is passed over while it has its share of the
        tasks in flight (torch's rule).
        """
        if self._auto is not None:
            return self._auto.pick()
        count = self._num_workers
        capacity = None
        if not self._in_order:
            active = sum(self._active)
            capacity = self._prefetch * count // active if active else 0
        for _ in range(count):
            worker = self._rotation
            self._rotation = (worker + 1) % count
            if self._active[worker] and (capacity is None or self._load[worker] < capacity):
                return worker
        return None

    def _dispatch(self) -> None:
        """Send the next batch to its worker, if there is one to send."""
        if self._indices_exhausted:
            return
        while self._skip_after and self._skips_next():
            self._rotation = (self._rotation + 1) % self._num_workers
        worker = self._pick_worker()
        if worker is None:
            return
        try:
            indices = next(self._indices)
        except StopIteration:
            self._indices_exhausted = True
            return
        for slot_id, name in self._ring.take_retired():
            self._pool.broadcast(retire_task(slot_id, name))
        try:
            slot = self._ring.acquire(worker)  # may make a slot's file: the open-file limit
        except Exception:
            self.shutdown()
            raise
        batch_no = self._next_batch_no
        self._next_batch_no += 1
        self._tasks[batch_no] = (worker, slot.slot_id)
        self._load[worker] += 1
        if self._snapshots is not None and not self._iterable and self._snapshot_every != 1:
            self._snapshots.sent(batch_no, indices)  # to replay it, until a snapshot covers it
        # Plain tuples and raw bytes pickle far faster than a tuple subclass
        # and an ndarray: this is on the per-batch path of both processes.
        # Only our kernel's batches travel as bytes (and become lists of keys);
        # any other sampler's batch reaches the dataset as it was yielded.
        if self._kernel_batch:
            self._pool.send(worker, batch_task(batch_no, tuple(slot), True, indices.tobytes()))
        else:
            self._pool.send(worker, batch_task(batch_no, tuple(slot), False, indices),
                            may_hold_tensors=_may_hold_tensors(indices))

    def _receive(self, awaited: int | None = None) -> tuple[int, tuple]:
        """``(worker, reply)``: the next reply from ``awaited`` (None: any worker) or
        from a dying worker; dead workers and timeouts raise."""
        blocked_from = perf_counter()
        got = self._pool.receive(self._timeout, awaited)
        self._ledger.blocked += perf_counter() - blocked_from
        if got is None:
            # As torch's, the iterator stays usable: the next call waits for the
            # batch again.  A worker is stuck in the caller's code, though: if
            # the loop is left now, the workers are terminated, not waited for.
            self._pool.exit_grace = 0.0
            raise RuntimeError(f"DataLoader timed out after {self._timeout} seconds")
        worker, reply = got
        if len(reply) > TIMES:  # an answer to a batch task: its worker's stage totals
            if len(reply) > SNAPSHOT:  # the snapshot of a dataset with state_dict (dataset_state)
                if self._snapshots is not None:
                    self._snapshots.arrive(reply[BATCH_NO], reply[SNAPSHOT])
            self._times.workers[worker] = reply[TIMES]
            reply = reply[:TIMES]
        kind, batch_no, slot_id, created, payload = reply
        if created is not None:
            try:
                self._ring.adopt(slot_id, created)
            except Exception:
                self.shutdown()
                raise
        if kind == BATCH_MADE:
            try:
                # Decoded on arrival: a worker's layout numbers follow its sending order.
                payload = self._layouts[worker].decode(payload)
            except Exception as exc:
                if isinstance(exc, (OSError, EOFError)):
                    # A value its worker hands over by descriptor, which a dead
                    # worker cannot: the death is the error.
                    self._pool.raise_if_exiting(worker)
                if isinstance(exc, (OSError, RuntimeError)) and near_open_file_limit():
                    # A descriptor that could not be received ("received 0 items
                    # of ancdata"): torch's error, as torch checks after a failed get.
                    self.shutdown()
                    raise too_many_open_files() from exc
                # e.g. a value whose class cannot be rebuilt in this process:
                # the batch fails at its turn, as a worker's error would, and
                # its slot and task are accounted for like any other answer.
                exc.add_note(f"raised in the main process while unpickling batch {batch_no} "
                             f"from worker {worker}")
                kind, payload = BATCH_FAILED, ArrivalError(exc)
                if isinstance(exc, LayoutLost):
                    self._pool.send(worker, RESEND_LAYOUTS)
            reply = (kind, batch_no, slot_id, created, payload)
        if kind == START_FAILED:
            self.shutdown()
            payload.reraise()
        if batch_no in self._tasks:
            self._load[worker] -= 1
            if self._auto is not None and self._auto.retiring:
                self._auto.answered(worker)
        return worker, reply

    def _next_batch(self) -> Any:
        try:
            return self._next()
        except KeyboardInterrupt:
            self.shutdown()
            raise
        except WorkerDied as exc:
            self.shutdown()
            raise RuntimeError(str(exc)) from None

    @contextlib.contextmanager
    def _worker_death_raises(self) -> Iterator[None]:
        """A worker found dead (as ``__next__`` does): stop the rest, raise RuntimeError."""
        try:
            yield
        except WorkerDied as exc:
            self.shutdown()
            raise RuntimeError(str(exc)) from None

    def _next(self) -> Any:
        if self.closed or self.epoch_finished:
            if self.inherited_from is not None and not self.epoch_finished:
                raise RuntimeError(
                    f"this DataLoader iterator came with a fork from process "
                    f"{self.inherited_from}, whose workers serve that process only; "
                    f"call iter() on the loader in this process to start workers of its own")
            raise StopIteration
        while True:
            ready = self._take_ready()
            if ready is not None:
                worker, (kind, batch_no, slot_id, _, payload) = ready
                if kind == BATCH_MADE:
                    layout, values = payload
                    if self._source.as_torch:
                        layout.as_torch()
                    batch = layout.build(self._ring.lease(slot_id), values)
                    if self._auto is not None:
                        self._auto.tick()
                        self._auto.top_up()
                    else:
                        self._dispatch()
                    if self._snapshots is not None:
                        self._snapshots.hand(worker, batch_no)
                    return self._deliver(batch_no, batch)
                self._ring.release(slot_id)
                if kind == STREAM_ENDED:  # this worker's IterableDataset replica is exhausted
                    self._active[worker] = False
                    if self._snapshots is not None:
                        self._snapshots.end(worker, batch_no)
                    self._dispatch()  # keep the other workers' share in flight
                    continue
                self.progress.hand(batch_no)  # its error was the caller's batch: resuming skips it
                if self._snapshots is not None:
                    self._snapshots.hand(worker, batch_no)
                self._dispatch()
                payload.reraise()
            if not self._tasks:
                self._dispatch()  # e.g. workers left idle while an exhausted one was skipped
                if not self._tasks:
                    self._end_epoch()
                    raise StopIteration
                continue
            # In order, the next batch's worker is known: only its answer is
            # worth waking up for.
            awaited = self._tasks.get(self._next_to_yield) if self._in_order else None
            worker, reply = self._receive(awaited[0] if awaited is not None else None)
            del self._tasks[reply[BATCH_NO]]
            self._replies[reply[BATCH_NO]] = (worker, reply)

    def _take_ready(self) -> tuple | None:
        if self._in_order:
            # An exhausted IterableDataset worker leaves holes in the numbering.
            while self._next_to_yield not in self._replies and self._next_to_yield not in self._tasks \
                    and self._next_to_yield < self._next_batch_no:
                self._next_to_yield += 1
            reply = self._replies.pop(self._next_to_yield, None)
            if reply is not None:
                self._next_to_yield += 1
            return reply
        if self._replies:
            return self._replies.pop(min(self._replies))
        return None

    def _end_epoch(self) -> None:
        if self._persistent:
            self._refresh_snapshots()  # every task is answered: the copies are idle
        self.epoch_finished = True
        if not self._persistent:
            if self._spares is not None:
                # Every task is answered: no worker writes a slot any more.
                self._ring.hand_over(self._spares)
            # The workers are idle: they exit on their own, and the caller's
            # StopIteration does not wait for their teardown (a visible share
            # of a short epoch).  They are reaped when the next pool starts, or
            # when the loader goes (DataLoader._reap_workers_when_gone).
            self._pool.shutdown(wait=False)
            self.shutdown()

    # -- teardown ------------------------------------------------------------

    def shutdown(self) -> None:
        """Stop the workers and close the ring; held batches stay valid."""
        self.closed = True
        self._times.done = True
        self._finalizer()

    # torch's name, which code calls to free a persistent loader's workers
    # (``loader._iterator._shutdown_workers()``); the next ``iter()`` starts new ones.
    _shutdown_workers = shutdown

    @property
    def worker_pids(self) -> list[int]:
        return self._pool.pids

    @property
    def _workers(self) -> list:
        """torch's ``_workers``, which code that watches workers reads: the
        worker ``Process`` objects in worker-id order, the same list every
        epoch of persistent workers, kept after shutdown with their exit codes.

        torch's shutdown joins its workers; at an epoch's end this one leaves
        its idle workers to exit on their own (see ``_end_epoch``), so reading
        the list of a finished iterator waits for them (bounded): each has its
        exit code then, as torch's has.
        """
        processes = shown_workers(self._workers_key)
        if self.closed and self.inherited_from is None:
            deadline = time.monotonic() + _WORKERS_EXIT_WAIT
            for process in processes:
                while running(process) and time.monotonic() < deadline:
                    process.join(timeout=0.05)
        return processes

