"""The shared-memory ring (interim: one module, split next)."""

from fastload._ring.slots import (SHM_DIR, SPARE_BYTES, Ring, Segment, SharedMemoryError,
                                  SlotInfo, SlotLease, SlotWriter, SpareSlots, near_open_file_limit,
                                  new_prefix, too_many_open_files, unlink_name, unlink_prefixed)
