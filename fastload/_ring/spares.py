"""SpareSlots, and the reason a loader keeps any.

NOTE [ Slots that outlive an epoch ]
Without persistent workers every epoch starts new workers, and a ring of its
own would have them create, fill and unlink a fresh set of segments, a
visible share of a short epoch's CPU, and the first one delays the first
batch.  A forked worker inherits the main process's mappings, so under fork
an epoch's ring leaves its slots to the next one's (``Ring.hand_over``, into
the loader's ``SpareSlots``): the free ones at once, one the caller still
holds when its last view dies.  The next epoch's workers write through the
mappings they inherited (``SlotWriter``'s ``inherited``): no file is made
or opened.  The files are anonymous (NOTE [ Anonymous memory files ] in
segments.py), so a main process killed between epochs frees them with its
address space.  At most ``SPARE_BYTES`` are kept, so a loader between two
epochs holds little (torch's holds nothing).  Under spawn or forkserver a
worker has nothing to inherit: every epoch makes its own; nor are slots kept
with POSIX segments, whose names go with their ring.
"""

from __future__ import annotations

import collections
import operator
import os
import weakref
from typing import Callable, Iterable, Iterator, TypeVar

from fastload._ring.fork_marks import holders_of_slots
from fastload._ring.segments import Segment

__all__ = ["SpareSlots", "SPARE_BYTES"]

# The most a loader keeps mapped between two epochs for the next one's workers.
SPARE_BYTES = 64 << 20

_T = TypeVar("_T")
_size = operator.attrgetter("size")


def _fitting(room: int, items: Iterable[_T], size: Callable[[_T], int]) -> Iterator[_T]:
    """The items, in order, that fit in ``room`` bytes together; one too big is
    passed over, not the ones after it."""
    for item in items:
        if size(item) <= room:
            room -= size(item)
            yield item


class SpareSlots:
    """Where a loader keeps the slots one epoch leaves for the next (fork only).

    See NOTE [ Slots that outlive an epoch ].  ``take`` empties it, so two
    iterators of one loader never share a slot; it keeps at most
    ``SPARE_BYTES``, the most recently returned first.  A forked child that
    iterates its copy of the loader gets none: its mappings of these slots are
    shared with the process that keeps them.
    """

    __slots__ = ("_segments", "_awaited", "_held_at_fork", "_pid", "__weakref__")

    def __init__(self) -> None:
        self._pid = os.getpid()
        self._segments: list[Segment] = []
        # Per handed-over ring: where its leases' weak references land when
        # they die (NOTE [ Leases ] in slots.py), and the segment of each
        # lease still held.  Only this holds those references: when the loader
        # (and so this) is gone, a batch released later gives its slot to nobody.
        self._awaited: list[tuple[collections.deque[weakref.ref], dict[weakref.ref, Segment]]] = []
        # Leases held when this process forked: their slots are not kept
        # (NOTE [ Batches a forked child holds ] in fork_marks.py).
        self._held_at_fork: set[weakref.ref] = set()
        holders_of_slots.add(self)

    def __reduce__(self):
        # A copied (or pickled) loader starts with none: these are mappings of
        # this process, which a copy of their bytes could not stand in for.
        return (SpareSlots, ())

    def put(self, segments: list[Segment]) -> None:
        """Keep those of ``segments`` that fit in ``SPARE_BYTES`` with what is kept
        (or awaited) already, in order; the others are freed with their mappings."""
        self._segments.extend(_fitting(SPARE_BYTES - self.nbytes, segments, _size))

    def await_leases(self, dead: collections.deque[weakref.ref],
                     held: dict[weakref.ref, Segment]) -> None:
        """Slots whose batches the caller holds past the end of their epoch: each
        is kept here once the weak reference to its lease lands in ``dead``.

        Only as many as fit in ``SPARE_BYTES`` with what is kept already, in
        ``held``'s order: the others are freed with their batch, not kept
        until the next epoch (or for good, by a loader that is not iterated again).
        """
        self._collect_released()
        kept = dict(_fitting(SPARE_BYTES - self.nbytes, held.items(),
                             lambda lease_and_segment: lease_and_segment[1].size))
        if kept:
            self._awaited.append((dead, kept))

    def _collect_released(self) -> None:
        awaited = []
        for dead, held in self._awaited:
            while dead:
                # A lease that was not kept may land here too, if it died while
                # its ring was handing over (another thread, a collection).
                lease = dead.popleft()
                segment = held.pop(lease, None)
                if lease in self._held_at_fork:
                    self._held_at_fork.discard(lease)
                elif segment is not None:
                    self._segments.append(segment)
            if held:
                awaited.append((dead, held))
        self._awaited = awaited

    def mark_held_at_fork(self, leases: list | None = None) -> None:
        """This process forks: the slots of batches the caller holds are not
        kept; nor those of ``leases``, which a ring marked at a fork."""
        if leases is None:
            leases = [lease for _, held in list(self._awaited) for lease in list(held)
                      if lease() is not None]
        self._held_at_fork.update(leases)

    def take(self) -> list[Segment]:
        """The slots kept, the most recently returned first, at most ``SPARE_BYTES``;
        none in a process that inherited this by a fork."""
        self._collect_released()
        segments, self._segments = self._segments, []
        if self._pid != os.getpid():  # inherited by a fork: not ours to write
            self._pid = os.getpid()
            return []
        return list(_fitting(SPARE_BYTES, reversed(segments), _size))

    @property
    def nbytes(self) -> int:
        """Bytes kept now or once the batches awaited are released (``take`` caps
        the free ones it returns at ``SPARE_BYTES``)."""
        self._collect_released()
        return sum(segment.size for segment in self._segments) \
            + sum(segment.size for _, held in self._awaited for segment in held.values())
