"""``len()`` of a sampler or a loader draws from no generator: with
``torch.manual_seed(s)``, asking it (tqdm and LR schedulers do) changes neither
the batches an epoch gives nor torch's later draws, and it counts the epoch the
loader then gives.  BucketBatchSampler with ``max_tokens`` is the one whose
length follows its seed; every other sampler is checked alike."""

from __future__ import annotations

import numpy as np
import pytest

import fastload as fl

pytestmark = pytest.mark.timeout(120)

N = 400
LENGTHS = np.clip(np.random.default_rng(3).lognormal(np.log(60), 0.9, N).astype(np.int64), 1, 900)


def bucket(generator=None):
    return fl.BucketBatchSampler(LENGTHS, 16, max_tokens=1500, generator=generator)


# Every batch sampler a loader may be given, each built afresh (after the seed is set).
BATCH_SAMPLERS = {
    "bucket, max_tokens": bucket,
    "bucket, max_tokens, drop_last": lambda: fl.BucketBatchSampler(
        LENGTHS, 16, drop_last=True, max_tokens=1500),
    "bucket": lambda: fl.BucketBatchSampler(LENGTHS, 16),
    "random": lambda: fl.BatchSampler(fl.RandomSampler(range(N)), 16, False),
    "random with replacement": lambda: fl.BatchSampler(
        fl.RandomSampler(range(N), replacement=True, num_samples=300), 16, False),
    "subset": lambda: fl.BatchSampler(fl.SubsetRandomSampler(list(range(0, N, 3))), 16, False),
    "weighted": lambda: fl.BatchSampler(
        fl.WeightedRandomSampler(np.arange(1.0, N + 1), 300), 16, False),
    "distributed": lambda: fl.BatchSampler(
        fl.DistributedSampler(range(N), num_replicas=2, rank=1), 16, False),
}


def epochs(torch, make, ask_len: bool, epochs: int = 2, **loader_args):
    """Batches of ``epochs`` epochs of a loader over ``make()``, seeded by
    ``torch.manual_seed``, asking ``len(loader)`` before each or not; then torch's next draw."""
    torch.manual_seed(11)
    loader = fl.DataLoader(range(N), batch_sampler=make(), **loader_args)
    runs = []
    for _ in range(epochs):
        expected = len(loader) if ask_len else None
        batches = [batch.tolist() for batch in loader]
        if ask_len:
            assert len(batches) == expected, "len(loader) did not count the epoch it gave"
        runs.append(batches)
    return runs, torch.rand(3).tolist()


@pytest.mark.parametrize("name", sorted(BATCH_SAMPLERS))
def test_len_of_a_loader_changes_no_batch_and_no_later_draw(torch, name):
    make = BATCH_SAMPLERS[name]
    assert epochs(torch, make, ask_len=True) == epochs(torch, make, ask_len=False)


@pytest.mark.parametrize("persistent", [False, True])
def test_len_with_workers_changes_nothing_either(torch, persistent):
    loader_args = dict(num_workers=2, persistent_workers=persistent)
    assert epochs(torch, bucket, ask_len=True, **loader_args) \
        == epochs(torch, bucket, ask_len=False, **loader_args)


def test_len_of_the_sampler_itself_changes_nothing(torch):
    def run(ask_len: bool):
        torch.manual_seed(5)
        sampler = bucket()
        counts, batches = [], []
        for epoch in range(3):
            sampler.set_epoch(epoch)
            counts.append(len(sampler) if ask_len else None)
            batches.append(list(sampler))
        return batches, torch.rand(3).tolist(), counts

    asked, quiet = run(True), run(False)
    assert asked[:2] == quiet[:2]
    assert asked[2] == [len(epoch) for epoch in asked[0]]


def test_len_alone_leaves_torchs_generator_where_it_was(torch):
    torch.manual_seed(2)
    sampler = bucket()
    loader = fl.DataLoader(range(N), batch_sampler=bucket())
    before = torch.get_rng_state()
    for _ in range(3):
        len(sampler), len(loader)
    assert torch.equal(torch.get_rng_state(), before)


@pytest.mark.parametrize("kind", ["torch", "numpy", "int"])
def test_len_draws_nothing_from_a_given_generator(torch, kind):
    def generator():
        if kind == "torch":
            return torch.Generator().manual_seed(9)
        return np.random.default_rng(9) if kind == "numpy" else 9

    given = generator()
    sampler, twin = bucket(given), bucket(generator())
    for _ in range(2):
        count = len(sampler)
        batches = list(sampler)
        assert batches == list(twin) and len(batches) == count
    if kind == "torch":
        assert next(iter(bucket(given))) == next(iter(bucket(twin.generator)))
