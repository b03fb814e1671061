"""Given a ``torch.Generator``, whatever decides which samples go where is torch's
own draw on it: ``random_split`` gives torch's split (a script moved from torch's
loader keeps its validation set), the random samplers and a shuffling loader give
torch's order, and the generator ends where torch's leaves it.  An int seed or a
numpy Generator keeps fastload's kernels."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import fastload as fl

pytestmark = pytest.mark.timeout(120)


def same_state(torch, a, b) -> bool:
    return torch.equal(a.get_state(), b.get_state())


def pair(torch, seed: int):
    return torch.Generator().manual_seed(seed), torch.Generator().manual_seed(seed)


# -- random_split ---------------------------------------------------------------

def test_random_split_gives_torchs_own_test_split(torch):
    # torch's test_splits_reproducibility pins this split.
    splits = fl.random_split(range(10), [3, 7], generator=torch.Generator().manual_seed(1))
    assert [list(split) for split in splits] == [[5, 6, 1], [2, 0, 8, 9, 3, 7, 4]]


SPLITS = [
    (10, [3, 7]), (10, [10]), (10, [0, 10]), (57, [20, 30, 7]), (1000, [1, 998, 1]),
    # fractions, with the remainder handed out one at a time from the first split on
    (10, [0.3, 0.3, 0.4]), (31, [0.3, 0.3, 0.4]), (7, [0.5, 0.5]), (23, [0.1] * 10),
    (10, [1 / 3] * 3), (101, [0.25, 0.25, 0.5]), (5, [1.0]), (9, [0.9, 0.1]),
]


@pytest.mark.parametrize("size,lengths", SPLITS)
def test_random_split_is_torchs_for_every_seed(torch, size, lengths):
    for seed in range(12):
        ours_generator, torchs_generator = pair(torch, seed)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "Length of split at index 0 is 0", from both
            ours = fl.random_split(range(size), lengths, generator=ours_generator)
            torchs = torch.utils.data.random_split(range(size), lengths,
                                                   generator=torchs_generator)
        assert [list(split) for split in ours] == [list(split) for split in torchs], seed
        assert same_state(torch, ours_generator, torchs_generator)


def test_random_split_with_an_int_or_numpy_seed_keeps_fastloads_split(torch):
    by_int = [list(s) for s in fl.random_split(range(50), [0.2, 0.8], generator=4)]
    assert by_int == [list(s) for s in fl.random_split(range(50), [0.2, 0.8], generator=4)]
    by_numpy = [list(s) for s in fl.random_split(range(50), [0.2, 0.8],
                                                 generator=np.random.default_rng(4))]
    assert sorted(by_numpy[0] + by_numpy[1]) == list(range(50))


# -- samplers -------------------------------------------------------------------

def sampler_pairs():
    """(name, build) where build(module, generator) makes the sampler from either library."""
    weights = [float(i % 7) + 0.25 for i in range(40)]
    return [
        ("random", lambda m, g: m.RandomSampler(range(40), generator=g)),
        ("random num_samples < n", lambda m, g: m.RandomSampler(range(40), num_samples=13,
                                                                generator=g)),
        ("random num_samples = 2n", lambda m, g: m.RandomSampler(range(40), num_samples=80,
                                                                 generator=g)),
        ("random num_samples > n", lambda m, g: m.RandomSampler(range(40), num_samples=97,
                                                                generator=g)),
        *[(f"random with replacement {k}",
           (lambda k: lambda m, g: m.RandomSampler(range(40), replacement=True, num_samples=k,
                                                   generator=g))(k))
          for k in (1, 31, 32, 33, 64, 200)],
        ("subset", lambda m, g: m.SubsetRandomSampler([7, 3, 19, 4, 0, 11], generator=g)),
        ("subset of strings", lambda m, g: m.SubsetRandomSampler(list("abcdefg"), generator=g)),
        ("weighted", lambda m, g: m.WeightedRandomSampler(weights, 50, generator=g)),
        ("weighted without replacement", lambda m, g: m.WeightedRandomSampler(
            weights, 30, replacement=False, generator=g)),
    ]


def test_samplers_given_a_torch_generator_give_torchs_order(torch):
    for name, build in sampler_pairs():
        for seed in (0, 1, 12345):
            ours_generator, torchs_generator = pair(torch, seed)
            ours = build(fl, ours_generator)
            torchs = build(torch.utils.data, torchs_generator)
            for epoch in range(2):
                assert list(ours) == list(torchs), (name, seed, epoch)
            assert same_state(torch, ours_generator, torchs_generator), name


# -- the loader -----------------------------------------------------------------

@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_loader_over_such_a_sampler_gives_torchs_batches(torch, num_workers):
    # The loader takes a fastload sampler's epoch whole (its kernel path): still torch's order.
    data = np.arange(40, dtype=np.int64)
    for name, build in sampler_pairs():
        if name == "subset of strings":
            continue  # not indices of data
        ours_generator, torchs_generator = pair(torch, 21)
        torch.manual_seed(4)
        ours = [b.tolist() for b in fl.DataLoader(data, batch_size=6, num_workers=num_workers,
                                                  sampler=build(fl, ours_generator))]
        torch.manual_seed(4)
        torchs = [b.tolist() for b in torch.utils.data.DataLoader(
            data, batch_size=6, num_workers=num_workers,
            sampler=build(torch.utils.data, torchs_generator))]
        assert ours == torchs, name
        assert same_state(torch, ours_generator, torchs_generator), name


@pytest.mark.parametrize("workers", [dict(num_workers=0), dict(num_workers=2),
                                     dict(num_workers=2, persistent_workers=True)])
def test_a_shuffling_loader_given_a_torch_generator_gives_torchs_batches(torch, workers):
    # A persistent iterator's later epochs draw no base seed from the generator, as torch's.
    data = np.arange(37, dtype=np.int64)
    ours_generator, torchs_generator = pair(torch, 3)
    ours = fl.DataLoader(data, batch_size=5, shuffle=True, generator=ours_generator, **workers)
    torchs = torch.utils.data.DataLoader(data, batch_size=5, shuffle=True,
                                         generator=torchs_generator, **workers)
    for epoch in range(3):
        assert [b.tolist() for b in ours] == [b.tolist() for b in torchs], epoch
    assert same_state(torch, ours_generator, torchs_generator)


def test_a_resumed_loader_replays_a_torch_generators_order(torch):
    data = np.arange(40, dtype=np.int64)
    loader = fl.DataLoader(data, batch_size=4, shuffle=True,
                           generator=torch.Generator().manual_seed(8))
    iterator = iter(loader)
    head = [next(iterator).tolist() for _ in range(3)]
    state = loader.state_dict()
    rest = [b.tolist() for b in iterator]
    again = fl.DataLoader(data, batch_size=4, shuffle=True,
                          generator=torch.Generator().manual_seed(99))
    again.load_state_dict(state)
    assert [b.tolist() for b in again] == rest
    torchs = torch.utils.data.DataLoader(data, batch_size=4, shuffle=True,
                                         generator=torch.Generator().manual_seed(8))
    assert head + rest == [b.tolist() for b in torchs]
