"""DataLoader in one process: torch's arguments, validation, lengths and batches."""

import collections
import sys
import warnings

import numpy as np
import pytest
from batch_compare import assert_same, assert_same_as_torch, torch_twin

import fastload as fl
from fastload.dataloader import DataLoader
from fastload.rng import SeedSource

Point = collections.namedtuple("Point", "x y")


class NestedDataset(fl.Dataset):
    """Samples with every kind of leaf default_collate handles."""

    def __init__(self, n=37):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return {
            "image": np.full((3, 4, 5), i, dtype=np.uint8),
            "label": i % 7,
            "weight": i / 10,
            "flag": i % 2 == 0,
            "name": f"sample-{i}",
            "pair": (np.float32(i), [i, -i]),
            "point": Point(np.arange(3, dtype=np.int16) + i, i * 1.5),
        }


@pytest.mark.parametrize("batch_size,drop_last", [(1, False), (5, False), (5, True), (37, False),
                                                  (64, False), (64, True)])
def test_sequential_batches_match_torch(torch, batch_size, drop_last):
    ds = NestedDataset()
    ours = list(DataLoader(ds, batch_size=batch_size, drop_last=drop_last))
    theirs = list(torch.utils.data.DataLoader(torch_twin(torch, ds), batch_size=batch_size,
                                              drop_last=drop_last))
    assert len(ours) == len(theirs)
    assert len(DataLoader(ds, batch_size=batch_size, drop_last=drop_last)) == len(theirs)
    for a, b in zip(ours, theirs):
        assert_same_as_torch(a, b)


def test_batch_size_none_uses_default_convert(torch):
    ds = NestedDataset(5)
    ours = list(DataLoader(ds, batch_size=None))
    theirs = list(torch.utils.data.DataLoader(torch_twin(torch, ds), batch_size=None))
    assert len(ours) == len(theirs) == 5
    for a, b in zip(ours, theirs):
        assert list(a) == list(b)
        assert a["label"] == b["label"] and a["name"] == b["name"]
        np.testing.assert_array_equal(a["image"], b["image"].numpy())
        assert isinstance(a["pair"], list) and isinstance(b["pair"], list)


def test_custom_collate_fn_and_batch_sampler(torch):
    ds = NestedDataset(20)
    batches = [[0, 3], [5, 1, 2], [19]]

    def collate(samples):
        return [s["label"] for s in samples]

    ours = list(DataLoader(ds, batch_sampler=batches, collate_fn=collate))
    theirs = list(torch.utils.data.DataLoader(torch_twin(torch, ds), batch_sampler=batches,
                                              collate_fn=collate))
    assert ours == theirs == [[0, 3], [5, 1, 2], [5]]


def test_array_dataset_matches_tensor_dataset(torch):
    x = np.random.default_rng(0).integers(0, 255, (103, 3, 8, 8), dtype=np.uint8)
    y = np.arange(103)
    w = np.linspace(0, 1, 103, dtype=np.float32)
    ours = list(DataLoader(fl.ArrayDataset(x, y, w), batch_size=16))
    theirs = list(torch.utils.data.DataLoader(
        torch.utils.data.TensorDataset(torch.from_numpy(x), torch.from_numpy(y), torch.from_numpy(w)),
        batch_size=16))
    assert len(ours) == len(theirs) == 7
    for a, b in zip(ours, theirs):
        assert_same_as_torch(a, b)


def test_array_dataset_fast_path_equals_per_sample_path():
    rng = np.random.default_rng(1)
    x = rng.normal(size=(500, 6)).astype(np.float32)
    y = rng.integers(0, 5, 500)
    arrays = fl.ArrayDataset(x, y)
    subset = fl.Subset(fl.Subset(arrays, np.arange(499, -1, -1)), list(range(0, 400, 3)))

    class PerSample(fl.Dataset):  # same items, but not recognised by the fast path
        def __init__(self, inner):
            self.inner = inner

        def __len__(self):
            return len(self.inner)

        def __getitem__(self, i):
            return self.inner[i]

    for dataset in (arrays, subset):
        fast = list(DataLoader(dataset, batch_size=32, shuffle=True, generator=3))
        slow = list(DataLoader(PerSample(dataset), batch_size=32, shuffle=True, generator=3))
        assert len(fast) == len(slow)
        for a, b in zip(fast, slow):
            assert_same(a, b)


def test_subsets_with_list_indices_take_the_array_fast_path():
    from fastload._loading.fetch import array_rows

    x = np.arange(40).reshape(20, 2)
    train, _ = fl.random_split(fl.ArrayDataset(x), [0.75, 0.25], generator=0)
    assert type(train.indices) is list
    arrays, rows = array_rows(train)
    assert arrays[0] is x
    np.testing.assert_array_equal(rows, train.indices)
    nested = fl.Subset(train, [4, 0, -1])
    np.testing.assert_array_equal(array_rows(nested)[1], [train.indices[i] for i in (4, 0, -1)])
    assert array_rows(fl.Subset(fl.ArrayDataset(x), [])) is not None
    assert array_rows(fl.Subset(fl.ArrayDataset(x), [True, False])) is None  # torch's 1/0 keys


def _torch_batches(torch, loader):
    """A torch loader's batches as nested lists, or its exception's type."""
    try:
        return [[t.tolist() for t in batch] for batch in loader]
    except Exception as error:  # noqa: BLE001
        return type(error)


def _our_batches(loader):
    try:
        return [[a.tolist() for a in batch] for batch in loader]
    except Exception as error:  # noqa: BLE001
        return type(error)


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("case", ["outer index past the inner subset", "empty batch",
                                  "ragged indices", "subset overriding __getitems__"])
def test_batches_the_array_fast_path_cannot_take_are_made_as_torch_makes_them(torch, case,
                                                                              num_workers):
    rows = np.arange(10)
    ours, theirs = fl.ArrayDataset(rows), torch.utils.data.TensorDataset(torch.from_numpy(rows))
    sampling: dict = dict(batch_size=2)
    if case == "outer index past the inner subset":
        # Index 9 of the outer Subset is past the inner one's 5: only the batch
        # that uses it fails (torch fetches sample by sample); iter() does not.
        ours = fl.Subset(fl.Subset(ours, range(5)), [3, 4, 9])
        theirs = torch.utils.data.Subset(torch.utils.data.Subset(theirs, range(5)), [3, 4, 9])
        sampling = dict(batch_sampler=[[0], [1], [2]])
    elif case == "empty batch":  # torch's default_collate refuses it (IndexError)
        sampling = dict(batch_sampler=[[1, 2], np.array([], dtype=np.int64), [3]])
    elif case == "ragged indices":  # each sample fetched, then collate refuses the shapes
        sampling = dict(batch_sampler=[[np.array([1]), 2]])
    else:
        class Doubled(fl.Subset):
            def __getitems__(self, indices):
                return [(row * 2,) for (row,) in super().__getitems__(indices)]

        class TorchDoubled(torch.utils.data.Subset):
            def __getitems__(self, indices):
                return [(row * 2,) for (row,) in super().__getitems__(indices)]

        ours, theirs = Doubled(ours, range(4)), TorchDoubled(theirs, range(4))
    expected = _torch_batches(torch, torch.utils.data.DataLoader(theirs, **sampling))
    got = _our_batches(DataLoader(ours, num_workers=num_workers, **sampling))
    if case == "outer index past the inner subset":  # torch's error comes at the third batch
        assert expected is IndexError
        loader = iter(DataLoader(ours, num_workers=num_workers, **sampling))
        assert [next(loader)[0].tolist(), next(loader)[0].tolist()] == [[3], [4]]
        with pytest.raises(IndexError):
            next(loader)
    elif case == "subset overriding __getitems__":
        assert got == expected == [[[0, 2]], [[4, 6]]]
    else:
        assert got == expected and isinstance(expected, type), (got, expected)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_output_torch_takes_big_endian_arrays_and_uint64_scalars(torch, num_workers):
    # torch has no big-endian tensors and torch.as_tensor refuses an np.uint64
    # scalar: fastload's batches of them become tensors of their values.
    big = fl.ArrayDataset(np.arange(6, dtype=">i4").reshape(3, 2))
    got = list(DataLoader(big, batch_size=2, num_workers=num_workers, output="torch"))
    assert got[0][0].dtype == torch.int32 and got[0][0].tolist() == [[0, 1], [2, 3]]
    rows = fl.ArrayDataset(np.arange(4, dtype=np.uint64))  # rows are np.uint64 scalars
    custom = list(DataLoader(rows, batch_size=2, num_workers=num_workers, output="torch",
                             collate_fn=lambda batch: batch[0]))
    assert [tuple(t.item() for t in batch) for batch in custom] == [(0,), (2,)]
    assert custom[0][0].dtype == torch.uint64


@pytest.mark.parametrize("num_workers", [0, 2])
def test_output_torch_takes_a_reversed_view_from_collate_fn(torch, num_workers):
    # torch has no negative strides; a collate_fn may return a reversed view.
    loader = DataLoader(list(range(4)), batch_size=2, num_workers=num_workers, output="torch",
                        collate_fn=lambda batch: np.asarray(batch, dtype=np.float64)[::-1])
    assert [batch.tolist() for batch in loader] == [[1.0, 0.0], [3.0, 2.0]]


@pytest.mark.parametrize("num_workers", [0, 2])
def test_output_torch_gives_writable_tensors_of_read_only_arrays(torch, tmp_path, num_workers):
    # A tensor over a read-only map crashes the process when written (torch's
    # own loader so, with batch_size=None): a read-only array becomes a copy.
    np.arange(8, dtype=np.float32).tofile(tmp_path / "rows.bin")
    rows = np.memmap(tmp_path / "rows.bin", dtype=np.float32, mode="r", shape=(4, 2))
    for kwargs in (dict(batch_size=None), dict(batch_size=2, collate_fn=lambda b: rows[:2])):
        batch = next(iter(DataLoader(fl.ArrayDataset(rows), num_workers=num_workers,
                                     output="torch", **kwargs)))
        if isinstance(batch, (tuple, list)):
            batch = batch[0]
        batch.add_(100)
        assert batch.min() >= 100
    assert rows.tolist() == [[0, 1], [2, 3], [4, 5], [6, 7]]


def test_output_torch_leaves_masked_arrays_as_torchs_default_convert_does(torch):
    # torch converts numpy's own array types only: a masked array (numpy.ma)
    # comes back as it is, mask and all, not a tensor of the hidden values.
    samples = [{"m": np.ma.masked_array([i, 99], mask=[False, True]), "x": np.array([i])}
               for i in range(2)]
    ours = next(iter(DataLoader(samples, batch_size=None, output="torch")))
    theirs = next(iter(torch.utils.data.DataLoader(samples, batch_size=None)))
    assert type(ours["m"]) is type(theirs["m"]) is np.ma.MaskedArray
    assert ours["m"].tolist() == theirs["m"].tolist() == [0, None]
    assert torch.equal(ours["x"], theirs["x"])


def test_seeded_shuffle_is_reproducible_and_differs_by_epoch_and_seed():
    ds = fl.ArrayDataset(np.arange(100))
    loader = DataLoader(ds, batch_size=10, shuffle=True, generator=7)
    epoch1 = np.concatenate([b[0] for b in loader])
    epoch2 = np.concatenate([b[0] for b in loader])
    again = np.concatenate([b[0] for b in DataLoader(ds, batch_size=10, shuffle=True, generator=7)])
    other = np.concatenate([b[0] for b in DataLoader(ds, batch_size=10, shuffle=True, generator=8)])
    assert sorted(epoch1.tolist()) == list(range(100))
    np.testing.assert_array_equal(epoch1, again)
    assert not np.array_equal(epoch1, epoch2)
    assert not np.array_equal(epoch1, other)


def test_numpy_generator_is_accepted_and_advanced():
    ds = fl.ArrayDataset(np.arange(50))
    gen = np.random.default_rng(5)
    first = np.concatenate([b[0] for b in DataLoader(ds, batch_size=8, shuffle=True, generator=gen)])
    second = np.concatenate([b[0] for b in DataLoader(ds, batch_size=8, shuffle=True, generator=gen)])
    replay = np.concatenate([b[0] for b in DataLoader(ds, batch_size=8, shuffle=True,
                                                      generator=np.random.default_rng(5))])
    np.testing.assert_array_equal(first, replay)
    assert not np.array_equal(first, second)


def _given_generators(torch):
    return {"none": None, "torch": torch.Generator().manual_seed(3),
            "numpy": np.random.default_rng(3), "int": 3}


@pytest.mark.parametrize("kind", ["none", "torch", "numpy", "int"])
def test_the_shuffling_sampler_keeps_the_callers_generator_as_torchs_does(torch, kind):
    # torch's RandomSampler holds the loader's generator itself (None when
    # none was given); libraries read it there to seed or snapshot it.
    generator = _given_generators(torch)[kind]
    ours = DataLoader(range(20), shuffle=True, generator=generator)
    assert ours.sampler.generator is generator and ours.generator is generator
    if kind in ("none", "torch"):
        theirs = torch.utils.data.DataLoader(range(20), shuffle=True, generator=generator)
        assert theirs.sampler.generator is generator
    sampler = fl.SubsetRandomSampler(range(5), generator=generator)
    assert sampler.generator is generator
    sampler.generator = None
    assert sampler.generator is None


def test_seeding_the_samplers_generator_in_place_replays_the_order_as_in_torch(torch):
    # accelerate's prepare_data_loader: it gives a sampler without one a
    # torch.Generator, and seeds it through ``sampler.generator.manual_seed``.
    orders = {}
    for name, module in (("ours", fl), ("theirs", torch.utils.data)):
        loader = module.DataLoader(range(30), shuffle=True, batch_size=None)
        assert loader.sampler.generator is None
        loader.sampler.generator = torch.Generator()
        runs = []
        for _ in range(2):
            loader.sampler.generator.manual_seed(7)
            runs.append([int(x) for x in loader])
        assert runs[0] == runs[1] and sorted(runs[0]) == list(range(30))
        loader.sampler.generator.manual_seed(8)
        assert [int(x) for x in loader] != runs[0]
        orders[name] = runs[0]
    assert orders["ours"] != list(range(30)) and orders["theirs"] != list(range(30))


def test_loader_and_its_shuffling_sampler_still_draw_from_one_stream():
    # The sampler keeps the caller's generator but shares the loader's stream:
    # an epoch draws the order and the base seed from it, one after the other.
    loader = DataLoader(range(20), shuffle=True, generator=5)
    assert loader.sampler._seed_source.stream is loader._seed_source.stream
    before = loader._seed_source.get_state()
    list(loader)
    after_one = loader._seed_source.get_state()
    solo = SeedSource(5)
    solo.draw(), solo.draw()
    assert after_one == solo.get_state() and before != after_one


class Stream(fl.IterableDataset):
    def __init__(self, n):
        self.n = n

    def __iter__(self):
        return iter(range(self.n))

    def __len__(self):
        return self.n


def test_iterable_dataset_batches_and_len(torch):
    class TorchStream(torch.utils.data.IterableDataset):
        def __iter__(self):
            return iter(range(23))

        def __len__(self):
            return 23

    for drop_last in (False, True):
        ours = [b.tolist() for b in DataLoader(Stream(23), batch_size=5, drop_last=drop_last)]
        theirs = [b.tolist() for b in torch.utils.data.DataLoader(TorchStream(), batch_size=5,
                                                                  drop_last=drop_last)]
        assert ours == theirs
        assert len(DataLoader(Stream(23), batch_size=5, drop_last=drop_last)) == \
            len(torch.utils.data.DataLoader(TorchStream(), batch_size=5, drop_last=drop_last))
    assert list(DataLoader(Stream(3), batch_size=None)) == [0, 1, 2]


def test_iterable_len_warning_when_more_samples_than_len():
    class Liar(Stream):
        def __len__(self):
            return 2

    loader = DataLoader(Liar(5), batch_size=None)
    assert len(loader) == 2
    with pytest.warns(UserWarning, match="was reported to be 2"):
        list(loader)


def _validation_cases():
    ds = NestedDataset(10)
    return [
        ("negative workers", dict(num_workers=-1)),
        ("negative timeout", dict(timeout=-1)),
        ("prefetch without workers", dict(prefetch_factor=2)),
        ("negative prefetch", dict(num_workers=1, prefetch_factor=-1)),
        ("persistent without workers", dict(persistent_workers=True)),
        ("sampler with shuffle", dict(sampler=range(10), shuffle=True)),
        ("batch_sampler with batch_size", dict(batch_sampler=[[0]], batch_size=2)),
        ("batch_sampler with shuffle", dict(batch_sampler=[[0]], shuffle=True)),
        ("batch_sampler with sampler", dict(batch_sampler=[[0]], sampler=range(10))),
        ("batch_sampler with drop_last", dict(batch_sampler=[[0]], drop_last=True)),
        ("batch_size None with drop_last", dict(batch_size=None, drop_last=True)),
        ("zero batch_size", dict(batch_size=0)),
        ("bool batch_size", dict(batch_size=True)),
        ("context without workers", dict(multiprocessing_context="spawn")),
        ("bad context name", dict(num_workers=1, multiprocessing_context="nope")),
        ("bad context type", dict(num_workers=1, multiprocessing_context=3)),
    ], ds


@pytest.mark.parametrize("case", [c[0] for c in _validation_cases()[0]])
def test_validation_errors_match_torch(torch, case):
    cases, ds = _validation_cases()
    kwargs = dict(cases)[case]
    with pytest.raises(Exception) as theirs:
        torch.utils.data.DataLoader(torch_twin(torch, ds), **kwargs)
    with pytest.raises(Exception) as ours:
        DataLoader(ds, **kwargs)
    assert type(ours.value) is type(theirs.value)
    assert str(ours.value) == str(theirs.value)


@pytest.mark.parametrize("kwargs", [dict(shuffle=True), dict(sampler=[0]), dict(batch_sampler=[[0]])])
def test_iterable_dataset_rejects_samplers_like_torch(torch, kwargs):
    class TorchStream(torch.utils.data.IterableDataset):
        def __iter__(self):
            return iter(range(3))

    with pytest.raises(ValueError) as theirs:
        torch.utils.data.DataLoader(TorchStream(), **kwargs)
    with pytest.raises(ValueError) as ours:
        DataLoader(Stream(3), **kwargs)
    assert str(ours.value).split(", but got")[0] == str(theirs.value).split(", but got")[0]


@pytest.mark.timeout(60)
# torch's iterator __del__ trips over the attributes its failed __init__ never set.
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
@pytest.mark.parametrize("attribute, bad, good, num_workers, message", [
    ("prefetch_factor", 0, 1, 2, "prefetch_factor must be greater than 0"),
    ("timeout", 0.5, 0, 0, "timeout=0.5 needs num_workers > 0")])
def test_arguments_torch_checks_at_iter_fail_there_like_torch(torch, no_leaks, attribute, bad,
                                                              good, num_workers, message):
    # Both accept them at construction (prefetch_factor=0 is "non-negative";
    # a timeout is checked only against single-process loading) and refuse
    # them at iter().
    kwargs = dict(batch_size=2, num_workers=num_workers, **{attribute: bad})
    theirs = torch.utils.data.DataLoader(list(range(6)), **kwargs)
    ours = DataLoader(list(range(6)), **kwargs)
    with pytest.raises(AssertionError):
        iter(theirs)
    with pytest.raises(AssertionError, match=message):
        iter(ours)
    with pytest.raises(ValueError):  # a bad argument, by Python's conventions too
        iter(ours)
    # The attributes are not guarded: a valid value set afterwards works.
    setattr(ours, attribute, good)
    assert [batch.tolist() for batch in ours] == [[0, 1], [2, 3], [4, 5]]


@pytest.mark.timeout(60)
def test_non_integer_prefetch_factor_with_workers_is_a_type_error(no_leaks):
    loader = DataLoader(list(range(6)), batch_size=2, num_workers=2, prefetch_factor=2.0)
    with pytest.raises(TypeError, match="prefetch_factor must be an int"):
        iter(loader)


@pytest.mark.parametrize("attribute", ["batch_size", "batch_sampler", "sampler", "drop_last",
                                       "dataset", "persistent_workers"])
def test_setattr_guard(torch, attribute):
    loader = DataLoader(NestedDataset(4))
    theirs = torch.utils.data.DataLoader(torch_twin(torch, NestedDataset(4)))
    with pytest.raises(ValueError) as expected:
        setattr(theirs, attribute, None)
    with pytest.raises(ValueError) as got:
        setattr(loader, attribute, None)
    assert str(got.value) == str(expected.value)
    loader.timeout = 3  # unguarded attributes stay settable
    assert loader.timeout == 3


def test_output_validation_and_torch_output(torch):
    with pytest.raises(ValueError, match="output"):
        DataLoader(NestedDataset(2), output="jax")
    batch = next(iter(DataLoader(NestedDataset(4), batch_size=2, output="torch")))
    assert isinstance(batch["image"], torch.Tensor) and batch["image"].dtype == torch.uint8
    assert batch["label"].tolist() == [0, 1]
    assert batch["name"] == ["sample-0", "sample-1"]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("workers", [{}, {"num_workers": 3, "persistent_workers": True}],
                         ids=["no workers", "3 persistent workers"])
@pytest.mark.parametrize("device", ["", "cuda"])
def test_pin_memory_warns_as_torch_and_changes_nothing(torch, device, workers, no_leaks):
    # The same warnings in the same order (after the worker-count one, where 3
    # workers are more than this process's CPUs), as an iterator is made: a
    # persistent loader's once, not every epoch.
    import os

    too_many_workers = bool(workers) and workers["num_workers"] > len(os.sched_getaffinity(0))
    def warnings_of(make_loader, dataset):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            loader = make_loader(dataset, batch_size=3, pin_memory=True,
                                 pin_memory_device=device, **workers)
            epochs = [list(loader) for _ in range(3)]
        return [(w.category, str(w.message), w.filename) for w in caught], epochs[-1]

    theirs, _ = warnings_of(torch.utils.data.DataLoader,
                            torch.utils.data.TensorDataset(torch.arange(6)))
    ours, batches = warnings_of(DataLoader, fl.ArrayDataset(np.arange(6)))
    assert [w[:2] for w in ours] == [w[:2] for w in theirs]
    # The worker-count warning comes at construction and as workers start.
    assert len(ours) == (1 + bool(device)) * (1 if workers else 3) + 2 * too_many_workers
    assert [b[0].tolist() for b in batches] == [[0, 1, 2], [3, 4, 5]]
    # Each from a line of the loader's, as torch's from its own: Python's
    # default filter shows it once, whichever lines of the caller's iterate.
    pin_warnings = [w for w in ours if "pin_memory" in w[1]]
    assert {w[2] for w in pin_warnings} == {sys.modules["fastload.dataloader"].__file__}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("default")
        list(DataLoader(fl.ArrayDataset(np.arange(6)), batch_size=3, pin_memory=True))
        list(DataLoader(fl.ArrayDataset(np.arange(6)), batch_size=3, pin_memory=True))
    assert len(caught) == 1


def test_too_many_workers_warns(torch):
    import os

    with pytest.warns(UserWarning, match="worker processes in total"):
        DataLoader(NestedDataset(2), num_workers=(os.cpu_count() or 1) + 5)


def _one_cpu(monkeypatch):
    """Both loaders (torch's through ``torch._utils.cpu_count``) count the CPUs this
    process may run on with ``os.sched_getaffinity``: say there is one, so two
    workers are too many on any machine, without starting a CPU's worth of them."""
    import os

    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0})


@pytest.mark.timeout(60)
@pytest.mark.parametrize("persistent", [False, True])
def test_too_many_workers_warns_whenever_workers_start_as_in_torch(torch, no_leaks, persistent,
                                                                   monkeypatch):
    _one_cpu(monkeypatch)

    def count(library):
        workers = 2
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            loader = library.DataLoader(list(range(4)), batch_size=2, num_workers=workers,
                                        persistent_workers=persistent)
            for _ in range(2):
                list(loader)
        return sum("worker processes in total" in str(w.message) for w in caught)

    assert count(fl) == count(torch.utils.data) == (2 if persistent else 3)


@pytest.mark.timeout(60)
def test_too_many_workers_warning_is_shown_from_the_loaders_lines_as_torchs(torch, no_leaks,
                                                                          monkeypatch):
    # From a line of the library's own, so Python's default filter shows it
    # once per place it is checked (construction, start of workers), however
    # many loaders and epochs; and the check is public under torch's name.
    _one_cpu(monkeypatch)

    def shown(library):
        workers = 2
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("default")
            for _ in range(2):
                loader = library.DataLoader(list(range(4)), batch_size=2, num_workers=workers)
                for _ in range(2):
                    list(loader)
            loader.check_worker_number_rationality()
        return [w for w in caught if "worker processes in total" in str(w.message)]

    ours, theirs = shown(fl), shown(torch.utils.data)
    assert len(ours) == len(theirs) == 3
    # The last one, asked for by the caller, is shown from the caller's line.
    assert [w.filename for w in ours] == [fl.dataloader.__file__] * 2 + [__file__]
    assert [w.filename for w in theirs] == [torch.utils.data.dataloader.__file__] * 2 + [__file__]
    assert DataLoader(range(3))._dataset_kind == torch.utils.data.DataLoader(range(3))._dataset_kind == 0
    assert DataLoader(Stream(3))._dataset_kind == 1


def _stream_classes(torch) -> dict:
    """IterableDatasets both loaders take (torch's base class), keyed by name."""

    class Resetting(torch.utils.data.IterableDataset):
        """Its own iterator: ``__iter__`` starts over and returns itself."""

        def __init__(self, n):
            self.n, self.i = n, 0

        def __iter__(self):
            self.i = 0
            return self

        def __next__(self):
            if self.i >= self.n:
                raise StopIteration
            self.i += 1
            return self.i - 1

    class NextOnly:
        def __init__(self, n):
            self.values = iter(range(n))

        def __next__(self):
            return next(self.values)

    class NextOnlyStream(torch.utils.data.IterableDataset):
        """``__iter__`` returns an object with ``__next__`` alone (torch only calls next())."""

        def __init__(self, n):
            self.n = n

        def __iter__(self):
            return NextOnly(self.n)

    class Arrays(torch.utils.data.IterableDataset):
        """Array samples: never to be compared with anything (ambiguous truth value)."""

        def __init__(self, n):
            self.n = n

        def __iter__(self):
            return (np.array([i]) for i in range(self.n))

    class EqualToAnything(int):
        def __eq__(self, other):
            return True

        __hash__ = int.__hash__

    class EqualToAnythingStream(Arrays):
        def __iter__(self):
            return (EqualToAnything(i) for i in range(self.n))

    class FailingIter(torch.utils.data.IterableDataset):
        def __init__(self, error):
            self.error = error

        def __iter__(self):
            raise self.error

    return dict(Resetting=Resetting, NextOnlyStream=NextOnlyStream, Arrays=Arrays,
                EqualToAnythingStream=EqualToAnythingStream, FailingIter=FailingIter)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("num_workers", [0, 1])
@pytest.mark.parametrize("stream", ["Resetting", "NextOnlyStream", "Arrays",
                                    "EqualToAnythingStream"])
def test_a_streams_samples_are_taken_with_next_only_as_torch_takes_them(torch, stream,
                                                                       num_workers):
    # Taking a batch with islice called iter() on the stream again: the
    # resetting one gave its first batch for ever, the other raised TypeError.
    # Nor may a sample be compared with a sentinel (arrays, odd __eq__).
    make = _stream_classes(torch)[stream]

    def batches(library):
        loader = library.DataLoader(make(5), batch_size=2, num_workers=num_workers)
        return [[int(np.asarray(sample).reshape(-1)[0]) if isinstance(sample, (np.ndarray,
                                                                                torch.Tensor))
                 else int(sample) for sample in batch] for batch in loader]

    assert batches(fl) == batches(torch.utils.data) == [[0, 1], [2, 3], [4]]


@pytest.mark.parametrize("error", [OSError("no shard list"), StopIteration()])
def test_a_streams_iter_runs_at_iter_loader_as_in_torch(torch, error):
    # In process, torch calls iter(dataset) when its iterator is made: its
    # error (even a StopIteration) comes out of iter(loader), not next().
    failing = _stream_classes(torch)["FailingIter"](error)
    with pytest.raises(type(error)):
        iter(torch.utils.data.DataLoader(failing, batch_size=2))
    with pytest.raises(type(error)):
        iter(DataLoader(failing, batch_size=2))


@pytest.mark.timeout(60)
@pytest.mark.parametrize("num_workers", [0, 2])
def test_the_length_warning_is_torchs_and_points_at_the_callers_loop(torch, num_workers):
    class Liar(torch.utils.data.IterableDataset):  # a torch dataset, so both loaders take it
        def __iter__(self):
            info = torch.utils.data.get_worker_info()
            return iter(range(0 if info is not None and info.id else 6))

        def __len__(self):
            return 2

    def first_warning(library):
        loader = library.DataLoader(Liar(), batch_size=None, num_workers=num_workers)
        len(loader)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for _ in loader:  # the line both warnings must point at
                pass
        warning = next(w for w in caught if "was reported to be" in str(w.message))
        return str(warning.message).split("but ")[1], warning.filename, warning.lineno

    assert first_warning(fl) == first_warning(torch.utils.data)
    assert first_warning(fl)[1] == __file__


def test_getitems_is_used_when_present():
    calls = []

    class Batched(fl.Dataset):
        def __len__(self):
            return 10

        def __getitem__(self, i):
            raise AssertionError("__getitems__ should be used")

        def __getitems__(self, indices):
            calls.append(list(indices))
            return [i * 2 for i in indices]

    batches = [b.tolist() for b in DataLoader(Batched(), batch_size=4)]
    assert batches == [[0, 2, 4, 6], [8, 10, 12, 14], [16, 18]]
    assert calls == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    assert all(type(i) is int for c in calls for i in c)


def test_dataset_receives_python_ints():
    seen = []

    class Recorder(fl.Dataset):
        def __len__(self):
            return 9

        def __getitem__(self, i):
            seen.append(type(i))
            return i

    list(DataLoader(Recorder(), batch_size=4, shuffle=True, generator=0))
    assert set(seen) == {int}


@pytest.mark.parametrize("num_workers", [0, 2])
def test_state_dict_resumes_at_next_unseen_batch(num_workers):
    ds = fl.ArrayDataset(np.arange(200))
    kwargs = dict(batch_size=16, shuffle=True, generator=11, num_workers=num_workers)
    reference = DataLoader(ds, **kwargs)
    full = [b[0].tolist() for b in reference]
    second_epoch = [b[0].tolist() for b in reference]

    loader = DataLoader(ds, **kwargs)
    iterator = iter(loader)
    seen = [next(iterator)[0].tolist() for _ in range(5)]
    state = loader.state_dict()
    del iterator

    resumed = DataLoader(ds, **kwargs)
    resumed.load_state_dict(state)
    rest = [b[0].tolist() for b in resumed]
    assert seen + rest == full
    # The epoch after the resumed one continues the original run's stream.
    assert [b[0].tolist() for b in resumed] == second_epoch


def test_state_dict_before_and_after_epochs():
    ds = fl.ArrayDataset(np.arange(30))
    loader = DataLoader(ds, batch_size=7, shuffle=True, generator=2)
    fresh_state = loader.state_dict()
    first = [b[0].tolist() for b in loader]
    after_epoch = loader.state_dict()
    second = [b[0].tolist() for b in loader]

    replay = DataLoader(ds, batch_size=7, shuffle=True, generator=99)
    replay.load_state_dict(fresh_state)
    assert [b[0].tolist() for b in replay] == first
    replay.load_state_dict(after_epoch)
    assert [b[0].tolist() for b in replay] == second


def test_state_dict_rejects_foreign_state():
    loader = DataLoader(fl.ArrayDataset(np.arange(4)))
    with pytest.raises(ValueError, match="state_dict"):
        loader.load_state_dict({"epoch": 3})
    # A stream without state methods is saved too (it is replayed on resume), and
    # its state is refused by a loader of other data.
    stream_state = DataLoader(Stream(3)).state_dict()
    with pytest.raises(ValueError, match="this state_dict comes from a DataLoader with"):
        DataLoader(fl.ArrayDataset(np.arange(3))).load_state_dict(stream_state)


def test_transform_rng_is_seeded_per_batch_regardless_of_workers():
    from fastload.rng import transform_rng

    class Noisy(fl.Dataset):
        def __len__(self):
            return 40

        def __getitem__(self, i):
            return transform_rng().integers(0, 1 << 30)

    def run(num_workers):
        return [b.tolist() for b in DataLoader(Noisy(), batch_size=4, shuffle=True, generator=5,
                                               num_workers=num_workers)]

    assert run(0) == run(2)
    assert run(0) != [b.tolist() for b in DataLoader(Noisy(), batch_size=4, shuffle=True,
                                                     generator=6)]


def test_a_batch_that_raises_does_not_shift_the_transform_seeds_after_it():
    from fastload.rng import transform_rng

    class NoisyWithAFault(fl.Dataset):
        def __len__(self):
            return 20

        def __getitem__(self, i):
            if i == 5:
                raise ValueError("sample 5 is broken")
            return transform_rng().integers(0, 1 << 30)

    def run(num_workers):
        it = iter(DataLoader(NoisyWithAFault(), batch_size=4, generator=5, num_workers=num_workers))
        batches = [next(it).tolist()]
        with pytest.raises(ValueError, match="sample 5"):
            next(it)
        return batches + [b.tolist() for b in it]

    assert run(0) == run(2)
    assert len(run(0)) == 4


@pytest.mark.timeout(60)
def test_loaders_in_two_threads_each_draw_from_their_own_batches_seeds():
    # In the main process (num_workers=0) each thread seeds its own batches:
    # one loader's draws between the other's must not shift its numbers.
    import threading

    from fastload.rng import transform_rng

    class TwoDraws(fl.Dataset):
        def __init__(self, barrier):
            self.barrier = barrier

        def __len__(self):
            return 8

        def __getitem__(self, i):
            first = transform_rng().integers(0, 1 << 30)
            self.barrier.wait()  # the other thread seeds and draws meanwhile
            return np.array([first, transform_rng().integers(0, 1 << 30)])

    def run(seed, barrier, out):
        out[seed] = [b.tolist() for b in DataLoader(TwoDraws(barrier), batch_size=4, generator=seed)]

    alone = {}
    for seed in (1, 2):
        run(seed, threading.Barrier(1), alone)
    together = {}
    barrier = threading.Barrier(2, timeout=20)
    threads = [threading.Thread(target=run, args=(seed, barrier, together)) for seed in (1, 2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert together == alone and alone[1] != alone[2]


# --------------------------------------------------------------------------
# Batch samplers the loader must iterate as they are
# --------------------------------------------------------------------------

def _reversed_batch_sampler(library):
    class ReversedBatches(library.BatchSampler):  # overrides __iter__, keeps the rest
        def __iter__(self):
            return iter(list(super().__iter__())[::-1])

    return ReversedBatches(library.SequentialSampler(range(5)), 2, False)


def _bucketing_batch_sampler(library):
    class Buckets(library.BatchSampler):  # a common pattern: no super().__init__()
        def __init__(self, batches):
            self.batches = batches

        def __iter__(self):
            return iter(self.batches)

        def __len__(self):
            return len(self.batches)

    return Buckets([[4, 0], [1], [3, 2]])


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("make", [_reversed_batch_sampler, _bucketing_batch_sampler],
                         ids=["overridden-iter", "no-super-init"])
def test_a_batch_sampler_subclass_is_iterated_as_torch_does(torch, make, num_workers):
    ours = [b.tolist() for b in DataLoader(list(range(5)), batch_sampler=make(fl),
                                           num_workers=num_workers)]
    theirs = [b.tolist() for b in torch.utils.data.DataLoader(
        list(range(5)), batch_sampler=make(torch.utils.data), num_workers=num_workers)]
    assert ours == theirs
    assert len(ours) == len(make(fl))


class BatchKeyed(fl.Dataset):
    """Indexed by a whole batch of keys at once, as a list (what torch passes)."""

    items = ["a", "b", "c", "d", "e"]

    def __len__(self):
        return len(self.items)

    def __getitem__(self, keys):
        assert type(keys) is list and all(type(k) is int for k in keys), keys
        return [self.items[k] for k in keys]


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_batch_sampler_as_sampler_hands_the_dataset_lists_as_torch(torch, num_workers):
    def batches(library):
        sampler = library.BatchSampler(library.SequentialSampler(range(5)), 2, False)
        return list(library.DataLoader(BatchKeyed(), sampler=sampler, batch_size=None,
                                       num_workers=num_workers))

    assert batches(fl) == batches(torch.utils.data) == [["a", "b"], ["c", "d"], ["e"]]


def test_num_workers_may_be_a_numpy_integer_as_in_torch(torch):
    for count in (np.int64(0), np.int32(2)):
        ours = DataLoader(list(range(6)), batch_size=2, num_workers=count)
        theirs = torch.utils.data.DataLoader(list(range(6)), batch_size=2, num_workers=count)
        assert [b.tolist() for b in ours] == [b.tolist() for b in theirs]
        assert ours.num_workers == count and type(ours.num_workers) is int
    with pytest.raises(TypeError, match="num_workers should be an integer.*2.0"):
        DataLoader(list(range(6)), num_workers=2.0)  # torch: TypeError too, at iter()


def test_a_float_zero_num_workers_loads_in_process_as_in_torch(torch):
    # torch only compares num_workers with 0 before it counts workers with it.
    ours = DataLoader(list(range(5)), batch_size=2, num_workers=0.0)
    theirs = torch.utils.data.DataLoader(list(range(5)), batch_size=2, num_workers=0.0)
    assert [b.tolist() for b in ours] == [b.tolist() for b in theirs] == [[0, 1], [2, 3], [4]]


@pytest.mark.timeout(60)
def test_prefetch_factor_true_counts_as_one_as_in_torch(torch, no_leaks):
    ours = DataLoader(list(range(6)), batch_size=2, num_workers=2, prefetch_factor=True)
    theirs = torch.utils.data.DataLoader(list(range(6)), batch_size=2, num_workers=2,
                                         prefetch_factor=True)
    assert [b.tolist() for b in ours] == [b.tolist() for b in theirs] == [[0, 1], [2, 3], [4, 5]]


class _BatchesByIndex:
    """A batch_sampler iterable only through ``__getitem__`` (the old sequence protocol)."""

    def __getitem__(self, i):
        if i >= 2:
            raise IndexError(i)
        return [2 * i, 2 * i + 1]

    def __len__(self):
        return 2


def test_a_batch_sampler_iterable_by_getitem_works_as_in_torch(torch):
    ours = DataLoader(list(range(4)), batch_sampler=_BatchesByIndex())
    theirs = torch.utils.data.DataLoader(list(range(4)), batch_sampler=_BatchesByIndex())
    assert [b.tolist() for b in ours] == [b.tolist() for b in theirs] == [[0, 1], [2, 3]]


def test_a_batch_sampler_that_is_not_iterable_is_torchs_type_error(torch):
    with pytest.raises(TypeError) as theirs:
        iter(torch.utils.data.DataLoader(list(range(4)), batch_sampler=5))
    with pytest.raises(TypeError) as ours:
        iter(DataLoader(list(range(4)), batch_sampler=5))
    assert str(ours.value) == str(theirs.value)


def _masked_collate(samples):
    return np.ma.masked_array(samples, mask=[v < 0 for v in samples])


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_collate_fn_returning_an_array_subclass_keeps_it(num_workers):
    loader = DataLoader([1.0, -2.0, 3.0, -4.0], batch_size=2, num_workers=num_workers,
                        collate_fn=_masked_collate)
    batches = list(loader)
    assert all(type(b) is np.ma.MaskedArray for b in batches)
    assert [b.mask.tolist() for b in batches] == [[False, True], [False, True]]
    assert [b.data.tolist() for b in batches] == [[1.0, -2.0], [3.0, -4.0]]


class ReportsItsKeys(fl.Dataset):
    """Each sample says what ``__getitems__`` (or ``__getitem__``) was handed."""

    def __init__(self, batched=True):
        if not batched:
            self.__getitems__ = None  # torch's fetcher then indexes sample by sample

    def __len__(self):
        return 8

    def __getitem__(self, key):
        return f"item {type(key).__name__}"

    def __getitems__(self, keys):
        return [f"batch {type(keys).__name__}"] * len(keys)


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("batched", [True, False], ids=["getitems", "getitem"])
def test_a_custom_batch_samplers_batches_reach_the_dataset_as_yielded(torch, num_workers, batched):
    batches = [np.array([3, 1]), (0, 2), [4, 5]]

    def keys_seen(library):
        loader = library.DataLoader(ReportsItsKeys(batched), batch_sampler=batches,
                                    num_workers=num_workers)
        return [sample for batch in loader for sample in batch]

    assert keys_seen(fl) == keys_seen(torch.utils.data)


def test_our_batch_samplers_batches_reach_the_dataset_as_lists_of_ints(torch):
    def keys_seen(library, **kwargs):
        return [s for b in library.DataLoader(ReportsItsKeys(), batch_size=3, **kwargs) for s in b]

    for kwargs in ({}, {"shuffle": True}, {"num_workers": 2}):
        assert keys_seen(fl, **kwargs) == keys_seen(torch.utils.data, **kwargs) == ["batch list"] * 8


@pytest.mark.parametrize("change", ["set_epoch", "rank"])
@pytest.mark.parametrize("batch_size", [1, 3, None])
def test_a_sampler_changed_between_iter_and_the_first_batch_applies_as_in_torch(torch, change,
                                                                                 batch_size):
    # torch's single-process iterator draws the order at the first batch (its
    # BatchSampler is a generator): a training loop that makes its iterator,
    # then calls set_epoch (or sets the rank), gets that epoch's shard.
    # Without batching the sampler itself is iterated at iter(), too early.
    def epoch(lib, late):
        dataset = list(range(12))
        sampler = lib.DistributedSampler(dataset, num_replicas=2, rank=0, shuffle=True, seed=0)
        loader = lib.DataLoader(dataset, sampler=sampler, batch_size=batch_size)

        def apply():
            if change == "set_epoch":
                sampler.set_epoch(5)
            else:
                sampler.rank = 1

        if not late:
            apply()
        it = iter(loader)
        if late:
            apply()
        return [np.asarray(batch).tolist() for batch in it]

    torch_applies = epoch(torch.utils.data, late=True) == epoch(torch.utils.data, late=False)
    assert torch_applies == (batch_size is not None)
    assert (epoch(fl, late=True) == epoch(fl, late=False)) == torch_applies


# -- the iterator's ``_workers``, which code that watches workers reads ------

class _PidOfMaker:
    """Sample i is the pid of the process that made it."""

    def __init__(self, n=8):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        import os

        return os.getpid()


def _workers_seen(library, persistent):
    """What code that watches workers sees of ``_workers`` over two epochs."""
    import os

    import psutil

    loader = library.DataLoader(_PidOfMaker(), batch_size=2, num_workers=2,
                                persistent_workers=persistent)
    iterator = iter(loader)
    workers = iterator._workers
    first = next(iterator)
    children = {child.pid for child in psutil.Process().children()}
    seen = {
        "running": (len(workers), [w.is_alive() for w in workers], [w.exitcode for w in workers],
                    all(w.pid in children and w.pid != os.getpid() for w in workers)),
        # Batch k comes from worker k % num_workers: the list is in worker-id order.
        "in worker-id order": int(first[0]) == workers[0].pid
        and int(next(iterator)[0]) == workers[1].pid,
    }
    list(iterator)
    again = iter(loader)
    seen["next epoch, same list"] = again is iterator and again._workers is workers
    seen["after the epoch"] = (iterator._workers is workers, [w.exitcode for w in workers],
                               [w.is_alive() for w in workers])
    list(again)
    again._shutdown_workers()
    seen["after shutdown"] = [w.exitcode for w in again._workers]
    return seen


@pytest.mark.timeout(60)
@pytest.mark.parametrize("persistent", [False, True])
def test_the_iterators_workers_are_torchs_list_of_processes(torch, no_leaks, persistent):
    ours, theirs = _workers_seen(fl, persistent), _workers_seen(torch.utils.data, persistent)
    assert ours == theirs
    assert ours["running"] == (2, [True, True], [None, None], True)
    assert ours["in worker-id order"]
    assert ours["after shutdown"] == [0, 0]
    if not persistent:  # torch's shutdown joins the workers of a finished epoch
        assert ours["after the epoch"] == (True, [0, 0], [False, False])


@pytest.mark.timeout(60)
def test_a_killed_worker_shows_in_workers_as_in_torch(torch, no_leaks):
    import os
    import signal

    def killed(library):
        iterator = iter(library.DataLoader(_PidOfMaker(40), batch_size=2, num_workers=2,
                                           persistent_workers=True))
        next(iterator)
        victim = iterator._workers[1]
        os.kill(victim.pid, signal.SIGKILL)
        # torch says "is killed by signal" or "exited unexpectedly", as its
        # signal handler or its poll notices first.
        pattern = f"DataLoader worker \\(pid(\\(s\\))? {victim.pid}\\)"
        with pytest.raises(RuntimeError, match=pattern):
            for _ in range(20):
                next(iterator)
        seen = (victim.is_alive(), victim.exitcode, iterator._workers[1] is victim)
        iterator._shutdown_workers()
        return seen

    assert killed(fl) == killed(torch.utils.data) == (False, -signal.SIGKILL, True)


def test_the_single_process_iterator_has_no_workers_as_torchs(torch):
    assert not hasattr(iter(DataLoader(range(4))), "_workers")
    assert not hasattr(iter(torch.utils.data.DataLoader(range(4))), "_workers")
