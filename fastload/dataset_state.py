"""A dataset's own state in a loader's ``state_dict``: snapshots, the section, restoring.

torchdata's ``StatefulDataLoader`` set the convention: a dataset (map-style
or iterable) that defines ``state_dict()`` and ``load_state_dict(state)`` is
saved and restored through them, and with workers each worker's copy is.
The state must describe the batch boundary the caller has seen, while
workers run ahead by the prefetch.  So a worker snapshots its copy with each
answer it sends (only when the dataset defines the two methods), and the
main process keeps, per worker, the snapshot of the last answer of that
worker it handed out (``WorkerSnapshots``).  With ``num_workers=0`` the
dataset's current state is the boundary's.

A snapshot is ``{"state": dataset.state_dict(), "ended": bool}``: ``ended``
says the worker's stream gave its last (short) batch, so the next one is its
end, whatever the dataset's own state says about it (a dataset that starts
over once its stream is done would otherwise yield it again).

The iterable round-robin: batch ``k`` of an epoch goes to the next worker in
turn that is not exhausted (``_MultiProcessIter._pick_worker``), so the
caller sees the workers' streams in turn, an exhausted one skipped; which
numbers are holes (tasks sent to a worker before its end was seen) depends
on timing, so a state records the worker after the last one handed out,
the workers found exhausted and the next batch number, not a count to replay.
"""

from __future__ import annotations

from typing import Any

__all__ = ["is_stateful", "require_stateful", "WorkerSnapshots", "MainSnapshot",
           "dataset_section", "check_dataset_section", "needs_fresh_workers"]

_KINDS = {True: "iterable", False: "map"}


def is_stateful(dataset: Any) -> bool:
    """Whether ``dataset`` defines both ``state_dict`` and ``load_state_dict``
    (torchdata's ``Stateful`` protocol, checked by duck typing as it is)."""
    return callable(getattr(dataset, "state_dict", None)) \
        and callable(getattr(dataset, "load_state_dict", None))


def require_stateful(dataset: Any, method: str) -> None:
    """TypeError unless an IterableDataset can be resumed through its own state."""
    if not is_stateful(dataset):
        raise TypeError(
            f"DataLoader.{method}: an IterableDataset's position is in its own stream, "
            f"and {type(dataset).__name__} does not define state_dict() and "
            f"load_state_dict(state); define both (state_dict() returns where the "
            f"stream is, load_state_dict(state) makes the next iter() continue from "
            f"there), as torchdata's StatefulDataLoader expects")


def snapshot(dataset: Any, ended: bool) -> dict:
    return {"state": dataset.state_dict(), "ended": bool(ended)}


class MainSnapshot:
    """``num_workers=0``: the dataset is the loader's own; its state is read when
    the state is taken, the stream's end from the epoch's ``BatchSource``."""

    __slots__ = ("source",)

    def __init__(self, source: Any) -> None:
        self.source = source


class WorkerSnapshots:
    """Per worker, the snapshot of its last answer the caller was handed, and the
    iterable round-robin's position at that boundary (one epoch)."""

    __slots__ = ("workers", "exhausted", "next_worker", "next_batch_no", "yielded", "_arrived")

    def __init__(self, carried: list, position: dict | None = None) -> None:
        self.workers = list(carried)      # None: the copy as it came from the main process
        position = position or {}
        self.exhausted = set(position.get("exhausted", ()))
        self.next_worker = position.get("next_worker", 0)
        self.next_batch_no = position.get("next_batch_no", 0)
        self.yielded = position.get("batches_yielded", 0)
        self._arrived: dict[int, tuple[int, dict]] = {}  # batch_no -> (worker, snapshot)

    @classmethod
    def next_epoch(cls, carried: list) -> "WorkerSnapshots":
        """A new epoch of the same (persistent) copies: their states carry over,
        and each stream starts over."""
        return cls([None if s is None else {"state": s["state"], "ended": False}
                    for s in carried])

    def arrive(self, worker: int, batch_no: int, snap: dict) -> None:
        self._arrived[batch_no] = (worker, snap)

    def hand(self, worker: int, batch_no: int) -> None:
        """Batch ``batch_no`` of ``worker`` (or the error making it raised) reached the caller."""
        self._take(worker, batch_no)
        self.yielded += 1
        self.next_batch_no = max(self.next_batch_no, batch_no + 1)
        self.next_worker = (worker + 1) % len(self.workers)

    def end(self, worker: int, batch_no: int) -> None:
        """``worker``'s stream ended (seen in turn, after the batches handed before it)."""
        self._take(worker, batch_no)
        self.exhausted.add(worker)

    def _take(self, worker: int, batch_no: int) -> None:
        got = self._arrived.pop(batch_no, None)
        if got is not None:
            self.workers[worker] = got[1]

    def absorb_unhanded(self) -> None:
        """An abandoned epoch's answers were collected: the copies are past them
        (persistent workers carry this into the next epoch)."""
        for batch_no in sorted(self._arrived):
            worker, snap = self._arrived[batch_no]
            self.workers[worker] = snap
        self._arrived.clear()

    def position(self) -> dict:
        return {"exhausted": sorted(self.exhausted), "next_worker": self.next_worker,
                "next_batch_no": self.next_batch_no, "batches_yielded": self.yielded}


def dataset_section(loader: Any, progress: Any) -> dict | None:
    """The dataset's part of a state (None for a dataset without state methods).

    Mid-epoch it is the boundary the caller has seen; between epochs, what
    the next epoch starts from: the dataset's state (``num_workers=0``), the
    workers' copies (persistent workers), or fresh copies (new workers).
    """
    dataset = loader.dataset
    if not is_stateful(dataset):
        return None
    workers = loader.num_workers
    tracker = getattr(progress, "datasets", None)
    mid_epoch = progress is not None and not progress.finished
    if mid_epoch and isinstance(tracker, WorkerSnapshots):
        workers = len(tracker.workers)  # the epoch's, if the attribute changed since
    elif mid_epoch and isinstance(tracker, MainSnapshot):
        workers = 0
    section: dict = {"kind": _KINDS[bool(loader._iterable)], "num_workers": workers}
    if workers == 0:
        ended = mid_epoch and isinstance(tracker, MainSnapshot) and tracker.source.stream_ended
        section["main"] = snapshot(dataset, ended)
        return section
    if mid_epoch and isinstance(tracker, WorkerSnapshots):
        section["workers"] = list(tracker.workers)
        section.update(tracker.position())
        return section
    live = loader._iterator is not None and not loader._iterator.closed
    carried = tracker.workers if loader.persistent_workers and live \
        and isinstance(tracker, WorkerSnapshots) and len(tracker.workers) == workers \
        else [None] * workers
    following = WorkerSnapshots.next_epoch(carried)
    section["workers"] = following.workers
    section.update(following.position())
    return section


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
    if not is_stateful(dataset):
        raise ValueError(f"this state_dict holds a dataset's own state, but {name} does not "
                         f"define state_dict() and load_state_dict(state) to take it")
    kind = _KINDS[bool(loader._iterable)]
    if section["kind"] != kind:
        raise ValueError(f"this state_dict comes from a loader of a {section['kind']}-style "
                         f"dataset, this one's {name} is {kind}-style")
    recorded, workers = section.get("num_workers"), loader.num_workers
    if recorded != workers:
        reason = ("each worker reads its own stream of an IterableDataset (sharding it by "
                  "get_worker_info()), so the streams of" if loader._iterable else
                  "each worker's copy of the dataset has a state of its own, so those of")
        raise ValueError(f"this state_dict comes from a DataLoader with num_workers="
                         f"{recorded!r}, this one has num_workers={workers}: {reason} "
                         f"{recorded!r} cannot continue in {workers}; build the loader "
                         f"with num_workers={recorded!r}")
    if workers == 0:
        _check_snapshot(section.get("main"), "main", allow_none=False)
        return
    snapshots = section.get("workers")
    if not isinstance(snapshots, list) or len(snapshots) != workers:
        raise ValueError(f"DataLoader state_dict: 'workers' must list {workers} workers' "
                         f"states, got {snapshots!r:.200}")
    for worker, snap in enumerate(snapshots):
        _check_snapshot(snap, f"workers[{worker}]", allow_none=True)
    exhausted, next_worker = section.get("exhausted"), section.get("next_worker")
    if not isinstance(exhausted, list) or not all(_is_count(w) and w < workers for w in exhausted) \
            or not (_is_count(next_worker) and next_worker < workers) \
            or not _is_count(section.get("next_batch_no")) \
            or not _is_count(section.get("batches_yielded")):
        raise ValueError(f"DataLoader state_dict: the workers' position (exhausted, "
                         f"next_worker, next_batch_no, batches_yielded) does not fit "
                         f"{workers} workers: {section!r:.200}")


def _check_snapshot(snap: Any, where: str, allow_none: bool) -> None:
    if snap is None and allow_none:
        return
    if not isinstance(snap, dict) or set(snap) != {"state", "ended"} \
            or not isinstance(snap["ended"], bool):
        raise ValueError(f"DataLoader state_dict: dataset {where} is not a dataset snapshot "
                         f"({{'state': ..., 'ended': bool}}): {snap!r:.200}")


def needs_fresh_workers(state: dict | None) -> bool:
    """Whether resuming ``state`` needs some worker's copy as it comes from the
    main process (a live persistent worker's copy has moved on)."""
    section = (state or {}).get("dataset")
    return bool(section) and any(s is None for s in section.get("workers") or ())


def restore_copy(dataset: Any, source: Any, snap: dict) -> None:
    """Give a copy of the dataset (a worker's, or the loader's own) its state,
    before the epoch's stream opens; an ended stream stays ended."""
    dataset.load_state_dict(snap["state"])
    source.stream_ended = snap["ended"]
