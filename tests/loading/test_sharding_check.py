"""The warning for a loader whose sampler gives every rank the same samples.

Under ``WORLD_SIZE`` > 1 (set per test) or an initialised process group of more
than one rank (real gloo ranks on 127.0.0.1), ``iter(loader)`` warns once per
loader unless a sampler it iterates takes one rank's share.
"""

from __future__ import annotations

import json
import sys
import warnings

import numpy as np
import pytest
from ranks import run_ranks

import fastload as fl

WARNING = "this process is one of"


def unsharded_warnings(loader, epochs=1):
    """The unsharded-loader warnings ``epochs`` passes over ``loader`` give."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(epochs):
            for _ in loader:
                pass
    return [w for w in caught if WARNING in str(w.message)]


@pytest.fixture
def no_group():
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        pytest.skip("a process group is initialised in this test process")


@pytest.fixture
def two_ranks(monkeypatch, no_group):
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")


class OwnShare(fl.Sampler):
    """A sampler of the caller's that says which share it takes, as DistributedSampler does."""

    def __init__(self, n, num_replicas, rank):
        self.n, self.num_replicas, self.rank = n, num_replicas, rank

    def __iter__(self):
        return iter(range(self.rank, self.n, self.num_replicas))

    def __len__(self):
        return len(range(self.rank, self.n, self.num_replicas))


class WrappingBatches(fl.Sampler):
    """A batch sampler of the caller's over another one (as accelerate's shards wrap)."""

    def __init__(self, batch_sampler):
        self.batch_sampler = batch_sampler

    def __iter__(self):
        return iter(self.batch_sampler)

    def __len__(self):
        return len(self.batch_sampler)


class Stream(fl.IterableDataset):
    def __iter__(self):
        return iter(range(6))


DATA = fl.ArrayDataset(np.arange(10))


def test_a_plain_loader_warns_once_naming_the_fix(two_ranks):
    loader = fl.DataLoader(DATA, batch_size=4, shuffle=True)
    caught = unsharded_warnings(loader, epochs=3)
    assert len(caught) == 1
    warning = caught[0]
    assert warning.category is UserWarning
    message = str(warning.message)
    for part in ("one of 2 ranks", "WORLD_SIZE", "RandomSampler", "fastload.DistributedSampler",
                 "train_dataloader()", "generator="):
        assert part in message, part
    assert warning.filename == __file__  # the line that iterated the loader
    # Each loader warns once: a second one warns too.
    assert len(unsharded_warnings(fl.DataLoader(DATA, batch_size=4), epochs=2)) == 1


def test_with_workers_and_persistent_workers_still_once(two_ranks):
    loader = fl.DataLoader(DATA, batch_size=4, num_workers=1, persistent_workers=True)
    assert len(unsharded_warnings(loader, epochs=2)) == 1


@pytest.mark.parametrize("make", [
    lambda: fl.DataLoader(DATA, batch_size=3),
    lambda: fl.DataLoader(DATA, batch_size=None),
    lambda: fl.DataLoader(DATA, sampler=fl.RandomSampler(DATA)),
    lambda: fl.DataLoader(DATA, batch_sampler=fl.BatchSampler(fl.SequentialSampler(DATA), 2,
                                                              False)),
    # One replica of two ranks: every rank still gets everything.
    lambda: fl.DataLoader(DATA, sampler=fl.DistributedSampler(DATA, num_replicas=1, rank=0)),
    lambda: fl.DataLoader(DATA, batch_sampler=fl.BucketBatchSampler(
        np.arange(10) + 1, 2, num_replicas=1, rank=0)),
], ids=["sequential", "unbatched", "random", "batch-sampler", "one-replica", "bucket-one"])
def test_unsharded_orders_warn(two_ranks, make):
    assert len(unsharded_warnings(make())) == 1


@pytest.mark.parametrize("make", [
    lambda: fl.DataLoader(DATA, batch_size=3, sampler=fl.DistributedSampler(DATA)),
    lambda: fl.DataLoader(DATA, batch_size=None, sampler=fl.DistributedSampler(DATA, rank=1)),
    lambda: fl.DataLoader(DATA, batch_sampler=fl.BatchSampler(fl.DistributedSampler(DATA), 2,
                                                              False)),
    lambda: fl.DataLoader(DATA, batch_sampler=WrappingBatches(fl.BatchSampler(
        fl.DistributedSampler(DATA), 2, False))),
    lambda: fl.DataLoader(DATA, batch_sampler=fl.BucketBatchSampler(np.arange(10) + 1, 2)),
    lambda: fl.DataLoader(DATA, batch_size=2, sampler=OwnShare(10, np.int64(2), 0)),
    lambda: fl.DataLoader(Stream(), batch_size=2),
], ids=["distributed", "unbatched", "in-batch-sampler", "wrapped", "bucket", "declares-share",
        "iterable-dataset"])
def test_sharded_orders_do_not_warn(two_ranks, make):
    assert unsharded_warnings(make(), epochs=2) == []


def test_torchs_distributed_sampler_does_not_warn(torch, two_ranks):
    sampler = torch.utils.data.DistributedSampler(DATA, num_replicas=2, rank=0)
    assert unsharded_warnings(fl.DataLoader(DATA, batch_size=2, sampler=sampler)) == []


@pytest.mark.parametrize("world", [None, "1", "0", "not-a-number"])
def test_one_rank_does_not_warn(monkeypatch, no_group, world):
    if world is None:
        monkeypatch.delenv("WORLD_SIZE", raising=False)
    else:
        monkeypatch.setenv("WORLD_SIZE", world)
    assert unsharded_warnings(fl.DataLoader(DATA, batch_size=4, shuffle=True)) == []


def test_a_rank_without_rank_in_the_environment_is_told_where_to_build_the_sampler(
        monkeypatch, no_group):
    # PyTorch Lightning's launcher: WORLD_SIZE, LOCAL_RANK and NODE_RANK, no RANK.
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.delenv("RANK", raising=False)
    with pytest.raises(ValueError, match=r"RANK is not.*train_dataloader\(\)"):
        fl.DistributedSampler(DATA)


GROUP_SCRIPT = r"""
import json, os, sys, warnings
import numpy as np
import torch.distributed as dist
import fastload as fl

def caught(loader):
    with warnings.catch_warnings(record=True) as found:
        warnings.simplefilter("always")
        for epoch in range(2):
            for _ in loader:
                pass
    return [str(w.message) for w in found if "this process is one of" in str(w.message)]

dist.init_process_group("gloo", init_method=os.environ["FASTLOAD_TEST_INIT_METHOD"])
rank = dist.get_rank()
# As Lightning's launcher leaves it: no RANK; WORLD_SIZE says one rank so that only
# the group can tell the loader it is one of two.
del os.environ["RANK"]
os.environ["WORLD_SIZE"] = "1"
data = fl.ArrayDataset(np.arange(10))
sampler = fl.DistributedSampler(data, shuffle=False)
result = {"rank": rank, "sampler": [sampler.rank, sampler.num_replicas],
          "plain": caught(fl.DataLoader(data, batch_size=4)),
          "sharded": caught(fl.DataLoader(data, batch_size=4, sampler=sampler)),
          "share": [int(i) for b in fl.DataLoader(data, batch_size=4, sampler=sampler)
                    for i in b[0]]}
dist.barrier()
dist.destroy_process_group()
# A group of one rank decides over WORLD_SIZE=2.
os.environ["WORLD_SIZE"] = "2"
dist.init_process_group("gloo", init_method="file://" + sys.argv[2] % rank, rank=0, world_size=1)
result["group_of_one"] = caught(fl.DataLoader(data, batch_size=4))
dist.destroy_process_group()
with open(sys.argv[1] % rank, "w") as f:
    json.dump(result, f)
"""


@pytest.mark.timeout(120)
def test_a_group_of_two_ranks_is_read_first(torch, tmp_path):
    script = tmp_path / "rank.py"
    script.write_text(GROUP_SCRIPT)
    out, store = str(tmp_path / "rank-%d.json"), str(tmp_path / "store-%d")
    run_ranks(2, [sys.executable, str(script), out, store], timeout=100)
    results = [json.load(open(out % rank)) for rank in range(2)]
    for rank, result in enumerate(results):
        assert result["sampler"] == [rank, 2]
        assert len(result["plain"]) == 1
        assert "one of 2 ranks (the initialised torch.distributed process group)" \
            in result["plain"][0]
        assert result["sharded"] == [] and result["group_of_one"] == []
    assert sorted(results[0]["share"] + results[1]["share"]) == list(range(10))
