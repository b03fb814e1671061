"""A Hugging Face ``datasets.Dataset`` through fl.DataLoader: torch's batches, any format.

Each test runs torch's DataLoader and fastload's over the same object (in
the order fastload shuffled, where it shuffles) and compares the
batches; the gathered path (numpy/torch formats) is also checked to be taken.
"""

import numpy as np
import pytest
from batch_compare import assert_same_as_torch

import fastload as fl
from fastload._loading.fetch import whole_batch_rows

datasets = pytest.importorskip("datasets")

ROWS = 203


def _table():
    rng = np.random.default_rng(0)
    return {
        "label": np.arange(ROWS, dtype=np.int64) % 11,
        "small": (np.arange(ROWS) % 200).astype(np.uint8),
        "features": rng.standard_normal((ROWS, 6)).astype(np.float32),
        "wide": rng.standard_normal((ROWS, 2, 3)),  # float64, two levels of lists
        "flag": np.arange(ROWS) % 3 == 0,
    }


@pytest.fixture(scope="module")
def hf_dataset():
    return datasets.Dataset.from_dict(_table())


@pytest.fixture(scope="module")
def mapped_dataset(tmp_path_factory):
    """Memory-mapped from an Arrow cache file of many record batches (chunks)."""
    path = tmp_path_factory.mktemp("hf") / "mapped.arrow"
    return datasets.Dataset.from_dict(_table()).map(
        lambda batch: batch, batched=True, batch_size=17, writer_batch_size=17,
        cache_file_name=str(path))


def _compare(torch, dataset, tensors=False, seed=None, **kwargs):
    """Every batch of both loaders over ``dataset``, compared; returns the count.

    With ``seed``, fastload shuffles with a ``torch.Generator`` of that seed;
    its RandomSampler's order is fastload's own, so torch is given that order
    as its sampler.
    """
    if seed is None:
        ours = fl.DataLoader(dataset, **kwargs)
        theirs = torch.utils.data.DataLoader(dataset, **kwargs)
    else:
        ours = fl.DataLoader(dataset, shuffle=True, generator=torch.Generator().manual_seed(seed),
                             **kwargs)
        # The same loader over range(n) makes the same draws: its batches are the order.
        order = [int(i) for i in fl.DataLoader(range(len(dataset)), batch_size=None, shuffle=True,
                                               generator=torch.Generator().manual_seed(seed))]
        assert sorted(order) == list(range(len(dataset))) and order != sorted(order)
        theirs = torch.utils.data.DataLoader(dataset, sampler=order, **kwargs)
    ours, theirs = list(ours), list(theirs)
    assert len(ours) == len(theirs)
    for i, (a, b) in enumerate(zip(ours, theirs)):
        assert_same_as_torch(a, b, f"batch[{i}]", tensors=tensors)
    return len(ours)


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("fmt", ["numpy", "torch"])
def test_formatted_batches_are_torchs_and_gathered(torch, hf_dataset, fmt, num_workers):
    dataset = hf_dataset.with_format(fmt)
    assert whole_batch_rows(dataset) is not None  # gathered, not sample by sample
    assert _compare(torch, dataset, tensors=fmt == "torch", batch_size=16, seed=5,
                    num_workers=num_workers, timeout=60 if num_workers else 0) == 13


def test_memory_mapped_chunks_are_gathered_as_one_table(torch, mapped_dataset):
    assert len(mapped_dataset.data.table.column("label").chunks) > 10
    dataset = mapped_dataset.with_format("numpy")
    assert whole_batch_rows(dataset) is not None
    _compare(torch, dataset, batch_size=32, seed=1)
    _compare(torch, dataset, batch_size=32, num_workers=2, timeout=60)


@pytest.mark.parametrize("arrange", [
    lambda d: d.shuffle(seed=3),
    lambda d: d.select(range(150, 10, -3)),
    lambda d: d.filter(lambda row: row["label"] % 4 != 1),
    lambda d: d.shuffle(seed=3).select(range(40)),
], ids=["shuffle", "select", "filter", "shuffle-select"])
@pytest.mark.parametrize("num_workers", [0, 2])
def test_an_indices_mapping_is_followed(torch, hf_dataset, arrange, num_workers):
    dataset = arrange(hf_dataset).with_format("numpy")
    assert dataset._indices is not None
    assert whole_batch_rows(dataset) is not None
    _compare(torch, dataset, batch_size=8, seed=9, num_workers=num_workers,
             timeout=60 if num_workers else 0)


@pytest.mark.parametrize("columns", [["features", "label"], ["wide"]])
def test_format_columns_give_torchs_keys_in_torchs_order(torch, hf_dataset, columns):
    dataset = hf_dataset.with_format("numpy", columns=columns)
    assert whole_batch_rows(dataset) is not None
    _compare(torch, dataset, batch_size=10)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_an_unformatted_dataset_gives_torchs_transposed_lists(torch, hf_dataset, num_workers):
    dataset = hf_dataset.select(range(40))
    assert whole_batch_rows(dataset) is None  # Python objects: sample by sample
    _compare(torch, dataset, batch_size=7, seed=2, num_workers=num_workers,
             timeout=60 if num_workers else 0)


def test_output_all_columns_leaves_the_rest_unformatted_as_torch_sees_them(torch, hf_dataset):
    dataset = hf_dataset.select(range(30)).with_format("numpy", columns=["label"],
                                                       output_all_columns=True)
    assert whole_batch_rows(dataset) is None
    _compare(torch, dataset, batch_size=6)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_transform_is_applied_sample_batch_by_batch(torch, hf_dataset, num_workers):
    def double(batch):
        return {"twice": [2 * np.asarray(v, dtype=np.float32) for v in batch["features"]],
                "label": batch["label"]}

    dataset = hf_dataset.with_transform(double)
    assert whole_batch_rows(dataset) is None
    _compare(torch, dataset, batch_size=9, num_workers=num_workers,
             timeout=60 if num_workers else 0)


def test_output_torch_gives_the_gathered_columns_as_tensors(torch, hf_dataset):
    dataset = hf_dataset.with_format("numpy")
    ours = next(iter(fl.DataLoader(dataset, batch_size=5, output="torch")))
    theirs = next(iter(torch.utils.data.DataLoader(dataset, batch_size=5)))
    assert_same_as_torch(ours, theirs, tensors=True)


def test_ragged_token_ids_pad_through_pad_collate():
    ids = [list(range(1, 1 + (i * 7) % 13)) for i in range(50)]
    dataset = datasets.Dataset.from_dict({"ids": ids, "label": list(range(50))}
                                         ).with_format("numpy")
    assert whole_batch_rows(dataset) is None  # ragged: sample by sample
    loader = fl.DataLoader(dataset, batch_size=8, collate_fn=fl.collate.pad_collate(-1))
    seen = 0
    for batch in loader:
        labels = batch["label"]
        padded = batch["ids"]
        for row, label in enumerate(labels):
            want = np.asarray(ids[label], dtype=np.int64)
            assert padded.lengths[row] == len(want)
            np.testing.assert_array_equal(padded.values[row, :len(want)], want)
            assert (padded.values[row, len(want):] == -1).all()
            seen += 1
    assert seen == 50


def test_a_subset_of_a_dataset_is_gathered_through_both_maps(torch, hf_dataset):
    dataset = fl.Subset(hf_dataset.shuffle(seed=4).with_format("numpy"), list(range(100, 0, -2)))
    assert whole_batch_rows(dataset) is not None
    ours = list(fl.DataLoader(dataset, batch_size=12))
    theirs = list(torch.utils.data.DataLoader(torch.utils.data.Subset(dataset.dataset,
                                                                      dataset.indices),
                                              batch_size=12))
    for a, b in zip(ours, theirs, strict=True):
        assert_same_as_torch(a, b)


def test_a_row_out_of_range_raises_the_datasets_own_error(hf_dataset):
    dataset = hf_dataset.with_format("numpy")
    with pytest.raises(IndexError):
        next(iter(fl.DataLoader(dataset, batch_size=2, sampler=[0, ROWS])))
