"""Worker processes: same batches for any num_workers, seeding, worker info, epochs."""

import collections
import collections.abc
import dataclasses
import gc
import os
import pickle
import random
import subprocess
import sys
import time
import types

import numpy as np
import pytest

import fastload as fl
from fastload import ArrayDataset, DataLoader, get_worker_info
from batch_compare import assert_same_as_torch

pytestmark = pytest.mark.timeout(120)


class DictSamples(fl.Dataset):
    def __init__(self, n=150):
        self.n = n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return {"x": np.full(16, i, dtype=np.float32), "y": i, "name": f"item{i}",
                "nested": [np.int8(i % 100), (i * 0.5,)]}


def flatten(batch):
    """A comparable, order-preserving form of any batch."""
    if isinstance(batch, np.ndarray):
        return ("array", batch.dtype.str, batch.shape, batch.tobytes())
    if isinstance(batch, dict):
        return ("dict", tuple((k, flatten(v)) for k, v in batch.items()))
    if isinstance(batch, (list, tuple)):
        return (type(batch).__name__, tuple(flatten(v) for v in batch))
    return ("value", batch)


def epoch(loader):
    return [flatten(b) for b in loader]


DATASETS = {
    "dict": lambda: DictSamples(),
    "array": lambda: fl.ArrayDataset(np.arange(150 * 12, dtype=np.int32).reshape(150, 12),
                                     np.arange(150) % 3),
    "strings": lambda: [f"s{i}" for i in range(150)],
}


@pytest.mark.parametrize("name", sorted(DATASETS))
@pytest.mark.parametrize("shuffle", [False, True])
def test_same_batches_for_any_num_workers(name, shuffle):
    results = {}
    for num_workers in (0, 2, 3):
        loader = DataLoader(DATASETS[name](), batch_size=16, shuffle=shuffle, generator=42,
                            num_workers=num_workers)
        results[num_workers] = epoch(loader)
    assert len(results[0]) == 10
    assert results[0] == results[2] == results[3]


def test_same_batches_with_custom_collate_and_without_batching():
    def collate(samples):
        return {"sum": np.stack([s["x"] for s in samples]).sum(axis=0), "names": tuple(
            s["name"] for s in samples), "first": samples[0]["y"]}

    for kwargs in (dict(batch_size=8, collate_fn=collate), dict(batch_size=None)):
        single = epoch(DataLoader(DictSamples(40), **kwargs))
        multi = epoch(DataLoader(DictSamples(40), num_workers=2, **kwargs))
        assert single == multi and len(single) > 0


def test_mapping_subclasses_come_back_from_workers_as_themselves():
    # A dict subclass travels as an emptied clone of the first sample; an
    # OrderedDict emptied with dict.clear could not be pickled.
    samples = [collections.OrderedDict(a=np.full(2, i), b=f"n{i}") for i in range(12)]
    samples += [collections.defaultdict(list, a=np.full(2, i), b=f"n{i}") for i in range(12)]
    single = list(DataLoader(samples, batch_size=4))
    multi = list(DataLoader(samples, batch_size=4, num_workers=2))
    assert [type(b) for b in multi] == [collections.OrderedDict] * 3 + [collections.defaultdict] * 3
    assert [flatten(b) for b in multi] == [flatten(b) for b in single]
    assert multi[-1].default_factory is list


def test_equal_keys_of_other_types_come_back_from_workers_as_the_samples_have_them(torch):
    # 1, True and 1.0 are equal keys: a worker reusing the layout of the batch
    # before (num_workers=1: every batch from one worker) kept its key types.
    samples = [{1: np.full(2, i)} for i in range(2)] + [{True: np.full(2, i)} for i in range(2)]
    samples += [{1.0: np.full(2, i)} for i in range(2)] + [{np.int64(1): np.full(2, i)}
                                                          for i in range(2)]

    def key_types(loader):
        return [[type(key) for key in batch] for batch in loader]

    expected = key_types(torch.utils.data.DataLoader(samples, batch_size=2, num_workers=1))
    assert expected == [[int], [bool], [float], [np.int64]]
    assert key_types(DataLoader(samples, batch_size=2)) == expected
    assert key_types(DataLoader(samples, batch_size=2, num_workers=1)) == expected
    custom = key_types(DataLoader(samples, batch_size=2, num_workers=1, collate_fn=lambda b: b[0]))
    assert custom == expected


def test_equal_dtypes_of_other_scalar_types_come_back_from_workers_as_they_were():
    # np.longlong and np.int64 are equal dtypes on Linux, with their own scalar types.
    samples = [np.arange(3, dtype=np.longlong)] * 2 + [np.arange(3, dtype=np.int64)] * 2
    single = [batch.dtype.char for batch in DataLoader(samples, batch_size=2)]
    multi = [batch.dtype.char for batch in DataLoader(samples, batch_size=2, num_workers=1)]
    assert single == multi == [np.dtype(np.longlong).char, np.dtype(np.int64).char]
    assert type(next(iter(DataLoader(samples, batch_size=2, num_workers=1)))[0, 0]) is np.longlong


def test_in_order_false_yields_every_batch_once():
    loader = DataLoader(fl.ArrayDataset(np.arange(300)), batch_size=10, num_workers=2,
                        in_order=False)
    values = np.concatenate([b[0] for b in loader])
    assert sorted(values.tolist()) == list(range(300))


def test_persistent_workers_keep_pids_and_match_non_persistent():
    kwargs = dict(batch_size=16, shuffle=True, generator=9, num_workers=2)
    persistent = DataLoader(DictSamples(), persistent_workers=True, **kwargs)
    plain = DataLoader(DictSamples(), **kwargs)
    pids = None
    for _ in range(3):
        iterator = iter(persistent)
        got = [flatten(b) for b in iterator]
        assert got == epoch(plain)
        if pids is None:
            pids = list(iterator.worker_pids)
        assert iterator.worker_pids == pids
    assert all(psutil_alive(pid) for pid in pids)
    persistent._iterator.shutdown()


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_loader_pickles_after_an_epoch_as_torchs_does(torch, num_workers):
    kwargs = dict(batch_size=16, shuffle=True, num_workers=num_workers)
    ours = DataLoader(DictSamples(), generator=5, **kwargs)
    theirs = torch.utils.data.DataLoader(DictSamples(), **kwargs)
    first = epoch(ours)
    for _ in theirs:
        pass
    ours_copy = pickle.loads(pickle.dumps(ours))
    theirs_copy = pickle.loads(pickle.dumps(theirs))
    # The copy carries the seed stream on from where the original is.
    second = epoch(ours_copy)
    assert second == epoch(ours)
    assert second != first
    assert len(second) == len(list(theirs_copy))


def test_a_persistent_loader_refuses_to_be_pickled_after_an_epoch_as_torchs_does(torch):
    kwargs = dict(batch_size=16, num_workers=2, persistent_workers=True)
    ours = DataLoader(DictSamples(), **kwargs)
    theirs = torch.utils.data.DataLoader(DictSamples(), **kwargs)
    for loader in (ours, theirs):
        for _ in loader:
            pass
    with pytest.raises(NotImplementedError, match="_MultiProcessIter cannot be pickled"):
        pickle.dumps(ours)
    with pytest.raises(NotImplementedError):
        pickle.dumps(theirs)
    ours._iterator.shutdown()
    theirs._iterator._shutdown_workers()


def test_persistent_workers_survive_an_abandoned_epoch():
    loader = DataLoader(fl.ArrayDataset(np.arange(100)), batch_size=5, num_workers=2,
                        persistent_workers=True)
    iterator = iter(loader)
    for _ in range(3):
        next(iterator)
    assert [b[0].tolist() for b in loader] == [list(range(i, i + 5)) for i in range(0, 100, 5)]
    loader._iterator.shutdown()


def psutil_alive(pid):
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False


class WorkerReport(fl.Dataset):
    """Each sample reports which worker made it, and that worker's seeds."""

    def __len__(self):
        return 24

    def __getitem__(self, i):
        info = get_worker_info()
        return {"id": info.id, "num_workers": info.num_workers, "seed": info.seed,
                "py": random.random(), "np": float(np.random.random()),
                "init": getattr(info.dataset, "initialised_by", -1)}


def mark_initialised(worker_id):
    info = get_worker_info()
    assert info is not None and info.id == worker_id
    info.dataset.initialised_by = worker_id


def test_worker_info_seeds_and_worker_init_fn():
    assert get_worker_info() is None
    loader = DataLoader(WorkerReport(), batch_size=None, num_workers=3, generator=123,
                        worker_init_fn=mark_initialised)
    samples = list(loader)
    ids = {s["id"] for s in samples}
    assert ids <= {0, 1, 2} and len(ids) >= 2
    seeds = {s["id"]: s["seed"] for s in samples}
    base = seeds[min(seeds)] - min(seeds)
    assert all(seed == base + wid for wid, seed in seeds.items())
    assert all(s["num_workers"] == 3 and s["init"] == s["id"] for s in samples)
    # Worker i seeded Python's and numpy's global RNGs with base_seed + i: its
    # first sample drew the first value of those streams.
    firsts = {}
    for s in samples:
        firsts.setdefault(s["id"], s)
    for wid, s in firsts.items():
        assert s["py"] == random.Random(base + wid).random()
        assert s["np"] == np.random.RandomState((base + wid) % 2**32).random_sample()
    # The same generator seed gives the same base seed.
    again = list(DataLoader(WorkerReport(), batch_size=None, num_workers=3, generator=123,
                            worker_init_fn=mark_initialised))
    assert {s["id"]: s["seed"] for s in again} == seeds


def _worker_info():
    """This worker's info, in a fastload worker or (for the differential tests) a torch one."""
    info = get_worker_info()
    if info is None and "torch" in sys.modules:
        info = sys.modules["torch"].utils.data.get_worker_info()
    return info


class WorkerInfoFields(fl.Dataset):
    def __len__(self):
        return 4

    def __getitem__(self, i):
        info = _worker_info()
        return {name: getattr(info, name) for name in ("id", "num_workers", "worker_method", "rng")}


def test_worker_info_has_torchs_fields_and_values(torch):
    ours = list(DataLoader(WorkerInfoFields(), batch_size=None, num_workers=2))
    theirs = list(torch.utils.data.DataLoader(WorkerInfoFields(), batch_size=None, num_workers=2))
    assert ours == theirs
    assert {s["worker_method"] for s in ours} == {"multiprocessing"}


class UnevenWorkers(fl.Dataset):
    """Worker 0 is slow; each sample is a draw from the worker's numpy generator.

    A loader that let the faster worker take more batches would change which
    worker, and so which draws, make each batch, from one run to the next.
    """

    def __init__(self, n=240, delay=0.002):
        self.n = n
        self.delay = delay

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        info = _worker_info()
        if info is not None and info.id == 0 and i % 4 == 0:
            time.sleep(self.delay)
        return np.random.randint(1 << 30), -1 if info is None else info.id


@pytest.mark.parametrize("num_workers", [2, 3])
def test_batch_k_is_made_by_worker_k_mod_num_workers_however_fast_they_are(num_workers):
    loader = DataLoader(UnevenWorkers(), batch_size=4, num_workers=num_workers, generator=3)
    workers = [int(ids[0]) for _, ids in loader]
    assert workers == [k % num_workers for k in range(60)]


def test_in_order_the_main_process_reads_only_the_answer_it_needs_next():
    # NOTE [ Waking for the awaited answer only ] (_loading/pool.py): worker 1's
    # answers wait in its pipe while worker 0's batch is awaited, so answers
    # are read exactly in batch order, however far ahead worker 1 is.
    loader = DataLoader(UnevenWorkers(), batch_size=4, num_workers=2)
    iterator = iter(loader)
    read_order = []
    receive = iterator._receive

    def recording_receive(*args):
        worker, reply = receive(*args)
        read_order.append(reply[1])
        return worker, reply

    iterator._receive = recording_receive
    assert len(list(iterator)) == 60
    assert read_order == list(range(60))


def test_a_dataset_drawing_from_numpy_repeats_its_batches_with_the_same_seed():
    def run(seed):
        loader = DataLoader(UnevenWorkers(), batch_size=4, num_workers=2, generator=seed)
        return [draws.tolist() for draws, _ in loader]

    first = run(7)
    assert run(7) == first
    assert run(8) != first


def test_out_of_order_a_slow_worker_is_passed_over_while_it_has_its_share():
    loader = DataLoader(UnevenWorkers(), batch_size=4, num_workers=2, in_order=False)
    made = collections.Counter()
    for _, ids in loader:
        made[int(ids[0])] += 1
    assert sum(made.values()) == 60
    assert made[1] > made[0], made  # worker 0 sleeps in one sample of each of its batches


def test_workers_are_assigned_batches_as_torchs_are(torch):
    ours = DataLoader(UnevenWorkers(), batch_size=4, num_workers=3)
    theirs = torch.utils.data.DataLoader(UnevenWorkers(), batch_size=4, num_workers=3)
    assert [ids.tolist() for _, ids in ours] == [ids.tolist() for _, ids in theirs]


class UnevenStreams(fl.IterableDataset):
    """Worker ``w`` yields ``10 * (w + 1)`` samples tagged with its id; worker 0 is slow."""

    def __iter__(self):
        info = _worker_info()
        for i in range(10 * (info.id + 1)):
            if info.id == 0:
                time.sleep(0.001)
            yield info.id


def test_exhausted_workers_are_skipped_in_turn_as_torchs_are(torch):
    # torch's loader needs its own IterableDataset base to treat it as one; fastload's takes both.
    class Streams(UnevenStreams, torch.utils.data.IterableDataset):
        pass

    ours = [b.tolist() for b in DataLoader(Streams(), batch_size=3, num_workers=3)]
    theirs = [b.tolist() for b in torch.utils.data.DataLoader(Streams(), batch_size=3,
                                                              num_workers=3)]
    assert ours == theirs
    assert sorted(sum(ours, [])) == sorted([0] * 10 + [1] * 20 + [2] * 30)


class ShardedStream(fl.IterableDataset):
    def __init__(self, n):
        self.n = n

    def __iter__(self):
        info = get_worker_info()
        if info is None:
            return iter(range(self.n))
        return iter(range(info.id, self.n, info.num_workers))


@pytest.mark.parametrize("num_workers", [2, 3])
def test_iterable_dataset_sharded_by_worker_info_yields_each_sample_once(num_workers):
    for batch_size in (None, 4):
        loader = DataLoader(ShardedStream(101), batch_size=batch_size, num_workers=num_workers)
        values = []
        for batch in loader:
            values.extend(np.atleast_1d(batch).tolist())
        assert sorted(values) == list(range(101))


def test_unsharded_iterable_dataset_is_duplicated_per_worker_as_torch():
    loader = DataLoader(ShardedStreamUnsharded(10), batch_size=5, num_workers=2)
    values = sorted(v for b in loader for v in b.tolist())
    assert values == sorted(list(range(10)) * 2)


class ShardedStreamUnsharded(fl.IterableDataset):
    def __init__(self, n):
        self.n = n

    def __iter__(self):
        return iter(range(self.n))


def test_a_dataset_written_for_torchs_workers_runs_unchanged(torch):
    # Only the DataLoader import changed: the dataset splits itself with
    # torch's get_worker_info, in __iter__ or in a worker_init_fn, as in
    # torch's IterableDataset docs.  Without torch's worker info, each worker
    # would yield the whole range: every sample twice, silently.
    class Range(torch.utils.data.IterableDataset):
        def __init__(self, start, end, shard_in_iter):
            self.start, self.end, self.shard_in_iter = start, end, shard_in_iter

        def __iter__(self):
            info = torch.utils.data.get_worker_info()
            if info is None or not self.shard_in_iter:
                return iter(range(self.start, self.end))
            per_worker = -(-(self.end - self.start) // info.num_workers)
            first = self.start + info.id * per_worker
            return iter(range(first, min(first + per_worker, self.end)))

    def shard_in_init(worker_id):
        info = torch.utils.data.get_worker_info()
        ds, whole = info.dataset, (info.dataset.start, info.dataset.end)
        per_worker = -(-(whole[1] - whole[0]) // info.num_workers)
        ds.start = whole[0] + worker_id * per_worker
        ds.end = min(ds.start + per_worker, whole[1])

    for shard_in_iter, init in ((True, None), (False, shard_in_init)):
        def values(loader_type):
            loader = loader_type(Range(3, 17, shard_in_iter), batch_size=None, num_workers=2,
                                 worker_init_fn=init)
            return sorted(int(v) for v in loader)

        assert values(DataLoader) == values(torch.utils.data.DataLoader) == list(range(3, 17))

    class TorchState(torch.utils.data.Dataset):
        def __len__(self):
            return 4

        def __getitem__(self, i):
            info = torch.utils.data.get_worker_info()
            return [torch.get_num_threads(), torch.initial_seed() == info.seed, info.id, info.num_workers]

    def report(loader_type):
        return sorted(tuple(int(x) for x in sample)
                      for sample in loader_type(TorchState(), batch_size=None, num_workers=2))

    # One torch thread per worker, torch's RNG seeded with the worker's seed.
    assert report(DataLoader) == report(torch.utils.data.DataLoader) == \
        [(1, 1, 0, 2), (1, 1, 0, 2), (1, 1, 1, 2), (1, 1, 1, 2)]


@pytest.mark.timeout(120)
def test_torch_imported_only_inside_a_spawned_worker_is_set_up_as_torchs_workers(torch):
    # A spawned worker starts without torch; the dataset imports it in its
    # __getitem__, and must still find torch's worker info, one thread, its seed.
    from datasets_for_workers import LazyTorchShards

    assert "import torch" not in open(sys.modules["datasets_for_workers"].__file__).read().split(
        "class LazyTorchShards")[0], "the module itself must not import torch"
    loader = DataLoader(LazyTorchShards(), batch_size=None, num_workers=2,
                        multiprocessing_context="spawn")
    assert sorted(tuple(sample) for sample in loader) == [(0, 2, 1), (0, 2, 1), (1, 2, 1),
                                                          (1, 2, 1)]


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_dataset_of_tensors_gives_torchs_batches(torch, num_workers):
    # The default output="numpy", but the samples hold tensors: every array
    # of the batch is a tensor, as torch's DataLoader gives.
    class Pairs(torch.utils.data.Dataset):
        def __len__(self):
            return 6

        def __getitem__(self, i):
            return {"x": torch.full((2, 3), float(i)), "y": i, "name": f"s{i}"}

    ours = list(DataLoader(Pairs(), batch_size=4, num_workers=num_workers))
    theirs = list(torch.utils.data.DataLoader(Pairs(), batch_size=4, num_workers=num_workers))
    assert len(ours) == len(theirs) == 2
    for mine, torchs in zip(ours, theirs):
        assert_same_as_torch(mine, torchs, tensors=True)


def test_torch_output_from_workers(torch):
    batch = next(iter(DataLoader(DictSamples(8), batch_size=4, num_workers=2, output="torch")))
    assert isinstance(batch["x"], torch.Tensor) and batch["x"].shape == (4, 16)
    assert batch["y"].tolist() == [0, 1, 2, 3]
    assert batch["name"] == ["item0", "item1", "item2", "item3"]


@pytest.mark.parametrize("collate", ["default", "custom"])
def test_numpy_views_of_torch_batches_survive_share_memory(torch, collate):
    # share_memory_() (as a torch.multiprocessing queue's put does) moves a
    # batch's storage out of its ring slot: a numpy view taken before must not
    # see the slot's next batches (NOTE [ Tensors keep their slot ]), and the
    # slots must still come back once nothing uses them.
    gc.collect()  # batches an earlier test left in garbage cycles are not this test's
    kwargs = {} if collate == "default" else {"collate_fn": fl.default_collate}
    loader = DataLoader(ArrayDataset(np.repeat(np.arange(200, dtype=np.float32), 256).reshape(200, 256)),
                        batch_size=4, num_workers=2, output="torch", **kwargs)
    for _ in range(2):
        views = []
        for k, (x,) in enumerate(loader):
            views.append((k, x.numpy()))
            x.share_memory_()
            assert x.is_shared()
        for k, view in views:
            np.testing.assert_array_equal(view[:, 0], np.arange(4 * k, 4 * k + 4, dtype=np.float32))
            assert (view == view[:, :1]).all()
        del views, view, x
    from fastload import collate as collate_module
    assert collate_module._arrays_of_storages == {}  # every batch gone: nothing kept


Point = collections.namedtuple("Point", "x y")


class NamedRecord(dict):
    """A dict subclass whose constructor takes more than the items."""

    def __init__(self, name, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.name = name


class ReadOnlySequence(collections.abc.Sequence):
    def __init__(self, items):
        self._items = list(items)

    def __getitem__(self, i):
        return self._items[i]

    def __len__(self):
        return len(self._items)


# Samples whose containers output="torch" must rebuild as torch's collate does.
TORCH_OUTPUT_SAMPLES = {
    "defaultdict": lambda i: collections.defaultdict(list, x=np.float32(i), y=np.arange(2) + i),
    "dict-subclass": lambda i: NamedRecord("r", img=np.zeros(3, np.float32) + i, label=i),
    "mappingproxy": lambda i: types.MappingProxyType({"x": np.float32(i)}),
    "deque": lambda i: collections.deque([np.arange(2) + i]),
    "sequence": lambda i: ReadOnlySequence([np.arange(2) + i, i]),
    # A string first: torch leaves the array beside it in the list as it is.
    "string-led-list": lambda i: ("s", 0) if i % 2 == 0 else (np.arange(2) + i, 1),
}


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("kind", sorted(TORCH_OUTPUT_SAMPLES))
def test_torch_output_rebuilds_containers_as_torch(torch, kind, num_workers):
    data = [TORCH_OUTPUT_SAMPLES[kind](i) for i in range(6)]
    if kind == "mappingproxy" and num_workers:
        # Its type cannot be pickled to the main process (torch's loader hangs
        # until its timeout): the worker's error says so.
        with pytest.raises(pickle.PicklingError, match="sending the batch"):
            next(iter(DataLoader(data, batch_size=2, num_workers=num_workers, output="torch")))
        return
    ours = list(DataLoader(data, batch_size=2, num_workers=num_workers, output="torch"))
    theirs = list(torch.utils.data.DataLoader(data, batch_size=2))
    assert len(ours) == len(theirs) == 3
    for mine, torchs in zip(ours, theirs):
        assert_same_as_torch(mine, torchs, tensors=True)
        assert getattr(mine, "name", None) == getattr(torchs, "name", None)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_torch_output_of_a_custom_collate_keeps_its_containers(torch, num_workers):
    def collate(samples):
        return (np.array(samples), {"k": np.float32(1)}, Point(np.zeros(2), "s"), ["t", 2])

    batch = next(iter(DataLoader(list(range(6)), batch_size=2, num_workers=num_workers,
                                 collate_fn=collate, output="torch")))
    assert type(batch) is tuple and len(batch) == 4
    assert batch[0].tolist() == [0, 1] and isinstance(batch[0], torch.Tensor)
    assert type(batch[1]) is dict and batch[1]["k"].dtype == torch.float32
    assert type(batch[2]) is Point and isinstance(batch[2].x, torch.Tensor) and batch[2].y == "s"
    assert batch[3] == ["t", 2]


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("output", ["numpy", "torch"])
def test_unbatched_samples_are_converted_as_torch_converts_them(torch, num_workers, output):
    # batch_size=None: torch's default_convert makes tensors of every array and
    # numpy scalar; in numpy output, ours does so once a sample holds tensors.
    data = [{"a": torch.arange(3) + i, "b": (np.arange(2) + i, "s"), "c": np.float32(i)}
            for i in range(4)]
    data += [collections.defaultdict(list, x=np.float32(i), y=np.arange(2) + i) for i in range(2)]
    ours = list(DataLoader(data, batch_size=None, num_workers=num_workers, output=output))
    theirs = list(torch.utils.data.DataLoader(data, batch_size=None))
    for i, (mine, torchs) in enumerate(zip(ours, theirs, strict=True)):
        assert_same_as_torch(mine, torchs, tensors=output == "torch" or i < 4)


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.filterwarnings("ignore:Using a non-tuple sequence:UserWarning")  # torch's, on [True]
def test_array_dataset_takes_only_integer_indices_as_torch(torch, num_workers):
    x = np.arange(12.0).reshape(4, 3)
    ours_ds, theirs_ds = fl.ArrayDataset(x), torch.utils.data.TensorDataset(torch.from_numpy(x))
    for bad in (1.7, np.float64(2.0), "1"):
        with pytest.raises((IndexError, TypeError)):
            next(iter(torch.utils.data.DataLoader(theirs_ds, sampler=[bad])))
        with pytest.raises(IndexError):  # ArrayDataset[bad]'s own error, not row 1 or 2
            next(iter(DataLoader(ours_ds, sampler=[bad], num_workers=num_workers)))
    # True indexes the whole array (torch: tensor[True]), as ArrayDataset[True] does.
    ours = next(iter(DataLoader(ours_ds, sampler=[True], num_workers=num_workers)))
    theirs = next(iter(torch.utils.data.DataLoader(theirs_ds, sampler=[True])))
    assert_same_as_torch(ours, theirs)
    # Integers of any kind still take the gather path, with the same rows.
    ours = next(iter(DataLoader(ours_ds, sampler=[np.uint8(3), 1, np.int32(0)], batch_size=3,
                                num_workers=num_workers)))
    np.testing.assert_array_equal(ours[0], x[[3, 1, 0]])


def test_batches_are_views_of_a_shared_slot():
    from fastload._ring import SlotLease

    batch = next(iter(DataLoader(DictSamples(8), batch_size=4, num_workers=2)))
    base = batch["x"]
    while isinstance(base, np.ndarray):
        base = base.base
    assert isinstance(base, SlotLease)
    assert np.shares_memory(np.asarray(base), batch["x"])
    assert np.shares_memory(np.asarray(base), batch["y"])



def test_tasks_are_sized_for_the_smallest_pipe_when_it_cannot_be_enlarged(monkeypatch):
    # A user over pipe-user-pages-soft gets 2-page pipes that refuse to grow:
    # the task budget comes from the pipes' real size, the smallest of them,
    # so a task that would not fit (2,000 indices, 16 KB) goes through shared
    # memory instead of a write that could wait on a busy worker.
    from fastload._loading import pool

    real_fcntl = pool.fcntl

    def refusing_fcntl(fd, command, *args):
        if command == pool._F_SETPIPE_SZ:
            real_fcntl(fd, command, 8192)  # what such a user's new pipe holds
            raise PermissionError(1, "Operation not permitted")
        return real_fcntl(fd, command, *args)

    monkeypatch.setattr(pool, "fcntl", refusing_fcntl)
    data = np.arange(20_000, dtype=np.int64)
    loader = DataLoader(ArrayDataset(data), batch_size=2_000, shuffle=True, generator=3,
                        num_workers=2)
    it = iter(loader)
    assert it._pool._max_task_bytes == 8192 // (loader.prefetch_factor + 2)
    batches = [batch.copy() for batch in it]
    expected = [batch.copy() for batch in DataLoader(ArrayDataset(data), batch_size=2_000,
                                                     shuffle=True, generator=3)]
    assert len(batches) == 10
    for ours, reference in zip(batches, expected):
        np.testing.assert_array_equal(ours, reference)


def test_memmap_array_dataset_travels_to_spawn_workers_by_path(tmp_path):
    path = tmp_path / "rows.u8"
    rows = np.lib.format.open_memmap(str(path), mode="w+", dtype=np.uint8, shape=(400, 3, 16, 16))
    rows[:] = np.arange(400, dtype=np.uint8)[:, None, None, None]
    rows.flush()
    data = np.load(str(path), mmap_mode="r")
    dataset = fl.ArrayDataset(data, np.arange(400))
    # 307 KB of rows: what a spawn worker receives must be the path, not the bytes.
    from fastload._loading.wire.payload import pickle_for_workers
    assert len(pickle_for_workers([("dataset", dataset)], "spawn").data) < 16_000
    loader = DataLoader(dataset, batch_size=50, shuffle=True, generator=4, num_workers=2,
                        multiprocessing_context="spawn")
    single = DataLoader(dataset, batch_size=50, shuffle=True, generator=4)
    assert epoch(loader) == epoch(single)


def test_forking_workers_leaves_the_callers_gc_freeze_state_alone():
    class FrozenCount(fl.Dataset):
        def __len__(self):
            return 4

        def __getitem__(self, i):
            return gc.get_freeze_count()

    assert gc.get_freeze_count() == 0
    # Workers inherit the heap frozen (their GC does not walk, and so copy, it) ...
    counts = [b.tolist() for b in DataLoader(FrozenCount(), batch_size=2, num_workers=2)]
    assert all(c > 0 for batch in counts for c in batch)
    # ... and the parent gets its own objects back.
    assert gc.get_freeze_count() == 0
    gc.freeze()
    try:
        list(DataLoader(FrozenCount(), batch_size=2, num_workers=2))
        assert gc.get_freeze_count() > 0  # a caller's own freeze is kept, not undone
    finally:
        gc.unfreeze()


@pytest.mark.timeout(60)
@pytest.mark.parametrize("method", ["spawn", "forkserver"])
def test_idle_persistent_workers_outlive_the_liveness_interval(method):
    # Workers check that the main process lives while they wait for tasks;
    # a forkserver worker's parent is the fork server, which must not count.
    from fastload._loading.parent_watch import LIVENESS_INTERVAL

    loader = DataLoader(ArrayDataset(np.arange(40)), batch_size=8, num_workers=2,
                        persistent_workers=True, multiprocessing_context=method)
    first = [b[0].tolist() for b in loader]
    pids = loader._iterator.worker_pids
    time.sleep(3 * LIVENESS_INTERVAL)
    assert [b[0].tolist() for b in loader] == first
    assert loader._iterator.worker_pids == pids


def test_parent_watch_sees_its_process_exit():
    from fastload._loading.parent_watch import ParentWatch

    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"],
                             stdin=subprocess.PIPE)
    watches = [ParentWatch(child.pid), ParentWatch(child.pid)]
    watches[1].close()  # the fallback without a pidfd (not our child: os.kill probing)
    try:
        assert [w.gone() for w in watches] == [False, False]
        child.stdin.close()
        child.wait(timeout=10)
        assert [w.gone() for w in watches] == [True, True]
    finally:
        if child.poll() is None:
            child.kill()
        for w in watches:
            w.close()


@pytest.mark.skipif(not (sys.platform.startswith("linux") and os.confstr("CS_GNU_LIBC_VERSION")),
                    reason="the malloc thresholds are glibc's")
def test_workers_keep_large_temporaries_off_fresh_pages():
    # See NOTE [ Why workers tune malloc ]: without it, every sample's 4 MiB of
    # temporaries would be mapped and faulted in again (about 1,000 faults).
    from datasets_for_workers import PageFaultCounting

    loader = DataLoader(PageFaultCounting(24), batch_size=4, num_workers=2)
    faults = np.concatenate([batch for batch in loader])
    assert faults.shape == (24,)
    later = np.concatenate([faults[4:8], faults[12:]])  # past each worker's first batch
    assert np.median(later) < 50, f"page faults per sample: {faults.tolist()}"


class Record(collections.abc.MutableMapping):
    """A mapping whose constructor takes something else first: only a clone rebuilds it."""

    def __init__(self, tag, items=None):
        self.tag = tag
        self.items = dict(items or {})

    def __getitem__(self, key):
        return self.items[key]

    def __setitem__(self, key, value):
        self.items[key] = value

    def __delitem__(self, key):
        del self.items[key]

    def __iter__(self):
        return iter(self.items)

    def __len__(self):
        return len(self.items)


class Records(fl.Dataset):
    def __len__(self):
        return 6

    def __getitem__(self, i):
        return Record(f"tag-{i}", {"x": np.full(3, i, dtype=np.int32), "name": f"r{i}"})


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_mutable_mapping_sample_is_rebuilt_as_torch_rebuilds_it(torch, num_workers):
    ours = list(DataLoader(Records(), batch_size=3, num_workers=num_workers))
    theirs = list(torch.utils.data.DataLoader(Records(), batch_size=3, num_workers=num_workers))
    for mine, torch_batch in zip(ours, theirs):
        assert type(mine) is type(torch_batch) is Record
        assert mine.tag == torch_batch.tag  # the first sample's, cloned
        assert list(mine) == list(torch_batch) == ["x", "name"]
        np.testing.assert_array_equal(mine["x"], torch_batch["x"].numpy())
        assert mine["name"] == torch_batch["name"]
    assert [b.tag for b in ours] == ["tag-0", "tag-3"]


# Tensors whose plain pickle does not unpickle in torch 2.13 (torch's own
# workers send them through shared memory: NOTE [ Pickled as torch's workers
# pickle ] in _loading/wire/layouts.py).  complex32 warns that it is experimental.
UNPICKLABLE_DTYPES = ("uint16", "uint32", "uint64", "float8_e4m3fn", "complex32")


def tensors_of_every_such_dtype(i):
    torch = sys.modules["torch"]
    return {dtype: torch.full((3,), i, dtype=getattr(torch, dtype)) for dtype in UNPICKLABLE_DTYPES}


@dataclasses.dataclass
class Crops:
    """A custom collate_fn's batch object: opaque to the layout, it travels pickled."""
    tensors: dict
    count: int


class LabelPair(tuple):
    """A tuple subclass: it travels pickled, as it is."""


class TensorBag(collections.UserDict):
    """A mapping that is no dict: it travels pickled, as it is."""


def collate_into_objects(samples):
    return [Crops(samples[0], len(samples)),
            LabelPair(sample["uint32"] for sample in samples),
            TensorBag(last=samples[-1]["uint64"])]


class Measured(collections.UserDict):
    """A mutable mapping with state: the batch is a clone of the first sample (torch's
    rule), which travels in the layout."""

    def __init__(self, items, unit):
        super().__init__(items)
        self.unit = unit


def assert_same_objects_as_torch(ours, theirs, path="batch"):
    """Same types all the way down; tensors of the same dtype, shape and bytes."""
    torch = sys.modules["torch"]
    assert type(ours) is type(theirs), f"{path}: {type(ours)} is not {type(theirs)}"
    if isinstance(theirs, torch.Tensor):
        assert (ours.dtype, ours.shape) == (theirs.dtype, theirs.shape), path
        assert ours.reshape(-1).view(torch.uint8).tolist() == \
            theirs.reshape(-1).view(torch.uint8).tolist(), path
    elif isinstance(theirs, np.ndarray):
        np.testing.assert_array_equal(ours, theirs, err_msg=path)
    elif dataclasses.is_dataclass(theirs):
        for field in dataclasses.fields(theirs):
            assert_same_objects_as_torch(getattr(ours, field.name), getattr(theirs, field.name),
                                         f"{path}.{field.name}")
    elif isinstance(theirs, collections.abc.Mapping):
        assert list(ours) == list(theirs), path
        for key in theirs:
            assert_same_objects_as_torch(ours[key], theirs[key], f"{path}[{key!r}]")
    elif isinstance(theirs, (list, tuple)):
        assert len(ours) == len(theirs), path
        for i, (mine, yours) in enumerate(zip(ours, theirs)):
            assert_same_objects_as_torch(mine, yours, f"{path}[{i}]")
    else:
        assert ours == theirs, path


@pytest.mark.timeout(180)
@pytest.mark.filterwarnings("ignore:ComplexHalf support is experimental")
@pytest.mark.parametrize("method", ["fork", "spawn", "forkserver"])
def test_tensors_inside_pickled_leaves_arrive_as_from_torchs_workers(torch, method, no_leaks):
    # A dataclass, a tuple subclass and a UserDict subclass from a custom
    # collate_fn travel pickled; plain pickling made their uint16 (and other)
    # tensors fail to unpickle in the main process, crashing the epoch.
    samples = [tensors_of_every_such_dtype(i) for i in range(12)]
    # A spawned (or forkserver's) worker imports torch to unpickle the tensors, most
    # of its cost: one such worker sends every batch, the first and the later ones.
    kwargs = dict(batch_size=4, num_workers=2 if method == "fork" else 1,
                  collate_fn=collate_into_objects)
    theirs = list(torch.utils.data.DataLoader(samples, **kwargs))
    loader = DataLoader(samples, multiprocessing_context=method, persistent_workers=True, **kwargs)
    for _ in range(2):  # every batch's tensors, not only the first one's
        ours = list(loader)
        assert len(ours) == len(theirs) == 3
        assert_same_objects_as_torch(ours, theirs)
    loader._iterator.shutdown()


@pytest.mark.timeout(120)
@pytest.mark.filterwarnings("ignore:ComplexHalf support is experimental")
def test_a_mapping_clone_holding_such_a_tensor_arrives_as_from_torchs_workers(torch, no_leaks):
    # The batch is a clone of the first sample, which travels in the layout:
    # the layout is pickled as the values are.
    samples = [Measured({"x": np.full(2, i, dtype=np.int32)}, tensors_of_every_such_dtype(7))
               for i in range(12)]
    theirs = list(torch.utils.data.DataLoader(samples, batch_size=4, num_workers=2))
    ours = list(DataLoader(samples, batch_size=4, num_workers=2))
    assert len(ours) == len(theirs) == 3
    for mine, yours in zip(ours, theirs):
        assert_same_objects_as_torch(mine.unit, yours.unit, "batch.unit")
        assert type(mine) is Measured and list(mine) == list(yours) == ["x"]
        np.testing.assert_array_equal(mine["x"], yours["x"].numpy())


INDEX_DTYPES = ("int64", *UNPICKLABLE_DTYPES)


class IndexTensorBatches:
    """A batch sampler yielding index tensors (e.g. ``torch.randperm(n).split(b)``,
    cast), one batch of each of ``INDEX_DTYPES``."""

    def __init__(self, elementwise=False):
        self.elementwise = elementwise

    def __iter__(self):
        torch = sys.modules["torch"]
        for number, dtype in enumerate(INDEX_DTYPES):
            batch = torch.arange(number, number + 3).to(getattr(torch, dtype))
            yield list(batch) if self.elementwise else batch

    def __len__(self):
        return len(INDEX_DTYPES)


class EchoIndex:
    """Gives back the index it is given, as the dataset received it."""

    def __len__(self):
        return 10

    def __getitem__(self, index):
        return index


@pytest.mark.timeout(120)
@pytest.mark.filterwarnings("ignore:ComplexHalf support is experimental")
@pytest.mark.parametrize("method, elementwise", [("fork", False), ("fork", True), ("spawn", False)],
                         ids=["tensor-fork", "list_of_tensors-fork", "tensor-spawn"])
def test_index_tensors_of_every_dtype_reach_the_workers_as_in_torch(torch, method, elementwise,
                                                                    no_leaks):
    # Tasks holding a uint16 (and other) tensor were pickled plainly, which
    # torch 2.13 cannot unpickle: the worker died at its first task.  A spawned
    # worker imports torch, most of its cost: one takes every task there.
    kwargs = dict(batch_sampler=IndexTensorBatches(elementwise),
                  num_workers=1 if method == "spawn" else 2,
                  multiprocessing_context=method, collate_fn=list)
    theirs = list(torch.utils.data.DataLoader(EchoIndex(), **kwargs))
    ours = list(DataLoader(EchoIndex(), **kwargs))
    assert len(ours) == len(INDEX_DTYPES)
    assert [str(batch[0].dtype) for batch in ours] == [f"torch.{dtype}" for dtype in INDEX_DTYPES]
    assert_same_objects_as_torch(ours, theirs)


@pytest.mark.timeout(120)
def test_tensors_handed_over_from_workers_leave_no_descriptor_open(torch, no_leaks):
    # A tensor's shared memory comes over as a file descriptor: the main
    # process holds one only while the batch lives.
    samples = [tensors_of_every_such_dtype(i) for i in range(40)]
    loader = DataLoader(samples, batch_size=4, num_workers=2, collate_fn=collate_into_objects,
                        persistent_workers=True)
    list(loader)  # warm: the workers, and whatever multiprocessing opens once
    gc.collect()
    open_before = len(os.listdir("/proc/self/fd"))
    for _ in range(3):
        batches = list(loader)
        assert batches[-1][0].tensors["uint16"].tolist() == [36, 36, 36]
        del batches
    iterator = iter(loader)  # an epoch left early: the answers drained come over too
    next(iterator)
    del iterator
    assert [batch[2]["last"].tolist() for batch in loader][:2] == [[3, 3, 3], [7, 7, 7]]
    gc.collect()
    assert len(os.listdir("/proc/self/fd")) == open_before
    loader._iterator.shutdown()
