"""``ShardStream``: every sample once an epoch over ranks x workers, equal batches, resume."""

import collections

import numpy as np
import pytest
from required import deferred

wds = deferred("webdataset")

import fastload as fl  # noqa: E402
from fastload.sources import ShardStream  # noqa: E402
from fastload.sources.shard_stream import buffer_shuffled  # noqa: E402

pytestmark = pytest.mark.imports_heavy_library

SAMPLES = 30


@pytest.fixture
def shards(tmp_path):
    """Four shards of 9, 9, 9 and 3 samples."""
    with wds.ShardWriter(str(tmp_path / "part-%02d.tar"), maxcount=9, verbose=0) as sink:
        for i in range(SAMPLES):
            sink.write({"__key__": f"k{i:03d}", "cls": str(i)})
    return sorted(str(p) for p in tmp_path.glob("part-*.tar"))


def _stream(shards, **kwargs):
    options = {"num_replicas": 1, "rank": 0, "shuffle_buffer": 5, "seed": 4,
               "transform": lambda s: s["cls"], **kwargs}
    return ShardStream(shards, **options)


def _loader(dataset, workers):
    return fl.DataLoader(dataset, batch_size=4, num_workers=workers, timeout=60 if workers else 0)


def test_a_shuffle_buffer_gives_a_permutation_that_moves_only_so_far():
    items = np.arange(100)
    order = buffer_shuffled(items, 10, np.random.default_rng(0))
    assert sorted(order.tolist()) == items.tolist() and order.tolist() != items.tolist()
    # An item leaves the buffer no earlier than 9 places before its own.
    assert all(position >= item - 9 for position, item in enumerate(order.tolist()))
    assert buffer_shuffled(items, 1, np.random.default_rng(0)).tolist() == items.tolist()


@pytest.mark.parametrize("ranks", [1, 2, 3, 4])
@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("drop_last", [False, True])
def test_every_sample_once_an_epoch_and_equal_batches_on_every_rank(shards, ranks, workers,
                                                                   drop_last):
    seen, batch_counts = [], []
    for rank in range(ranks):
        stream = _stream(shards, num_replicas=ranks, rank=rank, drop_last=drop_last)
        batches = list(_loader(stream, workers))
        batch_counts.append(len(batches))
        seen.extend(int(x) for batch in batches for x in batch)
    assert len(set(batch_counts)) == 1
    slots = ranks * max(workers, 1)
    counts = collections.Counter(seen)
    if drop_last:
        assert len(seen) == SAMPLES // slots * slots and max(counts.values()) == 1
    else:
        assert set(counts) == set(range(SAMPLES))
        assert len(seen) == -(-SAMPLES // slots) * slots  # the padding repeats, nothing else


def test_the_order_is_the_seeds_and_the_epochs(shards):
    first = [int(x) for b in _loader(_stream(shards), 0) for x in b]
    assert first == [int(x) for b in _loader(_stream(shards), 0) for x in b]
    assert first != list(range(SAMPLES))
    other = _stream(shards)
    other.set_epoch(1)
    assert [int(x) for b in _loader(other, 0) for x in b] != first


@pytest.mark.parametrize("workers", [0, 2])
def test_a_stream_resumes_mid_epoch_with_the_rest_of_it(shards, workers):
    whole = [b.tolist() for b in _loader(_stream(shards), workers)]
    loader, seen = _loader(_stream(shards), workers), []
    for batch in loader:
        seen.append(batch.tolist())
        if len(seen) == 3:
            break
    state = loader.state_dict()
    again = _loader(_stream(shards), workers)
    again.load_state_dict(state)
    assert seen + [b.tolist() for b in again] == whole


def test_a_state_of_another_world_is_refused(shards):
    loader = _loader(_stream(shards), 0)
    next(iter(loader))
    state = loader.state_dict()
    other = _loader(_stream(shards, num_replicas=2, rank=1), 0)
    other.load_state_dict(state)
    with pytest.raises(ValueError, match="same number of ranks and workers"):
        list(other)


def test_bad_arguments_are_named(shards):
    with pytest.raises(ValueError, match="shuffle_buffer should be an integer >= 1"):
        _stream(shards, shuffle_buffer=0)
    with pytest.raises(ValueError, match="Invalid rank 2"):
        _stream(shards, num_replicas=2, rank=2)
