"""``BucketBatchSampler``: batches of similar length, each index once an epoch, token
budgets kept, reproducible and resumable through the DataLoader, sharded evenly."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import fastload as fl
from fastload import BucketBatchSampler, DataLoader
from fastload.collate import pad_collate

pytestmark = pytest.mark.timeout(120)


def lognormal_lengths(n: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return np.clip(rng.lognormal(np.log(100), 0.8, n).astype(np.int64), 1, 2000)


class Sequences(fl.Dataset):
    """Sample ``i`` is ``{'ids': int32 array of lengths[i] entries equal to i, 'index': i}``."""

    def __init__(self, lengths):
        self.lengths = np.asarray(lengths)

    def __len__(self):
        return len(self.lengths)

    def __getitem__(self, i):
        return {"ids": np.full(int(self.lengths[i]), i, dtype=np.int32), "index": i}


def indices_of(loader) -> list[list[int]]:
    return [batch["index"].tolist() for batch in loader]


# -- what an epoch holds ---------------------------------------------------------

@settings(max_examples=150, deadline=None)
@given(lengths=st.lists(st.integers(0, 60), max_size=300), batch_size=st.integers(1, 17),
       multiplier=st.integers(1, 6), drop_last=st.booleans(), shuffle=st.booleans(),
       extra_tokens=st.one_of(st.none(), st.integers(0, 200)), seed=st.integers(0, 2**32))
def test_every_index_once_per_epoch_and_batches_keep_their_limits(
        lengths, batch_size, multiplier, drop_last, shuffle, extra_tokens, seed):
    n = len(lengths)
    max_tokens = None if extra_tokens is None else max(lengths, default=0) + extra_tokens + 1
    sampler = BucketBatchSampler(lengths, batch_size, drop_last=drop_last, shuffle=shuffle,
                                 bucket_size_multiplier=multiplier, max_tokens=max_tokens,
                                 generator=seed)
    expected_len = len(sampler)
    batches = list(sampler)
    assert len(batches) == expected_len
    seen = [i for batch in batches for i in batch]
    assert len(seen) == len(set(seen))
    assert len(seen) == (n - n % batch_size if drop_last else n)
    if not drop_last:
        assert sorted(seen) == list(range(n))
    assert all(1 <= len(batch) <= batch_size for batch in batches)
    if max_tokens is None:
        short = [batch for batch in batches if len(batch) < batch_size]
        assert len(short) <= (0 if drop_last else 1)
    else:
        assert all(len(b) * max(lengths[i] for i in b) <= max_tokens for b in batches)


def reference_unshuffled(lengths, batch_size, multiplier, drop_last=False):
    """shuffle=False, written plainly: chunks in order, each stably sorted by length, cut."""
    n = len(lengths)
    order = list(range(n - n % batch_size if drop_last else n))
    chunk = batch_size * multiplier
    batches = []
    for start in range(0, len(order), chunk):
        part = sorted(order[start:start + chunk], key=lambda i: lengths[i])
        batches += [part[k:k + batch_size] for k in range(0, len(part), batch_size)]
    return batches


@pytest.mark.parametrize("drop_last", [False, True])
def test_without_shuffle_buckets_are_sorted_chunks_in_order(drop_last):
    lengths = lognormal_lengths(1000, seed=4).tolist()
    sampler = BucketBatchSampler(lengths, 16, drop_last=drop_last, shuffle=False,
                                 bucket_size_multiplier=5)
    expected = reference_unshuffled(lengths, 16, 5, drop_last)
    assert list(sampler) == expected
    assert list(sampler) == expected  # deterministic, epoch after epoch
    sampler.set_epoch(3)
    assert list(sampler) == expected


def test_max_tokens_packs_as_many_as_fit_and_never_more():
    lengths = lognormal_lengths(5000, seed=1)
    sampler = BucketBatchSampler(lengths, 128, max_tokens=4096, generator=0)
    batches = list(sampler)
    assert len(batches) == len(sampler)
    costs = [len(b) * lengths[b].max() for b in batches]
    assert max(costs) <= 4096
    # Greedy within a sorted chunk: a batch that stopped short of batch_size
    # could not take one more sample of its chunk (the next is at least as long).
    full = sum(len(b) == 128 for b in batches)
    assert np.mean(costs) > 0.8 * 4096 or full > len(batches) / 2


def test_a_sample_longer_than_max_tokens_is_refused_naming_it():
    lengths = [5, 7, 300, 2]
    with pytest.raises(ValueError, match=r"sample 2 has length 300, more than max_tokens=100"):
        BucketBatchSampler(lengths, 4, max_tokens=100)


def test_padding_waste_is_far_below_random_batches():
    lengths = lognormal_lengths(20000, seed=7)

    def waste(batches):
        padded = sum(len(b) * lengths[b].max() for b in batches)
        return 1 - lengths.sum() / padded

    bucketed = waste(list(BucketBatchSampler(lengths, 64, generator=0)))
    randomly = waste(list(fl.BatchSampler(fl.RandomSampler(range(20000), generator=0), 64, False)))
    assert bucketed < randomly / 3, (bucketed, randomly)


# -- seeds and epochs -----------------------------------------------------------

def test_same_seed_same_batches_and_epochs_differ():
    lengths = lognormal_lengths(2000)
    a = BucketBatchSampler(lengths, 32, generator=11)
    b = BucketBatchSampler(lengths, 32, generator=np.random.default_rng(11))
    c = BucketBatchSampler(lengths, 32, generator=11)
    first_a, first_b = list(a), list(b)
    assert first_a == list(c)
    assert list(a) != first_a  # the stream moves on, as RandomSampler's does
    c.set_epoch(1)
    assert list(c) != list(BucketBatchSampler(lengths, 32, generator=11))
    assert sorted(map(len, first_b)) == sorted(map(len, first_a))


def test_a_torch_generator_seeds_it(torch):
    lengths = lognormal_lengths(500)
    runs = [list(BucketBatchSampler(lengths, 8, generator=torch.Generator().manual_seed(5)))
            for _ in range(2)]
    assert runs[0] == runs[1]


def test_len_with_max_tokens_is_the_epochs_and_does_not_consume_the_stream():
    lengths = lognormal_lengths(3000, seed=2)
    sampler = BucketBatchSampler(lengths, 64, max_tokens=6000, generator=3)
    twin = BucketBatchSampler(lengths, 64, max_tokens=6000, generator=3)
    counts = []
    for epoch in range(4):
        sampler.set_epoch(epoch)
        twin.set_epoch(epoch)
        expected = len(sampler)
        assert len(sampler) == expected
        iterator = iter(sampler)
        batches = [next(iterator)]
        assert len(sampler) == expected  # during the epoch: that epoch's
        batches += list(iterator)
        assert len(batches) == expected
        assert batches == list(twin)  # len() drew nothing the epoch did not
        counts.append(expected)
    assert len(set(counts)) > 1 or counts[0] > 0


# -- through the DataLoader -----------------------------------------------------

@pytest.mark.parametrize("max_tokens", [None, 4000])
def test_same_batches_for_any_number_of_workers(max_tokens):
    lengths = lognormal_lengths(1500, seed=3)
    runs = []
    for workers in (0, 2):
        sampler = BucketBatchSampler(lengths, 32, max_tokens=max_tokens, generator=21)
        loader = DataLoader(Sequences(lengths), batch_sampler=sampler, num_workers=workers,
                            collate_fn=pad_collate())
        runs.append([indices_of(loader) for _ in range(2)])
    assert runs[0] == runs[1]
    assert runs[0][0] != runs[0][1]


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("stop", [1, 17, "last"])
def test_resume_mid_epoch_gives_the_remaining_batches_exactly(workers, stop):
    lengths = lognormal_lengths(1200, seed=5)

    def make():
        sampler = BucketBatchSampler(lengths, 32, max_tokens=3000, generator=8)
        return DataLoader(Sequences(lengths), batch_sampler=sampler, num_workers=workers,
                          collate_fn=pad_collate())

    loader = make()
    loader.batch_sampler.set_epoch(2)
    first = indices_of(loader)  # epoch 2's batches, uninterrupted
    loader = make()
    loader.batch_sampler.set_epoch(2)
    count = len(first) - 1 if stop == "last" else stop
    taken = []
    with warnings.catch_warnings():
        # Its order is one a state can save (other warnings, such as torch's
        # worker-count one on a 1-CPU machine, are not this test's).
        warnings.filterwarnings("error", message="DataLoader.state_dict")
        for batch in loader:
            taken.append(batch["index"].tolist())
            if len(taken) == count:
                state = loader.state_dict()
                break
    resumed = make()  # a fresh process would build it at epoch 0
    resumed.load_state_dict(state)
    assert taken + indices_of(resumed) == first


def test_a_state_from_other_bucket_settings_is_refused():
    lengths = lognormal_lengths(300)
    loader = DataLoader(Sequences(lengths), collate_fn=pad_collate(),
                        batch_sampler=BucketBatchSampler(lengths, 16, max_tokens=3000, generator=1))
    iterator = iter(loader)
    next(iterator)
    state = loader.state_dict()
    for other in (BucketBatchSampler(lengths, 16, max_tokens=2500, generator=1),
                  BucketBatchSampler(lengths[::-1].copy(), 16, max_tokens=3000, generator=1)):
        with pytest.raises(ValueError, match="max_tokens|lengths"):
            DataLoader(Sequences(lengths), batch_sampler=other,
                       collate_fn=pad_collate()).load_state_dict(state)


def test_a_state_saved_before_the_sampler_modules_were_joined_still_resumes():
    # Earlier fastload named this sampler fastload.bucket_sampler.BucketBatchSampler
    # in a state; a checkpoint from then resumes the same batches.
    lengths = lognormal_lengths(300)

    def make():
        return DataLoader(Sequences(lengths), collate_fn=pad_collate(),
                          batch_sampler=BucketBatchSampler(lengths, 16, max_tokens=3000, generator=1))

    first = indices_of(make())
    loader = make()
    iterator = iter(loader)
    taken = [next(iterator)["index"].tolist() for _ in range(3)]
    state = loader.state_dict()

    def renamed(value):
        if isinstance(value, dict):
            return {key: renamed(item) for key, item in value.items()}
        if value == "fastload.sampler.BucketBatchSampler":
            return "fastload.bucket_sampler.BucketBatchSampler"
        return value

    old = renamed(state)
    assert old != state
    resumed = make()
    resumed.load_state_dict(old)
    assert taken + indices_of(resumed) == first


# -- sharding -------------------------------------------------------------------

@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("max_tokens", [None, 2500])
def test_ranks_get_as_many_batches_and_disjoint_ones(drop_last, max_tokens):
    lengths = lognormal_lengths(1000, seed=9)
    replicas = 3
    shares = [BucketBatchSampler(lengths, 16, drop_last=drop_last, max_tokens=max_tokens,
                                 generator=4, num_replicas=replicas, rank=rank)
              for rank in range(replicas)]
    whole = list(BucketBatchSampler(lengths, 16, drop_last=drop_last, max_tokens=max_tokens,
                                    generator=4))
    batches = [list(share) for share in shares]
    assert len({len(b) for b in batches}) == 1
    assert all(len(b) == len(share) for b, share in zip(batches, shares))
    flat = [tuple(batch) for rank in batches for batch in rank]
    if drop_last:
        assert len(set(flat)) == len(flat) == len(whole) - len(whole) % replicas
    else:
        assert set(flat) == {tuple(b) for b in whole}
        assert len(flat) - len(set(flat)) == -len(whole) % replicas  # only the padding repeats
    # Rank r holds every replicas-th batch of the whole list, from r on.
    assert batches[1][:3] == whole[1:1 + 3 * replicas:replicas]


@settings(max_examples=80, deadline=None)
@given(lengths=st.lists(st.integers(0, 40), max_size=200), batch_size=st.integers(1, 9),
       replicas=st.integers(1, 5), drop_last=st.booleans(), budget=st.booleans(),
       seed=st.integers(0, 2**32))
def test_every_rank_has_len_batches_and_together_they_cover_the_epoch(
        lengths, batch_size, replicas, drop_last, budget, seed):
    max_tokens = max(lengths, default=0) * 3 + 1 if budget else None
    shares = [BucketBatchSampler(lengths, batch_size, drop_last=drop_last, max_tokens=max_tokens,
                                 generator=seed, num_replicas=replicas, rank=rank)
              for rank in range(replicas)]
    counts = [len(share) for share in shares]
    batches = [list(share) for share in shares]
    assert [len(b) for b in batches] == counts and len(set(counts)) == 1
    whole = list(BucketBatchSampler(lengths, batch_size, drop_last=drop_last,
                                    max_tokens=max_tokens, generator=seed))
    flat = [tuple(batch) for rank in batches for batch in rank]
    assert set(flat) <= {tuple(b) for b in whole}
    if not drop_last:
        assert {i for batch in flat for i in batch} == set(range(len(lengths)))


def test_replicas_default_from_the_environment(monkeypatch):
    lengths = lognormal_lengths(400)
    assert BucketBatchSampler(lengths, 8).num_replicas == 1
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    shares = [BucketBatchSampler(lengths, 8, rank=rank) for rank in (0, 1)]
    assert [s.num_replicas for s in shares] == [2, 2]
    assert BucketBatchSampler(lengths, 8).rank == 1
    # generator=None, sharded: every rank draws the same order (seed 0).
    first, second = (list(s) for s in shares)
    assert not {tuple(b) for b in first} & {tuple(b) for b in second}
    monkeypatch.delenv("RANK")
    with pytest.raises(ValueError, match="RANK"):
        BucketBatchSampler(lengths, 8)


# -- arguments ------------------------------------------------------------------

@pytest.mark.parametrize("batch_size", [0, -1, True, 2.0, None])
def test_a_bad_batch_size_is_refused_as_torch_refuses_it(torch, batch_size):
    with pytest.raises(ValueError) as theirs:
        torch.utils.data.BatchSampler(range(4), batch_size, False)
    with pytest.raises(ValueError) as ours:
        BucketBatchSampler([1, 2, 3, 4], batch_size)
    assert str(ours.value) == str(theirs.value)


@pytest.mark.parametrize("kwargs, error, match", [
    (dict(drop_last=1), ValueError, "drop_last should be a boolean value"),
    (dict(shuffle="yes"), ValueError, "shuffle should be a boolean value"),
    (dict(bucket_size_multiplier=0), ValueError, "bucket_size_multiplier should be a positive"),
    (dict(max_tokens=0), ValueError, "max_tokens should be a positive"),
    (dict(num_replicas=2, rank=2), ValueError,
     r"Invalid rank 2, rank should be in the interval \[0, 1\]"),
    (dict(num_replicas=0, rank=0), ValueError, "num_replicas should be a positive"),
    (dict(generator="seed"), TypeError, "generator must be"),
])
def test_bad_arguments_name_themselves(kwargs, error, match):
    with pytest.raises(error, match=match):
        BucketBatchSampler([3, 1, 2], 2, **kwargs)


@pytest.mark.parametrize("lengths, error, match", [
    ([3, -1, 2], ValueError, r"lengths\[1\] = -1"),
    ([3, 1.5, 2], TypeError, r"lengths\[1\] is 1.5"),
    (np.array([1.0, 2.0]), TypeError, "dtype float64"),
    (np.ones((2, 2), dtype=int), ValueError, "1-d"),
])
def test_bad_lengths_are_refused_naming_the_entry(lengths, error, match):
    with pytest.raises(error, match=match):
        BucketBatchSampler(lengths, 2)


def test_lengths_are_copied_and_an_empty_dataset_has_no_batches():
    lengths = np.array([4, 2, 9, 1])
    sampler = BucketBatchSampler(lengths, 2, shuffle=False)
    lengths[:] = 0
    assert list(sampler) == [[3, 1], [0, 2]]
    empty = BucketBatchSampler([], 4, num_replicas=2, rank=1)
    assert list(empty) == [] and len(empty) == 0
