"""fastload.dataset: the Dataset family, mostly checked against torch.utils.data.

Differential tests build the same data for both libraries through the ``Lib``
adapters below and compare items, lengths and errors; the rest pin down what
torch cannot be compared on (memmaps, seeding).
"""

import copy
import json
import pickle
import warnings

import numpy as np
import pytest

import fastload.dataset as fd
from fastload import DataLoader
from fastload.dataset import (
    ArrayDataset,
    ChainDataset,
    ConcatDataset,
    Dataset,
    IterableDataset,
    SizeMismatchError,
    Subset,
    random_split,
)

# --------------------------------------------------------------------------
# helpers


class _FastloadLib:
    """fastload's side of a differential test."""

    name = "fastload"
    Dataset = fd.Dataset
    ConcatDataset = fd.ConcatDataset
    ChainDataset = fd.ChainDataset
    Subset = fd.Subset
    StackDataset = fd.StackDataset

    @staticmethod
    def array_dataset(*arrays):
        return fd.ArrayDataset(*arrays)

    @staticmethod
    def iterable(items):
        class Stream(fd.IterableDataset):
            def __iter__(self):
                return iter(items)

            def __len__(self):
                return len(items)

        return Stream()

    @staticmethod
    def random_split(dataset, lengths):
        return fd.random_split(dataset, lengths, generator=0)


class _TorchLib:
    """torch's side: the same names over torch.utils.data."""

    name = "torch"

    def __init__(self, torch):
        data = torch.utils.data
        self.torch = torch
        self.Dataset = data.Dataset
        self.ConcatDataset = data.ConcatDataset
        self.ChainDataset = data.ChainDataset
        self.Subset = data.Subset
        self.StackDataset = data.StackDataset
        self._data = data

    def array_dataset(self, *arrays):
        return self._data.TensorDataset(*(self.torch.as_tensor(np.asarray(a)) for a in arrays))

    def iterable(self, items):
        class Stream(self._data.IterableDataset):
            def __iter__(self):
                return iter(items)

            def __len__(self):
                return len(items)

        return Stream()

    def random_split(self, dataset, lengths):
        return self._data.random_split(dataset, lengths, generator=self.torch.Generator().manual_seed(0))


def _plain(value):
    """A sample with torch tensors turned into numpy, for np.testing."""
    if hasattr(value, "numpy") and not isinstance(value, (np.ndarray, np.generic)):
        return value.numpy()
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (tuple, list)):
        return type(value)(_plain(v) for v in value)
    return value


def _assert_same(ours, theirs):
    ours, theirs = _plain(ours), _plain(theirs)
    if isinstance(theirs, dict):
        assert isinstance(ours, dict) and list(ours) == list(theirs)
        for key in theirs:
            _assert_same(ours[key], theirs[key])
    elif isinstance(theirs, (tuple, list)):
        assert type(ours) is type(theirs) and len(ours) == len(theirs)
        for a, b in zip(ours, theirs):
            _assert_same(a, b)
    else:
        np.testing.assert_array_equal(np.asarray(ours), np.asarray(theirs))


def _raised(make):
    """The exception ``make()`` raises (fails the test if none)."""
    with pytest.raises(BaseException) as info:
        make()
    return info.value


class RecordingDataset(fd.Dataset):
    """Returns its key and remembers the key's exact type."""

    def __init__(self, n):
        self.n = n
        self.key_types = []

    def __getitem__(self, i):
        self.key_types.append(type(i))
        if isinstance(i, list):
            self.key_types.extend(type(k) for k in i)
        return i

    def __len__(self):
        return self.n


class BatchedRecordingDataset(RecordingDataset):
    def __getitems__(self, indices):
        self.key_types.append(type(indices))
        self.key_types.extend(type(k) for k in indices)
        return [("batched", i) for i in indices]


# --------------------------------------------------------------------------
# Dataset / IterableDataset


def test_base_getitem_is_not_implemented_like_torch(torch):
    ours = _raised(lambda: Dataset()[0])
    theirs = _raised(lambda: torch.utils.data.Dataset()[0])
    assert type(ours) is type(theirs) is NotImplementedError
    assert str(ours) == str(theirs)


def test_iterable_dataset_without_iter_is_abstract_like_torch(torch):
    ours = _raised(IterableDataset)
    theirs = _raised(torch.utils.data.IterableDataset)
    assert type(ours) is type(theirs) is TypeError
    assert "__iter__" in str(ours)


def test_add_builds_concat_and_chain():
    a, b = ArrayDataset(np.arange(3)), ArrayDataset(np.arange(4))
    both = a + b
    assert type(both) is ConcatDataset and len(both) == 7
    assert type(both + a) is ConcatDataset and len(both + a) == 10
    s, t = _FastloadLib.iterable([1, 2]), _FastloadLib.iterable([3])
    chained = s + t
    assert type(chained) is ChainDataset
    assert list(chained) == [1, 2, 3]
    assert type(chained + s) is ChainDataset and list(chained + s) == [1, 2, 3, 1, 2]


# --------------------------------------------------------------------------
# ArrayDataset


def _array_cases():
    rng = np.random.default_rng(1)
    return {
        "2d-float": (rng.standard_normal((6, 3)).astype(np.float32), np.arange(6)),
        "1d-int": (np.arange(5, dtype=np.int64) * 7,),
        "3d-uint8": (rng.integers(0, 255, (4, 2, 3), dtype=np.uint8), np.linspace(0, 1, 4)),
    }


@pytest.mark.parametrize("case", list(_array_cases()))
def test_array_dataset_items_match_tensor_dataset(torch, case):
    arrays = _array_cases()[case]
    ours, theirs = ArrayDataset(*arrays), _TorchLib(torch).array_dataset(*arrays)
    assert len(ours) == len(theirs)
    for i in range(-len(ours), len(ours)):
        item, expected = ours[i], theirs[i]
        assert isinstance(item, tuple) and len(item) == len(expected)
        for got, want in zip(item, expected):
            assert np.asarray(got).shape == tuple(want.shape)
            assert np.asarray(got).dtype == want.numpy().dtype
            np.testing.assert_array_equal(np.asarray(got), want.numpy())


def test_array_dataset_collates_like_tensor_dataset(torch):
    # A 1-D array gives numpy scalars where torch gives 0-d tensors: both must
    # collate to a 1-D batch of the array's dtype.
    values = np.arange(4, dtype=np.int32)
    ours = [ArrayDataset(values)[i][0] for i in range(4)]
    theirs = [torch.utils.data.TensorDataset(torch.as_tensor(values))[i][0] for i in range(4)]
    assert all(isinstance(v, np.int32) for v in ours)
    collated = torch.utils.data.default_collate(theirs)
    np.testing.assert_array_equal(np.stack(ours), collated.numpy())
    assert np.stack(ours).dtype == collated.numpy().dtype


def test_array_dataset_keeps_arrays_without_copying():
    a, b = np.arange(12.0).reshape(4, 3), np.arange(4)
    ds = ArrayDataset(a, b)
    assert isinstance(ds.arrays, tuple)
    assert ds.arrays[0] is a and ds.arrays[1] is b
    row, label = ds[2]
    assert np.shares_memory(row, a)  # a view, not a copy
    assert row.shape == (3,) and label == 2


def test_array_dataset_converts_lists_and_tensors_once(torch):
    tensor = torch.arange(6.0).reshape(3, 2).requires_grad_(True)
    ds = ArrayDataset(tensor, [10, 20, 30])
    assert all(type(a) is np.ndarray for a in ds.arrays)
    np.testing.assert_array_equal(ds.arrays[0], tensor.detach().numpy())
    assert np.shares_memory(ds.arrays[0], tensor.detach().numpy())
    assert ds[1][1] == 20


def test_array_dataset_of_tensors_gives_tensors_as_tensor_dataset(torch):
    x, y = torch.arange(-12.0, 12.0).reshape(8, 3), torch.arange(8, dtype=torch.int32)
    ours, theirs = ArrayDataset(x, y), torch.utils.data.TensorDataset(x, y)
    for index in [0, 5, -1, slice(1, 4), [2, 0]]:
        for got, want in zip(ours[index], theirs[index]):
            assert type(got) is torch.Tensor
            assert got.dtype == want.dtype and got.shape == want.shape
            assert torch.equal(got, want)
    # torch's test_add_dataset calls .abs() on a sample
    assert torch.equal(ours[0][0].abs(), theirs[0][0].abs())
    assert torch.equal(ours[2][0].abs(), x[2].abs())


@pytest.mark.parametrize("output", ["numpy", "torch"])
@pytest.mark.parametrize("loader_args", [dict(batch_size=3), dict(batch_size=None),
                                         dict(batch_size=3, num_workers=2)])
def test_a_loader_over_tensors_gives_what_output_says(torch, output, loader_args):
    x, y = torch.arange(30.0).reshape(10, 3), torch.arange(10)
    ours = ArrayDataset(x, y)
    expected = list(torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y),
                                                **loader_args))
    for dataset in (ours, fd.Subset(ours, list(range(10)))):
        batches = list(DataLoader(dataset, output=output, **loader_args))
        assert len(batches) == len(expected)
        for batch, want in zip(batches, expected):
            assert type(batch) is list and len(batch) == 2
            for got, column in zip(batch, want):
                assert type(got) is (torch.Tensor if output == "torch" else np.ndarray)
                assert str(got.dtype).split(".")[-1] == str(column.dtype).split(".")[-1]
                np.testing.assert_array_equal(np.asarray(got), column.numpy())


def test_memmap_stays_memmap(tmp_path):
    path = tmp_path / "x.dat"
    data = np.memmap(path, dtype=np.float32, mode="w+", shape=(5, 2))
    data[:] = np.arange(10).reshape(5, 2)
    ds = ArrayDataset(data)
    assert isinstance(ds.arrays[0], np.memmap)
    assert ds.arrays[0] is data
    np.testing.assert_array_equal(ds[3][0], [6, 7])


def test_pickling_a_memmap_dataset_copies_as_torchs_does(tmp_path):
    # Only workers' payloads map the file again (test_worker_payload); a
    # copy made by pickling or deepcopy is independent, even of an "r+" map.
    array = np.memmap(tmp_path / "x.dat", dtype=np.float64, mode="w+", shape=(3,))
    array[:] = [1, 2, 3]
    for clone in (pickle.loads(pickle.dumps(ArrayDataset(array))), copy.deepcopy(ArrayDataset(array))):
        clone.arrays[0][:] = 0
        np.testing.assert_array_equal(array, [1, 2, 3])
    array.flush()
    np.testing.assert_array_equal(np.fromfile(tmp_path / "x.dat"), [1, 2, 3])


def test_in_memory_arrays_pickle_by_value():
    ds = ArrayDataset(np.arange(6).reshape(3, 2), np.array([1.5, 2.5, 3.5]))
    clone = pickle.loads(pickle.dumps(ds))
    for a, b in zip(clone.arrays, ds.arrays):
        np.testing.assert_array_equal(a, b)
    assert len(clone) == 3


@pytest.mark.parametrize("index", [5, 6, 100, -6, -100])
def test_array_dataset_index_out_of_range(torch, index):
    values = np.arange(5)
    ours = _raised(lambda: ArrayDataset(values)[index])
    theirs = _raised(lambda: _TorchLib(torch).array_dataset(values)[index])
    assert type(ours) is type(theirs) is IndexError
    assert str(index) in str(ours) and "length 5" in str(ours)


def test_array_dataset_size_mismatch(torch):
    a, b = np.zeros((4, 3)), np.zeros(5)
    ours = _raised(lambda: ArrayDataset(a, b))
    theirs = _raised(lambda: _TorchLib(torch).array_dataset(a, b))
    assert type(theirs) is AssertionError
    assert isinstance(ours, SizeMismatchError)
    assert isinstance(ours, AssertionError) and isinstance(ours, ValueError)
    message = str(ours)
    assert "arrays[0] has shape (4, 3)" in message and "arrays[1] has shape (5,)" in message


def test_array_dataset_rejects_0d(torch):
    ours = _raised(lambda: ArrayDataset(np.zeros(3), np.float64(2.0)))
    theirs = _raised(lambda: torch.utils.data.TensorDataset(torch.zeros(3), torch.tensor(2.0)))
    assert isinstance(ours, type(theirs))  # IndexError in torch
    assert isinstance(ours, ValueError)
    assert "arrays[1]" in str(ours)


def test_array_dataset_needs_an_array():
    with pytest.raises(ValueError, match="at least one array"):
        ArrayDataset()


# --------------------------------------------------------------------------
# ConcatDataset


CONCAT_PARTS = [
    [[1, 2, 3]],
    [[1, 2, 3], [4, 5]],
    [[], [1, 2], [], [], [3], []],
    [[10], [20], [30], [40, 50, 60]],
]


@pytest.mark.parametrize("parts", CONCAT_PARTS)
def test_concat_matches_torch(torch, parts):
    ours, theirs = ConcatDataset(parts), torch.utils.data.ConcatDataset(parts)
    assert len(ours) == len(theirs)
    assert ours.cumulative_sizes == theirs.cumulative_sizes
    assert ConcatDataset.cumsum(parts) == torch.utils.data.ConcatDataset.cumsum(parts)
    for i in range(-len(ours), len(ours)):
        assert ours[i] == theirs[i]
    assert ours[np.int64(len(ours) - 1)] == theirs[len(theirs) - 1]


def test_concat_of_array_datasets_matches_torch(torch):
    lib = _TorchLib(torch)
    parts = [np.arange(6).reshape(3, 2), np.arange(100, 104).reshape(2, 2)]
    ours = ArrayDataset(parts[0]) + ArrayDataset(parts[1])
    theirs = lib.array_dataset(parts[0]) + lib.array_dataset(parts[1])
    for i in range(-5, 5):
        _assert_same(ours[i], theirs[i])


@pytest.mark.parametrize("index, word", [(-6, "-6"), (-100, "-100"), (5, "5"), (17, "17")])
def test_concat_index_errors_match_torch(torch, index, word):
    parts = [[1, 2, 3], [4, 5]]
    ours = _raised(lambda: ConcatDataset(parts)[index])
    theirs = _raised(lambda: torch.utils.data.ConcatDataset(parts)[index])
    assert type(ours) is type(theirs)
    if index < 0:
        assert str(ours).startswith(str(theirs))  # torch's wording, then the values
    assert word in str(ours) and "5" in str(ours)


def test_concat_has_deprecated_alias():
    ds = ConcatDataset([[1], [2, 3]])
    with pytest.warns(FutureWarning, match="cumulative_sizes"):
        assert ds.cummulative_sizes == [1, 3]


def test_concat_accepts_any_iterable_of_datasets():
    ds = ConcatDataset(iter([[1, 2], [3]]))
    assert ds.datasets == [[1, 2], [3]] and ds[2] == 3


def test_concat_rejects_torch_iterable_dataset(torch):
    with pytest.raises(AssertionError, match="IterableDataset"):
        ConcatDataset([[1], _TorchLib(torch).iterable([1])])


# --------------------------------------------------------------------------
# ChainDataset


def test_chain_matches_torch(torch):
    streams = [[1, 2], [], [3, 4, 5]]
    libs = [_FastloadLib, _TorchLib(torch)]
    ours, theirs = (lib.ChainDataset([lib.iterable(s) for s in streams]) for lib in libs)
    assert list(ours) == list(theirs) == [1, 2, 3, 4, 5]
    assert len(ours) == len(theirs) == 5
    assert list(ours) == list(theirs)  # iterable again


def test_chain_checks_lazily_like_torch(torch):
    libs = [_FastloadLib, _TorchLib(torch)]
    ours, theirs = (lib.ChainDataset([lib.iterable([1, 2]), [3, 4]]) for lib in libs)
    it_ours, it_theirs = iter(ours), iter(theirs)
    assert next(it_ours) == next(it_theirs) == 1  # constructing and starting is fine
    for make in (lambda: list(ours), lambda: len(ours)):
        error = _raised(make)
        assert type(error) is type(_raised(lambda: list(theirs))) is AssertionError
        assert "datasets[1] is a list" in str(error)


# --------------------------------------------------------------------------
# Subset


SUBSET_INDICES = [[0, 2, 4], [4, 3, 3, 0], [-1, -5, 2], [], range(1, 5)]


@pytest.mark.parametrize("indices", SUBSET_INDICES, ids=repr)
def test_subset_matches_torch(torch, indices):
    data = [10, 11, 12, 13, 14]
    ours, theirs = Subset(data, indices), torch.utils.data.Subset(data, indices)
    assert len(ours) == len(theirs)
    for i in range(-len(ours), len(ours)):
        assert ours[i] == theirs[i]
    positions = list(range(len(ours))) + [-1] * bool(len(ours))
    assert ours.__getitems__(positions) == theirs.__getitems__(positions)


def test_subset_of_array_dataset_matches_torch(torch):
    values = np.arange(20).reshape(10, 2)
    labels = np.arange(10) * 3
    indices = [9, 0, 4, -2]
    ours = Subset(ArrayDataset(values, labels), indices)
    theirs = torch.utils.data.Subset(_TorchLib(torch).array_dataset(values, labels), indices)
    for i in range(-4, 4):
        _assert_same(ours[i], theirs[i])
    _assert_same(ours.__getitems__([3, 1]), theirs.__getitems__([3, 1]))


def test_subset_list_index_matches_torch(torch):
    data = np.arange(100, 110)
    indices = [7, 2, 5, 9]
    ours, theirs = Subset(data, indices), torch.utils.data.Subset(data, indices)
    np.testing.assert_array_equal(ours[[0, -1, 2]], theirs[[0, -1, 2]])


@pytest.mark.parametrize("position", [3, 10, -4])
def test_subset_position_out_of_range_matches_torch(torch, position):
    data = list(range(10))
    ours = _raised(lambda: Subset(data, [1, 2, 3])[position])
    theirs = _raised(lambda: torch.utils.data.Subset(data, [1, 2, 3])[position])
    assert type(ours) is type(theirs) is IndexError
    assert str(position) in str(ours)


@pytest.mark.parametrize("indices", [[3, 1, 4], (3, 1, 4), range(3), np.array([3, 1, 4])], ids=repr)
def test_subset_keeps_indices_as_given_like_torch(torch, indices):
    ours, theirs = Subset(list(range(10)), indices), torch.utils.data.Subset(list(range(10)), indices)
    assert ours.indices is indices and theirs.indices is indices


def test_random_split_indices_are_lists_like_torch(torch):
    ours = random_split(range(10), [6, 4], generator=0)
    theirs = torch.utils.data.random_split(range(10), [6, 4], generator=torch.Generator().manual_seed(0))
    for mine, torch_split in zip(ours, theirs):
        assert type(mine.indices) is type(torch_split.indices) is list
        assert all(type(i) is int for i in mine.indices)
    # What callers do with them: join, compare, save.
    assert sorted(ours[0].indices + ours[1].indices) == list(range(10))
    assert (ours[0].indices == ours[1].indices) is False
    assert json.loads(json.dumps(ours[0].indices)) == ours[0].indices


def test_subset_keeps_non_integer_keys_as_given(torch):
    data = {"a": 1, "b": 2, "c": 3}
    ours, theirs = Subset(data, ["c", "a"]), torch.utils.data.Subset(data, ["c", "a"])
    assert [ours[0], ours[1]] == [theirs[0], theirs[1]] == [3, 1]
    assert ours.__getitems__([1, 0]) == theirs.__getitems__([1, 0])


@pytest.mark.parametrize("batched", [False, True])
def test_subset_passes_python_ints(batched):
    inner = (BatchedRecordingDataset if batched else RecordingDataset)(10)
    ds = Subset(inner, np.array([5, 3, 8], dtype=np.int32))
    assert ds[0] == 5 and ds[np.int64(-1)] == 8
    assert ds[[0, 2]] == [5, 8]
    expected = [("batched", 3), ("batched", 8)] if batched else [3, 8]
    assert ds.__getitems__([1, 2]) == expected
    assert ds.__getitems__(np.array([1, 2])) == expected
    assert all(t in (int, list) for t in inner.key_types), inner.key_types
    assert int in inner.key_types


def test_subset_subclass_must_override_getitems(torch):
    def make(base):
        class Broken(base):
            def __getitem__(self, idx):
                return 0

        return lambda: Broken([1, 2], [0])

    ours, theirs = _raised(make(Subset)), _raised(make(torch.utils.data.Subset))
    assert type(ours) is type(theirs) is NotImplementedError
    assert "Broken overrides __getitem__ but not __getitems__" in str(ours)

    class Fine(Subset):
        def __getitem__(self, idx):
            return "fine"

        def __getitems__(self, indices):
            return [self[i] for i in indices]

    assert Fine([1, 2], [0])[0] == "fine"


def test_subset_pickles():
    ds = Subset(list(range(10)), [9, 8])
    clone = pickle.loads(pickle.dumps(ds))
    assert [clone[0], clone[1]] == [9, 8]


# --------------------------------------------------------------------------
# StackDataset


def _stack_parts(lib):
    return (
        lib.array_dataset(np.arange(8).reshape(4, 2)),
        [10, 20, 30, 40],
        lib.Subset(list("abcdefg"), [6, 5, 4, 3]),  # has __getitems__
    )


@pytest.mark.parametrize("form", ["tuple", "dict"])
def test_stack_matches_torch(torch, form):
    results = []
    for lib in (_FastloadLib, _TorchLib(torch)):
        parts = _stack_parts(lib)
        if form == "tuple":
            results.append(lib.StackDataset(*parts))
        else:
            results.append(lib.StackDataset(image=parts[0], label=parts[1], letter=parts[2]))
    ours, theirs = results
    assert len(ours) == len(theirs) == 4
    for i in range(-4, 4):
        _assert_same(ours[i], theirs[i])
    for batch in ([0, 3, 1], [], [-1, 2]):
        _assert_same(ours.__getitems__(batch), theirs.__getitems__(batch))
    assert type(ours.datasets) is type(theirs.datasets)


class _ShortBatches:
    """A dataset whose __getitems__ drops a sample: StackDataset must notice."""

    def __len__(self):
        return 3

    def __getitem__(self, i):
        return i

    def __getitems__(self, indices):
        return list(indices)[:-1]


STACK_ERRORS = [
    ("args-and-kwargs", lambda lib: lib.StackDataset([1], b=[2]), ["1 args", "'b'"]),
    ("nothing", lambda lib: lib.StackDataset(), ["At least one dataset"]),
    ("tuple-mismatch", lambda lib: lib.StackDataset([1, 2], [1, 2, 3]), ["0: 2", "1: 3"]),
    ("dict-mismatch", lambda lib: lib.StackDataset(x=[1], y=[1, 2]), ["'x': 1", "'y': 2"]),
    ("nested-output", lambda lib: lib.StackDataset([1, 2, 3], _ShortBatches()).__getitems__([0, 1]),
     ["Expected 2, got 1"]),
]


@pytest.mark.parametrize("make, words", [c[1:] for c in STACK_ERRORS], ids=[c[0] for c in STACK_ERRORS])
def test_stack_errors_match_torch(torch, make, words):
    ours = _raised(lambda: make(_FastloadLib))
    theirs = _raised(lambda: make(_TorchLib(torch)))
    assert type(ours) is type(theirs) is ValueError
    for word in words:
        assert word in str(ours)


# --------------------------------------------------------------------------
# random_split


SPLITS = [
    (10, [3, 7]),
    (10, [0, 10]),
    (10, [0.3, 0.7]),
    (10, [0.33, 0.33, 0.34]),  # remainder of 1 goes to the first split
    (7, [0.5, 0.5]),
    (11, [0.25, 0.25, 0.25, 0.25]),  # remainder of 3, round-robin
    (3, [1 / 3, 1 / 3, 1 / 3]),
    (100, [0.7, 0.2, 0.1]),
    (5, [0.1] * 10),  # sums to 1 only approximately; most splits empty
    (4, [1]),  # a lone 1 is a fraction: everything
    (0, [0.5, 0.5]),
    (1, [0, 1]),  # reads as fractions, as in torch
]


@pytest.mark.parametrize("n, lengths", SPLITS, ids=repr)
def test_random_split_lengths_match_torch(torch, n, lengths):
    with warnings.catch_warnings(record=True) as ours_warned:
        warnings.simplefilter("always")
        ours = _FastloadLib.random_split(list(range(n)), lengths)
    with warnings.catch_warnings(record=True) as theirs_warned:
        warnings.simplefilter("always")
        theirs = _TorchLib(torch).random_split(list(range(n)), lengths)
    assert [len(s) for s in ours] == [len(s) for s in theirs]
    assert [str(w.message) for w in ours_warned] == [str(w.message) for w in theirs_warned]
    assert all(type(s) is Subset for s in ours)


@pytest.mark.parametrize("make", ["tensor", "tensors", "numpy"])
def test_random_split_takes_lengths_as_torch_integers_and_tensors(torch, make):
    lengths = {"tensor": lambda: torch.tensor([3, 7]),
               "tensors": lambda: [torch.tensor(3), torch.tensor(7)],
               "numpy": lambda: np.array([3, 7])}[make]()
    theirs = _TorchLib(torch).random_split(list(range(10)), lengths)
    ours = _FastloadLib.random_split(list(range(10)), lengths)
    assert [len(s) for s in ours] == [len(s) for s in theirs] == [3, 7]
    assert all(type(i) is int for s in ours for i in s.indices)


@pytest.mark.parametrize("n, lengths", SPLITS, ids=repr)
def test_random_split_is_disjoint_and_covering(n, lengths):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        parts = random_split(list(range(n)), lengths, generator=3)
    taken = [parts[k][i] for k in range(len(parts)) for i in range(len(parts[k]))]
    assert sorted(taken) == list(range(n))
    assert all(type(x) is int for x in taken)


def test_random_split_zero_length_warns_at_caller():
    with pytest.warns(UserWarning) as record:
        random_split(list(range(2)), [0.7, 0.2, 0.1], generator=0)
    assert [str(w.message) for w in record] == [
        f"Length of split at index {i} is 0. This might result in an empty dataset." for i in (1, 2)]
    assert all(w.filename == __file__ for w in record)


def test_random_split_is_reproducible_per_seed():
    def split(seed):
        return [s.indices for s in random_split(range(200), [0.5, 0.3, 0.2], generator=seed)]

    assert split(7) == split(7)
    assert split(7) != split(8)
    assert split(7) != split(None)
    assert sorted(sum(split(7), [])) == list(range(200))
    first = split(7)[0]
    assert first != sorted(first)  # actually shuffled


def test_random_split_accepts_numpy_and_torch_generators(torch):
    def split(generator):
        return [s.indices for s in random_split(range(50), [20, 30], generator=generator)]

    assert split(np.random.default_rng(5)) == split(np.random.default_rng(5))
    assert split(torch.Generator().manual_seed(5)) == split(torch.Generator().manual_seed(5))
    assert split(torch.Generator().manual_seed(5)) != split(torch.Generator().manual_seed(6))


def test_random_split_of_array_dataset_gives_array_subsets():
    values = np.arange(30).reshape(10, 3)
    train, val = random_split(ArrayDataset(values), [0.8, 0.2], generator=1)
    assert isinstance(train.dataset, ArrayDataset) and train.dataset.arrays[0] is values
    assert len(train) == 8 and len(val) == 2
    np.testing.assert_array_equal(val[1][0], values[val.indices[1]])


RANDOM_SPLIT_ERRORS = [
    ("fraction-above-1", 10, [1.5, -0.5], ["index 0", "1.5"]),
    ("fraction-below-0", 10, [-0.25, 1.25], ["index 0", "-0.25"]),
    ("sum-too-small", 10, [3, 4], ["[3, 4]", "10"]),
    ("sum-too-large", 10, [8, 4], ["[8, 4]", "12"]),
    ("fractions-not-1", 10, [0.5, 0.4], ["[0.5, 0.4]"]),
    ("float-counts", 10, [3.0, 7.0], ["3.0"]),
    ("float-counts-wrong-sum", 10, [3.5, 7.5], ["[3.5, 7.5]", "11.0"]),
]


@pytest.mark.parametrize("n, lengths, words", [c[1:] for c in RANDOM_SPLIT_ERRORS],
                         ids=[c[0] for c in RANDOM_SPLIT_ERRORS])
def test_random_split_errors_match_torch(torch, n, lengths, words):
    ours = _raised(lambda: _FastloadLib.random_split(list(range(n)), lengths))
    theirs = _raised(lambda: _TorchLib(torch).random_split(list(range(n)), lengths))
    assert type(ours) is type(theirs)
    if isinstance(theirs, ValueError):
        assert str(ours).startswith(str(theirs))  # torch's wording, then the values
    for word in words:
        assert word in str(ours)


def test_random_split_rejects_negative_lengths():
    # torch accepts [-1, 11] and returns overlapping splits; fastload refuses.
    with pytest.raises(ValueError, match=r"index 0 is negative \(-1\)"):
        random_split(range(10), [-1, 11], generator=0)


# --------------------------------------------------------------------------
# the exported names


def test_exports_match_module():
    assert set(fd.__all__) >= {"Dataset", "IterableDataset", "ArrayDataset", "ConcatDataset",
                               "ChainDataset", "Subset", "StackDataset", "random_split"}
    for name in fd.__all__:
        assert hasattr(fd, name)
    assert issubclass(IterableDataset, Dataset)
