"""Which stored entries this process has already checked against their checksum.

A reader checks an entry's bytes against the checksum in its record before it
uses them (a crash of the machine can leave a record whose data pages never
reached the disk).  Committed bytes never change afterwards: writers only
append, and a writer adopting a pair cuts off only what no record points to.
So once an entry has passed, later reads in the same process need not sum its
bytes again.

The set is an open-addressed table of 64-bit fingerprints (of where the entry
is and its checksum) in one numpy array, about 16 bytes per entry at most:
a Python set of ints would cost several times that, per process, for a
million-image dataset.  A forked worker starts with its parent's table.
"""

from __future__ import annotations

import numpy as np

from .cache_store import Entry

__all__ = ["VerifiedEntries"]

_EMPTY = 0
_MASK64 = 0xFFFFFFFFFFFFFFFF
_INITIAL_SLOTS = 1024


def _fingerprint(entry: Entry) -> int:
    # hash() of a str is per process, and so is this table; 0 marks a free slot.
    value = hash((entry.data_file, entry.offset, entry.length, entry.data_sum)) & _MASK64
    return value or 1


class VerifiedEntries:
    """A set of entries (by place, length and checksum) that passed their checksum."""

    def __init__(self) -> None:
        self._slots = np.zeros(_INITIAL_SLOTS, dtype=np.uint64)
        self._count = 0

    def __len__(self) -> int:
        return self._count

    def __contains__(self, entry: Entry) -> bool:
        return self._find(_fingerprint(entry), self._slots)[1]

    def add(self, entry: Entry) -> None:
        if (self._count + 1) * 2 > len(self._slots):
            self._grow()
        if self._insert(_fingerprint(entry), self._slots):
            self._count += 1

    @staticmethod
    def _find(value: int, slots: np.ndarray) -> tuple[int, bool]:
        """The slot holding ``value`` (True), or the free slot where it would go (False)."""
        mask = len(slots) - 1
        at = value & mask
        while True:
            held = int(slots[at])
            if held == value:
                return at, True
            if held == _EMPTY:
                return at, False
            at = (at + 1) & mask

    @classmethod
    def _insert(cls, value: int, slots: np.ndarray) -> bool:
        at, present = cls._find(value, slots)
        if not present:
            slots[at] = value
        return not present

    def _grow(self) -> None:
        old = self._slots
        self._slots = np.zeros(len(old) * 2, dtype=np.uint64)
        for value in old[old != _EMPTY].tolist():
            self._insert(value, self._slots)
