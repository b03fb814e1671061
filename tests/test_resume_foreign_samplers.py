"""Resuming with a sampler fastload does not own: torch's RandomSampler drawing
from the global generator (``generator=None``), a caller's sampler with a
``state_dict``, and one with neither.  A resumed run yields exactly the rest of
the uninterrupted run, mid-epoch and between epochs."""

from __future__ import annotations

import json
import warnings

import numpy as np
import pytest

import fastload as fl
from fastload import DataLoader

pytestmark = pytest.mark.timeout(120)

N = 10


def torch_random_loader(torch, num_workers, data=None):
    data = list(range(N)) if data is None else data
    return DataLoader(data, batch_size=1, num_workers=num_workers,
                      sampler=torch.utils.data.RandomSampler(data))


def flat(batches):
    return [int(value) for batch in batches for value in np.asarray(batch).ravel()]


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("epochs_before", [0, 1])
def test_torchs_random_sampler_without_generator_resumes_mid_epoch_exactly(
        torch, num_workers, epochs_before):
    # The case: seeded, 4 batches, saved, seeded again, resumed in a new loader.
    torch.manual_seed(0)
    uninterrupted = torch_random_loader(torch, num_workers)
    expected = [flat(uninterrupted) for _ in range(epochs_before + 1)][-1]

    torch.manual_seed(0)
    loader = torch_random_loader(torch, num_workers)
    for _ in range(epochs_before):
        flat(loader)
    iterator = iter(loader)
    seen = [flat([next(iterator)])[0] for _ in range(4)]
    state = loader.state_dict()
    del iterator
    torch.manual_seed(0)
    resumed = torch_random_loader(torch, num_workers)
    resumed.load_state_dict(state)
    rest = flat(resumed)
    assert seen + rest == expected
    assert sorted(seen + rest) == list(range(N))  # never a repeated or missing sample


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("restore_global", [True, False])
def test_a_state_between_epochs_fixes_the_next_epochs_order(torch, num_workers, restore_global):
    # Whether or not the script restores torch's generator, the next epoch is the
    # uninterrupted run's: drawn from it when it is as it was, else from a copy.
    torch.manual_seed(3)
    loader = torch_random_loader(torch, num_workers)
    flat(loader)
    state = loader.state_dict()
    global_state = torch.get_rng_state()
    expected = flat(loader)
    after_uninterrupted = torch.get_rng_state()

    torch.manual_seed(99)  # the script draws on, or starts from another seed
    torch.rand(7)
    if restore_global:
        torch.set_rng_state(global_state)
    resumed = torch_random_loader(torch, num_workers)
    resumed.load_state_dict(state)
    before = torch.get_rng_state()
    assert flat(resumed) == expected
    if restore_global:
        # The draws came from the global generator, as in the uninterrupted run.
        assert torch.equal(torch.get_rng_state(), after_uninterrupted)
    else:
        assert torch.equal(torch.get_rng_state(), before)  # left alone


def test_fastloads_shuffle_without_generator_between_epochs(torch):
    data = fl.ArrayDataset(np.arange(20))

    def make():
        return DataLoader(data, batch_size=3, shuffle=True, num_workers=2, persistent_workers=True)

    torch.manual_seed(1)
    loader = make()
    flat(b[0] for b in loader)
    state = loader.state_dict()
    expected = flat(b[0] for b in loader)
    resumed = make()  # the global generator has moved on: the state fixes the epoch
    resumed.load_state_dict(state)
    assert flat(b[0] for b in resumed) == expected


class CountingSampler:
    """A caller's sampler with a state of its own: where it is, and a generator."""

    def __init__(self, n, seed=0):
        self.n, self.position, self.rng = n, 0, np.random.default_rng(seed)
        self.resume_at = None

    def __iter__(self):
        self.position = self.resume_at or 0
        self.resume_at = None
        order = self.rng.permutation(self.n).tolist()
        while self.position < self.n:
            self.position += 1
            yield order[self.position - 1]
        self.position = 0

    def __len__(self):
        return self.n

    def state_dict(self):
        return {"position": self.position, "rng": self.rng.bit_generator.state}

    def load_state_dict(self, state):
        self.resume_at = state["position"]
        self.rng.bit_generator.state = state["rng"]


@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("epochs_before", [0, 1])
def test_a_sampler_with_state_dict_is_saved_through_it(num_workers, epochs_before):
    data = fl.ArrayDataset(np.arange(14))

    def make():
        return DataLoader(data, batch_size=3, sampler=CountingSampler(14), num_workers=num_workers)

    uninterrupted = make()
    expected = [flat(b[0] for b in uninterrupted) for _ in range(epochs_before + 2)]
    loader = make()
    for _ in range(epochs_before):
        flat(b[0] for b in loader)
    iterator = iter(loader)
    seen = flat(next(iterator)[0] for _ in range(2))
    state = json.loads(json.dumps(loader.state_dict()))  # plain data
    del iterator
    resumed = make()
    resumed.load_state_dict(state)
    assert seen + flat(b[0] for b in resumed) == expected[epochs_before]
    assert flat(b[0] for b in resumed) == expected[epochs_before + 1]


def test_a_caller_sampler_without_state_keeps_the_epoch_it_drew():
    class Reshuffling(fl.Sampler):
        # Draws a new order at every iter(): replaying it would not repeat it.
        def __init__(self, n):
            self.n, self.rng = n, np.random.default_rng(0)

        def __iter__(self):
            return iter(self.rng.permutation(self.n).tolist())

        def __len__(self):
            return self.n

    data = fl.ArrayDataset(np.arange(12))
    loader = DataLoader(data, batch_size=2, sampler=Reshuffling(12))
    iterator = iter(loader)
    seen = flat(next(iterator)[0] for _ in range(3))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # its order is kept: nothing to warn about
        state = loader.state_dict()
    rest_uninterrupted = flat(b[0] for b in iterator)
    resumed = DataLoader(data, batch_size=2, sampler=Reshuffling(12))
    resumed.load_state_dict(state)
    assert flat(b[0] for b in resumed) == rest_uninterrupted
    assert sorted(seen + rest_uninterrupted) == list(range(12))
