"""Ring, SlotInfo and SlotLease: slots, and the leases that keep one out of
circulation while the caller holds its batch.

NOTE [ Why one segment per slot ]
A slot is one file (NOTE [ Anonymous memory files ] in segments.py), created
once and reused for batch after batch.  The ring preallocates nothing it
cannot size (the batch layout is known only once a worker has collated the
first batch): the main process creates a slot's file empty, and the worker
that first fills it grows it to the size the batch needs and reports that
size, which the main process then maps.  A batch that no longer fits
(variable shapes, promotion) makes the worker grow the same file, with
headroom: a slot is only ever written while nobody holds a view of it, so
its old mapping has no reader left, and a file sealed against shrinking
never takes pages from under a mapping.

NOTE [ Leases ]
The main process hands out numpy views of a slot.  Their base is a
``SlotLease`` (``_core.lease_array`` makes the slot's bytes an array whose
base is the lease, as ``np.asarray(lease)`` does through the lease's
``__array_interface__``), so the slot stays out of circulation for exactly as
long as the caller holds any view; when the last one dies, the slot comes
back.  The ring learns of that death from a weak reference whose callback is
a deque's ``append``, not from a ``__del__``: no Python code runs where the
caller drops a batch, so a Ctrl-C cannot land inside such code, where CPython
would drop the KeyboardInterrupt (see NOTE [ Ctrl-C held over fork and
teardown ] in _lifetime/interrupts.py).  A caller that holds every batch of
an epoch makes the ring grow: it holds at most ``in_flight`` slots that
workers may write, plus one per batch the caller still holds -- the same
memory those batches need anyway.  Free slots beyond ``in_flight`` + 2 are retired as they come
back, so memory follows what is held.
"""

from __future__ import annotations

import collections
import operator
import os
import secrets
import weakref
from typing import TYPE_CHECKING, Sequence

import numpy as np

from fastload._core import lease_array
from fastload._ring import fork_marks
from fastload._ring.fork_marks import holders_of_slots
from fastload._ring.room import check_room_for_slots
from fastload._ring.segments import Segment, uses_memfd

if TYPE_CHECKING:
    from fastload._ring.spares import SpareSlots

__all__ = ["Ring", "SlotInfo", "SlotLease", "new_prefix"]

# Free slots kept beyond those in flight: a loop holds the batch it works on
# (and often the previous one) while the next are prefetched, so a ring of
# in_flight + 2 slots is the steady state; retiring below that would create
# and drop slot files every epoch.
_KEPT_SPARE_SLOTS = 2


def new_prefix() -> str:
    """A unique label prefix for one ring's slot files; every fastload one starts with ``fl_``."""
    return f"fl_{os.getpid()}_{secrets.token_hex(4)}_"


class SlotInfo(tuple):
    """What a worker needs to know of a slot: ``(slot_id, name, capacity)``.

    ``name`` is the handle of the slot's file (``Segment.attach``);
    ``capacity`` the bytes the main process has mapped, 0 while it is empty.
    """

    __slots__ = ()

    def __new__(cls, slot_id: int, name: str, capacity: int):
        return tuple.__new__(cls, (slot_id, name, capacity))

    def __getnewargs__(self):
        return tuple(self)

    # itemgetter: read in C, on the per-batch path of both processes
    slot_id = property(operator.itemgetter(0))
    name = property(operator.itemgetter(1))
    capacity = property(operator.itemgetter(2))


class SlotLease:
    """Holds one slot out of circulation while any view of it is alive.

    numpy arrays made from it (``np.asarray(lease)``) keep it as their base;
    when the last one is gone the slot goes back to the ring.
    """

    __slots__ = ("slot_id", "_segment", "__weakref__")

    def __init__(self, segment: "Segment", slot_id: int) -> None:
        self.slot_id = slot_id
        self._segment = segment  # keeps the mapping alive

    @property
    def __array_interface__(self) -> dict:
        # Only for ``np.asarray(lease)``: the ring's own leases are made into
        # arrays by ``_core.lease_array``, which needs none.
        return self._segment.array.__array_interface__

    def __repr__(self) -> str:
        return f"<SlotLease slot={self.slot_id} bytes={self._segment.size}>"


class _Slot:
    __slots__ = ("segment", "info", "writer")

    def __init__(self, segment: Segment) -> None:
        self.segment = segment
        self.info: SlotInfo | None = None  # made on first use, until the slot grows
        self.writer = -1                   # the worker that last got it


class Ring:
    """The main process's side of the ring: which slots exist, which are free.

    Only the main process allocates slot ids and creates slot files; workers
    grow them (see ``SlotWriter`` in writer.py).
    """

    def __init__(self, in_flight: int, prefix: str | None = None,
                 spares: Sequence[Segment] = ()) -> None:
        self.prefix = prefix or new_prefix()
        self.in_flight = max(1, in_flight)
        self._slots: dict[int, _Slot] = {}
        self._free: collections.deque[int] = collections.deque()
        # An earlier epoch's free slots (see NOTE [ Slots that outlive an
        # epoch ] in spares.py): free from the start, already mapped here; forked workers
        # get them as ``inherited``.
        self.inherited: dict[int, Segment] = {}
        for slot_id, segment in enumerate(spares[:self.in_flight + _KEPT_SPARE_SLOTS]):
            self._slots[slot_id] = _Slot(segment)
            self._free.append(slot_id)
            self.inherited[slot_id] = segment
        # Slots given back by ``release``.
        self._returned: collections.deque[int] = collections.deque()
        # The caller's leases, by a weak reference whose callback puts it in
        # ``_dead_leases`` (NOTE [ Leases ]); that may happen anywhere (GC,
        # another thread): a deque append is atomic, the rest waits for collect().
        self._lease_slots: dict[weakref.ref, int] = {}
        self._dead_leases: collections.deque[weakref.ref] = collections.deque()
        self._retired: list[tuple[int, str]] = []
        # Slots held when this process forked: retired when they come back
        # (NOTE [ Batches a forked child holds ] in fork_marks.py).
        self._held_at_fork: set[int] = set()
        holders_of_slots.add(self)
        self._next_id = len(self._slots)
        self._space_checked = False
        self.closed = False

    def _name(self, slot_id: int) -> str:
        return f"{self.prefix}s{slot_id}"

    # -- slot circulation ----------------------------------------------------

    def acquire(self, writer: int = 0) -> SlotInfo:
        """A free slot for a task of worker ``writer``, growing the ring if the caller holds them all.

        A slot that ``writer`` filled before is preferred: a worker maps each
        slot it is given, so keeping slots with their writer halves what every
        worker maps (and, with new workers every epoch, maps again).
        """
        self.collect()
        free = self._free
        if free:
            for slot_id in free:
                if self._slots[slot_id].writer == writer:
                    free.remove(slot_id)
                    break
            else:
                slot_id = free.popleft()
        else:
            slot_id = self._next_id
            self._slots[slot_id] = _Slot(Segment.create(self._name(slot_id)))
            self._next_id += 1
        self._slots[slot_id].writer = writer
        return self.info(slot_id)

    def mapped_bytes(self) -> int:
        """The bytes of every slot's file (a memory budget's count of the ring)."""
        return sum(slot.segment.size for slot in self._slots.values())

    def slot_bytes(self) -> int:
        """The largest slot's bytes (what one more slot would cost)."""
        return max((slot.segment.size for slot in self._slots.values()), default=0)

    def info(self, slot_id: int) -> SlotInfo:
        slot = self._slots[slot_id]
        if slot.info is None:
            slot.info = SlotInfo(slot_id, slot.segment.name, slot.segment.size)
        return slot.info

    def release(self, slot_id: int) -> None:
        """Give back a slot that no lease was made for (a task's slot was not used)."""
        self._returned.append(slot_id)

    def collect(self) -> None:
        """Move returned slots to the free list; retire the ones beyond ``in_flight``."""
        dead, slot_of = self._dead_leases, self._lease_slots
        while dead:
            self._returned.append(slot_of.pop(dead.popleft()))
        while self._returned:
            slot_id = self._returned.popleft()
            slot = self._slots.get(slot_id)
            if slot is None or self.closed:
                continue
            if slot_id in self._held_at_fork:
                self._held_at_fork.discard(slot_id)
                self._retire(slot_id)
            elif len(self._free) >= self.in_flight + _KEPT_SPARE_SLOTS:
                self._retire(slot_id)
            else:
                self._free.append(slot_id)

    def _retire(self, slot_id: int) -> None:
        segment = self._slots.pop(slot_id).segment
        segment.unlink()
        segment.close()  # no worker will open it again: its mappings live on
        self._retired.append((slot_id, segment.name))

    def take_retired(self) -> list[tuple[int, str]]:
        """Slots retired since the last call: workers should drop their mappings."""
        retired, self._retired = self._retired, []
        return retired

    def mark_held_at_fork(self) -> None:
        """This process forks: the slots the caller holds are never written again."""
        self._held_at_fork.update(slot_id for lease, slot_id in list(self._lease_slots.items())
                                  if lease() is not None)

    def hand_over(self, spares: "SpareSlots") -> None:
        """Leave this ring's slots to the next epoch's: the free ones now, the
        ones the caller still holds when their last view dies.

        Only once no worker writes a slot any more (every task answered), and
        before ``close()``: the spares keep the files open, and the next ring
        (whose workers are forked from this process) uses them as they are.
        """
        self.collect()
        spares.put([self._slots[slot_id].segment for slot_id in self._free])
        with fork_marks.marks_lock:  # no fork marks the ring or the spares halfway
            # The latest batches first: the spares take what fits in SPARE_BYTES.
            held = {lease: self._slots[slot_id].segment
                    for lease, slot_id in reversed(self._lease_slots.items())
                    if slot_id not in self._held_at_fork}
            # Those leases' references land in this deque when they die: it is the spares' now.
            spares.await_leases(self._dead_leases, held)
            # A fork in between (a signal handler of this thread's: the lock
            # is reentrant) marked them here only.  Dead since or not, the
            # child holds them.
            spares.mark_held_at_fork([lease for lease, slot_id in self._lease_slots.items()
                                      if slot_id in self._held_at_fork and lease in held])
            self._lease_slots, self._dead_leases = {}, collections.deque()

    # -- filled slots --------------------------------------------------------

    def adopt(self, slot_id: int, size: int) -> None:
        """A worker grew a slot's file to ``size`` bytes: map that much here
        (NOTE [ Why one segment per slot ])."""
        slot = self._slots.get(slot_id)
        if slot is None or slot.segment.size >= size:
            return
        slot.segment.map(size)
        slot.info = None
        if not self._space_checked:
            # The first batch tells how big a slot is: check now that the whole ring fits.
            self._space_checked = True
            slots_made = sum(1 for s in self._slots.values() if s.segment.size > 0)
            check_room_for_slots(self.in_flight - slots_made, size, self.in_flight,
                                 posix=not uses_memfd())

    def lease(self, slot_id: int) -> np.ndarray:
        """The slot's bytes as a uint8 array whose base is a fresh ``SlotLease``."""
        segment = self._slots[slot_id].segment
        if segment.size == 0:  # a batch without arrays: nothing to hold the slot for
            self.release(slot_id)
            return np.empty(0, dtype=np.uint8)
        with fork_marks.marks_lock:  # made before a fork's marks, or after its end
            lease = SlotLease(segment, slot_id)
            self._lease_slots[weakref.ref(lease, self._dead_leases.append)] = slot_id
        return lease_array(lease, segment.array)  # np.asarray(lease), without the interface lookup

    # -- teardown ------------------------------------------------------------

    def close(self) -> None:
        """Let go of every slot: POSIX names are unlinked, and a file closes with
        the last holder of its segment (views the caller holds stay valid, and
        the spares keep theirs open for the next epoch's workers)."""
        if self.closed:
            return
        self.closed = True
        for slot in self._slots.values():
            slot.segment.unlink()
        self._slots.clear()
        self._free.clear()
        self.inherited = {}
