"""``DataLoader``: torch's arguments, validation and semantics; fastload's batch path.

The loader itself holds policy (what to sample, how to collate, how many
workers); its iterators hold lifetimes:

* ``_SingleProcessIter`` makes each batch in the calling process;
* ``_MultiProcessIter`` keeps ``num_workers * prefetch_factor`` batches in
  flight in a ``WorkerPool``, each written by a worker into a slot of the
  shared-memory ``Ring``, and hands them out in batch order as views of their
  slot.

NOTE [ Determinism ]
Every epoch draws one base seed from the loader's ``generator`` (shared with
the default RandomSampler), and the random transforms of batch ``b`` are
seeded from ``(base_seed, b)``.  So the same seed gives the same batches
whatever ``num_workers`` or start method is, and ``load_state_dict`` can
replay an epoch: it restores the generators' state from the epoch's start and
skips the index batches already yielded (no data is fetched for them).
"""

from __future__ import annotations

import contextlib
import itertools
import math
import multiprocessing
import numbers
import os
import sys
import time
import warnings
import weakref
from typing import Any, Callable, Generic, Iterator, NoReturn, TypeVar

import numpy as np

from fastload.collate import default_collate, default_convert, to_torch
from fastload.dataset import is_iterable_dataset
from fastload.dataset_state import DATASET_STATE, MainSnapshot, WorkerSnapshots, \
    check_dataset_section, dataset_section, is_stateful, needs_fresh_workers, require_stateful, \
    restore_copy
from fastload.elastic import distributed_split, rebase_to_split, record_split, remainder_stream
from fastload._loading.fetch import BatchSource
from fastload._lifetime.forks import forking_workers
from fastload._lifetime.hooks import at_fork
from fastload._loading.teardown import tear_down_when_gone
from fastload._loading.wire.layouts import RESEND_LAYOUTS, LayoutLost, LayoutReceiver
from fastload._loading.pinning import pin_batch, pin_device
from fastload._loading.pool import WorkerDied, WorkerPool, join_exiting_workers, running, show_workers, \
    shown_workers
from fastload.resume import EpochProgress, check_state, epoch_sampler, make_state, \
    seed_streams, warn_if_order_unknown
from fastload.ring import Ring, SpareSlots, near_open_file_limit, too_many_open_files
from fastload.rng import SeedSource
from fastload.sampler import BatchSampler, RandomSampler, Sampler, SequentialSampler
from fastload._lifetime.weak_registry import WeakRegistry
from fastload._loading.wire.payload import pickle_for_workers

__all__ = ["DataLoader"]

_OUTPUTS = ("numpy", "torch")
_GUARDED_ATTRIBUTES = ("batch_size", "batch_sampler", "sampler", "drop_last", "dataset",
                       "persistent_workers")
_T_co = TypeVar("_T_co", covariant=True)


class _InfiniteConstantSampler(Sampler):
    """The sampler of an IterableDataset: the dataset decides when to stop."""

    def __iter__(self) -> Iterator[None]:
        return itertools.repeat(None)


class DataLoader(Generic[_T_co]):
    """Combines a dataset and a sampler, and iterates over the dataset in batches.

    Same arguments and semantics as ``torch.utils.data.DataLoader``; batches
    are numpy arrays (``output="torch"``: tensors sharing their memory).  With
    ``num_workers > 0`` each batch is a set of views of a shared-memory slot
    that stays reserved while you hold any of them.
    """

    # Name-mangled as torch's (``_DataLoader__initialized``): subclasses such as
    # timm's MultiEpochsDataLoader clear it to replace ``batch_sampler``.
    __initialized = False

    def __init__(self, dataset: Any, batch_size: int | None = 1, shuffle: bool | None = None,
                 sampler: Any = None, batch_sampler: Any = None, num_workers: int = 0,
                 collate_fn: Callable | None = None, pin_memory: bool = False,
                 drop_last: bool = False, timeout: float = 0,
                 worker_init_fn: Callable[[int], None] | None = None,
                 multiprocessing_context: Any = None, generator: Any = None, *,
                 prefetch_factor: int | None = None, persistent_workers: bool = False,
                 in_order: bool = True, pin_memory_device: str = "",
                 output: str = "numpy") -> None:
        if not isinstance(num_workers, numbers.Integral):  # numpy's integers too, as torch
            # torch compares it with 0 and only counts workers with it, so a
            # float zero loads in the main process; any other float fails there.
            if not (isinstance(num_workers, numbers.Real) and num_workers == 0):
                raise TypeError(f"num_workers should be an integer, but got "
                                f"{type(num_workers).__name__} {num_workers!r}")
        if num_workers < 0:
            raise ValueError("num_workers option should be non-negative; "
                             "use num_workers=0 to disable multiprocessing.")
        num_workers = int(num_workers)
        if timeout < 0:
            raise ValueError("timeout option should be non-negative")
        if num_workers == 0 and prefetch_factor is not None:
            raise ValueError("prefetch_factor option could only be specified in multiprocessing."
                             "let num_workers > 0 to enable multiprocessing, otherwise set "
                             "prefetch_factor to None.")
        elif num_workers > 0 and prefetch_factor is None:
            prefetch_factor = 2
        elif prefetch_factor is not None and prefetch_factor < 0:
            raise ValueError("prefetch_factor option should be non-negative")
        if persistent_workers and num_workers == 0:
            raise ValueError("persistent_workers option needs num_workers > 0")
        if output not in _OUTPUTS:
            raise ValueError(f"output should be one of {_OUTPUTS}, but got output={output!r}")
        if output == "torch":
            try:
                import torch  # noqa: F401
            except ImportError as exc:
                raise ImportError("output='torch' needs torch installed; "
                                  "use output='numpy' without it") from exc

        self.dataset = dataset
        self.num_workers = num_workers
        self.prefetch_factor = prefetch_factor
        self.pin_memory = pin_memory
        self.pin_memory_device = pin_memory_device
        self.timeout = timeout
        self.worker_init_fn = worker_init_fn
        self.multiprocessing_context = multiprocessing_context
        self.in_order = in_order
        self.output = output

        if is_iterable_dataset(dataset):
            self._iterable = True
            if shuffle not in {False, None}:
                raise ValueError(f"DataLoader with IterableDataset: expected unspecified shuffle "
                                 f"option, but got shuffle={shuffle}")
            if sampler is not None:
                raise ValueError(f"DataLoader with IterableDataset: expected unspecified sampler "
                                 f"option, but got sampler={sampler}")
            if batch_sampler is not None:
                raise ValueError(f"DataLoader with IterableDataset: expected unspecified "
                                 f"batch_sampler option, but got batch_sampler={batch_sampler}")
        else:
            self._iterable = False
            shuffle = bool(shuffle)
        if sampler is not None and shuffle:
            raise ValueError("sampler option is mutually exclusive with shuffle")
        if batch_sampler is not None:
            if batch_size != 1 or shuffle or sampler is not None or drop_last:
                raise ValueError("batch_sampler option is mutually exclusive with batch_size, "
                                 "shuffle, sampler, and drop_last")
            batch_size = None
            drop_last = False
        elif batch_size is None and drop_last:
            raise ValueError("batch_size=None option disables auto-batching and is mutually "
                             "exclusive with drop_last")

        # One seed stream for the default sampler and the per-epoch base seeds.
        self._seed_source = SeedSource(generator)
        if sampler is None:
            if self._iterable:
                sampler = _InfiniteConstantSampler()
            elif shuffle:
                sampler = RandomSampler(dataset, generator=self._seed_source)
            else:
                sampler = SequentialSampler(dataset)
        if batch_size is not None and batch_sampler is None:
            batch_sampler = BatchSampler(sampler, batch_size, drop_last)

        self.batch_size = batch_size
        self.drop_last = drop_last
        self.sampler = sampler
        self.batch_sampler = batch_sampler
        self.generator = generator
        if collate_fn is None:
            collate_fn = default_collate if self._auto_collation else default_convert
        self.collate_fn = collate_fn
        self.persistent_workers = persistent_workers
        self.__initialized = True
        self._IterableDataset_len_called: int | None = None
        self._iterator: _BaseIter | None = None  # persistent workers' iterator
        self._last_iterator: weakref.ref | None = None
        self._pending_state: dict | None = None
        # The last epoch's progress, kept past its iterator: a state_dict taken
        # after a `break`, an exception or Ctrl-C still says where it stopped.
        self._progress: EpochProgress | None = None
        self._warned_unknown_order = False
        self._reaps_workers_when_gone = False  # see _reap_workers_when_gone
        # Ring slots one epoch of new workers leaves for the next (fork only):
        # NOTE [ Slots that outlive an epoch ] in ring.py.
        self._spare_slots = SpareSlots()
        self.check_worker_number_rationality()

    # -- torch's attribute rules -------------------------------------------

    @property
    def multiprocessing_context(self) -> Any:
        return self._multiprocessing_context

    @multiprocessing_context.setter
    def multiprocessing_context(self, context: Any) -> None:
        if context is not None:
            if self.num_workers <= 0:
                raise ValueError("multiprocessing_context can only be used with multi-process "
                                 f"loading (num_workers > 0), but got num_workers={self.num_workers}")
            if isinstance(context, str):
                methods = multiprocessing.get_all_start_methods()
                if context not in methods:
                    raise ValueError(f"multiprocessing_context option should specify a valid start "
                                     f"method in {methods!r}, but got "
                                     f"multiprocessing_context={context!r}")
                context = multiprocessing.get_context(context)
            if not isinstance(context, multiprocessing.context.BaseContext):
                raise TypeError("multiprocessing_context option should be a valid context object "
                                "or a string specifying the start method, but got "
                                f"multiprocessing_context={context}")
        self._multiprocessing_context = context

    def __setattr__(self, name: str, value: Any) -> None:
        if self.__initialized and name in _GUARDED_ATTRIBUTES:
            raise ValueError(f"{name} attribute should not be set after "
                             f"{self.__class__.__name__} is initialized")
        super().__setattr__(name, value)

    @property
    def _auto_collation(self) -> bool:
        return self.batch_sampler is not None

    @property
    def _index_sampler(self) -> Any:
        return self.batch_sampler if self._auto_collation else self.sampler

    @property
    def _dataset_kind(self) -> int:
        # torch's _DatasetKind (Map 0, Iterable 1), which some libraries read.
        return 1 if self._iterable else 0

    def check_worker_number_rationality(self) -> None:
        """torch's warning when ``num_workers`` exceeds the CPUs this process may run on.

        From a line of the loader's (``stacklevel=2``), as torch's, so
        Python's default filter shows it once per place it is checked.
        """
        if self.num_workers == 0:
            return
        try:
            cpus = len(os.sched_getaffinity(0))
        except (AttributeError, OSError):
            cpus = os.cpu_count()
        if cpus is not None and self.num_workers > cpus:
            warnings.warn(f"This DataLoader will create {self.num_workers} worker processes in "
                          f"total. Our suggested max number of worker in current system is {cpus}, "
                          f"which is smaller than what this DataLoader is going to create. Please "
                          f"be aware that excessive worker creation might get DataLoader running "
                          f"slow or even freeze, lower the worker number to avoid potential "
                          f"slowness/freeze if necessary.", stacklevel=2)

    # -- iteration ---------------------------------------------------------

    def __len__(self) -> int:
        if self._iterable:
            length = self._IterableDataset_len_called = len(self.dataset)
            if self.batch_size is not None:
                length = length // self.batch_size if self.drop_last \
                    else math.ceil(length / self.batch_size)
            return length
        return len(self._index_sampler)

    def __iter__(self) -> "_BaseIter":
        if self.persistent_workers and self.num_workers > 0:
            if self._iterator is not None and not self._iterator.closed \
                    and is_stateful(self.dataset) and needs_fresh_workers(self._pending_state):
                self._iterator.shutdown()  # its copies of the dataset have moved on
            if self._iterator is None or self._iterator.closed:
                self._iterator = self._get_iterator()
            else:
                self._iterator.reset(self, self._pending_state)
                self._pending_state = None
                self._progress = self._iterator.progress
            return self._iterator
        return self._get_iterator()

    def _get_iterator(self) -> "_BaseIter":
        """A new iterator for one epoch, as torch's method of this name.

        Libraries call it (ultralytics' ``InfiniteDataLoader.reset``) or
        override it, so ``__iter__`` makes every new iterator through it.  A
        loaded state stays pending until an epoch has begun from it: an iterator
        that fails to start (a dataset's ``len()``, a worker) leaves it to the next try.
        """
        if self.num_workers > 0:
            self.check_worker_number_rationality()  # as torch, whenever workers start
        pinning = self._warn_about_pin_memory()
        resume = self._pending_state
        iterator: _BaseIter = _SingleProcessIter(self, resume) if self.num_workers == 0 \
            else _MultiProcessIter(self, resume)
        iterator._pin_memory, iterator._pin_memory_device = pinning
        self._pending_state = None
        # Only a weak reference: dropping the iterator (a `break`) must stop
        # its workers at once, as torch's does.
        self._last_iterator = weakref.ref(iterator)
        self._progress = iterator.progress
        return iterator

    def _warn_about_pin_memory(self) -> tuple[bool, str | None]:
        """torch's warnings, where it gives them: as an iterator is made (a
        persistent loader's once), after the worker-count one; from a line of
        the loader's, as torch's come from its own, so Python shows each once.
        Returns what the iterator pins (NOTE [ Where batches are pinned ])."""
        return pin_device(self.pin_memory, self.pin_memory_device, self.output, stacklevel=3)

    def __getstate__(self) -> dict:
        # A loader pickles as torch's does: the last epoch's iterator is only
        # weakly held (and gone in the copy); a persistent one is held, and
        # refuses to be pickled as torch's does.
        state = self.__dict__.copy()
        state["_last_iterator"] = None
        state["_reaps_workers_when_gone"] = False  # the finalizer is this loader's, not the copy's
        return state

    def _reap_workers_when_gone(self) -> None:
        """Once this loader is gone, wait for the workers its last epoch left to
        exit on their own, and reap them (``join_exiting_workers``)."""
        if not self._reaps_workers_when_gone:
            self._reaps_workers_when_gone = True
            weakref.finalize(self, join_exiting_workers)

    def _rng_sources(self) -> list:
        """Every seed stream an epoch draws from, to snapshot and restore them."""
        return [source for _, source in seed_streams(self)]

    # -- resumption ----------------------------------------------------------

    def state_dict(self) -> dict:
        """Where this loader is: resuming from it gives the next unseen batch, same order.

        Mid-epoch, also after the loop was left (``break``, an exception,
        Ctrl-C); between epochs, the start of the next one.  A state loaded and
        not yet resumed is returned as loaded.  A dataset that defines
        ``state_dict`` / ``load_state_dict`` is saved through them, each
        worker's copy at the batches handed out (``dataset_state``); an
        IterableDataset that does not raises TypeError.
        """
        if self._iterable:
            require_stateful(self.dataset, "state_dict")
        else:
            warn_if_order_unknown(self)
        if self._pending_state is not None:
            return dict(self._pending_state)
        state = make_state([s.get_state() for s in self._rng_sources()], self._progress, self)
        section = dataset_section(self, self._progress)
        if section is not None:
            state["dataset"] = section
            if self._iterable and "batches_yielded" in section:
                # With workers, batch numbers have holes (an exhausted worker's
                # tasks): the count of batches handed out is the section's.
                state["batches_yielded"], state["yielded_after"] = section["batches_yielded"], []
        return record_split(state, self, self._progress)

    def load_state_dict(self, state: dict) -> None:
        """Resume at ``state``: the next ``iter(loader)`` continues that epoch.

        The state is checked now against this loader (its dataset length,
        batch size, samplers and generator): a mismatch is a ValueError naming it.
        """
        if self._iterable:
            require_stateful(self.dataset, "load_state_dict")
        checked = check_state(rebase_to_split(state, self), self, self._rng_sources())
        check_dataset_section(checked, self)
        self._pending_state = checked


def _index_stream(index_sampler: Any, auto_collation: bool) -> tuple[Iterator[Any], bool]:
    """The epoch's index batches, and whether they are our kernel's int64 arrays.

    The arrays stand in for ``BatchSampler.__iter__``'s lists (the dataset is
    given them as lists) only where nothing can tell: a subclass may yield
    other batches than ours, and without auto-collation the dataset itself
    receives each batch.  Any other sampler's batches reach the dataset as
    they were yielded, as in torch.
    """
    if _takes_kernel_batches(index_sampler, auto_collation):
        epoch = index_sampler._kernel_epoch()
        if epoch is not None:
            return index_sampler._slices(epoch), True
    return iter(index_sampler), False


def _may_hold_tensors(indices: Any) -> bool:
    """Whether a sampler's batch may hold tensors (NOTE [ Tasks that may hold
    tensors ] in layout_wire.py): it is not an ndarray, and torch is loaded."""
    return type(indices) is not np.ndarray and "torch" in sys.modules


def _takes_kernel_batches(index_sampler: Any, auto_collation: bool) -> bool:
    """Whether the epoch's batches may come from our BatchSampler's kernel (see
    ``_index_stream``)."""
    # getattr: a batch_sampler may be iterable through __getitem__ alone (or
    # not at all: then iter() raises torch's TypeError).
    return auto_collation and getattr(type(index_sampler), "__iter__", None) is BatchSampler.__iter__


class _BaseIter:
    """What both iterators share: the epoch's index stream, seeds and counting.

    An iterator copies what it needs from its loader instead of keeping the
    loader: a persistent loader keeps its iterator, and a cycle between the two
    would keep workers alive after ``del loader`` until the garbage collector ran.
    """

    closed = False
    # Frames from the caller's next() down to _deliver: a warning there points at the caller.
    _DELIVER_DEPTH = 2
    # torch's names: whether batches are pinned, for which device (set by the loader).
    _pin_memory = False
    _pin_memory_device: str | None = None

    def __init__(self, loader: DataLoader) -> None:
        self._source = BatchSource(loader.dataset, loader._iterable, loader._auto_collation,
                                   loader.collate_fn, loader.batch_size, loader.drop_last)
        # output="torch": a collated batch's layout says which leaves are data
        # (BatchLayout.as_torch); anything else is converted as torch's
        # default_convert would (to_torch).
        self._source.as_torch = loader.output == "torch" and self._source.default_collate
        self._to_torch = loader.output == "torch" and not self._source.default_collate
        self._dataset = loader.dataset
        self._iterable = loader._iterable
        self._loader_workers = loader.num_workers
        self._seed_source = loader._seed_source
        self._rng_sources = loader._rng_sources()
        self._epoch_sampler = epoch_sampler(loader)
        self._index_sampler = loader._index_sampler
        self._split = distributed_split(loader)
        self._len_called = loader._IterableDataset_len_called
        self.progress = EpochProgress([], None)

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
        self.progress = EpochProgress([s.get_state() for s in sources],
                                      getattr(self._epoch_sampler, "epoch", None), skip, skip_after)
        # torch draws a base seed as each iterator is made; a persistent
        # iterator's later epochs (``same_workers``) keep theirs, drawing
        # nothing: NOTE [ torch's global seed ] in rng.py.
        base_seed = self._seed_source.draw_quiet() if same_workers else self._seed_source.draw()
        self._source.start_epoch(base_seed)
        start = (resume or {}).get("distributed", {}).get("start", 0)
        if start:
            self._index_remainder(start)
        elif lazy and _takes_kernel_batches(self._index_sampler, self._source.auto_collation):
            # BatchSampler.__iter__ is a generator, as torch's: nothing of it
            # runs before the first batch.
            self._kernel_batches = False
            self._indices = self._indices_from_first_batch()
        else:
            self._indices, self._kernel_batches = _index_stream(self._index_sampler,
                                                                self._source.auto_collation)
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
        self._kernel_batches = _takes_kernel_batches(self._index_sampler,
                                                     self._source.auto_collation)
        self._indices = remainder_stream(self._split, start, self._kernel_batches)

    def _indices_from_first_batch(self) -> Iterator[Any]:
        self.progress.sampler_epoch = getattr(self._epoch_sampler, "epoch", None)
        stream, self._kernel_batches = _index_stream(self._index_sampler,
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

    def __len__(self) -> int:
        return len(self._index_sampler)

    def __getstate__(self) -> NoReturn:
        # torch's error type; without it pickle would fail on some generator inside.
        raise NotImplementedError(f"{type(self).__name__} cannot be pickled")


class IterArgumentError(ValueError, AssertionError):
    """An argument torch checks with an assert at ``iter()`` (``timeout > 0`` without
    workers, ``prefetch_factor`` below 1 with them): torch's type, and a bad argument's."""


class _SingleProcessIter(_BaseIter):
    def __init__(self, loader: DataLoader, resume: dict | None = None) -> None:
        if loader.timeout > 0:
            # Checked now, as torch does (the attribute may change between epochs).
            raise IterArgumentError(
                f"timeout={loader.timeout} needs num_workers > 0: it bounds the wait for a "
                f"worker's batch, and with num_workers=0 the main process makes each batch "
                f"itself; set timeout=0 (torch: _SingleProcessDataLoaderIter requires "
                f"timeout == 0)")
        super().__init__(loader)
        self._begin_epoch(resume, lazy=True)
        section = resume.get("dataset") if resume is not None else None
        if section is not None:
            restore_copy(self._dataset, self._source, section["main"])
        if is_stateful(self._dataset):
            self.progress.datasets = MainSnapshot(self._source)
        if self._source.iterable and not self._source.stream_ended:
            # As torch: the dataset's iter() runs now, so its errors (even a
            # StopIteration) come out of iter(loader).  (A worker's runs at its first batch.)
            self._source.open_stream()

    def __next__(self) -> Any:
        if self.epoch_finished:
            raise StopIteration
        while self._skip_after and self._skips_next():
            pass
        try:
            indices = next(self._indices)
        except StopIteration:
            self.epoch_finished = True
            raise
        # Numbered before it is made, as a worker's task is: a batch that raises
        # does not shift the transform seeds of the ones after it.
        batch_no = self._next_batch_no
        self._next_batch_no += 1
        try:
            batch = self._source.make(batch_no, indices, self._kernel_batches)
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


# How long reading a finished iterator's ``_workers`` waits for its idle
# workers to exit (they were told to; the pool stops any that outstay this).
_WORKERS_EXIT_WAIT = 5.0


def _checked_prefetch_factor(prefetch_factor: Any) -> int:
    """Batches each worker may have on its way; checked at ``iter()``, where torch checks it.

    The loader accepts 0 (torch's "non-negative" check), and the attribute can
    be set between epochs, so only now is it known that workers need it.
    """
    if not isinstance(prefetch_factor, numbers.Integral):  # True is 1, as torch takes it
        raise TypeError(f"prefetch_factor must be an int when num_workers > 0, "
                        f"but got {prefetch_factor!r}")
    if prefetch_factor < 1:
        raise IterArgumentError(f"prefetch_factor must be greater than 0 when num_workers > 0 "
                                f"(it is how many batches each worker loads ahead), "
                                f"but got {prefetch_factor}")
    return int(prefetch_factor)


class _ArrivalError:
    """An answer that could not be unpacked in the main process, raised at its
    batch's turn (a worker's error travels as ``worker.ExceptionWrapper``)."""

    __slots__ = ("_exception",)

    def __init__(self, exception: Exception) -> None:
        self._exception = exception

    def reraise(self) -> NoReturn:
        exception, self._exception = self._exception, None
        try:
            raise exception
        finally:
            del exception  # see ExceptionWrapper.reraise: no cycle through this frame


# Every worker-backed iterator of this process, for the fork hook below.
_worker_iterators = WeakRegistry()


def _disown_inherited_iterators() -> None:
    """In a forked child: the iterators it inherited are its parent's.

    Their workers answer the parent: a child that asked them for batches
    took the parent's answers (and the parent then waited forever for them),
    as a child of torch's loader does.  So the copy is closed: ``next()`` on
    it raises, and a persistent loader's ``iter()`` starts workers of the
    child's own.  Its teardown, when dropped, leaves the parent's workers and
    segments alone (``_release_workers_and_ring``).
    """
    for iterator in _worker_iterators.live():
        iterator.closed = True
        iterator.inherited_from = iterator.owner_pid
    _worker_iterators.clear()


at_fork("inherited iterators", after_in_child=_disown_inherited_iterators)


class _MultiProcessIter(_BaseIter):
    """Batches made by worker processes into ring slots, handed out in order."""

    _DELIVER_DEPTH = 3  # __next__, _next, _deliver
    # The process whose workers these are, in a child that inherited this
    # iterator by fork (``_disown_inherited_iterators``).
    inherited_from: int | None = None

    def __init__(self, loader: DataLoader, resume: dict | None = None) -> None:
        self._prefetch = _checked_prefetch_factor(loader.prefetch_factor)
        super().__init__(loader)
        context = loader.multiprocessing_context or multiprocessing.get_context()
        method = context.get_start_method()
        self._num_workers = loader.num_workers
        self._timeout = loader.timeout if loader.timeout > 0 else None
        self._in_order = loader.in_order
        self._persistent = loader.persistent_workers
        # New workers every epoch, forked: they can write into the slots the
        # last epoch left, through the mappings they inherit.
        self._spares = loader._spare_slots if method == "fork" and not self._persistent else None
        self._ring = Ring(in_flight=self._num_workers * self._prefetch,
                          spares=self._spares.take() if self._spares is not None else ())
        self._tasks: dict[int, tuple[int, int]] = {}     # batch_no -> (worker, slot)
        self._layouts = [LayoutReceiver() for _ in range(self._num_workers)]
        source_args = (loader._iterable, loader._auto_collation, loader.collate_fn,
                       loader.batch_size, loader.drop_last)
        named = [("dataset", loader.dataset), ("batch settings and collate_fn", source_args),
                 ("worker_init_fn", loader.worker_init_fn)]
        payload: Any = tuple(obj for _, obj in named)
        if method != "fork":
            payload = pickle_for_workers(named, method)
        base_seed = self._begin_epoch(resume)
        self._pool = WorkerPool(context, self._num_workers, payload, base_seed, self._prefetch,
                                ring_prefix=self._ring.prefix, inherited_slots=self._ring.inherited)
        if not self._persistent:
            loader._reap_workers_when_gone()
        self.owner_pid = os.getpid()
        self._finalizer = tear_down_when_gone(self, self._pool, self._ring, self._tasks)
        _worker_iterators.add(self)
        self._workers_key = show_workers(self)
        try:
            # The first tasks wait in the pipes before the workers exist (see WorkerPool).
            self._start_dispatch(base_seed)
            with forking_workers(self._ring, self._spares):
                self._pool.start()
        except BaseException:
            self.shutdown()
            raise
        shown_workers(self._workers_key).extend(self._pool.processes)

    # -- epochs --------------------------------------------------------------

    def _start_dispatch(self, base_seed: int) -> None:
        self._pool.broadcast(("epoch", base_seed))
        self._tasks.clear()
        self._replies: dict[int, tuple] = {}             # batch_no -> (worker, reply), not yet handed out
        self._load = [0] * self._num_workers
        self._active = [True] * self._num_workers
        # Batch k goes to worker k % num_workers, also when resuming at k.
        self._rotation = self._next_batch_no % self._num_workers
        self._next_to_yield = self._next_batch_no
        self._indices_exhausted = False
        self._resume_datasets()
        for _ in range(self._num_workers * self._prefetch):
            self._dispatch()

    def _begin_epoch(self, resume: dict | None, **how: Any) -> int:
        """The base's, and the dataset copies' snapshots for this epoch (a
        dataset with ``state_dict``: see ``dataset_state``)."""
        base_seed = super()._begin_epoch(resume, **how)
        self._dataset_resume = resume.get("dataset") if resume is not None else None
        self._snapshots: WorkerSnapshots | None = None
        if is_stateful(self._dataset):
            if self._dataset_resume is not None:
                self._snapshots = WorkerSnapshots(self._dataset_resume["workers"],
                                                  self._dataset_resume)
            else:  # persistent workers' copies carry their state into the next epoch
                previous = getattr(self, "_carried", None)
                self._snapshots = WorkerSnapshots.next_epoch(previous or [None] * self._num_workers)
            self._carried = self._snapshots.workers
            self.progress.datasets = self._snapshots
        return base_seed

    def _resume_datasets(self) -> None:
        """Resuming: each worker's copy takes its state before its first task, and
        an IterableDataset's round-robin goes on from the worker after the last
        one handed out, the exhausted ones skipped."""
        section, self._dataset_resume = self._dataset_resume, None
        if section is None:
            return
        for worker, snap in enumerate(section["workers"]):
            if snap is not None:
                self._pool.send(worker, (DATASET_STATE, snap),
                                may_hold_tensors="torch" in sys.modules)
                if snap["ended"] and self._iterable:
                    self._active[worker] = False
        if self._iterable:
            for worker in section["exhausted"]:
                self._active[worker] = False
            self._rotation = section["next_worker"]
            self._next_batch_no = self._next_to_yield = section["next_batch_no"]

    def reset(self, loader: DataLoader, resume: dict | None = None) -> None:
        """A new epoch on the same workers (persistent_workers)."""
        self._len_called = loader._IterableDataset_len_called
        with self._worker_death_raises():
            self._drain()
            base_seed = self._begin_epoch(resume, same_workers=True)
            self._start_dispatch(base_seed)

    def _drain(self) -> None:
        """Collect the answers of an abandoned epoch, so its slots come back."""
        for _, reply in self._replies.values():
            self._ring.release(reply[2])
        self._replies.clear()
        while self._tasks:
            _, reply = self._receive()
            self._tasks.pop(reply[1], None)
            self._ring.release(reply[2])
        if self._snapshots is not None:
            self._snapshots.absorb_unhanded()

    # -- tasks ---------------------------------------------------------------

    def _pick_worker(self) -> int | None:
        """The worker for the next batch: the next active one in turn, as torch picks it.

        In order, batch ``k`` goes to worker ``k % num_workers`` (skipping the
        workers whose IterableDataset replica is exhausted) however fast each
        worker is: which worker makes a batch decides what a dataset that draws
        from a per-worker generator (numpy's global one, seeded per worker)
        returns, so the same seed must give the same assignment in every run.
        Out of order, a worker is passed over while it has its share of the
        tasks in flight (torch's rule).
        """
        count = self._num_workers
        capacity = None
        if not self._in_order:
            active = sum(self._active)
            capacity = self._prefetch * count // active if active else 0
        for _ in range(count):
            worker = self._rotation
            self._rotation = (worker + 1) % count
            if self._active[worker] and (capacity is None or self._load[worker] < capacity):
                return worker
        return None

    def _dispatch(self) -> None:
        """Send the next batch to its worker, if there is one to send."""
        if self._indices_exhausted:
            return
        while self._skip_after and self._skips_next():
            self._rotation = (self._rotation + 1) % self._num_workers
        worker = self._pick_worker()
        if worker is None:
            return
        try:
            indices = next(self._indices)
        except StopIteration:
            self._indices_exhausted = True
            return
        for slot_id, name in self._ring.take_retired():
            self._pool.broadcast(("retire", slot_id, name))
        slot = self._ring.acquire(worker)
        batch_no = self._next_batch_no
        self._next_batch_no += 1
        self._tasks[batch_no] = (worker, slot.slot_id)
        self._load[worker] += 1
        # Plain tuples and raw bytes pickle far faster than a tuple subclass
        # and an ndarray: this is on the per-batch path of both processes.
        # Only our kernel's batches travel as bytes (and become lists of keys);
        # any other sampler's batch reaches the dataset as it was yielded.
        if self._kernel_batches:
            self._pool.send(worker, ("batch", batch_no, tuple(slot), True, indices.tobytes()))
        else:
            self._pool.send(worker, ("batch", batch_no, tuple(slot), False, indices),
                            may_hold_tensors=_may_hold_tensors(indices))

    def _receive(self, awaited: int | None = None) -> tuple[int, tuple]:
        """``(worker, reply)``: the next reply from ``awaited`` (None: any worker) or
        from a dying worker; dead workers and timeouts raise."""
        got = self._pool.receive(self._timeout, awaited)
        if got is None:
            # As torch's, the iterator stays usable: the next call waits for the
            # batch again.  A worker is stuck in the caller's code, though: if
            # the loop is left now, the workers are terminated, not waited for.
            self._pool.exit_grace = 0.0
            raise RuntimeError(f"DataLoader timed out after {self._timeout} seconds")
        worker, reply = got
        if len(reply) > 5:  # the snapshot of a dataset with state_dict (dataset_state)
            if self._snapshots is not None:
                self._snapshots.arrive(worker, reply[1], reply[5])
            reply = reply[:5]
        kind, batch_no, slot_id, created, payload = reply
        if created is not None:
            try:
                self._ring.adopt(slot_id, created)
            except Exception:
                self.shutdown()
                raise
        if kind == "batch":
            try:
                # Decoded on arrival: a worker's layout numbers follow its sending order.
                payload = self._layouts[worker].decode(payload)
            except Exception as exc:
                if isinstance(exc, (OSError, EOFError)):
                    # A value its worker hands over by descriptor, which a dead
                    # worker cannot: the death is the error.
                    self._pool.raise_if_exiting(worker)
                if isinstance(exc, (OSError, RuntimeError)) and near_open_file_limit():
                    # A descriptor that could not be received ("received 0 items
                    # of ancdata"): torch's error, as torch checks after a failed get.
                    self.shutdown()
                    raise too_many_open_files() from exc
                # e.g. a value whose class cannot be rebuilt in this process:
                # the batch fails at its turn, as a worker's error would, and
                # its slot and task are accounted for like any other answer.
                exc.add_note(f"raised in the main process while unpickling batch {batch_no} "
                             f"from worker {worker}")
                kind, payload = "error", _ArrivalError(exc)
                if isinstance(exc, LayoutLost):
                    self._pool.send(worker, RESEND_LAYOUTS)
            reply = (kind, batch_no, slot_id, created, payload)
        if kind == "init_error":
            self.shutdown()
            payload.reraise()
        if batch_no in self._tasks:
            self._load[worker] -= 1
        return worker, reply

    def __next__(self) -> Any:
        try:
            return self._next()
        except KeyboardInterrupt:
            self.shutdown()
            raise
        except WorkerDied as exc:
            self.shutdown()
            raise RuntimeError(str(exc)) from None

    @contextlib.contextmanager
    def _worker_death_raises(self) -> Iterator[None]:
        """A worker found dead (as ``__next__`` does): stop the rest, raise RuntimeError."""
        try:
            yield
        except WorkerDied as exc:
            self.shutdown()
            raise RuntimeError(str(exc)) from None

    def _next(self) -> Any:
        if self.closed or self.epoch_finished:
            if self.inherited_from is not None and not self.epoch_finished:
                raise RuntimeError(
                    f"this DataLoader iterator came with a fork from process "
                    f"{self.inherited_from}, whose workers serve that process only; "
                    f"call iter() on the loader in this process to start workers of its own")
            raise StopIteration
        while True:
            ready = self._take_ready()
            if ready is not None:
                worker, (kind, batch_no, slot_id, _, payload) = ready
                if kind == "batch":
                    layout, values = payload
                    if self._source.as_torch:
                        layout.as_torch()
                    batch = layout.build(self._ring.lease(slot_id), values)
                    self._dispatch()
                    if self._snapshots is not None:
                        self._snapshots.hand(worker, batch_no)
                    return self._deliver(batch_no, batch)
                self._ring.release(slot_id)
                if kind == "end":  # this worker's IterableDataset replica is exhausted
                    self._active[worker] = False
                    if self._snapshots is not None:
                        self._snapshots.end(worker, batch_no)
                    self._dispatch()  # keep the other workers' share in flight
                    continue
                self.progress.hand(batch_no)  # its error was the caller's batch: resuming skips it
                if self._snapshots is not None:
                    self._snapshots.hand(worker, batch_no)
                self._dispatch()
                payload.reraise()
            if not self._tasks:
                self._dispatch()  # e.g. workers left idle while an exhausted one was skipped
                if not self._tasks:
                    self._end_epoch()
                    raise StopIteration
                continue
            # In order, the next batch's worker is known: only its answer is
            # worth waking up for.
            awaited = self._tasks.get(self._next_to_yield) if self._in_order else None
            worker, reply = self._receive(awaited[0] if awaited is not None else None)
            del self._tasks[reply[1]]
            self._replies[reply[1]] = (worker, reply)

    def _take_ready(self) -> tuple | None:
        if self._in_order:
            # An exhausted IterableDataset worker leaves holes in the numbering.
            while self._next_to_yield not in self._replies and self._next_to_yield not in self._tasks \
                    and self._next_to_yield < self._next_batch_no:
                self._next_to_yield += 1
            reply = self._replies.pop(self._next_to_yield, None)
            if reply is not None:
                self._next_to_yield += 1
            return reply
        if self._replies:
            return self._replies.pop(min(self._replies))
        return None

    def _end_epoch(self) -> None:
        self.epoch_finished = True
        if not self._persistent:
            if self._spares is not None:
                # Every task is answered: no worker writes a slot any more.
                self._ring.hand_over(self._spares)
            # The workers are idle: they exit on their own, and the caller's
            # StopIteration does not wait for their teardown (a visible share
            # of a short epoch).  They are reaped when the next pool starts, or
            # when the loader goes (DataLoader._reap_workers_when_gone).
            self._pool.shutdown(wait=False)
            self.shutdown()

    # -- teardown ------------------------------------------------------------

    def shutdown(self) -> None:
        """Stop the workers and unlink every segment; held batches stay valid."""
        self.closed = True
        self._finalizer()

    # torch's name, which code calls to free a persistent loader's workers
    # (``loader._iterator._shutdown_workers()``); the next ``iter()`` starts new ones.
    _shutdown_workers = shutdown

    @property
    def worker_pids(self) -> list[int]:
        return self._pool.pids

    @property
    def _workers(self) -> list:
        """torch's ``_workers``, which code that watches workers reads: the
        worker ``Process`` objects in worker-id order, the same list every
        epoch of persistent workers, kept after shutdown with their exit codes.

        torch's shutdown joins its workers; at an epoch's end this one leaves
        its idle workers to exit on their own (see ``_end_epoch``), so reading
        the list of a finished iterator waits for them (bounded): each has its
        exit code then, as torch's has.
        """
        processes = shown_workers(self._workers_key)
        if self.closed and self.inherited_from is None:
            deadline = time.monotonic() + _WORKERS_EXIT_WAIT
            for process in processes:
                while running(process) and time.monotonic() < deadline:
                    process.join(timeout=0.05)
        return processes
