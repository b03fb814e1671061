"""fastload.sampler against torch.utils.data's samplers.

Deterministic samplers (sequential, batching, unshuffled distributed) must
match torch exactly.  Random ones draw from a different generator, so they
are compared by structure: lengths, sets, counts, padding.  The private
loader protocol (_epoch_indices, _seed_source, and the index stream the loader
takes from a BatchSampler) is checked against the public iteration it must
reproduce.
"""

import subprocess
import sys
import warnings
from collections import Counter
from decimal import Decimal
from fractions import Fraction
from typing import Any

import numpy as np
import pytest

import fastload as fl
from fastload import sampler as fs
from fastload._loading.iterators import index_stream

SIZES = [0, 1, 2, 7, 10, 12, 13]


@pytest.fixture
def td(torch):
    return torch.utils.data


# --- sequential and batching: exact ----------------------------------------------

@pytest.mark.parametrize("source", [range(0), range(9), list("abcde")])
def test_sequential_matches_torch(td, source):
    ours, theirs = fs.SequentialSampler(source), td.SequentialSampler(source)
    assert list(ours) == list(theirs)
    assert len(ours) == len(theirs)
    assert ours._epoch_indices().tolist() == list(theirs)


def _wrapped(kind, n, module):
    if kind == "range":
        return range(n)
    if kind == "list":
        return list(range(n))
    if kind == "strided":
        return range(3, 3 + 2 * n, 2)
    return module.SequentialSampler(range(n))


@pytest.mark.parametrize("kind", ["range", "list", "strided", "sequential"])
@pytest.mark.parametrize("n", SIZES)
@pytest.mark.parametrize("batch_size", [1, 3, 5, 12, 20])
@pytest.mark.parametrize("drop_last", [False, True])
def test_batch_sampler_matches_torch(td, kind, n, batch_size, drop_last):
    ours = fs.BatchSampler(_wrapped(kind, n, fs), batch_size, drop_last)
    theirs = td.BatchSampler(_wrapped(kind, n, td), batch_size, drop_last)
    batches = list(ours)
    assert batches == list(theirs)
    assert len(ours) == len(theirs)
    assert all(type(i) is int for batch in batches for i in batch)
    stream, kernel_arrays = index_stream(ours, True)
    arrays = list(stream)
    assert [list(a) for a in arrays] == batches
    if kernel_arrays:
        assert all(a.dtype == np.int64 and a.flags.c_contiguous for a in arrays)


def test_batch_sampler_over_generic_iterable():
    # Neither ours nor a range: the loader iterates the BatchSampler itself.
    class Odd:
        def __iter__(self):
            return iter([5, 3, 1, 4, 2])

        def __len__(self):
            return 5

    for drop_last in (False, True):
        bs = fs.BatchSampler(Odd(), 2, drop_last)
        expected = [[5, 3], [1, 4]] + ([] if drop_last else [[2]])
        assert list(bs) == expected
        stream, kernel_arrays = index_stream(bs, True)
        assert not kernel_arrays and list(stream) == expected


def test_batch_sampler_honours_a_subclass_iter():
    # A subclass with its own __iter__ must not be bypassed by the kernel path.
    class Reversed(fs.SequentialSampler):
        def __iter__(self):
            return iter(range(len(self.data_source) - 1, -1, -1))

    bs = fs.BatchSampler(Reversed(range(5)), 2, False)
    assert list(bs) == [[4, 3], [2, 1], [0]]
    stream, kernel_arrays = index_stream(bs, True)
    assert not kernel_arrays and list(stream) == [[4, 3], [2, 1], [0]]


# --- random samplers: structure ---------------------------------------------------

@pytest.mark.parametrize("n", [1, 2, 10, 1000, 200003])
def test_random_sampler_is_a_permutation(td, n):
    ours = list(fs.RandomSampler(range(n), generator=1))
    theirs = list(td.RandomSampler(range(n)))
    assert len(ours) == len(theirs) == n
    assert sorted(ours) == sorted(theirs) == list(range(n))
    assert all(type(i) is int for i in ours[:10])


@pytest.mark.parametrize("num_samples", [1, 4, 10, 23, 30])
def test_random_sampler_num_samples_without_replacement(td, num_samples):
    n = 10
    ours = list(fs.RandomSampler(range(n), num_samples=num_samples, generator=3))
    theirs = list(td.RandomSampler(range(n), num_samples=num_samples))
    assert len(ours) == len(theirs) == num_samples
    assert len(fs.RandomSampler(range(n), num_samples=num_samples)) == num_samples
    # Whole permutations, then a partial one without repeats, as torch.
    for chunk_start in range(0, num_samples, n):
        chunk = ours[chunk_start:chunk_start + n]
        assert len(set(chunk)) == len(chunk)
    assert sorted(Counter(ours).values()) == sorted(Counter(theirs).values())


@pytest.mark.parametrize("num_samples", [None, 5, 1000])
def test_random_sampler_with_replacement(td, num_samples):
    ours = fs.RandomSampler(range(7), replacement=True, num_samples=num_samples, generator=2)
    theirs = td.RandomSampler(range(7), replacement=True, num_samples=num_samples)
    drawn = list(ours)
    assert len(drawn) == len(ours) == len(theirs) == len(list(theirs))
    assert set(drawn) <= set(range(7))
    if num_samples == 1000:
        assert set(drawn) == set(range(7))


def test_random_sampler_follows_dataset_size():
    data = list(range(5))
    s = fs.RandomSampler(data, generator=0)
    data.extend(range(5, 8))
    assert len(s) == 8 and sorted(s) == list(range(8))


def test_random_sampler_empty_source_errors():
    with pytest.raises(RuntimeError):
        list(fs.RandomSampler([], replacement=True, num_samples=3))
    with pytest.raises(ValueError):
        list(fs.RandomSampler([], num_samples=3))


def test_subset_random_sampler(td):
    indices = [10, 3, 99, 42, 7]
    ours = list(fs.SubsetRandomSampler(indices, generator=4))
    theirs = list(td.SubsetRandomSampler(indices))
    assert sorted(ours) == sorted(theirs) == sorted(indices)
    assert len(fs.SubsetRandomSampler(indices)) == len(td.SubsetRandomSampler(indices)) == 5
    assert sorted(fs.SubsetRandomSampler(range(4, 20, 3), generator=0)) == list(range(4, 20, 3))
    assert sorted(fs.SubsetRandomSampler(np.array([8, 6], dtype=np.int32), generator=0)) == [6, 8]
    assert list(fs.SubsetRandomSampler([])) == []


def test_subset_random_sampler_reads_indices_each_epoch():
    indices = [1, 2, 3]
    s = fs.SubsetRandomSampler(indices, generator=0)
    indices.append(4)
    assert sorted(s) == [1, 2, 3, 4]


def test_weighted_random_sampler_with_replacement(td):
    weights = [0.1, 0.0, 0.4, 2.0, 0.0, 1.0]
    ours = fs.WeightedRandomSampler(weights, 5000, generator=5)
    theirs = td.WeightedRandomSampler(weights, 5000)
    drawn = list(ours)
    assert len(drawn) == len(ours) == len(theirs) == len(list(theirs))
    assert set(drawn) == {0, 2, 3, 5} == set(theirs)
    counts = Counter(drawn)
    assert counts[3] > counts[5] > counts[2] > counts[0]


def test_weighted_random_sampler_without_replacement(td):
    weights = [0.5, 0.0, 3.0, 1.0, 2.0]
    for seed in range(20):
        drawn = list(fs.WeightedRandomSampler(weights, 4, replacement=False, generator=seed))
        assert sorted(drawn) == [0, 2, 3, 4]
    assert len(list(td.WeightedRandomSampler(weights, 4, replacement=False))) == 4
    # All five: the zero weight comes last (torch's too); six are too many for both.
    assert list(fs.WeightedRandomSampler(weights, 5, replacement=False))[-1] == 1
    assert list(td.WeightedRandomSampler(weights, 5, replacement=False))[-1] == 1
    for library in (fs, td):
        with pytest.raises(RuntimeError, match="n_sample > prob_dist.size"):
            list(library.WeightedRandomSampler(weights, 6, replacement=False))


def test_weighted_random_sampler_accepts_arrays_and_tensors(torch):
    for weights in (np.array([1.0, 0.0, 2.0], dtype=np.float32), torch.tensor([1.0, 0.0, 2.0])):
        s = fs.WeightedRandomSampler(weights, 50, generator=0)
        assert s.weights.dtype == np.float64
        assert set(s) == {0, 2}


def test_weighted_random_sampler_weights_reassigned():
    s = fs.WeightedRandomSampler([1.0, 0.0], 20, generator=0)
    assert set(s) == {0}
    s.weights = [0.0, 1.0]
    assert set(s) == {1}


@pytest.mark.parametrize("weights", [None, "abc", [1.0, None], [1.0, "a", 2.0], [1 + 2j, 1.0]])
def test_weights_that_are_not_real_numbers_are_torchs_type_error(torch, weights):
    with pytest.raises(TypeError):
        torch.utils.data.WeightedRandomSampler(weights, 2)
    with pytest.raises(TypeError, match="weights should be"):
        fs.WeightedRandomSampler(weights, 2)


def test_a_bad_weight_among_many_is_named_by_its_position():
    with pytest.raises(TypeError, match=r"weights\[1000\] is None"):
        fs.WeightedRandomSampler(list(range(1000)) + [None], 2)


def test_weights_of_real_number_objects_are_taken_as_in_torch(torch):
    weights = [Fraction(1, 2), 0, Fraction(3, 2)]
    assert torch.utils.data.WeightedRandomSampler(weights, 2).weights.tolist() == [0.5, 0, 1.5]
    sampler = fs.WeightedRandomSampler(weights, 40, generator=0)
    assert sampler.weights.tolist() == [0.5, 0, 1.5] and set(sampler) == {0, 2}


class _FailingTable:
    """A sequence whose items cannot be read: torch cannot tell its shape."""

    def __len__(self):
        return 2

    def __getitem__(self, index):
        raise KeyError(index)


# Each builds a fresh copy of its weights (a generator is used up), given the torch module.
WEIGHTS = {
    "list of 0-d tensors": lambda torch: [torch.tensor(1.0), torch.tensor(0.0), torch.tensor(2.0)],
    "list of 1-element tensors": lambda torch: [torch.tensor([1.0]), torch.tensor([0.0]),
                                                torch.tensor([2])],
    "list of 1x1 tensors": lambda torch: [torch.tensor([[1.0]]), torch.tensor([[3.0]])],
    "list of tensors and numbers": lambda torch: [torch.tensor([1.0]), 0, np.float32(2.5),
                                                  torch.tensor(4.0)],
    "list of tensors that require grad": lambda torch: [torch.tensor([1.0], requires_grad=True),
                                                        torch.tensor(2.0, requires_grad=True)],
    "float32 tensor that requires grad": lambda torch: torch.tensor([1.0, 0.0, 2.0],
                                                                    requires_grad=True),
    "float64 tensor that requires grad": lambda torch: torch.tensor([1.0, 2.0], dtype=torch.float64,
                                                                    requires_grad=True),
    "parameter": lambda torch: torch.nn.Parameter(torch.tensor([1.0, 2.0])),
    "bfloat16 tensor": lambda torch: torch.tensor([1.5, 0.0, 2.25], dtype=torch.bfloat16),
    "list of bfloat16 tensors": lambda torch: [torch.tensor(1.5, dtype=torch.bfloat16)] * 3,
    "complex tensor": lambda torch: torch.tensor([1 + 2j, 3 - 1j]),
    "list of 2-element tensors": lambda torch: [torch.tensor([1.0, 2.0])] * 2,
    "list of empty tensors": lambda torch: [torch.tensor([])] * 2,
    "tensor then a list": lambda torch: [torch.tensor([1.0]), [2.0]],
    "list of floats": lambda torch: [1.0, 0.0, 3.0],
    "decimals": lambda torch: [Decimal("0.5"), Decimal(2)],
    "list of 0-d numpy arrays": lambda torch: [np.array(1.0), np.array(2.0)],
    "a 0-d numpy array after a number": lambda torch: [1.0, np.array(2.0)],
    "a 1-element numpy array after a number": lambda torch: [1.0, np.array([2.0])],
    "numpy array of objects": lambda torch: np.array([1.0, 2.0], dtype=object),
    "numpy longdouble array": lambda torch: np.array([1.0, 2.0], dtype=np.longdouble),
    "numpy complex array": lambda torch: np.array([1 + 2j, 2.0]),
    "numpy array reversed": lambda torch: np.arange(1.0, 4.0)[::-1],
    "numpy array every other": lambda torch: np.arange(1.0, 7.0)[::2],
    "numpy big-endian array": lambda torch: np.arange(1.0, 4.0).astype(">f8"),
    "numpy field of a record array": lambda torch: np.zeros(3, dtype=[("w", "f8"), ("b", "i1")])["w"],
    "list of strings": lambda torch: ["1", "2"],
    "a string after a number": lambda torch: [1.0, "2"],
    "ragged": lambda torch: [[1.0, 2.0], [3.0]],
    "rows of a list and a set": lambda torch: [[1.0, 2.0], {3.0, 4.0}],
    "a number then a row": lambda torch: [[1.0], 2.0],
    "unreadable sequence": lambda torch: _FailingTable(),
    "generator": lambda torch: (w for w in [1.0, 2.0]),
    "int too large for a float": lambda torch: [10**400, 1],
    "numpy numbers": lambda torch: [np.float16(1.5), np.uint64(2**64 - 1), np.bool_(True), 2],
    "a numpy timedelta among numbers": lambda torch: [1.0, np.timedelta64(3, "s")],
    "bytearray": lambda torch: bytearray(b"\x01\x00\x02"),
    "empty list": lambda torch: [],
}


def _weighted_outcome(library, weights, generator):
    """What WeightedRandomSampler makes of ``weights``: the type of what construction
    raised, or the weights taken and the length, and an epoch's length (or the type
    of what drawing it raised)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # complex weights: torch's and numpy's casts warn
            sampler = library.WeightedRandomSampler(weights, 5, generator=generator)
    except Exception as error:
        return type(error)
    try:
        drawn = len(list(sampler))
    except Exception as error:
        drawn = type(error)
    return sampler.weights.tolist(), len(sampler), drawn


@pytest.mark.parametrize("case", list(WEIGHTS))
def test_weights_are_taken_and_refused_as_torch_as_tensor_does(torch, case):
    theirs = _weighted_outcome(torch.utils.data, WEIGHTS[case](torch), torch.Generator().manual_seed(3))
    ours = _weighted_outcome(fs, WEIGHTS[case](torch), 3)
    assert ours == theirs


def test_a_float64_tensor_that_requires_grad_is_shared_as_in_torch(torch):
    mine, yours = (torch.tensor([1.0, 0.0, 0.0], dtype=torch.float64, requires_grad=True)
                   for _ in range(2))
    ours = fs.WeightedRandomSampler(mine, 40, generator=0)
    theirs = torch.utils.data.WeightedRandomSampler(yours, 40)
    assert set(ours) == set(theirs) == {0}
    with torch.no_grad():
        mine[:] = yours[:] = torch.tensor([0.0, 0.0, 1.0])
    assert set(ours) == set(theirs) == {2}


def test_sparse_weights_are_taken_as_in_torch(torch):
    weights = torch.tensor([0.0, 1.0, 0.0, 2.0]).to_sparse()
    theirs = torch.utils.data.WeightedRandomSampler(weights, 30)
    ours = fs.WeightedRandomSampler(weights, 30, generator=0)
    assert ours.weights.tolist() == theirs.weights.to_dense().tolist()
    # torch has no sparse multinomial; ours draws from the dense copy.
    assert set(ours) == {1, 3}


# --- distributed --------------------------------------------------------------

@pytest.mark.parametrize("arguments", [dict(num_replicas=2, rank=0.5), dict(num_replicas=2, rank=1.5),
                                       dict(num_replicas=2.0, rank=1), dict(num_replicas=1.5, rank=0)])
def test_distributed_non_integer_rank_or_replicas_is_torchs_type_error(torch, arguments):
    theirs = torch.utils.data.DistributedSampler(range(10), **arguments)
    with pytest.raises(TypeError):  # torch: when iterated, slicing with a float
        list(theirs)
    name = "rank" if isinstance(arguments["rank"], float) else "num_replicas"
    with pytest.raises(TypeError, match=f"DistributedSampler: {name} should be an integer"):
        fs.DistributedSampler(range(10), **arguments)


def test_distributed_rank_and_replicas_may_be_numpy_integers(td):
    ours = fs.DistributedSampler(range(10), num_replicas=np.int64(2), rank=np.int32(1), shuffle=False)
    theirs = td.DistributedSampler(range(10), num_replicas=np.int64(2), rank=np.int32(1),
                                   shuffle=False)
    assert list(ours) == list(theirs) == [1, 3, 5, 7, 9]


@pytest.mark.parametrize("seed, epoch", [(1.5, 0), (0, 1.5)])
def test_distributed_non_integer_seed_or_epoch_fails_when_shuffling_as_in_torch(td, seed, epoch):
    theirs = td.DistributedSampler(range(10), 2, 0, seed=seed)
    ours = fs.DistributedSampler(range(10), 2, 0, seed=seed)
    theirs.set_epoch(epoch)
    ours.set_epoch(epoch)
    with pytest.raises(RuntimeError):
        list(theirs)
    with pytest.raises(RuntimeError, match=f"seed={seed!r}, epoch={epoch!r}"):
        list(ours)
    # Without shuffling neither uses the seed.
    unshuffled = fs.DistributedSampler(range(10), 2, 0, shuffle=False, seed=seed)
    assert list(unshuffled) == list(td.DistributedSampler(range(10), 2, 0, shuffle=False,
                                                          seed=seed)) == [0, 2, 4, 6, 8]

@pytest.mark.parametrize("n", [0, 1, 5, 10, 11, 12])
@pytest.mark.parametrize("replicas", [1, 2, 3, 4, 7])
@pytest.mark.parametrize("drop_last", [False, True])
def test_distributed_unshuffled_matches_torch(td, n, replicas, drop_last):
    for rank in range(replicas):
        ours = fs.DistributedSampler(range(n), replicas, rank, shuffle=False, drop_last=drop_last)
        theirs = td.DistributedSampler(range(n), replicas, rank, shuffle=False, drop_last=drop_last)
        assert list(ours) == list(theirs)
        assert len(ours) == len(theirs)
        assert (ours.num_samples, ours.total_size) == (theirs.num_samples, theirs.total_size)
        assert ours._epoch_indices().tolist() == list(theirs)


@pytest.mark.parametrize("n", [1, 5, 10, 11, 1000, 200001])
@pytest.mark.parametrize("replicas", [1, 3, 4])
@pytest.mark.parametrize("drop_last", [False, True])
def test_distributed_shuffled_structure(td, n, replicas, drop_last):
    ours = [list(fs.DistributedSampler(range(n), replicas, r, seed=3, drop_last=drop_last))
            for r in range(replicas)]
    theirs = [list(td.DistributedSampler(range(n), replicas, r, seed=3, drop_last=drop_last))
              for r in range(replicas)]
    assert [len(x) for x in ours] == [len(x) for x in theirs]
    merged, merged_theirs = Counter(sum(ours, [])), Counter(sum(theirs, []))
    assert sorted(merged.values()) == sorted(merged_theirs.values())
    if drop_last:
        assert max(merged.values(), default=1) == 1
    else:
        assert set(merged) == set(range(n))


def test_distributed_epochs_and_seeds():
    def rank_lists(epoch, seed=0):
        out = []
        for r in range(3):
            s = fs.DistributedSampler(range(30), 3, r, seed=seed)
            s.set_epoch(epoch)
            out.append(list(s))
        return out

    first = rank_lists(0)
    assert sorted(sum(first, [])) == list(range(30))
    assert rank_lists(0) == first
    assert rank_lists(1) != first
    assert rank_lists(0, seed=1) != first
    s = fs.DistributedSampler(range(30), 3, 0, seed=5)
    s.set_epoch(7)
    assert s.epoch == 7 and not hasattr(s, "_seed_source")


def test_distributed_rank_from_environment(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("RANK", "2")
    s = fs.DistributedSampler(range(10), shuffle=False)
    assert (s.num_replicas, s.rank) == (4, 2)
    assert list(s) == [2, 6, 0]  # padded by repeating from the start
    assert fs.DistributedSampler(range(10), rank=0).num_replicas == 4
    monkeypatch.setenv("RANK", "4")
    with pytest.raises(ValueError, match=r"Invalid rank 4, rank should be in the interval \[0, 3\]"):
        fs.DistributedSampler(range(10))
    monkeypatch.setenv("RANK", "two")
    with pytest.raises(ValueError, match="RANK='two'"):
        fs.DistributedSampler(range(10))


def test_distributed_without_group_or_environment(td, monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.delenv("RANK", raising=False)
    with pytest.raises(ValueError) as theirs:
        td.DistributedSampler(range(10))
    with pytest.raises(ValueError) as ours:
        fs.DistributedSampler(range(10))
    assert str(ours.value).startswith(str(theirs.value))
    with pytest.raises(ValueError):
        fs.DistributedSampler(range(10), num_replicas=2)


def test_distributed_rank_from_process_group(torch, tmp_path, monkeypatch):
    dist = torch.distributed
    if not dist.is_available():
        pytest.skip("torch.distributed is not available in this build")
    monkeypatch.setenv("WORLD_SIZE", "5")  # the group must win over the environment
    monkeypatch.setenv("RANK", "3")
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        s = fs.DistributedSampler(range(6), shuffle=False)
        assert (s.num_replicas, s.rank) == (1, 0)
        assert list(s) == list(range(6))
    finally:
        dist.destroy_process_group()


def test_import_does_not_import_torch(tmp_path):
    code = ("import sys, os; os.environ['WORLD_SIZE'] = '2'; os.environ['RANK'] = '1';"
            "import fastload.sampler as s, fastload.distributed; list(s.DistributedSampler(range(5)));"
            "list(s.RandomSampler(range(5))); assert 'torch' not in sys.modules, 'torch imported'")
    subprocess.run([sys.executable, "-c", code], check=True)


# --- typing and module names, as torch's ----------------------------------------------

# torch's public sampler and dataset classes, each with fastload's of that name.
PUBLIC_CLASSES = {
    "Dataset": "Dataset", "IterableDataset": "IterableDataset", "TensorDataset": "ArrayDataset",
    "ConcatDataset": "ConcatDataset", "ChainDataset": "ChainDataset", "Subset": "Subset",
    "StackDataset": "StackDataset", "Sampler": "Sampler", "SequentialSampler": "SequentialSampler",
    "RandomSampler": "RandomSampler", "SubsetRandomSampler": "SubsetRandomSampler",
    "WeightedRandomSampler": "WeightedRandomSampler", "BatchSampler": "BatchSampler",
    "DistributedSampler": "DistributedSampler",
}


def _subscription_outcomes(cls):
    """For each parameter list, the type of what ``cls[...]`` raised, or None."""
    outcomes = []
    for parameters in (int, Any, (int, str)):
        try:
            cls[parameters]
        except Exception as error:
            outcomes.append(type(error))
        else:
            outcomes.append(None)
    return outcomes


@pytest.mark.parametrize("torch_name", list(PUBLIC_CLASSES))
def test_generic_subscription_as_torch(td, torch_name):
    # Annotations such as DistributedSampler[int] run when user code is imported:
    # each class must be generic exactly when torch's is.
    ours, theirs = getattr(fl, PUBLIC_CLASSES[torch_name]), getattr(td, torch_name)
    assert _subscription_outcomes(ours) == _subscription_outcomes(theirs)


def test_distributed_sampler_built_through_its_subscription_as_torch(td):
    ours = fs.DistributedSampler[int](range(7), num_replicas=2, rank=1, shuffle=False)
    theirs = td.DistributedSampler[int](range(7), num_replicas=2, rank=1, shuffle=False)
    assert list(ours) == list(theirs) == [1, 3, 5, 0]
    assert isinstance(ours, fs.DistributedSampler)


def test_distributed_module_as_torchs(td):
    from fastload import distributed
    from fastload.distributed import DistributedSampler

    assert DistributedSampler is fs.DistributedSampler is fl.DistributedSampler
    assert distributed.__all__ == td.distributed.__all__
    assert fl.distributed is distributed  # reachable after `import fastload`, as torch's
    assert all(hasattr(distributed, name) for name in distributed.__all__)


# --- validation: same error types as torch ------------------------------------------

BAD_ARGS = {
    "random replacement not bool": lambda m: m.RandomSampler(range(3), replacement=1),
    "random num_samples zero": lambda m: m.RandomSampler(range(3), num_samples=0),
    "random num_samples negative": lambda m: m.RandomSampler(range(3), num_samples=-2),
    "random num_samples float": lambda m: m.RandomSampler(range(3), num_samples=2.0),
    "random empty source": lambda m: m.RandomSampler([]),
    "weighted num_samples zero": lambda m: m.WeightedRandomSampler([1.0], 0),
    "weighted num_samples bool": lambda m: m.WeightedRandomSampler([1.0], True),
    "weighted num_samples float": lambda m: m.WeightedRandomSampler([1.0], 1.5),
    "weighted replacement not bool": lambda m: m.WeightedRandomSampler([1.0], 2, replacement=0),
    "weighted 2d weights": lambda m: m.WeightedRandomSampler([[1.0, 2.0]], 2),
    "weighted 0d weights": lambda m: m.WeightedRandomSampler(1.0, 2),
    "weighted negative": lambda m: list(m.WeightedRandomSampler([1.0, -2.0], 2)),
    "weighted nan": lambda m: list(m.WeightedRandomSampler([1.0, float("nan")], 2)),
    "weighted inf": lambda m: list(m.WeightedRandomSampler([float("inf"), 1.0], 2)),
    "weighted all zero": lambda m: list(m.WeightedRandomSampler([0.0, 0.0], 2)),
    "weighted empty": lambda m: list(m.WeightedRandomSampler([], 2)),
    "weighted too many without replacement":
        lambda m: list(m.WeightedRandomSampler([1.0, 1.0], 3, replacement=False)),
    "batch size zero": lambda m: m.BatchSampler(range(3), 0, False),
    "batch size bool": lambda m: m.BatchSampler(range(3), True, False),
    "batch size float": lambda m: m.BatchSampler(range(3), 2.0, False),
    "batch size none": lambda m: m.BatchSampler(range(3), None, False),
    "batch drop_last not bool": lambda m: m.BatchSampler(range(3), 2, 1),
    "distributed rank too big": lambda m: m.DistributedSampler(range(3), num_replicas=2, rank=2),
    "distributed rank negative": lambda m: m.DistributedSampler(range(3), num_replicas=2, rank=-1),
    "distributed zero replicas": lambda m: m.DistributedSampler(range(3), num_replicas=0, rank=0),
}


@pytest.mark.parametrize("case", list(BAD_ARGS))
def test_errors_match_torch(td, case):
    make = BAD_ARGS[case]
    with pytest.raises(Exception) as theirs:
        make(td)
    with pytest.raises(Exception) as ours:
        make(fs)
    assert type(ours.value) is type(theirs.value)
    # Where torch's message is fixed text, ours starts with it (and may add detail).
    their_message = str(theirs.value)
    if not their_message.startswith(("aminmax", "Trying")):
        assert str(ours.value).startswith(their_message)


# --- seeding and the loader protocol ---------------------------------------------

def _random_samplers(generator):
    return [
        fs.RandomSampler(range(50), generator=generator),
        fs.RandomSampler(range(50), replacement=True, num_samples=80, generator=generator),
        fs.RandomSampler(range(20), num_samples=55, generator=generator),
        fs.SubsetRandomSampler(list(range(0, 100, 2)), generator=generator),
        fs.WeightedRandomSampler(np.arange(40.0), 60, generator=generator),
        fs.WeightedRandomSampler(np.arange(40.0), 30, replacement=False, generator=generator),
    ]


@pytest.mark.parametrize("index", range(6))
def test_same_seed_same_order_different_seed_differs(index):
    a, b, c = (_random_samplers(g)[index] for g in (7, 7, 8))
    first = list(a)
    assert first == list(b)
    assert first != list(c)
    assert list(a) != first  # the next epoch draws a new seed


@pytest.mark.parametrize("index", range(6))
def test_numpy_and_torch_generators_accepted(torch, index):
    a = _random_samplers(np.random.default_rng(3))[index]
    b = _random_samplers(np.random.default_rng(3))[index]
    assert list(a) == list(b)
    c = _random_samplers(torch.Generator().manual_seed(3))[index]
    d = _random_samplers(torch.Generator().manual_seed(3))[index]
    assert list(c) == list(d)


@pytest.mark.parametrize("index", range(6))
def test_epoch_indices_equal_iteration_and_resume(index):
    s = _random_samplers(11)[index]
    state = s._seed_source.get_state()
    epoch = s._epoch_indices()
    assert epoch.dtype == np.int64 and epoch.flags.c_contiguous and epoch.ndim == 1
    s._seed_source.set_state(state)
    assert list(s) == epoch.tolist()
    # Restoring the snapshot replays the epoch; without it the next differs.
    s._seed_source.set_state(state)
    assert np.array_equal(s._epoch_indices(), epoch)
    assert not np.array_equal(s._epoch_indices(), epoch)


@pytest.mark.parametrize("index", range(6))
@pytest.mark.parametrize("drop_last", [False, True])
def test_index_batches_equal_batch_iteration(index, drop_last):
    s = _random_samplers(12)[index]
    bs = fs.BatchSampler(s, 7, drop_last)
    state = s._seed_source.get_state()
    stream, _ = index_stream(bs, True)
    arrays = list(stream)
    s._seed_source.set_state(state)
    assert [list(a) for a in arrays] == list(bs)
    assert len(arrays) == len(bs)


def test_iteration_draws_seed_lazily_like_torch():
    s = fs.RandomSampler(range(10), generator=1)
    state = s._seed_source.get_state()
    it = iter(s)
    assert s._seed_source.get_state() == state
    next(it)
    assert s._seed_source.get_state() != state


def test_generator_reassignment_restarts_stream():
    s = fs.RandomSampler(range(30), generator=4)
    first = list(s)
    s.generator = 4
    assert list(s) == first


def test_large_epoch_iterates_in_chunks():
    s = fs.RandomSampler(range(300007), generator=0)
    out = list(s)
    assert len(out) == 300007 and sorted(out) == list(range(300007))


def test_sequential_and_distributed_have_epoch_indices():
    assert fs.SequentialSampler(range(4))._epoch_indices().tolist() == [0, 1, 2, 3]
    d = fs.DistributedSampler(range(9), 2, 1)
    assert d._epoch_indices().tolist() == list(d)


def test_all_exported():
    assert set(fs.__all__) == {"Sampler", "SequentialSampler", "RandomSampler", "SubsetRandomSampler",
                               "WeightedRandomSampler", "BatchSampler", "DistributedSampler",
                               "BucketBatchSampler"}
    with pytest.raises(NotImplementedError):
        iter(fs.Sampler())


def test_weights_edited_in_place_take_effect_as_in_torch(td):
    ours = fs.WeightedRandomSampler([1.0, 1.0, 1.0], 60, generator=0)
    theirs = td.WeightedRandomSampler([1.0, 1.0, 1.0], 60)
    assert set(ours) == set(theirs) == {0, 1, 2}
    for sampler in (ours, theirs):
        sampler.weights[0] = 0
        sampler.weights[1] = 0
    assert set(ours) == set(theirs) == {2}


def test_float64_weights_are_shared_with_the_caller_as_in_torch(td):
    # torch.as_tensor shares a float64 array's memory: the caller's later edits count.
    mine, yours = np.array([1.0, 0.0, 0.0]), np.array([1.0, 0.0, 0.0])
    ours = fs.WeightedRandomSampler(mine, 40, generator=0)
    theirs = td.WeightedRandomSampler(yours, 40)
    assert set(ours) == set(theirs) == {0}
    mine[:] = yours[:] = [0.0, 0.0, 1.0]
    assert set(ours) == set(theirs) == {2}
    # Other inputs are converted, so editing the original changes nothing.
    listed = [1.0, 0.0]
    converted = fs.WeightedRandomSampler(listed, 20, generator=0)
    listed[:] = [0.0, 1.0]
    assert set(converted) == {0}
    # A read-only array is copied (the kernels write nothing, but take writable buffers).
    frozen = np.array([0.0, 2.0])
    frozen.flags.writeable = False
    assert set(fs.WeightedRandomSampler(frozen, 20, generator=0)) == {1}


@pytest.mark.parametrize("indices", [["a", "b", "c"], [(0, 1), (2, 3)], [True, False],
                                     np.array([1, 2**63], dtype=np.uint64)], ids=repr)
def test_subset_random_sampler_yields_any_indices_as_torch(td, indices):
    ours = list(fs.SubsetRandomSampler(indices, generator=0))
    theirs = list(td.SubsetRandomSampler(indices))
    assert sorted(map(repr, ours)) == sorted(map(repr, theirs))
    assert len(ours) == len(indices)
    # Each epoch is a permutation drawn from the seed, as for integer indices.
    assert list(fs.SubsetRandomSampler(indices, generator=0)) == ours


def test_subset_random_sampler_of_strings_through_the_loader():
    data = {"a": 1, "b": 2, "c": 3, "d": 4}
    loader = fl.DataLoader(data, sampler=fs.SubsetRandomSampler(list(data), generator=3),
                           batch_size=2)
    assert sorted(np.concatenate(list(loader)).tolist()) == [1, 2, 3, 4]


def _changed_distributed_epoch(library, drop_last, change):
    """What iterating a DistributedSampler of 6 samples (2 replicas, rank 1) gives
    once ``change(sampler, data)`` has run: its indices, or the type of what
    ``iter()`` raised (torch's __iter__ checks before yielding anything)."""
    data = list(range(6))
    sampler = library.DistributedSampler(data, num_replicas=2, rank=1, shuffle=False,
                                         drop_last=drop_last)
    change(sampler, data)
    try:
        indices = iter(sampler)
    except Exception as error:
        return type(error)
    return list(indices)


DISTRIBUTED_CHANGES = {
    "dataset grown": lambda sampler, data: data.extend([6, 7, 8]),
    "dataset shrunk": lambda sampler, data: data.__delitem__(slice(3, None)),
    "dataset emptied": lambda sampler, data: data.clear(),
    "more replicas": lambda sampler, data: setattr(sampler, "num_replicas", 4),
    "fewer replicas": lambda sampler, data: setattr(sampler, "num_replicas", 1),
    "zero replicas": lambda sampler, data: setattr(sampler, "num_replicas", 0),
    "rank past the replicas": lambda sampler, data: setattr(sampler, "rank", 3),
    "negative rank": lambda sampler, data: setattr(sampler, "rank", -1),
    "other valid rank": lambda sampler, data: setattr(sampler, "rank", 0),
    "replicas and rank": lambda sampler, data: vars(sampler).update(num_replicas=3, rank=2),
    "replicas and sizes": lambda sampler, data: vars(sampler).update(
        num_replicas=3, rank=2, num_samples=2, total_size=6),
}


@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("change", list(DISTRIBUTED_CHANGES))
def test_distributed_sampler_changed_after_construction_as_torch(td, drop_last, change):
    change = DISTRIBUTED_CHANGES[change]
    assert _changed_distributed_epoch(fs, drop_last, change) == _changed_distributed_epoch(
        td, drop_last, change)


def test_more_replicas_after_construction_fail_when_iterated():
    sampler = fs.DistributedSampler(range(10), num_replicas=2, rank=0)
    sampler.num_replicas = 4
    assert len(sampler) == 5  # as torch: the length was fixed at construction
    with pytest.raises(AssertionError,
                       match=r"^Number of subsampled indices \(3\) does not match num_samples \(5\)"):
        iter(sampler)
    with pytest.raises(AssertionError, match="subsampled"):
        list(fl.DataLoader(range(10), sampler=sampler, batch_size=2))


@pytest.mark.parametrize("num_samples", [3, 4, 6])
def test_without_replacement_zero_weights_come_last_once_the_others_run_out(td, num_samples):
    weights = [1.0, 0.0, 1.0, 0.0, 0.0, 1.0]
    ours = list(fs.WeightedRandomSampler(weights, num_samples, replacement=False, generator=0))
    theirs = list(td.WeightedRandomSampler(weights, num_samples, replacement=False))
    assert len(ours) == len(theirs) == num_samples
    assert len(set(ours)) == num_samples
    # Both draw every positive weight first, then zero-weight indices.
    assert set(ours[:3]) == set(theirs[:3]) == {0, 2, 5}
    assert all(weights[i] == 0 for i in ours[3:]) and all(weights[i] == 0 for i in theirs[3:])
