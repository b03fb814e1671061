"""A Hugging Face ``datasets.Dataset`` through fl.DataLoader: torch's batches, any format.

Each test runs torch's DataLoader and fastload's over the same object (in
the order fastload shuffled, where it shuffles) and compares the
batches; the gathered path (numpy/torch formats) is also checked to be taken.
"""

import numpy as np
import pytest
from batch_compare import assert_same, assert_same_as_torch

import fastload as fl
from fastload._loading.fetch import whole_batch_rows
from required import deferred

datasets = deferred("datasets")

pytestmark = pytest.mark.imports_heavy_library

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


def _ragged(tmp_path=None):
    ids = [np.arange(1, 1 + (i * 7) % 13, dtype=np.int64) * (i + 1) for i in range(50)]
    features = np.arange(50 * 3, dtype=np.float64).reshape(50, 3)
    dataset = datasets.Dataset.from_dict({"ids": ids, "label": np.arange(50), "features": features,
                                          "small_ids": ids})
    # int32 token ids, as a tokenizer's features store them: the formatter makes them int64.
    dataset = dataset.cast_column("small_ids", datasets.List(datasets.Value("int32")))
    if tmp_path is not None:  # memory-mapped, many chunks
        dataset = dataset.map(lambda b: b, batched=True, batch_size=7, writer_batch_size=7,
                              cache_file_name=str(tmp_path / "ragged.arrow"))
    return dataset


@pytest.mark.parametrize("options", [
    {}, {"padding_value": -1, "return_mask": True}, {"pad_to_multiple_of": 8},
    {"return_lengths": False}, {"return_lengths": False, "return_mask": True, "padding_value": 3},
], ids=["default", "mask", "multiple", "values-only", "mask-only"])
@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("mapped", [False, True])
def test_ragged_token_ids_are_padded_from_the_arrow_buffers_as_pad_collate_pads_samples(
        tmp_path, options, num_workers, mapped):
    dataset = _ragged(tmp_path if mapped else None).shuffle(seed=1).with_format("numpy")
    pad = fl.collate.pad_collate(**options)
    from fastload._loading.fetch import _padded_gathering, _under_subsets
    assert _padded_gathering(_under_subsets(dataset)) is not None
    order = np.random.default_rng(2).permutation(50).tolist()
    loader = fl.DataLoader(dataset, batch_size=8, sampler=order, collate_fn=pad,
                           num_workers=num_workers, timeout=60 if num_workers else 0)
    batches = list(loader)
    assert len(batches) == 7
    for start, batch in zip(range(0, 50, 8), batches):
        # The reference: pad_collate over the samples torch's loader would fetch.
        assert_same(batch, pad(dataset.__getitems__(order[start:start + 8])))


def test_a_torch_formatted_ragged_dataset_pads_sample_by_sample(torch):
    dataset = _ragged().with_format("torch")
    pad = fl.collate.pad_collate()
    batch = next(iter(fl.DataLoader(dataset, batch_size=6, collate_fn=pad)))
    expected = pad(dataset.__getitems__(list(range(6))))
    assert_same_as_torch(batch["label"], expected["label"], tensors=True)
    assert_same_as_torch(batch["ids"].values, expected["ids"].values, tensors=True)


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


def test_spawned_workers_map_the_arrow_files_again_and_gather(torch, mapped_dataset):
    dataset = mapped_dataset.with_format("numpy")
    ours = list(fl.DataLoader(dataset, batch_size=50, num_workers=2, timeout=60,
                              multiprocessing_context="spawn"))
    theirs = list(torch.utils.data.DataLoader(dataset, batch_size=50))
    for a, b in zip(ours, theirs, strict=True):
        assert_same_as_torch(a, b)
