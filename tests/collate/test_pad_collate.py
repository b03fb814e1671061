"""``pad_collate``: variable-length arrays padded to the batch's longest, compared with a
padding written plainly here; the same batches with and without workers (written in
place into the ring), batches held across slot growth intact, errors naming the path."""

from __future__ import annotations

import collections
import pickle

import numpy as np
import pytest

import fastload as fl
from fastload import DataLoader
from fastload.collate import Padded, default_collate, pad_collate

pytestmark = pytest.mark.timeout(120)


def reference_pad(arrays, padding_value=0, multiple=None):
    """Padding written plainly: values, lengths, mask, one sample and one row at a time."""
    longest = max((len(a) for a in arrays), default=0)
    if multiple:
        while longest % multiple:
            longest += 1
    first = arrays[0]
    values = np.empty((len(arrays), longest) + first.shape[1:], dtype=first.dtype)
    mask = np.zeros((len(arrays), longest), dtype=bool)
    lengths = np.zeros(len(arrays), dtype=np.int64)
    for i, array in enumerate(arrays):
        lengths[i] = len(array)
        for row in range(longest):
            if row < len(array):
                values[i, row] = array[row]
                mask[i, row] = True
            else:
                values[i, row] = padding_value
    return values, lengths, mask


def assert_padded(got, arrays, padding_value=0, multiple=None, lengths=True, mask=False):
    values, want_lengths, want_mask = reference_pad(arrays, padding_value, multiple)
    if not (lengths or mask):
        assert isinstance(got, np.ndarray)
        got_values = got
    else:
        assert type(got) is Padded
        got_values = got.values
        if lengths:
            assert got.lengths.dtype == np.int64
            np.testing.assert_array_equal(got.lengths, want_lengths)
        else:
            assert got.lengths is None
        if mask:
            assert got.mask.dtype == np.bool_
            np.testing.assert_array_equal(got.mask, want_mask)
        else:
            assert got.mask is None
    assert got_values.dtype == values.dtype and got_values.shape == values.shape
    np.testing.assert_array_equal(got_values, values)


def ragged(rng, count, dtype=np.int32, trailing=(), low=0, high=20):
    return [rng.integers(-50, 50, size=(int(n),) + trailing).astype(dtype)
            for n in rng.integers(low, high, size=count)]


# -- values ----------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [np.int8, np.uint16, np.int32, np.int64, np.float16,
                                   np.float32, np.float64, np.complex64, np.bool_])
@pytest.mark.parametrize("trailing", [(), (3,), (2, 5)])
def test_arrays_of_any_dtype_are_padded_as_the_reference(dtype, trailing):
    rng = np.random.default_rng(0)
    arrays = ragged(rng, 9, dtype, trailing, low=1)
    assert_padded(pad_collate(return_mask=True)(arrays), arrays, mask=True)


@pytest.mark.parametrize("padding_value, dtype", [(-1, np.int64), (7, np.uint8), (2.5, np.float32),
                                                  (np.nan, np.float64), (True, np.bool_),
                                                  (-3, np.int16)])
@pytest.mark.parametrize("multiple", [None, 1, 8])
def test_padding_value_and_multiple(padding_value, dtype, multiple):
    rng = np.random.default_rng(1)
    arrays = [a.astype(dtype) for a in ragged(rng, 6, np.int64, (2,), low=0, high=11)]
    collate = pad_collate(padding_value=padding_value, pad_to_multiple_of=multiple)
    got = collate(arrays)
    if multiple:
        assert got.values.shape[1] % multiple == 0
    assert_padded(got, arrays, padding_value, multiple)


@pytest.mark.parametrize("lengths, mask", [(True, False), (False, True), (True, True),
                                           (False, False)])
def test_what_a_padded_leaf_becomes(lengths, mask):
    rng = np.random.default_rng(2)
    arrays = ragged(rng, 5)
    got = pad_collate(return_lengths=lengths, return_mask=mask)(arrays)
    assert_padded(got, arrays, lengths=lengths, mask=mask)


Pair = collections.namedtuple("Pair", "tokens frames")


def nested_samples(rng, count):
    return [{"text": (rng.integers(0, 9, size=int(rng.integers(1, 12))).astype(np.int32),
                      {"frames": rng.normal(size=(int(rng.integers(0, 7)), 4)).astype(np.float32)}),
             "pair": Pair(np.arange(int(rng.integers(1, 5)), dtype=np.int64),
                          np.ones(int(rng.integers(2, 6)), dtype=np.uint8)),
             "label": int(rng.integers(0, 3)), "weight": float(rng.random()),
             "name": f"s{i}", "scalar": np.float32(i), "fixed": np.array(i)}
            for i in range(count)]


def check_nested(batch, samples, **kwargs):
    column = lambda get: [get(s) for s in samples]  # noqa: E731
    assert set(batch) == {"text", "pair", "label", "weight", "name", "scalar", "fixed"}
    assert isinstance(batch["text"], list) and len(batch["text"]) == 2  # a tuple becomes a list
    assert_padded(batch["text"][0], column(lambda s: s["text"][0]), **kwargs)
    assert_padded(batch["text"][1]["frames"], column(lambda s: s["text"][1]["frames"]), **kwargs)
    assert type(batch["pair"]) is Pair
    assert_padded(batch["pair"].tokens, column(lambda s: s["pair"].tokens), **kwargs)
    assert_padded(batch["pair"].frames, column(lambda s: s["pair"].frames), **kwargs)
    # Leaves that are not padded are default_collate's.
    plain = default_collate([{k: s[k] for k in ("label", "weight", "name", "scalar", "fixed")}
                             for s in samples])
    for key, value in plain.items():
        if isinstance(value, np.ndarray):
            assert batch[key].dtype == value.dtype
            np.testing.assert_array_equal(batch[key], value)
        else:
            assert batch[key] == value


def test_nested_dicts_tuples_and_namedtuples():
    rng = np.random.default_rng(3)
    samples = nested_samples(rng, 7)
    check_nested(pad_collate(return_mask=True)(samples), samples, mask=True)
    check_nested(pad_collate(return_lengths=False)(samples), samples, lengths=False)


def test_a_tuple_sample_and_strided_arrays():
    base = np.arange(60, dtype=np.int64).reshape(20, 3)
    samples = [(base[:7:2], 0), (base[::-3], 1), (base[5:6, ::-1], 2)]
    batch = pad_collate()(samples)
    assert isinstance(batch, list)
    assert_padded(batch[0], [s[0] for s in samples])
    np.testing.assert_array_equal(batch[1], [0, 1, 2])


def test_every_array_empty_pads_to_zero_length():
    batch = pad_collate(return_mask=True)([np.zeros(0, np.float32), np.zeros(0, np.float32)])
    assert batch.values.shape == (2, 0) and batch.mask.shape == (2, 0)
    np.testing.assert_array_equal(batch.lengths, [0, 0])


def test_it_pickles_and_says_what_it_is():
    collate = pad_collate(padding_value=-1, pad_to_multiple_of=4, return_mask=True)
    again = pickle.loads(pickle.dumps(collate))
    arrays = ragged(np.random.default_rng(4), 4, low=1)
    assert_padded(again(arrays), arrays, -1, 4, mask=True)
    assert repr(collate) == ("pad_collate(padding_value=-1, pad_to_multiple_of=4, "
                             "return_lengths=True, return_mask=True)")


# -- errors ----------------------------------------------------------------------

@pytest.mark.parametrize("samples, error, match", [
    ([{"ids": np.zeros(3, np.int32)}, {"ids": np.zeros(2, np.int64)}], TypeError,
     r"batch\[1\]\['ids'\] has dtype int64, but batch\[0\]\['ids'\] has int32"),
    ([{"ids": np.zeros((3, 2))}, {"ids": np.zeros((3, 2))}, {"ids": np.zeros((4, 3))}],
     RuntimeError, r"batch\[2\]\['ids'\] has shape \(4, 3\), but batch\[0\]\['ids'\] has "
                   r"\(3, 2\): only the first dimension may differ"),
    ([(np.zeros(3), 1), ([1.0, 2.0], 2)], TypeError, r"batch\[1\]\[0\] is list"),
    ([(np.zeros(3), 1), (np.float64(2.0), 2)], TypeError, r"batch\[1\]\[0\] is float64"),
    ([{"ids": np.zeros(3)}, {"other": np.zeros(3)}], KeyError, "ids"),
])
def test_errors_name_the_batch_path(samples, error, match):
    with pytest.raises(error, match=match):
        pad_collate()(samples)


def test_a_padding_value_the_dtype_cannot_hold_is_refused_naming_the_leaf():
    with pytest.raises(ValueError, match=r"padding_value=-1 cannot be stored exactly in "
                                         r"batch\['ids'\]'s dtype uint8"):
        pad_collate(padding_value=-1)([{"ids": np.zeros(2, np.uint8)}])
    with pytest.raises(ValueError, match="padding_value=0.5"):
        pad_collate(padding_value=0.5)([np.zeros(2, np.int32)])


@pytest.mark.parametrize("kwargs, error, match", [
    (dict(pad_to_multiple_of=0), ValueError, "pad_to_multiple_of should be a positive integer"),
    (dict(pad_to_multiple_of=2.0), ValueError, "pad_to_multiple_of"),
    (dict(padding_value="x"), TypeError, "padding_value should be a number"),
    (dict(return_lengths=1), ValueError, "return_lengths should be a boolean"),
    (dict(return_mask=None), ValueError, "return_mask should be a boolean"),
])
def test_bad_arguments_are_refused(kwargs, error, match):
    with pytest.raises(error, match=match):
        pad_collate(**kwargs)


# -- in the loader -----------------------------------------------------------------

class RaggedDataset(fl.Dataset):
    """Sample ``i``: ``{'ids': int32 of lengths[i] entries (i, i+1, ...), 'feats': float32
    (lengths[i] // 2, 3), 'index': i, 'name': str}``."""

    def __init__(self, lengths):
        self.lengths = list(lengths)

    def __len__(self):
        return len(self.lengths)

    def __getitem__(self, i):
        n = self.lengths[i]
        return {"ids": np.arange(i, i + n, dtype=np.int32),
                "feats": np.full((n // 2, 3), i, dtype=np.float32),
                "index": i, "name": f"sample-{i}"}

    def reference(self, indices, **kwargs):
        samples = [self[i] for i in indices]
        return {"ids": reference_pad([s["ids"] for s in samples], **kwargs),
                "feats": reference_pad([s["feats"] for s in samples], **kwargs)}


def check_batch(batch, dataset, **kwargs):
    indices = batch["index"].tolist()
    assert batch["name"] == [f"sample-{i}" for i in indices]
    reference = dataset.reference(indices, **kwargs)
    for key in ("ids", "feats"):
        values, lengths, mask = reference[key]
        np.testing.assert_array_equal(batch[key].values, values)
        np.testing.assert_array_equal(batch[key].lengths, lengths)
        np.testing.assert_array_equal(batch[key].mask, mask)


@pytest.mark.parametrize("persistent", [False, True])
def test_workers_give_the_batches_of_the_main_process(persistent):
    rng = np.random.default_rng(5)
    dataset = RaggedDataset(rng.integers(0, 300, size=400).tolist())
    collate = pad_collate(padding_value=-2, pad_to_multiple_of=8, return_mask=True)
    runs = []
    for workers in (0, 2):
        loader = DataLoader(dataset, batch_size=16, shuffle=True, generator=9, collate_fn=collate,
                            num_workers=workers, persistent_workers=persistent and workers > 0)
        runs.append([list(loader) for _ in range(2)])
    for epoch_0, epoch_2 in zip(*runs):
        for a, b in zip(epoch_0, epoch_2):
            check_batch(b, dataset, padding_value=-2, multiple=8)
            assert a["index"].tolist() == b["index"].tolist()
            for key in ("ids", "feats"):
                for part in ("values", "lengths", "mask"):
                    np.testing.assert_array_equal(getattr(a[key], part), getattr(b[key], part))


@pytest.mark.parametrize("workers", [0, 2])
def test_batches_held_across_slot_growth_stay_intact(workers):
    # Lengths grow batch after batch, so every slot must grow again and again
    # while the caller holds all the batches made in the smaller slots.
    lengths = [10 * i * i for i in range(64)]
    dataset = RaggedDataset(lengths)
    loader = DataLoader(dataset, batch_size=4, collate_fn=pad_collate(return_mask=True),
                        num_workers=workers)
    held = list(loader)
    assert [b["ids"].values.shape[1] for b in held] == [lengths[4 * k + 3] for k in range(16)]
    for batch in held:
        check_batch(batch, dataset)


def test_with_workers_the_batch_is_written_into_the_ring():
    dataset = RaggedDataset([5, 9, 2, 7] * 8)
    loader = DataLoader(dataset, batch_size=4, collate_fn=pad_collate(), num_workers=2)
    batch = next(iter(loader))
    # A view of the slot: its base chain ends at the ring's lease, not a private array.
    base = batch["ids"].values
    while isinstance(base, np.ndarray) and base.base is not None:
        base = base.base
    assert type(base).__name__ == "SlotLease"


def test_a_worker_error_names_the_batch_path():
    class Mixed(RaggedDataset):
        def __getitem__(self, i):
            sample = super().__getitem__(i)
            if i == 6:
                sample["ids"] = sample["ids"].astype(np.int64)
            return sample

    loader = DataLoader(Mixed([3] * 8), batch_size=4, collate_fn=pad_collate(), num_workers=2)
    with pytest.raises(TypeError, match=r"batch\[2\]\['ids'\] has dtype int64"):
        list(loader)


def test_output_torch_gives_tensors_sharing_the_batch(torch):
    dataset = RaggedDataset([3, 8, 1, 4])
    loader = DataLoader(dataset, batch_size=4, collate_fn=pad_collate(return_mask=True),
                        num_workers=2, output="torch")
    batch = next(iter(loader))
    assert isinstance(batch["ids"], Padded)
    assert isinstance(batch["ids"].values, torch.Tensor) and batch["ids"].values.shape == (4, 8)
    assert batch["ids"].mask.dtype == torch.bool
    np.testing.assert_array_equal(batch["ids"].values.numpy(),
                                  dataset.reference(range(4))["ids"][0])


class TensorSequences(fl.Dataset):
    """torch-style samples: ``(int64 tensor of lengths[i] entries, float tensor
    (lengths[i], 2), i)``."""

    def __init__(self, lengths):
        self.lengths = list(lengths)

    def __len__(self):
        return len(self.lengths)

    def __getitem__(self, i):
        import torch

        n = self.lengths[i]
        return torch.arange(i, i + n), torch.full((n, 2), float(i)), i


@pytest.mark.parametrize("workers", [0, 2])
def test_tensor_samples_are_padded_into_a_batch_of_tensors(torch, workers):
    dataset = TensorSequences([4, 0, 9, 2, 5, 5, 1, 3])
    loader = DataLoader(dataset, batch_size=4, num_workers=workers,
                        collate_fn=pad_collate(padding_value=-1, return_mask=True))
    for batch in loader:
        ids, frames, index = batch
        assert isinstance(index, torch.Tensor)
        samples = [dataset[i] for i in index.tolist()]
        for got, k in ((ids, 0), (frames, 1)):
            assert isinstance(got.values, torch.Tensor) and isinstance(got.mask, torch.Tensor)
            assert got.values.dtype == samples[0][k].dtype
            values, lengths, mask = reference_pad([s[k].numpy() for s in samples], -1)
            np.testing.assert_array_equal(got.values.numpy(), values)
            np.testing.assert_array_equal(got.lengths.numpy(), lengths)
            np.testing.assert_array_equal(got.mask.numpy(), mask)


def test_tensors_numpy_has_no_dtype_for_are_refused(torch):
    with pytest.raises(TypeError, match=r"batch\[0\]\[0\] is a torch.bfloat16 tensor"):
        pad_collate()([(torch.zeros(3, dtype=torch.bfloat16),)])
    with pytest.raises(TypeError,
                       match=r"batch\[1\]\[0\] is ndarray, but batch\[0\]\[0\] is a tensor"):
        pad_collate()([(torch.zeros(3),), (np.zeros(3),)])


@pytest.mark.parametrize("context", ["spawn", "forkserver"])
def test_the_collate_function_travels_to_spawned_workers(context):
    dataset = RaggedDataset([6, 2, 9, 4, 1, 7])
    loader = DataLoader(dataset, batch_size=3, num_workers=2, multiprocessing_context=context,
                        collate_fn=pad_collate(padding_value=-5, return_mask=True))
    for batch in loader:
        check_batch(batch, dataset, padding_value=-5)
