"""``ParquetDataset``: rows by global index across files and row groups, as pyarrow reads them."""

import pickle

import numpy as np
import pytest
from required import deferred

pa = deferred("pyarrow")
pq = deferred("pyarrow.parquet")

import fastload as fl  # noqa: E402
from fastload.sources import ParquetDataset  # noqa: E402
from arrow_tables import (assert_row_is, labels_seen, mixed_table, numeric_table,  # noqa: E402
                          reference_row)

pytestmark = pytest.mark.imports_heavy_library


def _write(tmp_path, tables, group_rows=5):
    paths = []
    for number, table in enumerate(tables):
        path = str(tmp_path / f"part-{number}.parquet")
        pq.write_table(table, path, row_group_size=group_rows)
        paths.append(path)
    return paths


@pytest.fixture
def numeric_files(tmp_path):
    tables = [numeric_table(23), numeric_table(25, start=23)]
    return _write(tmp_path, tables), pa.concat_tables(tables)


def test_rows_are_pyarrows_across_files_and_row_groups(numeric_files):
    paths, table = numeric_files
    dataset = ParquetDataset(paths, cached_row_groups=2)
    assert len(dataset) == 48 and len(dataset.row_group_bounds) == 5 + 5 + 1
    for i in (0, 4, 5, 22, 23, 47, -48, 11, 3):
        assert_row_is(dataset[i], reference_row(table, i % 48))
        assert len(dataset._decoded) <= 2  # the cache stays bounded
    with pytest.raises(IndexError, match="index 48 is out of range"):
        dataset[48]


@pytest.mark.parametrize("num_workers", [0, 2])
def test_batches_of_fixed_width_columns_are_gathered_from_the_decoded_groups(numeric_files,
                                                                            num_workers):
    paths, table = numeric_files
    dataset = ParquetDataset(paths, columns=["vector", "label"])
    assert dataset._fastload_batch(np.array([0, 30])) is not None
    order = np.random.default_rng(1).permutation(48)
    loader = fl.DataLoader(dataset, batch_size=10, sampler=order.tolist(),
                           num_workers=num_workers, timeout=60 if num_workers else 0)
    for start, batch in zip(range(0, 48, 10), loader, strict=True):
        rows = order[start:start + 10]
        assert list(batch) == ["vector", "label"]
        np.testing.assert_array_equal(batch["label"], rows)
        np.testing.assert_array_equal(
            batch["vector"], np.stack([table.column("vector")[int(r)].as_py() for r in rows]))


def test_ragged_and_text_columns_are_made_sample_by_sample(tmp_path):
    table = mixed_table(17)
    dataset = ParquetDataset(_write(tmp_path, [table], group_rows=4))
    assert dataset._fastload_batch(np.array([1, 2])) is None
    for i in range(17):
        assert_row_is(dataset[i], reference_row(table, i))
    batch = next(iter(fl.DataLoader(dataset, batch_size=5, collate_fn=fl.collate.pad_collate())))
    assert batch["text"] == [f"row {i}" for i in range(5)]


def test_it_pickles_without_its_handles_or_decoded_groups(numeric_files):
    dataset = ParquetDataset(numeric_files[0])
    dataset[30]
    again = pickle.loads(pickle.dumps(dataset))
    assert again._decoded == {} and again[30]["label"] == 30


def test_bad_arguments_and_files_are_named(tmp_path, numeric_files):
    with pytest.raises(FileNotFoundError, match="gone.parquet"):
        ParquetDataset(str(tmp_path / "gone.parquet"))
    junk = tmp_path / "junk.parquet"
    junk.write_bytes(b"PAR1 but not really")
    with pytest.raises(ValueError, match="junk.parquet"):
        ParquetDataset(str(junk))
    (tmp_path / "other").mkdir()
    other = _write(tmp_path / "other", [mixed_table(3)])[0]
    with pytest.raises(ValueError, match="has another schema"):
        ParquetDataset([numeric_files[0][0], other])
    with pytest.raises(ValueError, match="cached_row_groups should be a positive integer"):
        ParquetDataset(numeric_files[0], cached_row_groups=0)
    with pytest.raises(KeyError, match="column 'x'"):
        ParquetDataset(numeric_files[0], columns=["x"])


@pytest.mark.parametrize("ranks", [1, 2, 3, 4])
@pytest.mark.parametrize("workers", [0, 2])
def test_every_row_once_an_epoch_over_ranks_and_workers(numeric_files, ranks, workers):
    assert sorted(labels_seen(ParquetDataset(numeric_files[0]), ranks, workers)) == list(range(48))
