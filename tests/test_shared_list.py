"""SharedList: list semantics, pickling, and forked workers that read it
without copying it (NOTE [ Copy-on-read ] in fastload/shared_list.py)."""

from __future__ import annotations

import pickle

import numpy as np
import psutil
import pytest

import fastload as fl

RECORDS = [{"file": f"train/{i:06d}.jpg", "boxes": [[i, 2.5, 3.0, 4.0]] * (i % 3), "label": i % 7}
           for i in range(50)] + ["a string", 7, None, (1, "x"), b"bytes"]


def test_it_reads_as_the_list_it_was_made_from():
    shared = fl.SharedList(RECORDS)
    assert len(shared) == len(RECORDS)
    assert [shared[i] for i in range(len(RECORDS))] == RECORDS
    assert [shared[-i] for i in range(1, len(RECORDS) + 1)] == [RECORDS[-i] for i in
                                                                range(1, len(RECORDS) + 1)]
    assert list(shared) == RECORDS
    assert shared[np.int64(3)] == RECORDS[3]
    assert shared[2:40:5] == RECORDS[2:40:5] and shared[::-1] == RECORDS[::-1]
    assert list(fl.SharedList([])) == [] and len(fl.SharedList(iter(RECORDS))) == len(RECORDS)


@pytest.mark.parametrize("index", [55, -56, 10**12])
def test_an_index_out_of_range_is_lists_index_error(index):
    shared = fl.SharedList(RECORDS)
    with pytest.raises(IndexError, match="^list index out of range$"):
        shared[index]
    with pytest.raises(IndexError, match="^list index out of range$"):
        RECORDS[index]


def test_a_bad_index_type_is_lists_type_error():
    with pytest.raises(TypeError, match="^list indices must be integers or slices, not str$"):
        fl.SharedList(RECORDS)["0"]


def test_a_record_read_is_a_copy():
    shared = fl.SharedList(RECORDS)
    shared[0]["label"] = 99
    assert shared[0] == RECORDS[0]


def test_unpicklable_records_are_refused_at_once():
    with pytest.raises((pickle.PicklingError, AttributeError, TypeError)):
        fl.SharedList([lambda: 0])


def test_it_pickles_as_two_flat_buffers():
    shared = fl.SharedList(RECORDS)
    data = pickle.dumps(shared, protocol=pickle.HIGHEST_PROTOCOL)
    assert len(data) < shared.nbytes + 1024
    assert list(pickle.loads(data)) == RECORDS
    assert list(fl.SharedList(shared)) == RECORDS


class _Annotated(fl.Dataset):
    """What a detection dataset keeps: one annotation record per image."""

    def __init__(self, records):
        self.records = records

    def __len__(self):
        return len(self.records)

    def __getitem__(self, i):
        record = self.records[i]
        return len(record["file"]) + record["label"] + len(record["boxes"])


def _annotations(n):
    return [{"file": f"images/train2017/{i:012d}.jpg", "boxes": [[float(i), 1.0, 2.0, 3.0]] * 2,
             "labels": [i % 80, 3], "label": i % 5, "crowd": False} for i in range(n)]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_workers_read_it(method, no_leaks):
    records = _annotations(2000)
    loader = fl.DataLoader(_Annotated(fl.SharedList(records)), batch_size=100, num_workers=2,
                           multiprocessing_context=method)
    got = np.concatenate([batch for batch in loader])
    assert got.tolist() == [_Annotated(records)[i] for i in range(2000)]


def _workers_private_memory(records) -> int:
    """Bytes private to the two forked workers (USS) after each read every record."""
    loader = fl.DataLoader(_Annotated(records), batch_size=500, num_workers=2,
                           persistent_workers=True, multiprocessing_context="fork")
    iterator = iter(loader)
    assert sum(len(batch) for batch in iterator) == len(records)
    private = sum(psutil.Process(pid).memory_full_info().uss for pid in iterator.worker_pids)
    iterator.shutdown()
    return private


@pytest.mark.timeout(120)
@pytest.mark.filterwarnings("ignore:the dataset's attribute 'records'")  # the plain list's, meant
def test_forked_workers_do_not_copy_it(no_leaks):
    # The plain list is copied page by page into each worker as reading touches
    # reference counts; the SharedList's pages stay shared.  Qualitative: the
    # list's copies dwarf everything else a worker owns.
    records = _annotations(150_000)
    shared = fl.SharedList(records)
    with_list = _workers_private_memory(records)
    with_shared = _workers_private_memory(shared)
    assert with_shared < with_list / 2, (with_shared >> 20, with_list >> 20)
