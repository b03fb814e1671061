"""What a dataset copy's snapshot holds and when it is taken: the state of the
iterator an IterableDataset's ``__iter__`` returns, ``iter()`` before that
state is loaded, ``snapshot_every_n_steps`` (a state between two snapshots
replays what the copy made since the last one), and the dataset's state
restored before the epoch draws its base seed."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import fastload as fl
from fastload import DataLoader

from stateful_datasets import CountingStream, NoisyTable, as_lists

pytestmark = [pytest.mark.timeout(120),
              pytest.mark.filterwarnings("ignore:This DataLoader will create")]


class PositionIterator:
    """An iterator with a state of its own, over its worker's share of ``0..n``."""

    def __init__(self, values):
        self.values, self.i = values, 0

    def __iter__(self):
        return self

    def __next__(self):
        if self.i >= len(self.values):
            raise StopIteration
        self.i += 1
        return self.values[self.i - 1]

    def state_dict(self):
        return {"i": self.i}

    def load_state_dict(self, state):
        self.i = state["i"]


def worker_share(n):
    info = fl.get_worker_info()
    if info is None:
        return list(range(n))
    return list(range(info.id, n, info.num_workers))


class StatelessDatasetStatefulIterator(fl.IterableDataset):
    def __init__(self, n=31):
        self.n = n

    def __iter__(self):
        return PositionIterator(worker_share(self.n))


class OwnIterator(fl.IterableDataset, PositionIterator):
    """Its own iterator; ``__iter__`` sets its position, ``load_state_dict`` moves it."""

    def __init__(self, n=31):
        self.n = n

    def __iter__(self):
        self.values, self.i = worker_share(self.n), 0
        return self


def array_lists(batches):
    return [np.asarray(batch).tolist() for batch in batches]


def resumed_run(make, cut, listed=array_lists):
    """Batches before ``cut``, then a new loader resumed from the state there (each
    batch as ``listed`` writes it, to compare runs)."""
    loader = make()
    iterator = iter(loader)
    seen = listed(next(iterator) for _ in range(cut))
    state = loader.state_dict()
    del iterator
    resumed = make()
    resumed.load_state_dict(state)
    return seen + listed(resumed)


@pytest.mark.parametrize("dataset_class", [StatelessDatasetStatefulIterator, OwnIterator])
@pytest.mark.parametrize("kwargs", [dict(num_workers=0), dict(num_workers=2),
                                    dict(num_workers=2, persistent_workers=True)])
def test_an_iterators_own_state_resumes_the_stream_without_replaying(dataset_class, kwargs):
    def make():
        return DataLoader(dataset_class(), batch_size=4, **kwargs)

    expected = array_lists(make())
    for cut in (1, 3, len(expected) - 1):
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # nothing is replayed
            assert resumed_run(make, cut) == expected


@pytest.mark.parametrize("every", [0, 3])
@pytest.mark.parametrize("persistent", [False, True])
def test_a_state_between_snapshots_replays_to_the_boundary_exactly(every, persistent):
    def make():
        return DataLoader(CountingStream(29), batch_size=3, num_workers=2,
                          persistent_workers=persistent, snapshot_every_n_steps=every)

    expected = as_lists(make())
    for cut in (1, 4, 7):
        assert resumed_run(make, cut, as_lists) == expected


@pytest.mark.parametrize("every", [0, 2, 5])
@pytest.mark.parametrize("persistent", [False, True])
def test_a_map_style_copy_replays_its_batches_since_the_last_snapshot(every, persistent):
    def make():
        return DataLoader(NoisyTable(22), batch_size=3, shuffle=True, generator=4, num_workers=2,
                          persistent_workers=persistent, snapshot_every_n_steps=every)

    uninterrupted = make()
    expected = [as_lists(uninterrupted) for _ in range(2)]
    for cut in (1, 4, 7):
        assert resumed_run(make, cut, as_lists) == expected[0]
    # Between epochs, persistent copies carry their state: the next epoch goes on.
    loader = make()
    as_lists(loader)
    state = loader.state_dict()
    resumed = make()
    resumed.load_state_dict(state)
    assert as_lists(resumed) == expected[1]


@pytest.mark.parametrize("value", [-1, 1.5, True, "2"])
def test_snapshot_every_n_steps_must_be_a_count(value):
    with pytest.raises(ValueError, match="snapshot_every_n_steps should be an int >= 0"):
        DataLoader(range(4), snapshot_every_n_steps=value)


class TorchStateTable(fl.Dataset):
    """A map-style dataset whose state is torch's global generator."""

    def __init__(self, torch, n=12):
        self.torch, self.n = torch, n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return i

    def state_dict(self):
        return {"g": self.torch.get_rng_state()}

    def load_state_dict(self, state):
        self.torch.set_rng_state(state["g"])


def test_the_datasets_state_is_restored_before_the_epoch_draws_its_seed(torch):
    # Restored after the draw, it would rewind torch's generator under the
    # sampler, which would then draw the base seed's value again.
    def make():
        return DataLoader(TorchStateTable(torch), batch_size=1, shuffle=True)

    torch.manual_seed(0)
    loader = make()
    [int(b[0]) for b in loader]
    state = loader.state_dict()
    expected = [int(b[0]) for b in loader]
    torch.manual_seed(7)
    resumed = make()
    resumed.load_state_dict(state)
    assert [int(b[0]) for b in resumed] == expected
