"""The shared-memory ring: workers write batches into its slots in place, the
main process hands them out as views (NOTE [ Why one segment per slot ] and
NOTE [ Leases ] in slots.py, NOTE [ Anonymous memory files ] in segments.py)."""

from fastload._ring.room import SharedMemoryError, near_open_file_limit, too_many_open_files
from fastload._ring.segments import Segment, uses_memfd
from fastload._ring.slots import Ring, SlotInfo, SlotLease, new_prefix
from fastload._ring.spares import SpareSlots
from fastload._ring.writer import SlotWriter

__all__ = ["Ring", "SlotInfo", "SlotLease", "SlotWriter", "SpareSlots", "Segment",
           "SharedMemoryError", "new_prefix", "uses_memfd", "near_open_file_limit",
           "too_many_open_files"]
