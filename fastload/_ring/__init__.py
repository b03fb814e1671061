"""The shared-memory ring: workers write batches into its slots in place, the
main process hands them out as views (NOTE [ Why one segment per slot ] and
NOTE [ Leases ] in slots.py)."""

from fastload._ring.segments import (Segment, SharedMemoryError, near_open_file_limit, new_prefix,
                                     too_many_open_files, unlink_name, unlink_prefixed)
from fastload._ring.slots import Ring, SlotInfo, SlotLease
from fastload._ring.spares import SpareSlots
from fastload._ring.writer import SlotWriter

__all__ = ["Ring", "SlotInfo", "SlotLease", "SlotWriter", "SpareSlots", "Segment",
           "SharedMemoryError", "new_prefix", "unlink_name", "unlink_prefixed",
           "near_open_file_limit", "too_many_open_files"]
