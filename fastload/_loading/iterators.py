"""The DataLoader's iterators: what both share, and the single-process one.

``_SingleProcessIter`` makes each batch in the calling process;
``_MultiProcessIter`` (``worker_iterator.py``) has worker processes make them.
Both draw the epoch's index batches, seeds and resume skips the same way
(``_BaseIter``), so they give identical batches.
"""

from __future__ import annotations

import copy
import itertools
import warnings
from time import perf_counter
from typing import Any, Iterator, NoReturn

import numpy as np

from fastload.collate import to_torch
from fastload.dataset_state import MainSnapshot, is_stateful, load_dataset_state, \
    resume_stream, warn_of_replay
from fastload.elastic import remainder_stream
from fastload.kept_order import KEEP_ORDER, KEEP_STATE
from fastload.resume import EpochProgress
from fastload.sampler import BatchSampler
from fastload._loading.errors import IterArgumentError
from fastload._loading.fetch import BatchSource
from fastload._loading.pinning import pin_batch
from fastload._loading.settings import LoaderSettings

__all__ = ["_BaseIter", "_SingleProcessIter", "index_stream", "takes_kernel_batches"]


def index_stream(index_sampler: Any, auto_collation: bool) -> tuple[Iterator[Any], bool]:
    """The epoch's index batches, and whether they are our kernel's int64 arrays.

    The arrays stand in for ``BatchSampler.__iter__``'s lists (the dataset is
    given them as lists) only where nothing can tell: a subclass may yield
    other batches than ours, and without auto-collation the dataset itself
    receives each batch.  Any other sampler's batches reach the dataset as
    they were yielded, as in torch.
    """
    if takes_kernel_batches(index_sampler, auto_collation):
        epoch = index_sampler._kernel_epoch()
        if epoch is not None:
            return index_sampler._slices(epoch), True
    return iter(index_sampler), False


def takes_kernel_batches(index_sampler: Any, auto_collation: bool) -> bool:
    """Whether the epoch's batches may come from our BatchSampler's kernel (see
    ``index_stream``)."""
    # getattr: a batch_sampler may be iterable through __getitem__ alone (or
    # not at all: then iter() raises torch's TypeError).
    return auto_collation and getattr(type(index_sampler), "__iter__", None) is BatchSampler.__iter__


class _BaseIter:
    """What both iterators share: the epoch's index stream, seeds and counting.

    An iterator is given its loader's ``LoaderSettings`` and never holds the
    loader: a persistent loader keeps its iterator, and a cycle between the two
    would keep workers alive after ``del loader`` until the garbage collector ran.
    """

    closed = False
    # Frames from the caller's next() down to _deliver: a warning there points at the caller.
    _DELIVER_DEPTH = 3

    def __init__(self, settings: LoaderSettings) -> None:
        self._source = BatchSource(settings.dataset, settings.batch)
        # output="torch": a collated batch's layout says which leaves are data
        # (BatchLayout.as_torch); anything else is converted as torch's
        # default_convert would (to_torch).
        self._source.as_torch = settings.output == "torch" and self._source.default_collate
        self._to_torch = settings.output == "torch" and not self._source.default_collate
        # torch's names: whether batches are pinned, for which device.
        self._pin_memory = settings.pin_memory
        self._pin_memory_device = settings.pin_memory_device
        self._dataset = settings.dataset
        self._iterable = settings.batch.iterable
        self._loader_workers = settings.num_workers
        self._seed_source = settings.seed_source
        self._rng_sources = settings.rng_sources
        self._epoch_sampler = settings.epoch_sampler
        self._index_sampler = settings.index_sampler
        self._kept_order = settings.kept_order
        self._split = settings.split
        self._len_called = settings.len_called
        self.progress = EpochProgress([], None)
        # loader.report()'s account: the consumer's seconds in and between next() calls.
        self._ledger = settings.ledger
        self._times = settings.ledger.new_iterator(settings.num_workers)
        self._handed_at: float | None = None  # when the last batch was handed out
        # The wait for workers' first batch is start-up, kept apart from the steady wait.
        self._first_batch = settings.num_workers > 0

    @property
    def epoch_finished(self) -> bool:
        return self.progress.finished

    @epoch_finished.setter
    def epoch_finished(self, finished: bool) -> None:
        self.progress.finished = finished

    def _begin_epoch(self, resume: dict | None, lazy: bool = False,
                     same_workers: bool = False) -> int:
        """Restore (on resume) and snapshot the seed streams, draw the epoch's base seed.

        ``lazy``: our BatchSampler draws the epoch at the first batch, as
        torch's (a generator) does in its single-process iterator, so that a
        change made between ``iter()`` and the first ``next()``
        (``set_epoch``, a ``rank``) applies to this epoch.  Workers take their
        first tasks at ``iter()``, as torch's do.
        """
        sources = self._rng_sources
        skip, skip_after = 0, ()
        if resume is not None:
            for source, state in zip(sources, resume["rng_states"]):
                source.set_state(state)
            if resume["sampler_epoch"] is not None and self._epoch_sampler is not None:
                self._epoch_sampler.set_epoch(resume["sampler_epoch"])
            skip, skip_after = int(resume["batches_yielded"]), resume["yielded_after"]
        how, foreign = self._kept_order
        if how == KEEP_STATE and resume is not None and resume.get("sampler_state") is not None:
            foreign.load_state_dict(copy.deepcopy(resume["sampler_state"]))
        self.progress = EpochProgress([s.get_state() for s in sources],
                                      getattr(self._epoch_sampler, "epoch", None), skip, skip_after)
        if how == KEEP_STATE:
            self.progress.sampler_state = copy.deepcopy(foreign.state_dict())
        # torch draws a base seed as each iterator is made; a persistent
        # iterator's later epochs (``same_workers``) keep theirs, drawing
        # nothing: NOTE [ torch's global seed ] in rng.py.
        quiet = (resume or {}).get("next_base_seed")
        if quiet is not None:  # a persistent iterator's next epoch, resumed (make_state)
            self._seed_source.take_quiet(quiet)
            base_seed = quiet
        elif same_workers:
            base_seed = self._seed_source.draw_quiet()
        else:
            base_seed = self._seed_source.draw()
        self._source.start_epoch(base_seed)
        start = (resume or {}).get("distributed", {}).get("start", 0)
        if start:
            self._index_remainder(start)
        elif lazy and takes_kernel_batches(self._index_sampler, self._source.auto_collation):
            # BatchSampler.__iter__ is a generator, as torch's: nothing of it
            # runs before the first batch.
            self._kernel_batch = False
            self._indices = self._indices_from_first_batch()
        else:
            self._indices, self._kernel_batch = index_stream(self._index_sampler,
                                                                self._source.auto_collation)
        if how == KEEP_ORDER and not start:
            saved = (resume or {}).get("order")
            if saved is not None:
                self.progress.order, self._indices, self._kernel_batch = saved, iter(saved), False
            else:
                self._indices = self._keeping_order(self._indices)
        # Batches already handed out are skipped as indices only: nothing is
        # fetched.  Those handed out of order (in_order=False) beyond the first
        # ones are skipped as their turn comes (``_skips_next``).
        for _ in itertools.islice(self._indices, skip):
            pass
        self._skip_after = set(skip_after)
        self._num_yielded = skip
        self._next_batch_no = skip
        return base_seed

    def _index_remainder(self, start: int) -> None:
        """The index stream of an epoch resumed past ``start`` samples of its
        DistributedSampler order, on any world size (fastload/elastic.py)."""
        self.progress.order_start = start
        self._kernel_batch = takes_kernel_batches(self._index_sampler,
                                                     self._source.auto_collation)
        self._indices = remainder_stream(self._split, start, self._kernel_batch)

    def _keeping_order(self, stream: Iterator[Any]) -> Iterator[Any]:
        """A foreign sampler's epoch, drawn whole at its first batch and kept for a
        state (``resume.order_keeping``); drawn as the loader's generator draws
        (``SeedSource.global_draws``)."""
        with self._seed_source.global_draws():
            order = [batch.tolist() if isinstance(batch, np.ndarray) else batch
                     for batch in stream]
        self._kernel_batch = False
        self.progress.order = order
        yield from order

    def _indices_from_first_batch(self) -> Iterator[Any]:
        self.progress.sampler_epoch = getattr(self._epoch_sampler, "epoch", None)
        stream, self._kernel_batch = index_stream(self._index_sampler,
                                                     self._source.auto_collation)
        yield from stream

    def _skips_next(self) -> bool:
        """Skip the next index batch if it was handed out before a resume; False at the end."""
        if self._next_batch_no not in self._skip_after:
            return False
        self._skip_after.discard(self._next_batch_no)
        self._next_batch_no += 1
        next(self._indices, None)
        return True

    def _deliver(self, batch_no: int, batch: Any) -> Any:
        """``batch`` as the caller gets it, counted as handed out only then: a
        Ctrl-C before (in the next task's dispatch, say) leaves it for a resume."""
        self._num_yielded += 1
        if self._iterable and self._len_called is not None and self._num_yielded > self._len_called:
            message = (f"Length of IterableDataset {self._dataset} was reported to be "
                       f"{self._len_called}(when accessing len(dataloader)), but "
                       f"{self._num_yielded} samples have been fetched. ")
            if self._loader_workers > 0:
                message += ("For multiprocessing data-loading, this could be caused by not "
                            "properly configuring the IterableDataset replica at each worker. "
                            "Please see https://pytorch.org/docs/stable/data.html"
                            "#torch.utils.data.IterableDataset for examples.")
            warnings.warn(message, stacklevel=self._DELIVER_DEPTH + 1)  # the caller's line
        if self._to_torch:
            batch = to_torch(batch)
        if self._pin_memory:
            batch = pin_batch(batch, self._pin_memory_device)
        self.progress.hand(batch_no)
        return batch

    def __iter__(self) -> "_BaseIter":
        return self

    def __next__(self) -> Any:
        # The consumer's step is the time since the last batch was handed out;
        # its wait for data, the time in here (loader.report()).
        entered = perf_counter()
        ledger = self._ledger
        if self._handed_at is not None:
            ledger.step += entered - self._handed_at
            self._handed_at = None
        blocked = ledger.blocked
        try:
            batch = self._next_batch()
        except StopIteration:
            self._account(entered, blocked, ended=True)
            raise
        except BaseException:
            self._account(entered, blocked)
            raise
        self._account(entered, blocked)
        ledger.batches += 1
        self._handed_at = perf_counter()
        return batch

    def _account(self, entered: float, blocked: float, ended: bool = False) -> None:
        """Count a next() call from ``entered``: an epoch's end and workers' first
        batch (start-up) apart from the steady wait for data; ``blocked``: the
        ledger's blocked seconds before the call, kept for what is set apart."""
        ledger = self._ledger
        spent = perf_counter() - entered
        if ended or self._first_batch:
            if ended:
                ledger.startup += spent
            else:
                ledger.first_wait += spent
                ledger.first_batches += 1
            ledger.blocked = blocked
        else:
            ledger.wait += spent
        self._first_batch = False

    def _next_batch(self) -> Any:
        """The next batch, made in this process or received from a worker: each
        iterator class has its own (``__next__`` above only keeps the account)."""
        raise NotImplementedError(f"{type(self).__name__} must define _next_batch()")

    def __len__(self) -> int:
        return len(self._index_sampler)

    def __getstate__(self) -> NoReturn:
        # torch's error type; without it pickle would fail on some generator inside.
        raise NotImplementedError(f"{type(self).__name__} cannot be pickled")


class _SingleProcessIter(_BaseIter):
    """Batches made in the calling process, one per ``next()``."""

    def __init__(self, settings: LoaderSettings, resume: dict | None = None) -> None:
        if settings.timeout > 0:
            # Checked now, as torch does (the attribute may change between epochs).
            raise IterArgumentError(
                f"timeout={settings.timeout} needs num_workers > 0: it bounds the wait for a "
                f"worker's batch, and with num_workers=0 the main process makes each batch "
                f"itself; set timeout=0 (torch: _SingleProcessDataLoaderIter requires "
                f"timeout == 0)")
        super().__init__(settings)
        section = resume.get("dataset") if resume is not None else None
        snap = section["main"] if section is not None else None
        # The dataset's state was taken before the epoch drew its base seed: a
        # dataset whose state is torch's generator sets it back before the draw.
        load_dataset_state(self._dataset, snap)
        self._begin_epoch(resume, lazy=True)
        if section is not None:
            replay = section.get("replay", 0)
            if replay:
                samples = replay * (settings.batch.batch_size or 1)
                warn_of_replay(self._dataset, samples, stacklevel=5)  # iter(loader)
            resume_stream(self._source, snap, replay, section.get("next_epoch", False))
        if self._source.iterable or is_stateful(self._dataset):
            self.progress.datasets = MainSnapshot(self._source)
        self._times.main = self._source.totals.seconds
        if self._source.iterable and not self._source.stream_ended \
                and self._source.stream is None:
            # As torch: the dataset's iter() runs now, so its errors (even a
            # StopIteration) come out of iter(loader).  (A worker's runs at its first batch.)
            self._source.open_stream()

    def _next_batch(self) -> Any:
        if self.epoch_finished:
            raise StopIteration
        while self._skip_after and self._skips_next():
            pass
        try:
            indices = next(self._indices)
        except StopIteration:
            self.epoch_finished = True
            self._times.done = True
            raise
        # Numbered before it is made, as a worker's task is: a batch that raises
        # does not shift the transform seeds of the ones after it.
        batch_no = self._next_batch_no
        self._next_batch_no += 1
        try:
            batch = self._source.make(batch_no, indices, self._kernel_batch)
        except StopIteration:
            # The end of an IterableDataset ends the epoch.  Raised by a map-style
            # dataset, it ends only the caller's loop: the epoch goes on, as in torch.
            self.progress.hand(batch_no)
            if self._source.iterable:
                self.epoch_finished = True
            raise
        except Exception:
            self.progress.hand(batch_no)  # its error was the caller's batch: resuming skips it
            raise
        return self._deliver(batch_no, batch)


