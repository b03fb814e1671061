"""The shared-memory ring: segments, slots, leases; and through the DataLoader,
zero-copy batches that stay valid while held."""

from __future__ import annotations

import collections
import copy
import gc
import os
import re
import shutil
import subprocess
import sys
import threading
import weakref

import numpy as np
import pytest

import fastload as fl
from fastload import _core
from fastload._ring import (Ring, Segment, SharedMemoryError, SlotInfo, SlotLease, SlotWriter,
                            SpareSlots, new_prefix)
from fastload._ring import room as room_module
from fastload._ring import fork_marks
from fastload._ring import segments as segments_module
from fastload._ring import spares as spares_module
from datasets_for_workers import GrowingDataset, SquareDataset
from forking import fork_child, run_and_exit
from leakcheck import segment_pid, shm_entries
from paths import REPO_DIR, TESTS_DIR


def _exists(name: str) -> bool:
    return os.path.exists(os.path.join("/dev/shm", name))


def _unlink(name: str) -> None:
    try:
        segments_module._posixshmem.shm_unlink("/" + name)
    except FileNotFoundError:
        pass


@pytest.fixture
def prefix():
    """A fresh ring prefix; anything left under it is unlinked (and reported) afterwards."""
    p = new_prefix()
    yield p
    left = sorted(n for n in shm_entries() if n.startswith(p))
    for name in left:
        _unlink(name)
    assert not left, f"test left segments {left}"


@pytest.fixture(params=["memfd", "posix"])
def backend(request, monkeypatch):
    """Each kind of slot file: anonymous memory files, and the POSIX fallback."""
    if request.param == "memfd" and not hasattr(os, "memfd_create"):
        pytest.skip("no memfd_create on this platform")
    monkeypatch.setattr(segments_module, "USES_MEMFD", request.param == "memfd")
    return request.param


def _segment(name: str, size: int) -> Segment:
    """A slot file of ``size`` bytes, mapped in this process, as the main process has it
    (a POSIX one unlinked already, as a closed ring leaves its slots)."""
    segment = Segment.create(name)
    Segment.attach(segment.name, size)
    segment.map(size)
    segment.unlink()
    return segment


# Slots are kept between epochs only as memory files (a POSIX segment's name
# goes with its ring): FASTLOAD_RING=posix runs skip what tests keeping them.
memfd_only = pytest.mark.skipif(not segments_module.USES_MEMFD,
                                reason="spare slots are kept only as memory files")


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


# ---------------------------------------------------------------------------
# Segment
# ---------------------------------------------------------------------------

def test_segment_create_attach_grow(prefix, backend):
    name = prefix + "seg"
    created = Segment.create(name)
    assert created.size == 0 and created.array.shape == (0,)
    if backend == "memfd":
        assert created.name == f"/proc/{os.getpid()}/fd/{created.fd}" and not _exists(name)
    else:
        assert created.name == name and _exists(name)
    attached = Segment.attach(created.name, 10_000)  # a worker sizes it
    assert attached.fd is None, "a worker keeps no descriptor of a slot it mapped"
    assert created.file_size() == 10_000
    created.map(10_000)
    attached.array[:5] = [1, 2, 3, 4, 5]
    assert created.array[:5].tolist() == [1, 2, 3, 4, 5]  # the same memory, both ways
    created.array[9_999] = 77
    assert attached.array[9_999] == 77
    # Growing keeps the bytes, and the smaller mappings stay valid.
    grown = Segment.attach(created.name, 50_000)
    assert created.file_size() == 50_000 and grown.array[9_999] == 77
    grown.array[0] = 9
    assert attached.array[0] == 9 and created.array[0] == 9
    if backend == "memfd":
        with pytest.raises(PermissionError):  # sealed: no mapping can lose its pages
            os.ftruncate(created.fd, 0)
    created.unlink()
    created.unlink()  # idempotent
    assert not _exists(name)
    created.close()
    created.array[1] = 8  # the mappings outlive the file's descriptor and name
    assert attached.array[1] == 8


def test_segment_reserves_its_pages(prefix, backend):
    """posix_fallocate: the pages exist at once (a memory file is otherwise sparse)."""
    size = 3 * 2**20 + 123
    segment = Segment.create(prefix + "reserved")
    try:
        Segment.attach(segment.name, size)
        st = os.fstat(segment.fd)
        assert st.st_size == size
        assert st.st_blocks * 512 >= size, "segment pages were not reserved"
    finally:
        segment.unlink()


def test_segment_whose_mapping_fails_closes_its_file(prefix, backend, monkeypatch):
    segment = Segment.create(prefix + "unmapped")

    def no_mapping(*args, **kwargs):
        raise OSError(12, "Cannot allocate memory")

    monkeypatch.setattr(segments_module, "_Mapping", no_mapping)
    before = _open_fds()
    with pytest.raises(OSError, match="Cannot allocate memory"):
        Segment.attach(segment.name, 4096)
    assert _open_fds() == before
    segment.unlink()


def test_segment_of_size_zero(prefix, backend):
    segment = Segment.create(prefix + "empty")
    assert segment.size == 0 and segment.array.shape == (0,)
    segment.prefault()  # nothing mapped: nothing to do
    segment.unlink()


# Only memory files: a POSIX segment lives until its name is unlinked.
@pytest.mark.parametrize("backend", ["memfd"], indirect=True)
def test_a_memory_file_goes_with_its_last_descriptor(prefix, backend):
    segment = _segment(prefix + "gone", 8192)
    handle = segment.name
    view = segment.array[:10]
    del segment
    gc.collect()
    with pytest.raises(FileNotFoundError):  # nothing names it any more
        os.open(handle, os.O_RDWR)
    view[:] = 1  # the mapping is the last holder of its pages
    assert not [n for n in shm_entries() if n.startswith(prefix)]


# ---------------------------------------------------------------------------
# Ring and SlotWriter, driven by hand
# ---------------------------------------------------------------------------

def _fill(ring: Ring, writer: SlotWriter, nbytes: int, value: int) -> int:
    """What a task does: acquire a slot, a worker writes it, the main process adopts."""
    info = ring.acquire()
    allocation = writer.allocator(info)
    buffer = allocation(nbytes)
    buffer[:nbytes] = value
    if allocation.created is not None:
        ring.adopt(info.slot_id, allocation.created)
    return info.slot_id


def test_a_ring_that_cannot_fit_asks_for_the_slots_it_lacks(prefix, backend, monkeypatch):
    # At the first batch the ring checks that its other slots fit: the slot
    # just made exists, so the error asks for what is missing, not for it.
    # Memory files are checked against the memory cgroup, POSIX segments
    # against /dev/shm.
    ring = Ring(in_flight=4, prefix=prefix)
    try:
        info = ring.acquire(0)
        allocation = SlotWriter().allocator(info)
        allocation(1 << 20)
        monkeypatch.setattr(room_module, "shm_free_bytes", lambda: 2 << 20)
        monkeypatch.setattr(room_module, "cgroup_memory_room",
                            lambda: (2 << 20, 64 << 20, "/sys/fs/cgroup/memory.max"))
        with pytest.raises(SharedMemoryError) as excinfo:
            ring.adopt(info.slot_id, allocation.created)
        message = str(excinfo.value)
        needs = ("needs 3.0 MiB more shared memory for its ring: 3 more slots of 1.0 MiB "
                 "(4.0 MiB for all 4); ")
        if backend == "memfd":
            assert needs + "the memory cgroup's limit is 64.0 MiB (/sys/fs/cgroup/memory.max), " \
                "2.0 MiB of it free" in message, message
            assert "--memory" in message, message
        else:
            assert needs + "/dev/shm has 2.0 MiB free" in message, message
    finally:
        ring.close()


def test_no_memory_limit_no_check(prefix, monkeypatch):
    monkeypatch.setattr(segments_module, "USES_MEMFD", True)
    monkeypatch.setattr(room_module, "cgroup_memory_room", lambda: None)
    monkeypatch.setattr(room_module, "shm_free_bytes", lambda: 0)  # /dev/shm plays no part
    ring = Ring(in_flight=4, prefix=prefix)
    try:
        _fill(ring, SlotWriter(), 1 << 20, 1)
    finally:
        ring.close()


def test_acquire_release_collect(prefix):
    ring = Ring(in_flight=2, prefix=prefix)
    try:
        a, b, c = (ring.acquire().slot_id for _ in range(3))
        assert len({a, b, c}) == 3 and len(ring._slots) == 3  # grows while every slot is held
        ring.release(b)
        assert ring.acquire().slot_id == b  # collect() moved it to the free list
        assert ring.acquire().slot_id not in (a, b, c)
    finally:
        ring.close()


def test_a_free_slot_goes_back_to_the_worker_that_filled_it(prefix):
    ring = Ring(in_flight=4, prefix=prefix)
    try:
        first = [ring.acquire(writer).slot_id for writer in (0, 1, 0, 1)]
        for slot_id in first:                  # all free again, oldest first: 0, 1, 0, 1
            ring.release(slot_id)
        again = [ring.acquire(writer).slot_id for writer in (1, 1, 0, 0)]
        assert again == [first[1], first[3], first[0], first[2]]
        ring.release(again[0])                 # only worker 1's slot is free: worker 0 takes it
        assert ring.acquire(0).slot_id == again[0]
        assert len(ring._slots) == 4
    finally:
        ring.close()


def test_a_slot_grows_in_place(prefix, backend):
    ring = Ring(in_flight=1, prefix=prefix)
    writer = SlotWriter()
    try:
        info = ring.acquire()
        assert info.capacity == 0 and info.name == ring._slots[info.slot_id].segment.name
        allocation = writer.allocator(info)
        allocation(1000)[:1000] = 4
        assert allocation.created >= 1000
        ring.adopt(info.slot_id, allocation.created)
        info2 = ring.info(info.slot_id)
        assert info2.name == info.name and info2.capacity == allocation.created
        # It fits: the worker reuses the mapping, grows nothing.
        again = writer.allocator(info2)
        again(900)
        assert again.created is None
        # It does not: the same file grows, with headroom.
        grown = writer.allocator(info2)
        buffer = grown(100_000)
        assert grown.created >= 100_000 + 100_000 // 4 and buffer.shape[0] == grown.created
        buffer[50_000] = 6
        ring.adopt(info.slot_id, grown.created)
        view = ring.lease(info.slot_id)
        assert view.shape[0] == grown.created and view[0] == 4 and view[50_000] == 6
        # Another worker maps it at its new size.
        other = SlotWriter().allocator(ring.info(info.slot_id))
        assert other(100_000)[50_000] == 6 and other.created is None
    finally:
        ring.close()


def test_pickled_slot_info_round_trips():
    import pickle

    info = SlotInfo(3, "/proc/1/fd/7", 4096)
    back = pickle.loads(pickle.dumps(info))
    assert back == info and back.slot_id == 3 and back.name == "/proc/1/fd/7"
    assert back.capacity == 4096


def test_free_slots_beyond_in_flight_are_retired(prefix):
    ring = Ring(in_flight=2, prefix=prefix)
    writer = SlotWriter()
    try:
        slots = [_fill(ring, writer, 5000, i) for i in range(7)]
        names = {s: ring.info(s).name for s in slots}
        for s in slots:
            ring.release(s)
        ring.collect()
        retired = ring.take_retired()
        # in_flight (2) plus the 2 spare slots a loop typically holds are kept.
        assert len(retired) == 3 and len(ring._slots) == 4
        for slot_id, name in retired:
            assert name == names[slot_id]
        kept = [s for s in slots if s not in {r[0] for r in retired}]
        assert ring.take_retired() == []  # handed out once
        for slot_id, name in retired:
            writer.forget(slot_id, name)
        # The kept slots are reused before any new one is made.
        assert {ring.acquire().slot_id for _ in range(4)} == set(kept)
    finally:
        ring.close()


def test_lease_keeps_slot_until_every_view_is_gone(prefix):
    ring = Ring(in_flight=4, prefix=prefix)
    writer = SlotWriter()
    try:
        slot = _fill(ring, writer, 4096, 7)
        raw = ring.lease(slot)
        assert isinstance(raw.base, SlotLease) and raw.base.slot_id == slot
        view = raw[100:200].view(np.int32)       # a view of a view
        view2 = view.reshape(5, 5)[1:3]          # and of that
        del raw
        gc.collect()
        assert ring.acquire().slot_id != slot    # still held by view2 (and view)
        del view
        gc.collect()
        assert ring.acquire().slot_id != slot
        assert int(view2.view(np.uint8)[0, 0]) == 7
        del view2
        gc.collect()
        assert ring.acquire().slot_id == slot    # the last view died: back in circulation
    finally:
        ring.close()


def test_a_batch_without_arrays_gives_its_slot_back_at_once(prefix):
    # Its slot's file stays empty: nothing holds it, and a ring that kept such
    # slots out of circulation would open a file per batch, forever.
    ring = Ring(in_flight=2, prefix=prefix)
    try:
        slot = ring.acquire().slot_id
        assert ring.lease(slot).shape == (0,)
        assert ring.acquire().slot_id == slot
    finally:
        ring.close()


def test_two_leases_of_one_slot_share_memory(prefix):
    ring = Ring(in_flight=2, prefix=prefix)
    writer = SlotWriter()
    try:
        slot = _fill(ring, writer, 64, 3)
        a = ring.lease(slot)
        b = ring.lease(slot)
        assert np.shares_memory(a, b)
        a[0] = 42
        assert b[0] == 42
    finally:
        ring.close()


def test_close_lets_go_of_every_slot(prefix, backend):
    ring = Ring(in_flight=2, prefix=prefix)
    writer = SlotWriter()
    slots = [_fill(ring, writer, 2000, i) for i in range(3)]
    held = ring.lease(slots[0])
    free = weakref.ref(ring._slots[slots[1]].segment)
    ring.acquire()  # a new slot no worker filled yet
    fds = _open_fds()
    ring.close()
    gc.collect()
    assert ring.closed and free() is None
    assert _open_fds() == fds - 3  # the free slots' files; the held one's stays open
    assert [n for n in shm_entries() if n.startswith(prefix)] == []
    assert held[0] == 0  # a held view stays valid
    ring.close()  # idempotent
    del held
    gc.collect()
    assert _open_fds() == fds - 4


# ---------------------------------------------------------------------------
# Slots that outlive an epoch (NOTE [ Slots that outlive an epoch ])
# ---------------------------------------------------------------------------

def test_hand_over_gives_free_slots_now_and_held_ones_when_released(prefix):
    ring = Ring(in_flight=2, prefix=prefix)
    writer = SlotWriter()
    spares = SpareSlots()
    slots = [_fill(ring, writer, 5000, i) for i in range(3)]
    segments = {s: ring._slots[s].segment for s in slots}
    held = ring.lease(slots[0])
    for s in slots[1:]:
        ring.release(s)
    ring.hand_over(spares)
    ring.close()
    assert [n for n in shm_entries() if n.startswith(prefix)] == []  # names gone, as always
    # The free slots, and the held one to come (it fits in SPARE_BYTES).
    assert spares.nbytes == sum(segment.size for segment in segments.values())
    del held  # the batch outlived its epoch: its slot joins the spares now
    gc.collect()
    taken = spares.take()
    assert {id(seg) for seg in taken} == {id(seg) for seg in segments.values()}
    assert taken[0] is segments[slots[0]]  # the most recently returned comes first
    assert spares.take() == []  # taken once


def _hooks_of_a_fork() -> None:
    """What the fork hooks of the ring run in the parent around a fork."""
    fork_marks._mark_slots_held_at_fork()
    fork_marks._release_marks_after_fork()


@pytest.mark.timeout(30)
def test_a_fork_from_another_thread_marks_a_held_slot_however_the_hand_over_interleaves(
        prefix, monkeypatch):
    # The fork hook marks the spares, then the ring.  Were the ring to hand
    # its leases to the spares in between, the caller's batch was marked in
    # neither, and its slot went to the next epoch's workers while a child
    # read it (a helper's stress run: 94 children in 5,366).
    spares = SpareSlots()  # first, as a loader's: the hook marks it first
    ring = Ring(in_flight=2, prefix=prefix)
    writer = SlotWriter()
    slots = [_fill(ring, writer, 5000, i) for i in range(2)]
    held = ring.lease(slots[0])
    ring.release(slots[1])
    in_hook, handed_over = threading.Event(), threading.Event()
    mark_spares = SpareSlots.mark_held_at_fork

    def pause_after_the_spares(self, *args):
        mark_spares(self, *args)
        if self is spares and not args:
            in_hook.set()
            handed_over.wait(1.0)  # the main thread's chance to hand over

    monkeypatch.setattr(SpareSlots, "mark_held_at_fork", pause_after_the_spares)
    forker = threading.Thread(target=_hooks_of_a_fork)
    forker.start()
    assert in_hook.wait(10)
    ring.hand_over(spares)
    handed_over.set()
    forker.join(10)
    ring.close()
    assert len(spares.take()) == 1  # the free slot is kept
    del held  # the parent lets go; the child still reads it
    gc.collect()
    assert spares.take() == [], "a slot a forked child holds was kept for the next epoch's workers"


@pytest.mark.timeout(30)
def test_no_batch_is_made_between_a_forks_marks_and_its_end(prefix):
    # A batch made in that gap would be in the child unmarked; it waits for
    # the fork to end instead (and is then not the child's).
    ring = Ring(in_flight=2, prefix=prefix)
    writer = SlotWriter()
    slot = _fill(ring, writer, 5000, 0)
    fork_marks._mark_slots_held_at_fork()
    made = []
    try:
        maker = threading.Thread(target=lambda: made.append(ring.lease(slot)))
        maker.start()
        maker.join(0.3)
        assert made == [], "a batch was made while a fork was under way"
    finally:
        fork_marks._release_marks_after_fork()
    maker.join(10)
    assert len(made) == 1 and slot not in ring._held_at_fork
    made.clear()
    ring.close()


@pytest.mark.parametrize("when", ["before the hand-over", "during it"])
def test_a_slot_held_at_a_fork_is_not_kept_for_the_next_epoch(prefix, monkeypatch, when):
    # NOTE [ Batches a forked child holds ]: another thread may fork at any
    # instant, also while the ring hands its slots over to the spares.
    ring = Ring(in_flight=2, prefix=prefix)
    writer = SlotWriter()
    spares = SpareSlots()
    slots = [_fill(ring, writer, 5000, i) for i in range(2)]
    held = ring.lease(slots[0])
    ring.release(slots[1])
    if when == "before the hand-over":
        _hooks_of_a_fork()
    else:  # a signal handler of this thread's forks in the middle
        await_leases = SpareSlots.await_leases

        def forked_meanwhile(self, *args):
            _hooks_of_a_fork()
            await_leases(self, *args)

        monkeypatch.setattr(SpareSlots, "await_leases", forked_meanwhile)
    ring.hand_over(spares)
    ring.close()
    assert len(spares.take()) == 1  # the free slot is kept
    del held  # the parent lets go; the child still reads it
    gc.collect()
    assert spares.take() == [], "a slot a forked child holds was kept for the next epoch's workers"
    assert spares._held_at_fork == set()  # nothing left to watch for


def test_dropping_a_batch_runs_no_python_code(prefix):
    # Python code run where the caller drops a batch is where a Ctrl-C can be
    # lost (CPython drops a KeyboardInterrupt raised in a __del__): the ring
    # learns of it from a weak reference's C-level callback instead.
    ring = Ring(in_flight=2, prefix=prefix)
    slot = _fill(ring, SlotWriter(), 5000, 7)
    batch = ring.lease(slot)[:10]
    calls = []
    sys.setprofile(lambda frame, event, arg: calls.append((event, frame.f_code.co_name)))
    try:
        del batch
    finally:
        sys.setprofile(None)
    assert [call for call in calls if call[0] == "call"] == []
    ring.collect()
    assert slot in ring._free  # and the slot did come back
    ring.close()


def test_spare_slots_keep_at_most_spare_bytes(prefix, monkeypatch):
    segments = [_segment(f"{prefix}{i}", 4 * 4096) for i in range(5)]
    spares = SpareSlots()
    monkeypatch.setattr(spares_module, "SPARE_BYTES", 3 * 4 * 4096)
    spares.put(segments[:1])
    dead: collections.deque = collections.deque()
    leases = {i: SlotLease(segments[i], i) for i in (4, 3, 2, 1)}  # the latest batch first
    spares.await_leases(dead, {weakref.ref(lease, dead.append): segments[i]
                               for i, lease in leases.items()})
    assert spares.nbytes == 3 * 4 * 4096  # room for two of the four: the latest two
    gone = weakref.ref(segments[1].array.base)
    del leases[4], leases[3], leases[2], leases[1]
    segments[1] = None
    gc.collect()
    assert gone() is None, "a batch beyond SPARE_BYTES kept its slot after it was released"
    assert [s.name for s in spares.take()] == [segments[i].name for i in (3, 4, 0)]


def test_free_slots_handed_over_keep_at_most_spare_bytes(prefix, monkeypatch):
    # The free slots of an epoch count against SPARE_BYTES as the held ones do:
    # more than fits is freed at the hand-over, not mapped until the next epoch.
    monkeypatch.setattr(spares_module, "SPARE_BYTES", 2 * 8192)
    ring = Ring(in_flight=4, prefix=prefix)
    writer = SlotWriter()
    slots = [_fill(ring, writer, 5000, i) for i in range(4)]  # 8 KiB segments
    mappings = [weakref.ref(ring._slots[s].segment.array.base) for s in slots]
    for s in slots:
        ring.release(s)
    spares = SpareSlots()
    ring.hand_over(spares)
    ring.close()
    gc.collect()
    assert spares.nbytes == 2 * 8192
    assert sum(mapping() is not None for mapping in mappings) == 2, "free slots beyond the cap kept"
    assert len(spares.take()) == 2


def test_a_batch_released_while_its_ring_hands_over_is_freed_without_error(prefix, monkeypatch):
    # A lease the spares do not keep can die during hand_over (another thread,
    # a collection): its weak reference lands in the spares' queue all the same.
    monkeypatch.setattr(spares_module, "SPARE_BYTES", 8192)
    ring = Ring(in_flight=2, prefix=prefix)
    writer = SlotWriter()
    slots = [_fill(ring, writer, 5000, i) for i in range(2)]
    held = [ring.lease(slots[0]), ring.lease(slots[1])]  # the latest (slots[1]) is kept

    class ReleasingMeanwhile(SpareSlots):
        def await_leases(self, dead, leases):
            super().await_leases(dead, leases)
            held.pop(0)  # slots[0]'s batch dies before hand_over has returned
            gc.collect()

    spares = ReleasingMeanwhile()
    ring.hand_over(spares)
    ring.close()
    assert spares.nbytes == 8192
    del held[:]
    gc.collect()
    assert [segment.size for segment in spares.take()] == [8192]


@pytest.mark.timeout(60)
def test_reference_cycles_holding_batches_are_collected_between_epochs(no_leaks):
    # gc.freeze() before the workers fork, then gc.unfreeze(), put every young
    # object in the oldest generation: cycles that became garbage during an
    # epoch (here, one per batch, each holding its batch and so its slot)
    # waited for a full collection, which seldom comes.
    assert gc.get_freeze_count() == 0

    class Marker:
        pass

    markers = weakref.WeakSet()
    loader = fl.DataLoader(SquareDataset(16, (4,)), batch_size=4, num_workers=2,
                           multiprocessing_context="fork")
    for _ in range(10):
        for batch in loader:
            node = {"batch": batch, "marker": Marker()}
            node["self"] = node  # garbage at once, but only the cycle collector frees it
            markers.add(node["marker"])
            del node
    assert len(markers) <= 40
    iterator = iter(loader)  # the next epoch's workers fork
    assert len(markers) == 0, f"{len(markers)} of 40 cycles promoted past the young collections"
    del iterator

    ring = Ring(in_flight=2, prefix=prefix)
    writer = SlotWriter()
    spares = SpareSlots()
    slots = [_fill(ring, writer, 5000, i) for i in range(2)]
    held = ring.lease(slots[0])  # a batch the caller keeps past its epoch
    ring.release(slots[1])
    gone = weakref.ref(ring._slots[slots[1]].segment.array.base)  # the free slot's mmap
    ring.hand_over(spares)
    ring.close()
    assert gone() is not None and spares.nbytes > 0
    del spares  # the loader is gone, and only it held its spares
    gc.collect()
    assert gone() is None, "the free slot's mapping outlived the loader"
    del held  # and releasing the batch now gives it to nobody, without error
    gc.collect()


def _next_epochs_ring(prefix: str, in_flight: int, nbytes: int) -> Ring:
    """A ring whose ``in_flight`` slots of ``nbytes`` were filled, freed and handed over,
    and the ring of the next epoch, which starts with them."""
    old = Ring(in_flight=in_flight, prefix=prefix)
    writer = SlotWriter()
    slots = [_fill(old, writer, nbytes, i) for i in range(in_flight)]
    for slot in slots:
        old.release(slot)
    spares = SpareSlots()
    old.hand_over(spares)
    old.close()
    return Ring(in_flight=in_flight, prefix=prefix + "n", spares=spares.take())


def test_a_new_ring_starts_with_the_spares_and_a_forked_writer_fills_them(prefix):
    ring = _next_epochs_ring(prefix, in_flight=2, nbytes=8000)
    try:
        assert len(ring._slots) == 2 and set(ring.inherited) == {0, 1}
        infos = [ring.acquire(), ring.acquire()]
        assert all(info.capacity >= 8000 for info in infos)

        def fill():  # what a forked worker does with a slot it inherited
            child = SlotWriter(ring.inherited)
            for value, info in enumerate(infos, start=7):
                allocation = child.allocator(info)
                allocation(8000)[:8000] = value
                assert allocation.created is None  # nothing grown, nothing opened

        assert fork_child(fill) == 0
        for value, info in enumerate(infos, start=7):
            view = ring.lease(info.slot_id)
            assert (view[:8000] == value).all()  # written through the shared mapping
            del view
        assert [n for n in shm_entries() if n.startswith(prefix)] == []
    finally:
        ring.close()


@memfd_only
def test_an_inherited_slot_too_small_is_grown(prefix):
    ring = _next_epochs_ring(prefix, in_flight=1, nbytes=4096)
    try:
        info = ring.acquire()
        allocation = SlotWriter(ring.inherited).allocator(info)
        allocation(50_000)[:50_000] = 3
        assert allocation.created >= 50_000
        ring.adopt(info.slot_id, allocation.created)
        assert (ring.lease(info.slot_id)[:50_000] == 3).all()
    finally:
        ring.close()


def test_prefault_maps_a_segment_without_changing_it(prefix):
    segment = _segment(prefix + "p", 3 * 4096)
    try:
        segment.array[:] = 5
        segment.prefault()
        assert (segment.array == 5).all()
    finally:
        segment.unlink()


# ---------------------------------------------------------------------------
# Through the DataLoader
# ---------------------------------------------------------------------------

def _lease_of(array: np.ndarray) -> SlotLease | None:
    base = array
    while base is not None:
        if isinstance(base, SlotLease):
            return base
        base = getattr(base, "base", None)
    return None


@pytest.mark.timeout(60)
def test_batches_are_views_of_one_slot(no_leaks):
    loader = fl.DataLoader(SquareDataset(16, (3, 4, 4)), batch_size=4, num_workers=1)
    it = iter(loader)
    images, labels = next(it)
    lease_images, lease_labels = _lease_of(images), _lease_of(labels)
    assert lease_images is not None, "batch array is not a view of a ring slot (copied?)"
    assert lease_images is lease_labels, "two leaves of one batch should share one slot lease"
    slot_bytes = np.asarray(lease_images)
    assert np.shares_memory(images, slot_bytes) and np.shares_memory(labels, slot_bytes)
    assert not np.shares_memory(images, labels)  # distinct regions of the slot
    np.testing.assert_array_equal(labels, [0, 1, 2, 3])
    np.testing.assert_array_equal(images[:, 0, 0, 0], [0, 1, 2, 3])
    del it


@pytest.mark.timeout(60)
def test_holding_a_whole_epoch_is_correct_and_does_not_deadlock(no_leaks):
    dataset = SquareDataset(40 * 8, (3, 8, 8))
    expected = list(fl.DataLoader(dataset, batch_size=8, shuffle=True, generator=5))
    loader = fl.DataLoader(dataset, batch_size=8, shuffle=True, generator=5, num_workers=2)
    held = list(loader)  # every batch of the epoch kept alive at once
    assert len(held) == len(expected) == 40
    leases = {id(_lease_of(b[0])) for b in held}
    assert len(leases) == 40, "two held batches share a slot: one would be overwritten"
    for ours, ref in zip(held, expected):
        np.testing.assert_array_equal(ours[0], ref[0])
        np.testing.assert_array_equal(ours[1], ref[1])
    # Same for a second epoch while the first is still held.
    held2 = list(loader)
    for ours, first in zip(held, expected):
        np.testing.assert_array_equal(ours[0], first[0])
    assert len(held2) == 40


def _our_segments() -> list[str]:
    return sorted(n for n in shm_entries() if segment_pid(n) == os.getpid())


def _our_mappings() -> list[str]:
    """This process's mappings of ring segments (named or already unlinked)."""
    with open("/proc/self/maps") as maps:
        return [line.split()[-2] if line.rstrip().endswith("(deleted)") else line.split()[-1]
                for line in maps if f"/fl_{os.getpid()}_" in line]


def _reference_and_forked_loader(batches: int, generator: int) -> tuple:
    """Shuffled batches of 4: in process, and from new forked workers every epoch."""
    dataset = SquareDataset(batches * 4, (3, 16, 16))
    reference = fl.DataLoader(dataset, batch_size=4, shuffle=True, generator=generator)
    loader = fl.DataLoader(dataset, batch_size=4, shuffle=True, generator=generator,
                           num_workers=2, multiprocessing_context="fork")
    return reference, loader


@memfd_only
@pytest.mark.timeout(60)
def test_new_workers_write_into_the_slots_the_last_epoch_left(no_leaks):
    # NOTE [ Slots that outlive an epoch ]: under fork, the workers of a new
    # epoch fill the slots the last one left, through inherited mappings; no
    # segment is made, so none ever has a name in /dev/shm.
    reference, loader = _reference_and_forked_loader(batches=40, generator=3)
    for epoch in range(4):
        expected = list(reference)
        named_mid_epoch = None
        count = 0
        for (images, labels), (ref_images, ref_labels) in zip(loader, expected):
            np.testing.assert_array_equal(images, ref_images)
            np.testing.assert_array_equal(labels, ref_labels)
            count += 1
            if count == 20:
                named_mid_epoch = _our_segments()
        assert count == len(expected) == 40
        assert _our_segments() == [], "a kept slot still has a name between epochs"
        if epoch >= 2:
            # The first epoch makes the ring, the second one slot more (the
            # loop still held the first epoch's last batch); then none.
            assert named_mid_epoch == [], f"epoch {epoch} made segments {named_mid_epoch}"
    assert len(_our_mappings()) <= 2 * 4 + 2 + 1  # the kept slots and the batch still held
    del images, labels
    del loader
    gc.collect()
    assert _our_mappings() == [], "a kept slot outlived its loader"


@pytest.mark.timeout(60)
def test_batches_held_across_epochs_are_never_written_again(no_leaks):
    reference, loader = _reference_and_forked_loader(batches=24, generator=4)
    expected, kept = [], []
    for epoch in range(4):
        expected.append(list(reference))
        for b, batch in enumerate(loader):
            if epoch < 2 and b % 5 == 0:
                kept.append((epoch, b, batch))
    assert len(kept) == 10
    for epoch, b, (images, labels) in kept:
        np.testing.assert_array_equal(images, expected[epoch][b][0])
        np.testing.assert_array_equal(labels, expected[epoch][b][1])
    del kept, batch, images, labels
    del loader
    gc.collect()
    assert _our_mappings() == []


@pytest.mark.timeout(60)
def test_new_workers_fill_kept_slots_when_samples_grow_between_epochs(no_leaks):
    dataset = SquareDataset(16 * 4, (3, 8, 8))
    loader = fl.DataLoader(dataset, batch_size=4, num_workers=2, multiprocessing_context="fork")
    for shape in [(3, 8, 8), (3, 40, 40), (3, 8, 8), (5,)]:
        dataset.shape = shape  # the next epoch's workers are forked with it
        got = list(loader)
        assert len(got) == 16
        for b, (images, labels) in enumerate(got):
            assert images.shape == (4, *shape)
            np.testing.assert_array_equal(labels, np.arange(4 * b, 4 * b + 4))
            np.testing.assert_array_equal(images.reshape(4, -1)[:, -1], labels % 251)


@memfd_only
@pytest.mark.timeout(60)
def test_a_forked_child_iterating_the_loader_leaves_the_parents_slots_alone(no_leaks):
    # The child's mappings of the slots its copy of the loader lists are the
    # parent's: were it to fill them, the two would write the same pages.
    epochs, batches = 5, 100
    reference, loader = _reference_and_forked_loader(batches=batches, generator=6)
    expected = [list(reference) for _ in range(1 + epochs)]

    def check_epochs(numbers, scribble):
        for epoch in numbers:
            count = 0
            for (images, labels), (ref_images, ref_labels) in zip(loader, expected[epoch]):
                np.testing.assert_array_equal(images, ref_images)
                np.testing.assert_array_equal(labels, ref_labels)
                if scribble:
                    images[...] = 0  # in a page shared with the parent, it would show there
                count += 1
            assert count == batches

    check_epochs([0], scribble=False)
    kept = loader._spare_slots.nbytes
    assert kept > 0
    started_r, started_w = os.pipe()

    def child():
        assert loader._spare_slots.nbytes == kept  # inherited with the loader, unused
        os.write(started_w, b"x")
        check_epochs(range(1, 1 + epochs), scribble=True)
        assert loader._spare_slots.nbytes > 0      # its own, from its own epochs

    pid = os.fork()
    if pid == 0:  # pragma: no cover - runs in the child
        run_and_exit(child)
    try:
        assert os.read(started_r, 1) == b"x"
        check_epochs(range(1, 1 + epochs), scribble=False)  # while the child runs its own
    finally:
        status = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
        os.close(started_r)
        os.close(started_w)
    assert status == 0, "the child's epochs went wrong"
    assert loader._spare_slots.nbytes > 0


@pytest.mark.timeout(60)
@pytest.mark.parametrize("persistent, when", [(False, "mid-epoch"), (True, "mid-epoch"),
                                              (False, "between epochs")])
def test_a_batch_a_forked_child_holds_is_never_written_again(no_leaks, persistent, when):
    # NOTE [ Batches a forked child holds ]: the child (a background save, say)
    # reads the batch it inherited while the parent drops its own views and
    # goes on loading; between epochs the batch's slot would have been kept
    # for the next epoch's workers.
    dataset = SquareDataset(24 * 4, (3, 16, 16))
    expected = list(fl.DataLoader(dataset, batch_size=4))
    loader = fl.DataLoader(dataset, batch_size=4, num_workers=2, persistent_workers=persistent,
                           multiprocessing_context="fork")
    iterator = iter(loader)
    if when == "mid-epoch":
        number, held = 0, next(iterator)
    else:
        for number, held in enumerate(iterator):
            pass
    shared = {number: held}  # the parent lets go of it once the child has it
    del held
    go_r, go_w = os.pipe()

    def child():
        assert os.read(go_r, 1) == b"x"  # the parent has moved on
        np.testing.assert_array_equal(shared[number][0], expected[number][0])
        np.testing.assert_array_equal(shared[number][1], expected[number][1])

    pid = os.fork()
    if pid == 0:  # pragma: no cover - runs in the child
        run_and_exit(child)
    try:
        shared.clear()
        rest = list(iterator)  # held, so the ring reuses the slot the child holds, if anything
        for _ in range(2):
            for (images, _), (ref_images, _) in zip(loader, expected):
                np.testing.assert_array_equal(images, ref_images)
        del rest, images
        os.write(go_w, b"x")
    finally:
        status = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
        os.close(go_r)
        os.close(go_w)
    assert status == 0, "the batch the child held was written over"
    del loader, iterator


class _ReplayBuffer(fl.Dataset):
    """Batches of another loader, kept as samples."""

    def __init__(self, items):
        self.items = items

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        return self.items[i]


@pytest.mark.timeout(60)
def test_another_loaders_batches_a_dataset_holds_stay_intact_in_its_workers(no_leaks):
    # A loader forking its workers leaves only its own slots in circulation:
    # loader A's batches in B's dataset are read by B's (persistent) workers
    # after the main process has let go of them and A has gone on.
    dataset = SquareDataset(100 * 4, (3, 16, 16))
    expected = list(fl.DataLoader(dataset, batch_size=4))
    a_iterator = iter(fl.DataLoader(dataset, batch_size=4, num_workers=2,
                                    persistent_workers=True, multiprocessing_context="fork"))
    replay = _ReplayBuffer([next(a_iterator)[0] for _ in range(2)])
    b_loader = fl.DataLoader(replay, batch_size=None, num_workers=1, persistent_workers=True,
                             multiprocessing_context="fork")
    assert len(list(b_loader)) == 2  # B's worker is forked now, with A's batches
    replay.items = [item.copy() for item in replay.items]  # the main process lets go
    for _ in range(20):
        next(a_iterator)  # A's ring reuses the slots it gets back, if any
    for b, images in enumerate(b_loader):
        np.testing.assert_array_equal(images, expected[b][0])
    del a_iterator, b_loader


@memfd_only
@pytest.mark.timeout(60)
def test_a_copy_of_a_loader_keeps_no_slots_of_the_original(no_leaks):
    dataset = SquareDataset(12 * 4, (2, 4))
    expected = list(fl.DataLoader(dataset, batch_size=4))
    loader = fl.DataLoader(dataset, batch_size=4, num_workers=2, multiprocessing_context="fork")
    for batch in loader:
        pass
    del batch
    assert loader._spare_slots.nbytes > 0
    twin = copy.deepcopy(loader)
    assert twin._spare_slots.nbytes == 0  # a copy of the bytes is no shared mapping
    for _ in range(2):
        got = list(twin)
        for ours, ref in zip(got, expected):
            np.testing.assert_array_equal(ours[0], ref[0])


@pytest.mark.timeout(120)
@pytest.mark.parametrize("method", ["spawn", "forkserver"])
def test_workers_that_inherit_nothing_make_their_own_slots_every_epoch(no_leaks, method):
    dataset = SquareDataset(12 * 4, (2, 4))
    expected = list(fl.DataLoader(dataset, batch_size=4))
    loader = fl.DataLoader(dataset, batch_size=4, num_workers=2, multiprocessing_context=method)
    for _ in range(2):
        got = list(loader)
        assert len(got) == len(expected)
        for ours, ref in zip(got, expected):
            np.testing.assert_array_equal(ours[0], ref[0])
            np.testing.assert_array_equal(ours[1], ref[1])
        assert loader._spare_slots.nbytes == 0


class VaryingCollate:
    """Returns a different amount of data per batch (not a function of the batch size)."""

    def __call__(self, samples):
        labels = np.array([s[1] for s in samples], dtype=np.int64)
        length = int(labels[0] * 37 % 5000) + 1
        return {"labels": labels, "payload": np.arange(length, dtype=np.float32) + labels[0],
                "note": f"first={labels[0]}"}


@pytest.mark.timeout(60)
def test_custom_collate_with_varying_sizes(no_leaks):
    dataset = SquareDataset(200, (2,))
    collate = VaryingCollate()
    reference = fl.DataLoader(dataset, batch_size=4, shuffle=True, generator=1, collate_fn=collate)
    loader = fl.DataLoader(dataset, batch_size=4, shuffle=True, generator=1, num_workers=2,
                           collate_fn=collate)
    expected_epochs = [list(reference), list(reference)]
    streamed = [{k: (v.copy() if isinstance(v, np.ndarray) else v) for k, v in b.items()}
                for b in loader]  # epoch 1, each batch released before the next
    held = list(loader)           # epoch 2, every batch held
    for got, expected in zip((streamed, held), expected_epochs):
        assert len(got) == len(expected)
        for ours, ref in zip(got, expected):
            assert ours["note"] == ref["note"]
            np.testing.assert_array_equal(ours["labels"], ref["labels"])
            np.testing.assert_array_equal(ours["payload"], ref["payload"])


@pytest.mark.timeout(60)
@pytest.mark.parametrize("hold", [False, True])
def test_samples_growing_with_index_need_bigger_slots(no_leaks, hold):
    dataset = GrowingDataset(24 * 4, batch_size=4, step=2048)  # batch b: 4 x (b+1)*2048 float64
    loader = fl.DataLoader(dataset, batch_size=4, num_workers=2)
    got = []
    for vectors, names in loader:
        got.append((vectors if hold else vectors.copy(), names))
    assert len(got) == 24
    for b, (vectors, names) in enumerate(got):
        idx = np.arange(4 * b, 4 * b + 4)
        assert vectors.shape == (4, (b + 1) * 2048)
        np.testing.assert_array_equal(vectors, np.arange((b + 1) * 2048)[None, :] + idx[:, None])
        assert list(names) == [f"sample-{i}" for i in idx]  # a tuple, as torch gives


class TaggedDataset(SquareDataset):
    def __getitem__(self, i):
        image, label = super().__getitem__(i)
        return {"image": image, "label": label, "name": f"img_{i:04d}.jpg", "raw": b"\x00%d" % i,
                "meta": {"source": "synthetic", "index": i}}


@pytest.mark.timeout(60)
def test_string_and_object_leaves_ride_along(no_leaks):
    dataset = TaggedDataset(30, (2, 2))
    expected = list(fl.DataLoader(dataset, batch_size=7))
    got = list(fl.DataLoader(dataset, batch_size=7, num_workers=2))
    assert len(got) == len(expected) == 5
    for ours, ref in zip(got, expected):
        assert ours["name"] == ref["name"] and isinstance(ours["name"], list)
        assert ours["raw"] == ref["raw"]
        assert ours["meta"]["source"] == ref["meta"]["source"]
        np.testing.assert_array_equal(ours["meta"]["index"], ref["meta"]["index"])
        np.testing.assert_array_equal(ours["image"], ref["image"])
        np.testing.assert_array_equal(ours["label"], ref["label"])


# ---------------------------------------------------------------------------
# Too little /dev/shm (a real 4 MiB tmpfs in a private mount namespace)
# ---------------------------------------------------------------------------

_SMALL_SHM_SCRIPT = """
import os, sys
sys.path[:0] = [{tests!r}, {repo!r}]
import numpy as np
import fastload as fl
from fastload._ring import SharedMemoryError
from datasets_for_workers import SquareDataset

print("SHM", os.statvfs("/dev/shm").f_blocks * os.statvfs("/dev/shm").f_frsize, flush=True)
# {case}
if {case!r} == "one-batch-too-big":
    # One batch is 8 x 1 MiB = 8 MiB; /dev/shm is 4 MiB.
    loader = fl.DataLoader(SquareDataset(64, (1024, 1024)), batch_size=8, num_workers=2)
else:
    # One batch (1.5 MiB) fits, the ring's in-flight batches do not.
    loader = fl.DataLoader(SquareDataset(64, (3, 512, 512)), batch_size=2, num_workers=2,
                           prefetch_factor=2)
try:
    held = list(loader)
except SharedMemoryError as exc:
    print("TYPE", type(exc).__name__)
    print("MESSAGE", str(exc).replace("\\n", " | "))
else:
    print("NO ERROR", len(held))
del loader
import gc
gc.collect()
print("LEFT", sorted(n for n in os.listdir("/dev/shm") if n.startswith("fl_")), flush=True)
"""


def _run_in_small_shm(tmp_path, case: str) -> subprocess.CompletedProcess:
    if shutil.which("unshare") is None:
        pytest.skip("needs unshare(1) to mount a private 4 MiB /dev/shm")
    script = tmp_path / "small_shm.py"
    script.write_text(_SMALL_SHM_SCRIPT.format(tests=TESTS_DIR, repo=REPO_DIR, case=case))
    # POSIX segments, which live in /dev/shm (the ring's memory files do not).
    command = (f"mount -t tmpfs -o size=4m tmpfs /dev/shm && "
               f"FASTLOAD_RING=posix exec {sys.executable} {script}")
    probe = subprocess.run(["unshare", "-m", "sh", "-c", "mount -t tmpfs -o size=4m tmpfs /dev/shm"],
                           capture_output=True, text=True)
    if probe.returncode != 0:
        pytest.skip(f"cannot mount a private /dev/shm here: {probe.stderr.strip()}")
    return subprocess.run(["unshare", "-m", "sh", "-c", command], capture_output=True, text=True,
                          timeout=60)


@pytest.mark.timeout(90)
@pytest.mark.parametrize("case", ["one-batch-too-big", "ring-too-big"])
def test_too_small_dev_shm_gives_clear_error(tmp_path, case):
    result = _run_in_small_shm(tmp_path, case)
    out = result.stdout
    assert "SHM 4194304" in out, (out, result.stderr)
    assert result.returncode == 0, result.stderr
    assert "TYPE SharedMemoryError" in out, (out, result.stderr[-3000:])
    message = out.split("MESSAGE", 1)[1].split("\nLEFT", 1)[0]
    # How much was needed, what is free, what to change.
    assert "MiB" in message and "free" in message, message
    needed = 8.0 if case == "one-batch-too-big" else 1.5
    amounts = [float(x) for x in re.findall(r"(\d+(?:\.\d+)?) MiB", message)]
    assert any(abs(a - needed) < 0.6 for a in amounts), (needed, message)
    assert any(a <= 4.0 for a in amounts), message  # the free space reported
    assert "/dev/shm" in message and ("shm-size" in message or "larger" in message), message
    assert "batch_size" in message or "prefetch_factor" in message, message
    # And the failed loader left nothing behind in that /dev/shm (once collected;
    # test_faults checks that no garbage collection is needed).
    assert "LEFT []" in out, out



# The limits are set before the script starts, and it does not import
# ``resource``: loading an extension module takes a descriptor too, so
# fastload must not load one once none is left.
_FD_LIMIT_SCRIPT = """
import sys
sys.path[:0] = [{repo!r}]
import numpy as np
import fastload as fl

class Rows(fl.Dataset):
    def __len__(self):
        return 400

    def __getitem__(self, i):
        return np.full(4, i, np.float32)

def soft_limit():
    with open("/proc/self/limits") as limits:
        return next(line.split()[3] for line in limits if line.startswith("Max open files"))

try:
    held = list(fl.DataLoader(Rows(), batch_size=2, num_workers=2))
    print("HELD", len(held))
except Exception as exc:
    print("ERROR", type(exc).__name__, "LIMIT", soft_limit(), "MESSAGE", exc)
"""


@pytest.mark.timeout(60)
def test_holding_more_batches_than_the_open_file_limit_raises_torchs_error(tmp_path, no_leaks):
    # Each held batch keeps a descriptor (its slot's mapping).  A caller keeping
    # an epoch of 200 batches under a soft limit of 64 gets torch's error (a
    # RuntimeError that says to raise ``ulimit -n``), and the limit stays the
    # caller's: not raised towards the hard one behind its back.
    script = tmp_path / "fd_limit.py"
    script.write_text(_FD_LIMIT_SCRIPT.format(repo=REPO_DIR))
    proc = subprocess.Popen(["prlimit", "--nofile=64:4096", sys.executable, str(script)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    no_leaks.watch_pid(proc.pid)
    out, err = proc.communicate(timeout=50)
    assert out.split()[:4] == ["ERROR", "RuntimeError", "LIMIT", "64"], (out, err[-2000:])
    message = out.split("MESSAGE ", 1)[1]
    assert message.startswith("Too many open files. "), message
    assert "`ulimit -n`" in message and "now 64, at most 4096" in message, message
    assert "`torch.multiprocessing.set_sharing_strategy('file_system')`" in message, message


def test_the_open_file_limit_error_names_both_of_torchs_remedies():
    # torch's test_fd_limit_exceeded looks for both phrases in the message.
    from fastload._ring.segments import too_many_open_files

    error = too_many_open_files()
    message = str(error)
    assert type(error) is RuntimeError and message.startswith("Too many open files. ")
    assert "ulimit -n" in message and "set_sharing_strategy" in message
    assert "torch.multiprocessing.set_sharing_strategy('file_system')" in message
    # ... and says what the strategy does for fastload's own batches: nothing.
    assert "whatever the strategy" in message


# ---------------------------------------------------------------------------
# The kernels that make a batch's arrays over its slot (_core, _views.pxi)
# ---------------------------------------------------------------------------

class _Holder:
    """Stands for a SlotLease: any object may be a lease array's base."""


def test_lease_array_is_the_memory_with_the_lease_as_its_base():
    memory = np.arange(64, dtype=np.uint8)
    lease = _Holder()
    array = _core.lease_array(lease, memory)
    assert array.base is lease
    assert array.dtype == np.uint8 and array.shape == (64,)
    assert array.flags.c_contiguous and array.flags.writeable
    assert array.__array_interface__["data"][0] == memory.__array_interface__["data"][0]
    array[3] = 200  # the same bytes, not a copy
    assert memory[3] == 200
    del array
    gc.collect()
    assert sys.getrefcount(lease) == 2  # the array let go of it


@pytest.mark.parametrize("memory", [np.zeros(16, dtype=np.int32), np.zeros(64, np.uint8)[::2]],
                         ids=["not bytes", "not contiguous"])
def test_lease_array_refuses_other_memory(memory):
    with pytest.raises(ValueError, match="contiguous array of bytes"):
        _core.lease_array(_Holder(), memory)


@pytest.mark.parametrize("dtype, shape, offset", [
    (np.float32, (3, 4), 64),
    (np.int64, (), 8),
    (np.uint8, (0, 5), 200),
    (np.float64, (3,), 3),  # misaligned: not ALIGNED, as numpy says
    (np.dtype(">i4"), (2, 2), 4),
    (np.dtype("u2", metadata={"torch_dtype": "torch.uint16"}), (4,), 16),
    (np.dtype([("a", "<i4"), ("b", "<f8", (2,))]), (2,), 32),
    (np.dtype("S0"), (3,), 0),
])
def test_slot_view_is_numpys_view_of_the_buffer(dtype, shape, offset):
    buffer = _core.lease_array(_Holder(), np.zeros(256, dtype=np.uint8))
    dtype = np.dtype(dtype)
    ours = _core.slot_view(buffer, dtype, shape, offset)
    theirs = np.ndarray(shape, dtype, buffer, offset)
    assert ours.dtype == theirs.dtype and ours.dtype.metadata == theirs.dtype.metadata
    assert ours.shape == theirs.shape and ours.strides == theirs.strides
    assert ours.__array_interface__["data"] == theirs.__array_interface__["data"]
    assert ours.flags == theirs.flags
    assert ours.base is buffer


def test_arrays_over_read_only_memory_are_read_only():
    memory = np.zeros(64, dtype=np.uint8)
    memory.flags.writeable = False
    assert not _core.lease_array(_Holder(), memory).flags.writeable
    assert not _core.slot_view(memory, np.dtype(np.int32), (4,), 0).flags.writeable


@pytest.mark.parametrize("shape, offset, message", [
    ((17,), 0, "does not fit"),
    ((15,), 8, "does not fit"),
    ((4,), -4, "does not fit"),
    ((0,), 65, "does not fit"),
    ((1,), 2**62, "does not fit"),
    ((-1,), 0, "negative dimension"),
    ((2**40, 2**40), 0, "larger than memory"),
    ((1,) * 65, 0, "dimensions"),
])
def test_slot_view_refuses_a_view_past_the_buffer(shape, offset, message):
    buffer = np.zeros(64, dtype=np.uint8)
    with pytest.raises(ValueError, match=message):
        _core.slot_view(buffer, np.dtype(np.int32), shape, offset)
