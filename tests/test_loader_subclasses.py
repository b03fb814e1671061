"""What libraries do with torch's DataLoader internals works on fastload's the same way.

Each pattern below is written as its library ships it (timm, ultralytics,
SpeechBrain, Lightning), once over torch's DataLoader and once over
fastload's, and the two must give the same batches.
"""

from typing import Any

import numpy as np
import pytest
from batch_compare import assert_same_as_torch

import fastload as fl

WORKERS = [0, 2]


class Squares(fl.Dataset):
    def __len__(self):
        return 23

    def __getitem__(self, i):
        return {"x": np.full(3, i * i, dtype=np.int64), "i": i}


def torch_squares(torch):
    class TorchSquares(torch.utils.data.Dataset):
        def __len__(self):
            return 23

        def __getitem__(self, i):
            return Squares()[i]

    return TorchSquares()


class _RepeatSampler:
    """timm's and ultralytics': a batch sampler repeated for ever."""

    def __init__(self, sampler):
        self.sampler = sampler

    def __iter__(self):
        while True:
            yield from iter(self.sampler)


def multi_epochs_loader_class(base):
    """timm's ``MultiEpochsDataLoader``: one iterator (so one set of workers) for every epoch."""

    class MultiEpochsDataLoader(base):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self._DataLoader__initialized = False
            if self.batch_sampler is None:
                self.sampler = _RepeatSampler(self.sampler)
            else:
                self.batch_sampler = _RepeatSampler(self.batch_sampler)
            self._DataLoader__initialized = True
            self.iterator = super().__iter__()

        def __len__(self):
            return len(self.sampler) if self.batch_sampler is None \
                else len(self.batch_sampler.sampler)

        def __iter__(self):
            for _ in range(len(self)):
                yield next(self.iterator)

    return MultiEpochsDataLoader


def infinite_loader_class(base):
    """ultralytics' ``InfiniteDataLoader``, whose ``reset()`` calls ``_get_iterator``."""

    class InfiniteDataLoader(base):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            object.__setattr__(self, "batch_sampler", _RepeatSampler(self.batch_sampler))
            self.iterator = super().__iter__()

        def __len__(self):
            return len(self.batch_sampler.sampler)

        def __iter__(self):
            for _ in range(len(self)):
                yield next(self.iterator)

        def reset(self):
            self.iterator = self._get_iterator()

    return InfiniteDataLoader


def epochs(loader, count):
    return [batch for _ in range(count) for batch in loader]


@pytest.mark.timeout(60)
@pytest.mark.parametrize("num_workers", WORKERS)
def test_timms_multi_epochs_loader_reassigns_batch_sampler(torch, no_leaks, num_workers):
    ours_loader = multi_epochs_loader_class(fl.DataLoader)(
        Squares(), batch_size=5, shuffle=True, generator=7, num_workers=num_workers)
    theirs_loader = multi_epochs_loader_class(torch.utils.data.DataLoader)(
        torch_squares(torch), batch_size=5, shuffle=True,
        generator=torch.Generator().manual_seed(7), num_workers=num_workers)
    assert len(ours_loader) == len(theirs_loader) == 5
    ours, theirs = epochs(ours_loader, 3), epochs(theirs_loader, 3)
    assert len(ours) == len(theirs) == 15
    # Three epochs of one sampler: every sample once per epoch, in the same kinds of batch.
    for epoch in range(3):
        seen = sorted(int(i) for batch in ours[epoch * 5:(epoch + 1) * 5] for i in batch["i"])
        assert seen == list(range(23))
    for a, b in zip(ours, theirs):
        assert sorted(a) == sorted(b)
        assert_same_as_torch(a["x"][:0], b["x"][:0])  # same dtype and row shape
    # The guard is back on after the subclass's reassignment.
    with pytest.raises(ValueError, match="batch_sampler attribute should not be set"):
        ours_loader.batch_sampler = None
    del ours_loader.iterator, theirs_loader.iterator


@pytest.mark.timeout(60)
@pytest.mark.parametrize("num_workers", WORKERS)
def test_ultralytics_infinite_loader_resets_through_get_iterator(torch, no_leaks, num_workers):
    ours_loader = infinite_loader_class(fl.DataLoader)(Squares(), batch_size=4,
                                                       num_workers=num_workers)
    theirs_loader = infinite_loader_class(torch.utils.data.DataLoader)(
        torch_squares(torch), batch_size=4, num_workers=num_workers)
    first = [next(ours_loader.iterator), next(ours_loader.iterator)]
    ours_loader.reset()  # a new iterator: the sequential epoch starts again
    theirs_loader.reset()
    ours, theirs = epochs(ours_loader, 2), epochs(theirs_loader, 2)
    assert len(ours) == len(theirs) == 12
    for a, b in zip(ours, theirs):
        assert_same_as_torch(a, b)
    np.testing.assert_array_equal(first[0]["i"], ours[0]["i"])
    del ours_loader.iterator, theirs_loader.iterator


@pytest.mark.parametrize("num_workers", WORKERS)
def test_an_overridden_get_iterator_makes_every_epochs_iterator(no_leaks, num_workers):
    made = []

    class Counting(fl.DataLoader):
        def _get_iterator(self):
            iterator = super()._get_iterator()
            made.append(iterator)
            return iterator

    loader = Counting(Squares(), batch_size=10, num_workers=num_workers)
    assert [len(list(loader)) for _ in range(2)] == [3, 3]
    assert len(made) == 2 and made[0] is not made[1]


@pytest.mark.timeout(60)
def test_persistent_loader_makes_its_iterator_once_through_get_iterator(no_leaks):
    made = []

    class Counting(fl.DataLoader):
        def _get_iterator(self):
            made.append(super()._get_iterator())
            return made[-1]

    loader = Counting(Squares(), batch_size=10, num_workers=2, persistent_workers=True)
    assert [len(list(loader)) for _ in range(3)] == [3, 3, 3]
    assert len(made) == 1
    del loader, made


@pytest.mark.timeout(60)
@pytest.mark.parametrize("num_workers", WORKERS)
def test_iterator_counts_batches_in_num_yielded_as_torch(torch, no_leaks, num_workers):
    """SpeechBrain checkpoints ``iterator._num_yielded`` and skips as many batches on resume."""
    ours = iter(fl.DataLoader(Squares(), batch_size=5, num_workers=num_workers))
    theirs = iter(torch.utils.data.DataLoader(torch_squares(torch), batch_size=5,
                                              num_workers=num_workers))
    counts = []
    for _ in range(3):
        next(ours)
        next(theirs)
        counts.append((ours._num_yielded, theirs._num_yielded))
    assert counts == [(1, 1), (2, 2), (3, 3)]
    del ours, theirs


def test_loader_is_generic_as_torchs(torch):
    """Lightning-style annotations such as ``DataLoader[Any]`` are evaluated at import."""
    assert fl.DataLoader[Any].__origin__ is fl.DataLoader
    assert torch.utils.data.DataLoader[Any].__origin__ is torch.utils.data.DataLoader

    class Typed(fl.DataLoader[dict]):
        pass

    batch = next(iter(Typed(Squares(), batch_size=2)))
    np.testing.assert_array_equal(batch["i"], [0, 1])


@pytest.mark.timeout(60)
def test_shutdown_workers_frees_a_persistent_loaders_workers(no_leaks):
    """Code frees persistent workers with torch's ``loader._iterator._shutdown_workers()``."""
    loader = fl.DataLoader(Squares(), batch_size=10, num_workers=2, persistent_workers=True)
    first = [batch["i"].copy() for batch in loader]
    pids = loader._iterator.worker_pids
    loader._iterator._shutdown_workers()
    assert loader._iterator.closed
    again = [batch["i"].copy() for batch in loader]  # new workers, same batches
    assert set(loader._iterator.worker_pids).isdisjoint(pids)
    for a, b in zip(first, again, strict=True):
        np.testing.assert_array_equal(a, b)
    del loader
