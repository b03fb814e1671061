"""Tables the source tests write, and the reference rows pyarrow itself reads back."""

import numpy as np
from required import deferred

import fastload as fl

pa = deferred("pyarrow")  # imported by the first test to use it: tests/required.py says why


def numeric_table(rows, start=0):
    """Fixed-width columns only: a label, a float vector, a 2-D int block, a flag."""
    index = np.arange(start, start + rows)
    return pa.table({
        "label": pa.array(index, pa.int64()),
        "vector": pa.FixedSizeListArray.from_arrays(
            pa.array(np.repeat(index, 4).astype(np.float32) / 7), 4),
        "block": pa.array([[[i, -i, 2 * i]] * 2 for i in index], pa.list_(pa.list_(pa.int16(), 3))),
        "flag": pa.array(index % 3 == 0),
    })


def mixed_table(rows, start=0):
    """Columns read sample by sample: ragged token ids and text beside a label."""
    index = np.arange(start, start + rows)
    return pa.table({
        "label": pa.array(index, pa.int64()),
        "ids": pa.array([list(range(i % 5 + 1)) for i in index], pa.list_(pa.int32())),
        "text": pa.array([f"row {i}" for i in index]),
    })


def reference_row(table, i):
    """Row ``i`` as pyarrow gives it (Python values)."""
    return {name: table.column(name)[i].as_py() for name in table.column_names}


def assert_row_is(ours, reference):
    assert list(ours) == list(reference)
    for name, value in reference.items():
        if isinstance(ours[name], np.ndarray) or isinstance(ours[name], np.generic):
            np.testing.assert_array_equal(ours[name], np.asarray(value), err_msg=name)
        else:
            assert ours[name] == value, name


def labels_seen(dataset, ranks, workers, batch_size=3):
    """Every rank's labels over one epoch of a DistributedSampler (no shuffle padding)."""
    seen = []
    for rank in range(ranks):
        sampler = fl.DistributedSampler(dataset, num_replicas=ranks, rank=rank, seed=1)
        loader = fl.DataLoader(dataset, batch_size=batch_size, sampler=sampler,
                               num_workers=workers, timeout=60 if workers else 0)
        seen.extend(int(x) for batch in loader for x in batch["label"])
    return seen
