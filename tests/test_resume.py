"""``DataLoader.state_dict`` / ``load_state_dict``: resuming gives exactly the batches an
uninterrupted run would have given, however the epoch was left, and a state that does
not fit the loader is refused when it is loaded."""

from __future__ import annotations

import time
import warnings

import numpy as np
import pytest

import fastload as fl
from fastload import DataLoader

pytestmark = pytest.mark.timeout(120)

LOADERS = [dict(num_workers=0), dict(num_workers=2), dict(num_workers=2, persistent_workers=True)]


def firsts(batches) -> list:
    """Each batch as a list (an ArrayDataset's batch is a 1-tuple of arrays)."""
    return [(b[0] if isinstance(b, (list, tuple)) else b).tolist() for b in batches]


def uninterrupted(make, epochs=2) -> list:
    loader = make()
    return [firsts(loader) for _ in range(epochs)]


def resume_from(make, state, epochs=2) -> list:
    loader = make()
    loader.load_state_dict(state)
    return [firsts(loader) for _ in range(epochs)]


class Flaky(fl.Dataset):
    """Sample ``bad`` raises; sample ``slow`` takes a while (so workers answer out of order)."""

    def __init__(self, n, bad=None, slow=None):
        self.n, self.bad, self.slow = n, bad, slow

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        if i == self.bad:
            raise KeyError(f"sample {i} is broken")
        if i == self.slow:
            time.sleep(0.3)
        return i


@pytest.mark.parametrize("how", ["break", "exception"])
@pytest.mark.parametrize("kwargs", LOADERS, ids=["0", "2", "2p"])
def test_a_state_taken_after_the_loop_was_left_resumes_where_it_stopped(kwargs, how):
    # The usual checkpoint on preemption: the loop is left (break, Ctrl-C, an
    # error), which drops the iterator, and only then is the state taken.
    def make():
        return DataLoader(fl.ArrayDataset(np.arange(20)), batch_size=4, shuffle=True,
                          generator=1, **kwargs)

    loader, seen = make(), []
    try:
        for batch in loader:
            seen.append(batch[0].tolist())
            if len(seen) == 2:
                if how == "break":
                    break
                raise KeyboardInterrupt
    except KeyboardInterrupt:
        pass
    state = loader.state_dict()
    assert state["batches_yielded"] == 2
    expected = uninterrupted(make)
    resumed = resume_from(make, state)
    assert seen + resumed[0] == expected[0]
    assert resumed[1] == expected[1]  # the next epoch too


@pytest.mark.parametrize("kwargs, where", [
    (LOADERS[0], "deliver"), (LOADERS[1], "deliver"), (LOADERS[2], "deliver"),
    (LOADERS[1], "dispatch"), (LOADERS[2], "dispatch"),  # no task is sent without workers
], ids=["0-deliver", "2-deliver", "2p-deliver", "2-dispatch", "2p-dispatch"])
def test_a_ctrl_c_inside_next_leaves_its_batch_for_the_resume(monkeypatch, kwargs, where):
    # A Ctrl-C can land inside next() after the batch was taken from its
    # worker but before the caller has it: sending the next task, or handing
    # the batch over.  It was counted as handed out, and a resume skipped it.
    from fastload._loading import iterators
    from fastload._loading import pool

    def make():
        return DataLoader(fl.ArrayDataset(np.arange(40)), batch_size=4, shuffle=True,
                          generator=3, **kwargs)

    armed = []
    real = pool.WorkerPool.send if where == "dispatch" else iterators._BaseIter._deliver

    def interrupted(self, *args):
        if armed:
            armed.clear()
            raise KeyboardInterrupt
        return real(self, *args)

    target = pool.WorkerPool if where == "dispatch" else iterators._BaseIter
    monkeypatch.setattr(target, "send" if where == "dispatch" else "_deliver", interrupted)
    loader, seen = make(), []
    with pytest.raises(KeyboardInterrupt):
        for batch in loader:
            seen.append(batch[0].tolist())
            if len(seen) == 3:
                armed.append(True)  # lands in the next next()
    monkeypatch.undo()
    state = loader.state_dict()
    assert state["batches_yielded"] == 3
    expected = uninterrupted(make)
    assert seen + resume_from(make, state)[0] == expected[0]


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_batch_whose_error_the_caller_caught_is_not_made_again(num_workers):
    def make():
        return DataLoader(Flaky(12, bad=4), batch_size=2, num_workers=num_workers)

    loader, seen = make(), []
    iterator = iter(loader)
    for _ in range(4):
        try:
            seen.append(next(iterator).tolist())
        except KeyError:
            seen.append("error")
    assert seen == [[0, 1], [2, 3], "error", [6, 7]]
    state = loader.state_dict()
    del iterator
    assert resume_from(make, state, epochs=1) == [[[8, 9], [10, 11]]]


def test_out_of_order_batches_resume_with_each_sample_once():
    # in_order=False hands batches out as workers finish them: the state lists
    # the ones handed out beyond the first gap.
    def make():
        return DataLoader(Flaky(16, slow=0), batch_size=2, num_workers=2, in_order=False)

    loader = make()
    iterator = iter(loader)
    seen = [next(iterator).tolist() for _ in range(3)]
    state = loader.state_dict()
    del iterator
    assert [0, 1] not in seen and state["batches_yielded"] == 0 and state["yielded_after"]
    rest = resume_from(make, state, epochs=1)[0]
    assert sorted(v for b in seen + rest for v in b) == list(range(16))


def test_worker_assignment_survives_a_resume():
    # Batch k goes to worker k % num_workers in every run, resumed or not.
    class WhichWorker(fl.Dataset):
        def __len__(self):
            return 12

        def __getitem__(self, i):
            return fl.get_worker_info().id

    def make():
        return DataLoader(WhichWorker(), batch_size=2, num_workers=2)

    loader = make()
    iterator = iter(loader)
    next(iterator)
    state = loader.state_dict()
    del iterator
    workers = [batch[0] for batch in resume_from(make, state, epochs=1)[0]]
    assert workers == [k % 2 for k in range(1, 6)]


def test_a_distributed_sampler_checkpointed_between_epochs_follows_set_epoch():
    ds = fl.ArrayDataset(np.arange(12))
    sampler = fl.DistributedSampler(ds, num_replicas=2, rank=0, seed=3)
    loader = DataLoader(ds, batch_size=3, sampler=sampler)
    sampler.set_epoch(0)
    list(loader)
    state = loader.state_dict()  # between epochs
    sampler.set_epoch(1)
    expected = [b[0].tolist() for b in loader]

    sampler = fl.DistributedSampler(ds, num_replicas=2, rank=0, seed=3)
    resumed = DataLoader(ds, batch_size=3, sampler=sampler)
    resumed.load_state_dict(state)
    sampler.set_epoch(1)
    assert [b[0].tolist() for b in resumed] == expected


def _resumes_the_epoch_set(make, epoch: int, taken: int) -> list:
    """``make()`` gives a loader and the sampler its epoch is set on: a state
    taken after ``taken`` batches of epoch ``epoch`` resumes that epoch in a
    new loader whose ``set_epoch`` nobody called.  Returns the epoch's batches."""
    loader, sampler = make()
    sampler.set_epoch(epoch)
    expected = firsts(loader)
    loader, sampler = make()
    sampler.set_epoch(epoch)
    iterator = iter(loader)
    head = [next(iterator)[0].tolist() for _ in range(taken)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a caller's batch sampler: its order is not saved
        state = loader.state_dict()
    del iterator
    assert state["sampler_epoch"] == epoch
    resumed, _ = make()
    resumed.load_state_dict(state)
    assert head + firsts(resumed) == expected
    return expected


@pytest.mark.parametrize("kwargs", LOADERS)
def test_a_distributed_sampler_inside_a_batch_sampler_resumes_its_epoch(kwargs):
    # The state keeps the epoch of the sampler with set_epoch wherever it sits,
    # so resuming does not replay epoch 0's order (duplicating samples).
    def make():
        ds = fl.ArrayDataset(np.arange(16))
        sampler = fl.DistributedSampler(ds, num_replicas=2, rank=0, seed=0)
        return DataLoader(ds, batch_sampler=fl.BatchSampler(sampler, 2, False), **kwargs), sampler

    expected = _resumes_the_epoch_set(make, epoch=2, taken=2)
    assert sorted(sum(expected, [])) == sorted(set(sum(expected, [])))


def test_a_batch_sampler_that_passes_set_epoch_on_records_its_samplers_epoch():
    class PassesSetEpoch(fl.BatchSampler):
        def set_epoch(self, epoch):
            self.sampler.set_epoch(epoch)

    def make():
        ds = fl.ArrayDataset(np.arange(16))
        sampler = PassesSetEpoch(fl.DistributedSampler(ds, num_replicas=2, rank=0, seed=0), 2,
                                 False)
        return DataLoader(ds, batch_sampler=sampler), sampler

    _resumes_the_epoch_set(make, epoch=3, taken=1)


def test_a_state_without_digests_of_sampler_contents_still_loads():
    # States saved before the samplers' indices and weights were digested.
    make = lambda: _sampled(fl.SubsetRandomSampler(range(3, 20), generator=0))  # noqa: E731
    expected = uninterrupted(make, epochs=1)
    loader = make()
    iterator = iter(loader)
    head = [next(iterator)[0].tolist()]
    state = loader.state_dict()
    del state["loader"]["samplers"]["batch_sampler.sampler"]["indices"]
    del state["loader"]["seed_streams"]
    assert [head + resume_from(make, state, epochs=1)[0]] == expected


def test_a_callers_sampler_that_rebuilds_its_indices_each_epoch_resumes():
    # Only fastload's and torch's samplers have their contents compared: a
    # caller's may keep the epoch's order in an attribute named indices.
    class EpochOrder(fl.Sampler):
        def __init__(self):
            self.indices = list(range(12))

        def __len__(self):
            return 12

        def __iter__(self):
            self.indices = self.indices[1:] + self.indices[:1]
            return iter(self.indices)

    make = lambda: _sampled(EpochOrder())  # noqa: E731
    expected = uninterrupted(make, epochs=1)
    loader = make()
    iterator = iter(loader)
    head = [next(iterator)[0].tolist()]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        state = loader.state_dict()
    assert [head + resume_from(make, state, epochs=1)[0]] == expected


@pytest.mark.parametrize("change, field", [
    (dict(batch_size=2), "batch_size=7, this one has batch_size=2"),
    (dict(length=50), "dataset_length=20, this one has dataset_length=50"),
    (dict(drop_last=True), "drop_last=False, this one has drop_last=True"),
    (dict(sampler="weighted"), "batch_sampler.sampler='fastload.sampler.RandomSampler', this "
                               "one has batch_sampler.sampler='fastload.sampler.WeightedRandomSampler'"),
])
def test_a_state_from_a_loader_built_otherwise_is_refused_when_loaded(change, field):
    def make(length=20, batch_size=7, drop_last=False, sampler=None):
        ds = fl.ArrayDataset(np.arange(length))
        if sampler == "weighted":
            return DataLoader(ds, batch_size=batch_size, drop_last=drop_last,
                              sampler=fl.WeightedRandomSampler(np.ones(length), length,
                                                               generator=0))
        return DataLoader(ds, batch_size=batch_size, drop_last=drop_last, shuffle=True,
                          generator=0)

    loader = make()
    iterator = iter(loader)
    next(iterator)
    state = loader.state_dict()
    with pytest.raises(ValueError, match=field):
        make(**change).load_state_dict(state)


def _batch_sampled(sampler=None, batch_size=4, drop_last=False):
    dataset = fl.ArrayDataset(np.arange(24))
    sampler = sampler if sampler is not None else fl.RandomSampler(dataset, generator=0)
    return DataLoader(dataset, batch_sampler=fl.BatchSampler(sampler, batch_size, drop_last))


def _sampled(sampler):
    return DataLoader(fl.ArrayDataset(np.arange(24)), batch_size=4, sampler=sampler)


@pytest.mark.parametrize("make, other, field", [
    (_batch_sampled, lambda: _batch_sampled(batch_size=8),
     "batch_sampler.batch_size=4, this one has batch_sampler.batch_size=8"),
    (_batch_sampled, lambda: _batch_sampled(drop_last=True),
     "batch_sampler.drop_last=False, this one has batch_sampler.drop_last=True"),
    (lambda: _sampled(fl.DistributedSampler(range(24), 2, 0, shuffle=True)),
     lambda: _sampled(fl.DistributedSampler(range(24), 2, 0, shuffle=False)),
     "batch_sampler.sampler.shuffle=True, this one has batch_sampler.sampler.shuffle=False"),
    # Another rank or world size resumes elastically (test_elastic_resume.py); another seed cannot.
    (lambda: _sampled(fl.DistributedSampler(range(24), 2, 0, seed=0)),
     lambda: _sampled(fl.DistributedSampler(range(24), 2, 1, seed=1)), "sampler.seed=0, this one has"),
    (lambda: _sampled(fl.RandomSampler(range(24), generator=0)),
     lambda: _sampled(fl.RandomSampler(range(24), replacement=True, generator=0)),
     "sampler.replacement=False, this one has"),
    (lambda: _sampled(fl.SubsetRandomSampler(range(24), generator=0)),
     lambda: _sampled(fl.SubsetRandomSampler(range(12), generator=0)),
     "batch_sampler.sampler.length=24, this one has batch_sampler.sampler.length=12"),
    (lambda: _sampled(fl.SubsetRandomSampler(range(24), generator=0)),
     lambda: _sampled(fl.SubsetRandomSampler(range(24, 48), generator=0)),
     "batch_sampler.sampler.indices='<digest"),
    (lambda: _sampled(fl.WeightedRandomSampler(np.ones(24), 24, generator=0)),
     lambda: _sampled(fl.WeightedRandomSampler(np.arange(1.0, 25.0), 24, generator=0)),
     "batch_sampler.sampler.weights='<digest"),
    (lambda: _sampled(list(range(24))), lambda: _sampled(list(range(23, -1, -1))),
     "batch_sampler.sampler.indices='<digest"),
    (lambda: DataLoader(fl.ArrayDataset(np.arange(24)), batch_size=4, shuffle=True, generator=0),
     lambda: _sampled(fl.RandomSampler(range(24), generator=0)),
     r"seed_streams=\['generator', 'batch_sampler.sampler \(draws from generator\)'\], this "
     r"one has seed_streams=\['generator', 'batch_sampler.sampler'\]"),
], ids=["batch size", "drop_last", "shuffle", "seed", "replacement", "subset", "subset indices",
        "weights", "index list", "a generator shared or not"])
def test_a_state_from_samplers_built_otherwise_is_refused_when_loaded(make, other, field):
    # The samplers' own settings, not only their types: each of these would
    # have resumed into other batches, skipping or repeating samples.
    loader = make()
    iterator = iter(loader)
    next(iterator)
    state = loader.state_dict()
    with pytest.raises(ValueError, match=field):
        other().load_state_dict(state)
    make().load_state_dict(state)  # the same arguments: taken


def test_a_state_survives_an_iter_that_raised_before_the_epoch_began():
    class FlakyLength(fl.Dataset):
        fail_next = False

        def __len__(self):
            if self.fail_next:
                self.fail_next = False
                raise OSError("the index file could not be read")
            return 12

        def __getitem__(self, i):
            return i

    def make():
        return DataLoader(FlakyLength(), batch_size=3, shuffle=True, generator=0)

    expected = uninterrupted(make, epochs=1)[0]
    source = make()
    iterator = iter(source)
    seen = firsts([next(iterator)])
    state = source.state_dict()
    loader = make()
    loader.load_state_dict(state)
    loader.dataset.fail_next = True
    with pytest.raises(OSError, match="index file"):
        iter(loader)
    assert loader.state_dict() == state  # still pending
    assert seen + firsts(loader) == expected


def test_a_broken_state_is_refused_when_loaded_and_disturbs_nothing():
    def make(generator=0):
        return DataLoader(fl.ArrayDataset(np.arange(20)), batch_size=4, shuffle=True,
                          generator=generator)

    state = make().state_dict()
    loader = make()
    expected = uninterrupted(make)
    for broken, match in ((dict(state, batches_yielded=-1), "batch numbers"),
                          ({k: v for k, v in state.items() if k != "batches_yielded"},
                           "no 'batches_yielded'"),
                          (dict(state, batches_yielded=9), "has 5 batches"),
                          (dict(state, rng_states=[("numpy", {"bit_generator": "MT19937"})] * 2),
                           "does not fit")):
        with pytest.raises(ValueError, match=match):
            loader.load_state_dict(broken)
    assert [firsts(loader) for _ in range(2)] == expected


def test_state_dict_after_load_state_dict_is_the_loaded_state():
    def make():
        return DataLoader(fl.ArrayDataset(np.arange(20)), batch_size=2, shuffle=True, generator=5)

    source = make()
    iterator = iter(source)
    for _ in range(3):
        next(iterator)
    state = source.state_dict()
    other = make()
    running = iter(other)
    next(running)  # mid-epoch when the state is loaded
    other.load_state_dict(state)
    assert other.state_dict() == state


def test_a_torch_sampler_with_its_generator_resumes_exactly(torch):
    def make():
        generator = torch.Generator().manual_seed(0)
        return DataLoader(fl.ArrayDataset(np.arange(12)), batch_size=3,
                          sampler=torch.utils.data.RandomSampler(range(12), generator=generator))

    expected = uninterrupted(make)
    loader = make()
    list(loader)
    iterator = iter(loader)
    seen = firsts([next(iterator)])
    state = loader.state_dict()
    del iterator
    assert seen + resume_from(make, state, epochs=1)[0] == expected[1]


def test_a_sampler_whose_order_cannot_be_saved_is_warned_about():
    class OwnRandom(fl.Sampler):
        # No state, no generator and no len(): its epoch cannot be drawn whole and kept.
        def __init__(self, n):
            self.n, self.rng = n, np.random.default_rng(0)

        def __iter__(self):
            return iter(self.rng.permutation(self.n).tolist())

    loader = DataLoader(fl.ArrayDataset(np.arange(6)), batch_size=2, sampler=OwnRandom(6))
    with pytest.warns(UserWarning, match="OwnRandom is not one fastload can save"):
        loader.state_dict()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        loader.state_dict()  # once per loader
        DataLoader(fl.ArrayDataset(np.arange(6)), batch_size=2, shuffle=True).state_dict()


def test_torchs_distributed_sampler_resumes_without_a_warning(torch):
    # Its order is drawn from its seed and epoch, which a state keeps.
    def make():
        dataset = fl.ArrayDataset(np.arange(40))
        sampler = torch.utils.data.DistributedSampler(dataset, num_replicas=2, rank=1, seed=3)
        sampler.set_epoch(2)
        return DataLoader(dataset, batch_size=4, sampler=sampler)

    expected = [batch[0].tolist() for batch in make()]
    loader = make()
    iterator = iter(loader)
    seen = [next(iterator)[0].tolist() for _ in range(2)]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        state = loader.state_dict()
    resumed = make()
    resumed.load_state_dict(state)
    assert seen + [batch[0].tolist() for batch in resumed] == expected
