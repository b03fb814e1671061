"""What spawn/forkserver workers receive: pickled once, file-mapped arrays by
reference, per-worker pickling where an object needs it, errors that name the
object (NOTE [ Pickled once, or per worker ] in fastload/_loading/wire/payload.py)."""

from __future__ import annotations

import multiprocessing
import os
import pickle

import numpy as np
import pytest

import fastload as fl
from fastload._loading.wire.payload import PickledPayload, pickle_for_workers
from fastload._loading.wire.picklers import TruncatedFileError

pytestmark = pytest.mark.timeout(120)


def _through_workers(obj):
    """``obj`` as a spawn worker unpickles it."""
    payload = pickle_for_workers([("dataset", obj)], "spawn")
    assert isinstance(payload, PickledPayload)
    return pickle.loads(payload.data)[0], len(payload.data)


@pytest.fixture
def values():
    return np.arange(64 * 1024 * 4, dtype=np.float64).reshape(-1, 4)


def _memmap(tmp_path, values, mode="r"):
    values.tofile(tmp_path / "x.dat")
    return np.memmap(tmp_path / "x.dat", dtype=values.dtype, mode=mode, shape=values.shape)


@pytest.mark.parametrize("view", ["whole", "rows", "every-other-row", "reversed", "columns",
                                  "transposed", "asarray", "npy"])
def test_file_mapped_arrays_travel_by_reference(tmp_path, values, view):
    if view == "npy":
        np.save(tmp_path / "x.npy", values)
        array = np.load(tmp_path / "x.npy", mmap_mode="r")
    else:
        array = _memmap(tmp_path, values)
    pick = {"whole": np.s_[:], "rows": np.s_[1000:3000], "every-other-row": np.s_[::2],
            "reversed": np.s_[::-1], "columns": np.s_[:, 1:3], "transposed": np.s_[:],
            "asarray": np.s_[5:], "npy": np.s_[:]}[view]
    array, expected = array[pick], values[pick]
    if view == "transposed":
        array, expected = array.T, expected.T
    if view == "asarray":
        array = np.asarray(array)  # no longer a memmap, still the file's pages
    clone, size = _through_workers(array)
    assert size < 2000 < expected.nbytes  # the file's name, not its bytes
    np.testing.assert_array_equal(clone, expected)
    assert clone.strides == array.strides
    assert isinstance(clone, np.memmap) == isinstance(array, np.memmap)
    if isinstance(array, np.memmap) and array.flags.c_contiguous:
        assert clone.filename == array.filename


def test_a_writable_mapping_is_shared_with_the_worker_and_not_truncated(tmp_path, values):
    array = _memmap(tmp_path, values, mode="w+")  # reopens "r+", which keeps the file
    array[:] = values
    clone, _ = _through_workers(array)
    clone[0, 0] = -1.0
    assert array[0, 0] == -1.0  # the same pages, as a forked worker would have them
    np.testing.assert_array_equal(array[1:], values[1:])


@pytest.mark.parametrize("change", ["copy-on-write", "replaced", "deleted"])
def test_arrays_whose_file_differs_from_their_pages_travel_by_value(tmp_path, values, change):
    # What the worker gets is what the main process sees, never what the path holds now.
    array = _memmap(tmp_path, values, mode="c" if change == "copy-on-write" else "r")
    expected = values.copy()
    if change == "copy-on-write":
        array[0, 0] = expected[0, 0] = 99.0  # only in this process's pages
    elif change == "replaced":  # as rsync and atomic writers do
        (values + 1000).tofile(tmp_path / "new.dat")
        os.replace(tmp_path / "new.dat", tmp_path / "x.dat")
    else:
        os.unlink(tmp_path / "x.dat")
    clone, size = _through_workers(array)
    assert size > expected.nbytes
    np.testing.assert_array_equal(clone, expected)


def test_a_file_replaced_after_pickling_fails_in_the_worker_naming_it(tmp_path, values):
    array = _memmap(tmp_path, values)
    payload = pickle_for_workers([("dataset", array)], "spawn")
    (values + 1000).tofile(tmp_path / "new.dat")
    os.replace(tmp_path / "new.dat", tmp_path / "x.dat")
    with pytest.raises(RuntimeError, match=r"x\.dat.*was replaced or removed"):
        pickle.loads(payload.data)


def _truncate(path, size):
    with open(path, "r+b") as file:
        file.truncate(size)


@pytest.mark.parametrize("mode", ["r", "c"])
def test_a_file_truncated_before_pickling_fails_at_iter_naming_it(tmp_path, values, no_leaks,
                                                                  mode):
    # Its pages past the new end are gone: sending them by value would be a
    # SIGBUS in the main process (torch's dies so), mapping them a SIGBUS in a
    # worker; a copy-on-write map ("c") is sent by value, so the same.
    array = _memmap(tmp_path, values, mode=mode)[1000:]
    _truncate(tmp_path / "x.dat", 100)
    loader = fl.DataLoader(fl.ArrayDataset(array), batch_size=64, num_workers=2,
                           multiprocessing_context="spawn")
    with pytest.raises(TruncatedFileError, match=r"x\.dat', mapped by an array of the dataset, "
                                                 r"is 100 bytes long, but the array reads up to "
                                                 rf"byte {values.nbytes}: the file was truncated"):
        iter(loader)


def test_a_file_truncated_after_pickling_fails_in_the_worker_naming_it(tmp_path, values):
    payload = pickle_for_workers([("dataset", _memmap(tmp_path, values))], "spawn")
    _truncate(tmp_path / "x.dat", values.nbytes - 8)
    with pytest.raises(TruncatedFileError, match=r"x\.dat'.* is \d+ bytes long"):
        pickle.loads(payload.data)


def test_memmap_array_dataset_under_spawn_workers_matches_in_process(tmp_path, values):
    array = _memmap(tmp_path, values)[::3]
    dataset = fl.ArrayDataset(array, np.asarray(array)[:, 0])
    kwargs = dict(batch_size=500, shuffle=True, generator=7)
    expected = [[part.copy() for part in batch] for batch in fl.DataLoader(dataset, **kwargs)]
    got = [[part.copy() for part in batch] for batch in fl.DataLoader(
        dataset, num_workers=2, multiprocessing_context="spawn", **kwargs)]
    assert len(got) == len(expected)
    for ours, reference in zip(got, expected):
        for a, b in zip(ours, reference):
            np.testing.assert_array_equal(a, b)


class CountingDataset(fl.Dataset):
    """Counts its unpickling in each worker, and carries a multiprocessing object."""

    def __init__(self, shared):
        self.shared = shared

    def __len__(self):
        return 8

    def __getitem__(self, i):
        with self.shared.get_lock():
            self.shared.value += 1
        return np.int64(i)


@pytest.mark.parametrize("method", ["spawn", "forkserver"])
def test_objects_that_hand_a_descriptor_to_each_worker_are_pickled_per_worker(method):
    # A multiprocessing.Value lives in memory reached by a file descriptor,
    # which multiprocessing hands to each process it starts: pickled once it
    # failed at iter(); per worker, as torch does, the workers' writes reach
    # the main process.
    context = multiprocessing.get_context(method)
    shared = context.Value("i", 0)
    payload = pickle_for_workers([("dataset", CountingDataset(shared))], method)
    assert isinstance(payload, tuple)
    loader = fl.DataLoader(CountingDataset(shared), batch_size=4, num_workers=2,
                           multiprocessing_context=context)
    assert [batch.tolist() for batch in loader] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    assert shared.value == 8


class TwoArgumentError(Exception):
    def __init__(self, code, detail):
        super().__init__(code, detail)


class RefusesPickling(fl.Dataset):
    def __len__(self):
        return 1

    def __getitem__(self, i):
        return i

    def __reduce__(self):
        raise TwoArgumentError("E1", "no pickling here")


def test_a_pickling_error_keeps_its_type_even_when_it_takes_other_arguments():
    with pytest.raises(TwoArgumentError) as excinfo:
        pickle_for_workers([("dataset", RefusesPickling())], "spawn")
    assert "must pickle the dataset" in "\n".join(excinfo.value.__notes__)


def test_an_unpicklable_object_is_named_even_beside_one_pickled_per_worker():
    shared = multiprocessing.get_context("spawn").Value("i", 0)
    with pytest.raises(AttributeError, match="must pickle the worker_init_fn"):
        pickle_for_workers([("dataset", CountingDataset(shared)),
                            ("worker_init_fn", lambda worker_id: None)], "spawn")


def _fail_if_payload_bytes_remain(worker_id):
    """worker_init_fn: runs once the payload is unpickled."""
    import gc

    from fastload._loading.wire.payload import PickledPayload

    held = [len(obj.data) for obj in gc.get_objects()
            if isinstance(obj, PickledPayload) and len(obj.data) > 1_000_000]
    left = held + [len(item) for holder in gc.get_objects()
                   if isinstance(holder, (tuple, list, dict))
                   for item in (holder.values() if isinstance(holder, dict) else holder)
                   if isinstance(item, (bytes, bytearray)) and len(item) > 1_000_000]
    if left:
        raise AssertionError(f"worker {worker_id} still holds the payload's bytes: {left}")


def test_workers_free_the_payload_bytes_once_unpickled():
    # Else every spawn worker held the dataset twice (its bytes and itself).
    dataset = fl.ArrayDataset(np.ones((1024, 1024), dtype=np.float32))  # 4 MiB, by value
    loader = fl.DataLoader(dataset, batch_size=256, num_workers=2, multiprocessing_context="spawn",
                           worker_init_fn=_fail_if_payload_bytes_remain)
    assert sum(len(batch[0]) for batch in loader) == 1024
