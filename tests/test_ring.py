"""The shared-memory ring: segments, slots, leases; and through the DataLoader,
zero-copy batches that stay valid while held."""

from __future__ import annotations

import gc
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

import fastload as fl
from fastload import ring as ringmod
from fastload.ring import Ring, Segment, SlotLease, SlotWriter, unlink_name
from datasets_for_workers import GrowingDataset, SquareDataset
from leakcheck import shm_entries

TESTS_DIR = os.path.dirname(os.path.abspath(__file__))
REPO_DIR = os.path.dirname(TESTS_DIR)


def _exists(name: str) -> bool:
    return os.path.exists(os.path.join("/dev/shm", name))


@pytest.fixture
def prefix():
    """A fresh ring prefix; anything left under it is unlinked (and reported) afterwards."""
    p = ringmod.new_prefix()
    yield p
    left = sorted(n for n in shm_entries() if n.startswith(p))
    for name in left:
        unlink_name(name)
    assert not left, f"test left segments {left}"


# ---------------------------------------------------------------------------
# Segment
# ---------------------------------------------------------------------------

def test_segment_create_attach_unlink(prefix):
    name = prefix + "seg"
    created = Segment(name, 10_000, create=True)
    assert created.size == 10_000 and created.array.shape == (10_000,)
    assert _exists(name)
    created.array[:5] = [1, 2, 3, 4, 5]
    attached = Segment(name)
    assert attached.size == 10_000
    assert attached.array[:5].tolist() == [1, 2, 3, 4, 5]
    attached.array[9_999] = 77  # the same memory, both ways
    assert created.array[9_999] == 77
    with pytest.raises(FileExistsError):
        Segment(name, 10, create=True)
    created.unlink()
    assert not _exists(name)
    created.unlink()  # idempotent
    attached.unlink()
    # The mappings outlive the name.
    created.array[0] = 9
    assert attached.array[0] == 9
    with pytest.raises(FileNotFoundError):
        Segment(name)


def test_segment_reserves_its_pages(prefix):
    """posix_fallocate: the pages exist at once (a tmpfs file is otherwise sparse)."""
    name = prefix + "reserved"
    size = 3 * 2**20 + 123
    segment = Segment(name, size, create=True)
    try:
        st = os.stat(os.path.join("/dev/shm", name))
        assert st.st_size == size
        assert st.st_blocks * 512 >= size, "segment pages were not reserved"
    finally:
        segment.unlink()


def test_segment_of_size_zero(prefix):
    segment = Segment(prefix + "empty", 0, create=True)
    assert segment.size == 0 and segment.array.shape == (0,)
    segment.unlink()


# ---------------------------------------------------------------------------
# Ring and SlotWriter, driven by hand
# ---------------------------------------------------------------------------

def _fill(ring: Ring, writer: SlotWriter, nbytes: int, value: int) -> int:
    """What a task does: acquire a slot, a worker writes it, the main process adopts."""
    info = ring.acquire()
    allocation = writer.allocator(info)
    buffer = allocation(nbytes)
    buffer[:nbytes] = value
    if allocation.created_name is not None:
        ring.adopt(info.slot_id, allocation.created_name)
    return info.slot_id


def test_acquire_release_collect(prefix):
    ring = Ring(in_flight=2, prefix=prefix)
    try:
        a, b, c = (ring.acquire().slot_id for _ in range(3))
        assert len({a, b, c}) == 3 and ring.slot_count == 3  # grows while every slot is held
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
        assert ring.slot_count == 4
    finally:
        ring.close()


def test_slot_info_names_the_next_generation(prefix):
    ring = Ring(in_flight=1, prefix=prefix)
    writer = SlotWriter()
    try:
        info = ring.acquire()
        assert info.name is None and info.capacity == 0
        assert info.next_name == f"{prefix}s{info.slot_id}g1"
        allocation = writer.allocator(info)
        allocation(1000)
        assert allocation.created_name == info.next_name and _exists(info.next_name)
        ring.adopt(info.slot_id, allocation.created_name)
        info2 = ring.info(info.slot_id)
        assert info2.name == info.next_name and info2.capacity >= 1000
        assert info2.next_name == f"{prefix}s{info.slot_id}g2"
        # It fits: the worker reuses the segment, creates nothing.
        again = writer.allocator(info2)
        again(900)
        assert again.created_name is None
        # It does not: a next generation with headroom; adopting it unlinks the old one.
        grown = writer.allocator(info2)
        buffer = grown(100_000)
        assert grown.created_name == info2.next_name
        assert buffer.shape[0] >= 100_000 + 100_000 // 4
        ring.adopt(info.slot_id, grown.created_name)
        assert not _exists(info2.name) and _exists(info2.next_name)
    finally:
        ring.close()


def test_pickled_slot_info_round_trips():
    import pickle

    info = ringmod.SlotInfo(3, "fl_x_s3g1", 4096, "fl_x_s3g2")
    back = pickle.loads(pickle.dumps(info))
    assert back == info and back.slot_id == 3 and back.next_name == "fl_x_s3g2"


def test_free_slots_beyond_in_flight_are_retired(prefix):
    ring = Ring(in_flight=2, prefix=prefix)
    writer = SlotWriter()
    try:
        slots = [_fill(ring, writer, 5000, i) for i in range(7)]
        names = {s: ring.info(s).name for s in slots}
        assert all(_exists(n) for n in names.values())
        for s in slots:
            ring.release(s)
        ring.collect()
        retired = ring.take_retired()
        # in_flight (2) plus the 2 spare slots a loop typically holds are kept.
        assert len(retired) == 3 and ring.slot_count == 4
        for slot_id, name in retired:
            assert name == names[slot_id] and not _exists(name)
        kept = [s for s in slots if s not in {r[0] for r in retired}]
        assert all(_exists(names[s]) for s in kept)
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


def test_close_unlinks_everything_including_unreported_next_generation(prefix):
    ring = Ring(in_flight=2, prefix=prefix)
    writer = SlotWriter()
    slots = [_fill(ring, writer, 2000, i) for i in range(3)]
    held = ring.lease(slots[0])
    # A worker starts regrowing slot 1 and dies before it can report it.
    info = ring.info(slots[1])
    orphan = writer.allocator(info)
    orphan(50_000)
    assert _exists(info.next_name)
    # A worker creating a brand-new slot's first generation, unreported too.
    fresh = ring.acquire()
    writer.allocator(fresh)(3000)
    assert _exists(fresh.next_name)
    ring.close(in_flight_ids=[slots[1], fresh.slot_id])
    assert ring.closed
    assert [n for n in shm_entries() if n.startswith(prefix)] == []
    assert held[0] == 0  # a held view stays valid
    ring.close()  # idempotent
    del held
    gc.collect()


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
from fastload.ring import SharedMemoryError
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
    command = f"mount -t tmpfs -o size=4m tmpfs /dev/shm && exec {sys.executable} {script}"
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
    amounts = [float(x) for x in __import__("re").findall(r"(\d+(?:\.\d+)?) MiB", message)]
    assert any(abs(a - needed) < 0.6 for a in amounts), (needed, message)
    assert any(a <= 4.0 for a in amounts), message  # the free space reported
    assert "/dev/shm" in message and ("shm-size" in message or "larger" in message), message
    assert "batch_size" in message or "prefetch_factor" in message, message
    # And the failed loader left nothing behind in that /dev/shm (once collected;
    # test_faults checks that no garbage collection is needed).
    assert "LEFT []" in out, out
