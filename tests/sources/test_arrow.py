"""``ArrowDataset``: IPC files, streams and tables read as pyarrow reads them."""

import pickle

import numpy as np
import pytest
from required import deferred, require

pa = deferred("pyarrow")

import fastload as fl  # noqa: E402
from fastload.sources import ArrowDataset  # noqa: E402
from arrow_tables import (assert_row_is, labels_seen, mixed_table, numeric_table,  # noqa: E402
                              reference_row)

pytestmark = pytest.mark.imports_heavy_library


def _write(path, table, stream=False, batch_rows=7):
    with pa.OSFile(str(path), "wb") as sink:
        opener = pa.ipc.new_stream if stream else pa.ipc.new_file
        with opener(sink, table.schema) as writer:
            for batch in table.to_batches(max_chunksize=batch_rows):
                writer.write_batch(batch)
    return str(path)


@pytest.fixture
def numeric_files(tmp_path):
    tables = [numeric_table(30), numeric_table(24, start=30)]
    paths = [_write(tmp_path / "a.arrow", tables[0]),
             _write(tmp_path / "b.arrows", tables[1], stream=True)]
    return paths, pa.concat_tables(tables)


def test_rows_are_pyarrows_across_files_and_formats(numeric_files):
    paths, table = numeric_files
    dataset = ArrowDataset(paths)
    assert len(dataset) == 54 and dataset.columns == table.column_names
    for i in (0, 6, 7, 29, 30, 53, -1):
        assert_row_is(dataset[i], reference_row(table, i % 54))
    assert isinstance(dataset[3]["label"], np.int64)
    assert dataset[3]["vector"].dtype == np.float32 and dataset[3]["block"].shape == (2, 3)
    with pytest.raises(IndexError, match="index 54 is out of range for a dataset of length 54"):
        dataset[54]
    with pytest.raises(TypeError, match="must be integers"):
        dataset["label"]


@pytest.mark.parametrize("num_workers", [0, 2])
def test_batches_are_the_stacked_rows_gathered_in_place(numeric_files, num_workers):
    paths, table = numeric_files
    dataset = ArrowDataset(paths)
    assert dataset._fastload_batch(np.array([0, 40])) is not None
    order = np.random.default_rng(0).permutation(54)
    loader = fl.DataLoader(dataset, batch_size=8, sampler=order.tolist(), num_workers=num_workers,
                           timeout=60 if num_workers else 0)
    batches = list(loader)
    assert len(batches) == 7
    for start, batch in zip(range(0, 54, 8), batches):
        rows = order[start:start + 8]
        assert list(batch) == ["label", "vector", "block", "flag"]
        np.testing.assert_array_equal(batch["label"], rows)
        np.testing.assert_array_equal(
            batch["vector"], np.stack([table.column("vector")[int(r)].as_py() for r in rows]))
        assert batch["vector"].dtype == np.float32 and batch["block"].dtype == np.int16
        np.testing.assert_array_equal(
            batch["block"], np.stack([table.column("block")[int(r)].as_py() for r in rows]))
        np.testing.assert_array_equal(batch["flag"], rows % 3 == 0)


def test_a_table_columns_and_ragged_rows_go_sample_by_sample():
    table = mixed_table(20)
    dataset = ArrowDataset(table, columns=["text", "ids"])
    assert dataset.columns == ["text", "ids"]
    assert dataset._fastload_batch(np.array([0, 1])) is None
    assert_row_is(dataset[7], {"text": "row 7", "ids": [0, 1, 2]})
    batch = next(iter(fl.DataLoader(dataset, batch_size=4, collate_fn=fl.collate.pad_collate())))
    assert batch["text"] == ["row 0", "row 1", "row 2", "row 3"]
    np.testing.assert_array_equal(batch["ids"].lengths, [1, 2, 3, 4])
    with pytest.raises(KeyError, match="column 'nope' is not in the table"):
        ArrowDataset(table, columns=["nope"])


def test_a_hugging_face_cache_file_is_read_as_datasets_reads_it(tmp_path):
    datasets = require("datasets")
    hf = datasets.Dataset.from_dict({"x": list(range(10)), "y": [[i, i] for i in range(10)]}).map(
        lambda b: b, batched=True, cache_file_name=str(tmp_path / "hf.arrow"))
    dataset = ArrowDataset(hf.cache_files[0]["filename"])
    for i in range(10):
        assert_row_is(dataset[i], hf[i])


def test_it_pickles_as_its_paths_and_maps_them_again(numeric_files):
    paths, table = numeric_files
    dataset = ArrowDataset(paths, columns=["label"])
    state = pickle.dumps(dataset)
    assert len(state) < 1000  # not the data
    again = pickle.loads(state)
    assert again.columns == ["label"] and again[40] == {"label": 40}


def test_bad_files_are_named(tmp_path, numeric_files):
    missing = str(tmp_path / "missing.arrow")
    with pytest.raises(FileNotFoundError, match="missing.arrow"):
        ArrowDataset(missing)
    junk = tmp_path / "junk.arrow"
    junk.write_bytes(b"not arrow at all")
    with pytest.raises(ValueError, match="junk.arrow"):
        ArrowDataset(str(junk))
    other = _write(tmp_path / "other.arrow", mixed_table(3))
    with pytest.raises(ValueError, match="other.arrow' has another schema"):
        ArrowDataset([numeric_files[0][0], other])


@pytest.mark.parametrize("ranks", [1, 2, 3, 4])
@pytest.mark.parametrize("workers", [0, 2])
def test_every_row_once_an_epoch_over_ranks_and_workers(numeric_files, ranks, workers):
    # 48 rows: every world size divides it, so DistributedSampler pads none.
    dataset = ArrowDataset(numeric_files[1].slice(0, 48))
    assert sorted(labels_seen(dataset, ranks, workers)) == list(range(48))
