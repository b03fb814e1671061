"""A dataset's own state in a loader's ``state_dict``: snapshots, replays, the section.

torchdata's ``StatefulDataLoader`` set the convention: a dataset (map-style
or iterable) that defines ``state_dict()`` and ``load_state_dict(state)`` is
saved and restored through them, and so is the iterator an IterableDataset's
``__iter__`` returns when that one defines them; with workers each worker's
copy is.  The state must describe the batch boundary the caller has seen,
while workers run ahead by the prefetch.  So a worker snapshots its copy with
every ``snapshot_every_n_steps``-th answer it sends (and with its stream's
end), and the main process keeps, per worker, the snapshot of the last
answer of that worker it handed out, and what that worker made since
(``WorkerSnapshots``): the batches a resume makes that copy replay, without
handing them out, to reach the boundary exactly.  A stream without any state
methods has no snapshot at all: resuming replays all it had given (and
warns).  With ``num_workers=0`` the dataset's current state is the
boundary's.

A snapshot is ``{"state": dataset.state_dict() or None, "iter":
iterator.state_dict() or None, "ended": bool}``.  An IterableDataset that is
its own iterator is saved once, as ``"iter"``.  Restoring follows torchdata's
order: the dataset's state, then ``iter(dataset)``, then the iterator's state
(an iterator that sets its position in ``__iter__`` keeps the loaded one).
``ended`` says the worker's stream gave its last (short) batch, so the next
one is its end, whatever the dataset's own state says about it (a dataset
that starts over once its stream is done would otherwise yield it again).

A replay is, per worker, what it made after its snapshot: a count of batches
for a stream, the index batches for a map-style copy.

The iterable round-robin: batch ``k`` of an epoch goes to the next worker in
turn that is not exhausted (``_MultiProcessIter._pick_worker``), so the
caller sees the workers' streams in turn, an exhausted one skipped; which
numbers are holes (tasks sent to a worker before its end was seen) depends
on timing, so a state records the worker after the last one handed out,
the workers found exhausted and the next batch number, not a count to replay.
"""

from __future__ import annotations

import warnings
from typing import Any

__all__ = ["is_stateful", "has_state", "WorkerSnapshots", "MainSnapshot", "dataset_section",
           "check_dataset_section", "needs_fresh_workers", "restore_copy", "warn_of_replay"]

_KINDS = {True: "iterable", False: "map"}


def is_stateful(obj: Any) -> bool:
    """Whether ``obj`` defines both ``state_dict`` and ``load_state_dict``
    (torchdata's ``Stateful`` protocol, checked by duck typing as it is)."""
    return callable(getattr(obj, "state_dict", None)) \
        and callable(getattr(obj, "load_state_dict", None))


def has_state(loader: Any) -> bool:
    """Whether a state holds a dataset part: every IterableDataset's (its own
    state, its iterator's, or what to replay), a stateful map-style one's."""
    return bool(loader._iterable) or is_stateful(loader.dataset)


def snapshot(dataset: Any, source: Any, ended: bool) -> dict | None:
    """The copy's state now, or None when neither it nor its open stream has any."""
    stream = source.stream
    state = iter_state = None
    if stream is not None:
        if is_stateful(dataset) and stream is not dataset:
            state = dataset.state_dict()
        if is_stateful(stream):
            iter_state = stream.state_dict()
    elif is_stateful(dataset):
        # Not iterated yet: an iterator-dataset's state belongs after iter() (restore_copy).
        if source.iterable and dataset_is_own_iterator(dataset):
            iter_state = dataset.state_dict()
        else:
            state = dataset.state_dict()
    if state is None and iter_state is None and not ended:
        return None
    return {"state": state, "iter": iter_state, "ended": bool(ended)}


def dataset_is_own_iterator(dataset: Any) -> bool:
    """An IterableDataset that is its own iterator (``__iter__`` returns it, ``__next__``)."""
    return callable(getattr(dataset, "__next__", None))


class MainSnapshot:
    """``num_workers=0``: the dataset is the loader's own; its state is read when
    the state is taken, the stream's end from the epoch's ``BatchSource``."""

    __slots__ = ("source",)

    def __init__(self, source: Any) -> None:
        self.source = source


class WorkerSnapshots:
    """Per worker, the snapshot of its last answer the caller was handed that had
    one, what it made since (``replays``), and the iterable round-robin's position
    at that boundary (one epoch)."""

    __slots__ = ("workers", "replays", "exhausted", "next_worker", "next_batch_no", "yielded",
                 "iterable", "_arrived", "_sent")

    def __init__(self, carried: list, position: dict | None = None, iterable: bool = True,
                 replays: list | None = None) -> None:
        self.workers = list(carried)      # None: the copy as it came from the main process
        self.iterable = iterable
        self.replays = [_copy_replay(r) for r in replays] if replays is not None \
            else [_no_replay(iterable) for _ in carried]
        position = position or {}
        self.exhausted = set(position.get("exhausted", ()))
        self.next_worker = position.get("next_worker", 0)
        self.next_batch_no = position.get("next_batch_no", 0)
        self.yielded = position.get("batches_yielded", 0)
        self._arrived: dict[int, dict] = {}  # batch_no -> the snapshot its answer carried
        self._sent: dict[int, Any] = {}      # batch_no -> its indices (map-style, replayable)

    @classmethod
    def next_epoch(cls, carried: list, replays: list | None, iterable: bool) -> "WorkerSnapshots":
        """A new epoch of the same (persistent) copies: their states carry over,
        and each stream starts over."""
        return cls([None if s is None else {**s, "ended": False} for s in carried],
                   iterable=iterable, replays=replays)

    def sent(self, batch_no: int, indices: Any) -> None:
        """A map-style batch went to a worker: kept until handed, to replay it."""
        self._sent[batch_no] = indices

    def arrive(self, batch_no: int, snap: dict) -> None:
        self._arrived[batch_no] = snap

    def hand(self, worker: int, batch_no: int) -> None:
        """Batch ``batch_no`` of ``worker`` (or the error making it raised) reached the caller."""
        self._take(worker, batch_no)
        self.yielded += 1
        self.next_batch_no = max(self.next_batch_no, batch_no + 1)
        self.next_worker = (worker + 1) % len(self.workers)

    def end(self, worker: int, batch_no: int) -> None:
        """``worker``'s stream ended (seen in turn, after the batches handed before it)."""
        self._take(worker, batch_no, counts=False)
        self.exhausted.add(worker)

    def _take(self, worker: int, batch_no: int, counts: bool = True) -> None:
        snap = self._arrived.pop(batch_no, None)
        indices = self._sent.pop(batch_no, None)
        if snap is not None:
            self.workers[worker], self.replays[worker] = snap, _no_replay(self.iterable)
        elif counts and self.iterable:
            self.replays[worker] += 1
        elif counts:
            self.replays[worker].append(_as_list(indices))

    def absorb_unhanded(self, worker_of: dict) -> None:
        """An abandoned epoch's answers were collected: the copies are past them
        (persistent workers carry this into the next epoch)."""
        for batch_no in sorted(set(self._arrived) | set(self._sent)):
            if batch_no in worker_of:
                self._take(worker_of[batch_no], batch_no)
        self._arrived.clear()
        self._sent.clear()

    def position(self) -> dict:
        return {"exhausted": sorted(self.exhausted), "next_worker": self.next_worker,
                "next_batch_no": self.next_batch_no, "batches_yielded": self.yielded}

    def replayed_batches(self) -> int:
        return sum(r if isinstance(r, int) else len(r) for r in self.replays)


def _no_replay(iterable: bool) -> Any:
    return 0 if iterable else []


def _copy_replay(replay: Any) -> Any:
    return replay if isinstance(replay, int) else list(replay)


def _as_list(indices: Any) -> Any:
    return indices.tolist() if hasattr(indices, "tolist") else indices


def dataset_section(loader: Any, progress: Any) -> dict | None:
    """The dataset's part of a state (None for a map-style dataset without state methods).

    Mid-epoch it is the boundary the caller has seen; between epochs, what
    the next epoch starts from (``next_epoch``): the dataset's state
    (``num_workers=0``), the workers' copies (persistent workers), or fresh
    copies (new workers).
    """
    if not has_state(loader):
        return None
    dataset = loader.dataset
    workers = loader.num_workers
    tracker = getattr(progress, "datasets", None)
    mid_epoch = progress is not None and not progress.finished
    if mid_epoch and isinstance(tracker, WorkerSnapshots):
        workers = len(tracker.workers)  # the epoch's, if the attribute changed since
    elif mid_epoch and isinstance(tracker, MainSnapshot):
        workers = 0
    section: dict = {"kind": _KINDS[bool(loader._iterable)], "num_workers": workers,
                     "next_epoch": not mid_epoch}
    if workers == 0:
        source = tracker.source if isinstance(tracker, MainSnapshot) else None
        ended = mid_epoch and source is not None and source.stream_ended
        snap = snapshot(dataset, source, ended) if source is not None and mid_epoch \
            else snapshot(dataset, _StreamClosed(bool(loader._iterable)), False)
        section["main"] = snap
        stateless = snap is None or (snap["state"] is None and snap["iter"] is None)
        # A stream without state is read again up to where it was.
        section["replay"] = (progress.handed if mid_epoch and stateless and not ended else 0) \
            if loader._iterable else []
        return section
    if mid_epoch and isinstance(tracker, WorkerSnapshots):
        section["workers"] = list(tracker.workers)
        section["replays"] = [_copy_replay(r) for r in tracker.replays]
        section.update(tracker.position())
        return section
    live = loader._iterator is not None and not loader._iterator.closed
    kept = loader.persistent_workers and live and isinstance(tracker, WorkerSnapshots) \
        and len(tracker.workers) == workers
    following = WorkerSnapshots.next_epoch(
        tracker.workers if kept else [None] * workers, tracker.replays if kept else None,
        bool(loader._iterable))
    section["workers"] = following.workers
    section["replays"] = following.replays
    section.update(following.position())
    return section


class _StreamClosed:
    """A ``BatchSource`` stand-in between epochs: no stream is open."""

    stream = None

    def __init__(self, iterable: bool) -> None:
        self.iterable = iterable


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def check_dataset_section(state: dict, loader: Any) -> None:
    """ValueError naming what in ``state``'s dataset part does not fit ``loader``."""
    section = state.get("dataset")
    dataset = loader.dataset
    name = type(dataset).__name__
    if section is None:
        if loader._iterable:
            raise ValueError(f"this state_dict holds no state of the IterableDataset "
                             f"{name}: it comes from a loader of another dataset")
        return  # a map-style state taken before datasets' states were kept: nothing to restore
    if not isinstance(section, dict) or section.get("kind") not in _KINDS.values():
        raise ValueError(f"DataLoader state_dict: its 'dataset' entry is not a dataset's "
                         f"state: {section!r:.200}")
    kind = _KINDS[bool(loader._iterable)]
    if section["kind"] != kind:
        raise ValueError(f"this state_dict comes from a loader of a {section['kind']}-style "
                         f"dataset, this one's {name} is {kind}-style")
    workers = section.get("num_workers")
    if not _is_count(workers):
        raise ValueError(f"DataLoader state_dict: the dataset part's 'num_workers' must be "
                         f"a count, got {workers!r:.200}")
    if workers == 0:
        snaps = [section.get("main")]
        replays = [section.get("replay", _no_replay(loader._iterable))]
    else:
        snaps = section.get("workers")
        if not isinstance(snaps, list) or len(snaps) != workers:
            raise ValueError(f"DataLoader state_dict: 'workers' must list {workers} workers' "
                             f"states, got {snaps!r:.200}")
        replays = section.get("replays", [_no_replay(loader._iterable)] * workers)
        _check_position(section, workers)
    for worker, snap in enumerate(snaps):
        where = "main" if workers == 0 else f"workers[{worker}]"
        _check_snapshot(snap, where)
        if snap is not None and snap.get("state") is not None and not is_stateful(dataset):
            raise ValueError(f"this state_dict holds a dataset's own state, but {name} does "
                             f"not define state_dict() and load_state_dict(state) to take it")
    if not isinstance(replays, list) or len(replays) != len(snaps) \
            or not all(_is_replay(r, loader._iterable) for r in replays):
        raise ValueError(f"DataLoader state_dict: the batches to replay must be, per worker, "
                         f"{'a count' if loader._iterable else 'a list of index batches'}: "
                         f"{replays!r:.200}")


class WorkerCountMismatch(ValueError, AssertionError):
    """A dataset's state saved by one number of workers, resumed by another.

    A ValueError like fastload's other refusals, and an AssertionError as
    torchdata's StatefulDataLoader raises for it.
    """


def check_dataset_workers(state: dict, loader: Any) -> None:
    """Refuse, at ``iter()``, a dataset state whose workers differ from the loader's.

    Checked when the epoch starts rather than at ``load_state_dict``: the
    worker count that resumes is the one set by then (torchdata checks there too).
    """
    section = state.get("dataset")
    if section is None:
        return
    recorded, workers = section["num_workers"], loader.num_workers
    if recorded == workers:
        return
    reason = ("each worker reads its own stream of an IterableDataset (sharding it by "
              "get_worker_info()), so the streams of" if loader._iterable else
              "each worker's copy of the dataset has a state of its own, so those of")
    raise WorkerCountMismatch(f"this state_dict comes from a DataLoader with num_workers="
                              f"{recorded!r}, this one has num_workers={workers}: {reason} "
                              f"{recorded!r} cannot continue in {workers}; set the loader's "
                              f"num_workers={recorded!r}")


def _is_replay(replay: Any, iterable: bool) -> bool:
    return _is_count(replay) if iterable else isinstance(replay, list)


def _check_position(section: dict, workers: int) -> None:
    exhausted, next_worker = section.get("exhausted"), section.get("next_worker")
    if not isinstance(exhausted, list) or not all(_is_count(w) and w < workers for w in exhausted) \
            or not (_is_count(next_worker) and next_worker < workers) \
            or not _is_count(section.get("next_batch_no")) \
            or not _is_count(section.get("batches_yielded")):
        raise ValueError(f"DataLoader state_dict: the workers' position (exhausted, "
                         f"next_worker, next_batch_no, batches_yielded) does not fit "
                         f"{workers} workers: {section!r:.200}")


def _check_snapshot(snap: Any, where: str) -> None:
    if snap is None:
        return
    # Version 2 snapshots had no "iter".
    if not isinstance(snap, dict) or not {"state", "ended"} <= set(snap) <= {"state", "iter", "ended"} \
            or not isinstance(snap["ended"], bool):
        raise ValueError(f"DataLoader state_dict: dataset {where} is not a dataset snapshot "
                         f"({{'state': ..., 'iter': ..., 'ended': bool}}): {snap!r:.200}")


def needs_fresh_workers(state: dict | None) -> bool:
    """Whether resuming ``state`` needs some worker's copy as it comes from the
    main process (a live persistent worker's copy has moved on)."""
    section = (state or {}).get("dataset")
    return bool(section) and any(s is None for s in section.get("workers") or ())


def load_dataset_state(dataset: Any, snap: dict | None) -> None:
    """The first step of restoring a copy: the dataset's own state (before its
    stream opens, and in the main process before the epoch draws its seed, as
    the state was taken before the uninterrupted run's draw)."""
    if snap is not None and snap.get("state") is not None:
        dataset.load_state_dict(snap["state"])


def resume_stream(source: Any, snap: dict | None, replay: Any, next_epoch: bool) -> None:
    """The rest of restoring a copy, once its epoch began: ``iter(dataset)``, the
    iterator's state, the batches to replay; an ended stream stays ended.  A
    state of the next epoch's start leaves the stream to open anew."""
    iter_state = snap.get("iter") if snap is not None else None
    if source.iterable and (not next_epoch or iter_state is not None or replay):
        source.open_stream()
        if iter_state is not None:
            stream = source.stream
            if not is_stateful(stream):
                raise TypeError(f"this state_dict holds the state of an iterator of "
                                f"{type(source.dataset).__name__}, but its iter() returned a "
                                f"{type(stream).__name__}, which does not define "
                                f"load_state_dict(state)")
            stream.load_state_dict(iter_state)
    source.stream_ended = bool(snap is not None and snap["ended"])
    source.replay(replay)
    if next_epoch:
        source.start_epoch(source.base_seed)


def restore_copy(dataset: Any, source: Any, snap: dict | None, replay: Any,
                 next_epoch: bool) -> None:
    """Give a worker's copy of the dataset its state, once its epoch began."""
    load_dataset_state(dataset, snap)
    resume_stream(source, snap, replay, next_epoch)


def warn_of_replay(dataset: Any, samples: int, stacklevel: int) -> None:
    """The one warning of a resume that reads a stream again to reach its place."""
    warnings.warn(f"DataLoader: resuming reads {samples} samples of {type(dataset).__name__}'s "
                  f"stream again, and drops them, to continue where the state_dict was taken: "
                  f"neither the dataset nor the iterator its __iter__ returns defines "
                  f"state_dict() and load_state_dict(state) (or none of their snapshots had "
                  f"reached the main process: snapshot_every_n_steps); defining them resumes "
                  f"at once, reading nothing again", stacklevel=stacklevel)
