"""SlotWriter and the allocation it gives each task (NOTE [ Why one segment
per slot ] in slots.py)."""

from __future__ import annotations

import mmap

import numpy as np

from fastload._ring.segments import Segment
from fastload._ring.slots import SlotInfo

__all__ = ["SlotWriter"]

_PAGE = mmap.PAGESIZE
_GROWTH_HEADROOM = 4  # a regrown slot gets 1/4 more than asked, so shapes that vary settle fast


class SlotWriter:
    """A worker's side of the ring: map slots by handle, grow them on demand.

    ``inherited``: slots whose mapping a forked worker inherited from the main
    process, by slot id.
    """

    def __init__(self, inherited: dict[int, Segment] | None = None) -> None:
        self._mapped: dict[int, Segment] = dict(inherited or {})
        # Inherited mappings have no page mapped in this process yet.
        self._to_prefault: set[int] = set(self._mapped)
        # The most bytes a batch of this worker has needed: a slot filled or grown
        # gets at least that, so batches of varying size (padded ones) settle all
        # slots at the largest instead of regrowing each slot record by record.
        self.largest = 0

    def forget(self, slot_id: int, name: str) -> None:
        segment = self._mapped.get(slot_id)
        if segment is not None and segment.name == name:
            del self._mapped[slot_id]
            self._to_prefault.discard(slot_id)

    def allocator(self, info: SlotInfo) -> "_TaskAllocation":
        return _TaskAllocation(self, info)

    def _map(self, slot_id: int, segment: Segment) -> Segment:
        """Write ``slot_id`` through ``segment`` from now on; it was mapped populated."""
        self._mapped[slot_id] = segment
        self._to_prefault.discard(slot_id)
        return segment


class _TaskAllocation:
    """The ``allocate`` callback for one task: returns the slot's bytes, big enough.

    Records the size it grew the slot's file to, which the worker reports
    (even when the task then fails) so the main process maps that much.
    """

    __slots__ = ("writer", "info", "created")

    def __init__(self, writer: SlotWriter, info: SlotInfo) -> None:
        self.writer = writer
        self.info = info
        self.created: int | None = None  # the size this task grew the file to

    def __call__(self, nbytes: int) -> np.ndarray:
        info, writer = self.info, self.writer
        slot_id = info.slot_id
        segment = writer._mapped.get(slot_id)
        if segment is not None and segment.name != info.name:
            segment = None  # a mapping of a slot retired since
        capacity = info.capacity if self.created is None else self.created
        if nbytes <= capacity:
            if segment is None or segment.size < capacity:
                segment = writer._map(slot_id, Segment.attach(info.name, capacity, populate=True))
            elif writer._to_prefault and slot_id in writer._to_prefault:
                writer._to_prefault.discard(slot_id)
                segment.prefault()
            return segment.array
        writer.largest = max(writer.largest, nbytes)
        size = writer.largest if capacity == 0 \
            else writer.largest + writer.largest // _GROWTH_HEADROOM
        size = max(_PAGE, (size + _PAGE - 1) // _PAGE * _PAGE)
        self.created = size
        return writer._map(slot_id, Segment.attach(info.name, size, populate=True)).array
