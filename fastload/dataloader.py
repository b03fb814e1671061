"""``DataLoader``: torch's arguments, validation and semantics; fastload's batch path.

The loader itself holds policy (what to sample, how to collate, how many
workers); at each ``iter()`` it reads its attributes once into a
``LoaderSettings`` (``_loading/settings.py``) and hands that to a new
iterator, which holds the epoch's lifetimes:

* ``_SingleProcessIter`` (``_loading/iterators.py``) makes each batch in the
  calling process;
* ``_MultiProcessIter`` (``_loading/worker_iterator.py``) keeps
  ``num_workers * prefetch_factor`` batches in flight in a ``WorkerPool``,
  each written by a worker into a slot of the shared-memory ``Ring``, and
  hands them out in batch order as views of their slot.

NOTE [ Determinism ]
Every epoch draws one base seed from the loader's ``generator`` (shared with
the default RandomSampler), and the random transforms of batch ``b`` are
seeded from ``(base_seed, b)``.  So the same seed gives the same batches
whatever ``num_workers`` or start method is, and ``load_state_dict`` can
replay an epoch: it restores the generators' state from the epoch's start and
skips the index batches already yielded (no data is fetched for them).
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import multiprocessing
import numbers
import os
import warnings
import weakref
from time import perf_counter
from typing import Any, Callable, Generic, Iterator, TypeVar

from fastload.collate import default_collate, default_convert
from fastload.dataset import is_iterable_dataset
from fastload.dataset_state import check_dataset_section, check_dataset_workers, \
    dataset_section, has_state, is_stateful, needs_fresh_workers
from fastload.elastic import distributed_split, rebase_to_split, record_split
from fastload.kept_order import kept_order_section, order_keeping, warn_if_order_unknown
from fastload.resume import EpochProgress, check_state, epoch_sampler, make_state, seed_streams
from fastload._ring import SpareSlots
from fastload.rng import SeedSource
from fastload.sampler import BatchSampler, RandomSampler, Sampler, SequentialSampler
from fastload._loading.autotune import AutoOptions, HillClimb, max_workers, usable_cpus
from fastload._loading.iterators import _BaseIter, _SingleProcessIter
from fastload._loading.memory_budget import DEFAULT_SHARE
from fastload._loading.pinning import pin_device
from fastload._loading.reaping import join_exiting_workers
from fastload._loading.report import LoaderReport, make_report
from fastload._loading.settings import BatchSettings, LoaderSettings
from fastload._loading.sharding_check import warn_if_unsharded
from fastload._loading.time_ledger import TimeLedger
from fastload._loading.worker_iterator import _MultiProcessIter

__all__ = ["DataLoader"]

_OUTPUTS = ("numpy", "torch")
_GUARDED_ATTRIBUTES = ("batch_size", "batch_sampler", "sampler", "drop_last", "dataset",
                       "persistent_workers")
_T_co = TypeVar("_T_co", covariant=True)


class _InfiniteConstantSampler(Sampler):
    """The sampler of an IterableDataset: the dataset decides when to stop."""

    def __iter__(self) -> Iterator[None]:
        return itertools.repeat(None)


def _checked_auto_options(num_workers: Any, prefetch_factor: Any, memory_budget: Any,
                          dataset: Any) -> AutoOptions | None:
    """``num_workers="auto"``'s options (None for a fixed count), checked."""
    auto_workers = isinstance(num_workers, str)
    auto_prefetch = isinstance(prefetch_factor, str)
    if auto_workers and num_workers != "auto":
        raise ValueError(f"num_workers should be an int >= 0 or 'auto', but got {num_workers!r}")
    if auto_prefetch and (prefetch_factor != "auto" or not auto_workers):
        raise ValueError(f"prefetch_factor should be an int, or 'auto' with num_workers='auto', "
                         f"but got prefetch_factor={prefetch_factor!r} with "
                         f"num_workers={num_workers!r}")
    if not auto_workers:
        if memory_budget is not None:
            raise ValueError(f"memory_budget is the budget of num_workers='auto'; with "
                             f"num_workers={num_workers!r} it would limit nothing: leave it None")
        return None
    if memory_budget is not None and (isinstance(memory_budget, bool)
                                      or not isinstance(memory_budget, numbers.Integral)
                                      or memory_budget <= 0):
        raise ValueError(f"memory_budget should be a number of bytes > 0 (None: "
                         f"{int(100 * DEFAULT_SHARE)} % of the available memory), but got "
                         f"memory_budget={memory_budget!r}")
    if is_iterable_dataset(dataset) or is_stateful(dataset):
        kind = "an IterableDataset splits its stream" if is_iterable_dataset(dataset) else \
            "a dataset with state_dict keeps a state per worker copy"
        raise ValueError(f"num_workers='auto' needs a map-style dataset without state_dict: "
                         f"{kind} by worker, and the autopilot adds and retires workers "
                         f"mid-epoch; give num_workers as an int")
    if not auto_prefetch and prefetch_factor is not None and prefetch_factor < 1:
        raise ValueError(f"prefetch_factor must be >= 1 with num_workers='auto', "
                         f"but got {prefetch_factor}")
    start_prefetch = 2 if auto_prefetch or prefetch_factor is None else int(prefetch_factor)
    return AutoOptions(start_workers=1, start_prefetch=start_prefetch, auto_prefetch=auto_prefetch,
                       memory_budget=None if memory_budget is None else int(memory_budget),
                       max_workers=max_workers(), cpus=usable_cpus())


def _checked_worker_options(num_workers: Any, timeout: float, prefetch_factor: int | None,
                            persistent_workers: bool, output: str) -> tuple[int, int | None]:
    """``num_workers`` as an int and ``prefetch_factor`` with its default, once
    the options about workers and output are checked as torch checks them."""
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
    return num_workers, prefetch_factor


def _checked_choice(choice: Any) -> dict:
    """A state's ``autopilot`` section, checked: where the climb was."""
    try:
        workers, prefetch = int(choice["num_workers"]), int(choice["prefetch_factor"])
    except (TypeError, KeyError, ValueError):
        raise ValueError(f"DataLoader state_dict's 'autopilot' should be a dict of "
                         f"num_workers and prefetch_factor, but got {choice!r:.200}") from None
    if workers < 1 or prefetch < 1:
        raise ValueError(f"DataLoader state_dict's 'autopilot' holds num_workers={workers} and "
                         f"prefetch_factor={prefetch}; both should be >= 1")
    return {"num_workers": workers, "prefetch_factor": prefetch}


class DataLoader(Generic[_T_co]):
    """Combines a dataset and a sampler, and iterates over the dataset in batches.

    Same arguments and semantics as ``torch.utils.data.DataLoader``; batches
    are numpy arrays (``output="torch"``: tensors sharing their memory).  With
    ``num_workers > 0`` each batch is a set of views of a shared-memory slot
    that stays reserved while you hold any of them.  ``num_workers="auto"``
    (and ``prefetch_factor="auto"``) choose the count while the epoch runs,
    under ``memory_budget`` bytes (NOTE [ The autopilot's hill climb ] in
    ``_loading/autotune.py``); ``report()`` says where the time went.
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
                 output: str = "numpy", snapshot_every_n_steps: int = 1,
                 memory_budget: int | None = None) -> None:
        # num_workers="auto" (autotune.py): the loader starts the climb's choice, an int.
        self._autopilot = _checked_auto_options(num_workers, prefetch_factor, memory_budget,
                                                dataset)
        self.memory_budget = memory_budget
        if self._autopilot is not None:
            num_workers, prefetch_factor = 1, self._autopilot.start_prefetch
        # What the climb chose: the next epoch, and a state, start from it.
        self._auto_choice: dict = {}
        self._auto_climb: HillClimb | None = None  # made at the first iter(), kept across epochs
        # Every generator seeded per batch, as in auto mode, with a fixed count too
        # (private: the tests compare auto's batches with a fixed count's).
        self._seed_per_batch = False
        num_workers, prefetch_factor = _checked_worker_options(
            num_workers, timeout, prefetch_factor, persistent_workers, output)
        if not isinstance(snapshot_every_n_steps, numbers.Integral) \
                or isinstance(snapshot_every_n_steps, bool) or snapshot_every_n_steps < 0:
            raise ValueError(f"snapshot_every_n_steps should be an int >= 0 (how many batches "
                             f"of a worker pass between the snapshots of its dataset copy it "
                             f"sends; 0: only at the epoch's start), but got "
                             f"snapshot_every_n_steps={snapshot_every_n_steps!r}")
        self.snapshot_every_n_steps = int(snapshot_every_n_steps)

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
        # NOTE [ Slots that outlive an epoch ] in _ring/spares.py.
        self._spare_slots = SpareSlots()
        self._ledger = TimeLedger()  # where the time went: report()
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
        if self.num_workers == 0 or self._autopilot is not None:
            return  # "auto" chooses the count itself, past the CPUs when that helps
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
        sampler = self._index_sampler
        if callable(getattr(sampler, "_len_after", None)):
            # Its length follows its seed, which an epoch draws after the base
            # seed: count the epoch iter() will give (BucketBatchSampler).
            return sampler._len_after(self._seed_source, quiet=self._keeps_workers())
        return len(sampler)

    def _keeps_workers(self) -> bool:
        """The next iter() reuses this loader's persistent workers (and their base seed)."""
        return self.persistent_workers and self.num_workers > 0 \
            and self._iterator is not None and not self._iterator.closed

    def __iter__(self) -> "_BaseIter":
        warn_if_unsharded(self, stacklevel=2)  # every rank the same samples: say so, once
        if self._pending_state is not None:
            check_dataset_workers(self._pending_state, self)
        started = perf_counter()
        try:
            if self.persistent_workers and self.num_workers > 0:
                if self._iterator is not None and not self._iterator.closed \
                        and has_state(self) and needs_fresh_workers(self._pending_state):
                    self._iterator.shutdown()  # its copies of the dataset have moved on
                if self._iterator is None or self._iterator.closed:
                    self._iterator = self._get_iterator()
                else:
                    self._iterator.reset(self._IterableDataset_len_called, self._pending_state)
                    self._pending_state = None
                    self._progress = self._iterator.progress
                return self._iterator
            return self._get_iterator()
        finally:
            self._ledger.startup += perf_counter() - started

    def report(self, reset: bool = False) -> LoaderReport:
        """Where the time went since this loader was made (or last reset): the share of
        the consumer's time spent waiting for data in ``next()``, each stage's share of
        making a batch, per worker, and a verdict in words (``str()`` of the report).

        ``reset=True`` starts a new account after this one (e.g. once per epoch).
        """
        workers = self._auto_choice.get("num_workers", self.num_workers)  # auto: the last choice
        report = make_report(self._ledger, workers, autopilot=self._autopilot is not None)
        if reset:
            self._ledger.reset()
        return report

    def _get_iterator(self) -> "_BaseIter":
        """A new iterator for one epoch, as torch's method of this name.

        Libraries call it (ultralytics' ``InfiniteDataLoader.reset``) or
        override it, so ``__iter__`` makes every new iterator through it.  A
        loaded state stays pending until an epoch has begun from it: an iterator
        that fails to start (a dataset's ``len()``, a worker) leaves it to the next try.
        """
        if self.num_workers > 0:
            self.check_worker_number_rationality()  # as torch, whenever workers start
        settings = self._settings(self._warn_about_pin_memory())
        resume = self._pending_state
        if self.num_workers == 0:
            iterator: _BaseIter = _SingleProcessIter(settings, resume)
        else:
            if not self.persistent_workers:
                self._reap_workers_when_gone()
            iterator = _MultiProcessIter(settings, resume)
        self._pending_state = None
        # Only a weak reference: dropping the iterator (a `break`) must stop
        # its workers at once, as torch's does.
        self._last_iterator = weakref.ref(iterator)
        self._progress = iterator.progress
        return iterator

    def _settings(self, pinning: tuple[bool, str | None]) -> LoaderSettings:
        """What the epoch about to start runs with (its iterator reads nothing else of ours)."""
        batch = BatchSettings(self._iterable, self._auto_collation, self.collate_fn,
                              self.batch_size, self.drop_last)
        auto = self._autopilot
        if auto is not None and self._auto_choice:
            # The last epoch's (or a state's) choice is where this one starts.
            self.num_workers = self._auto_choice["num_workers"]
            self.prefetch_factor = self._auto_choice["prefetch_factor"]
            auto = dataclasses.replace(auto, start_workers=self.num_workers,
                                       start_prefetch=self.prefetch_factor)
        if auto is not None and self._auto_climb is None:
            self._auto_climb = HillClimb(auto.start_workers, auto.start_prefetch, auto)
        return LoaderSettings(
            dataset=self.dataset, batch=batch, output=self.output, num_workers=self.num_workers,
            prefetch_factor=self.prefetch_factor, timeout=self.timeout, in_order=self.in_order,
            persistent_workers=self.persistent_workers,
            snapshot_every_n_steps=self.snapshot_every_n_steps,
            multiprocessing_context=self.multiprocessing_context,
            worker_init_fn=self.worker_init_fn, seed_source=self._seed_source,
            rng_sources=tuple(self._rng_sources()), epoch_sampler=epoch_sampler(self),
            index_sampler=self._index_sampler, kept_order=order_keeping(self),
            split=distributed_split(self),
            len_called=self._IterableDataset_len_called, pin_memory=pinning[0],
            pin_memory_device=pinning[1], spare_slots=self._spare_slots, ledger=self._ledger,
            autopilot=auto, auto_choice=self._auto_choice, auto_climb=self._auto_climb,
            seed_per_batch=auto is not None or self._seed_per_batch)

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
        if not self._iterable:
            warn_if_order_unknown(self)
        if self._pending_state is not None:
            return dict(self._pending_state)
        state = make_state([s.pinned_state() for s in self._rng_sources()], self._progress, self)
        state.update(kept_order_section(self._progress, self))
        live = self._iterator is not None and not self._iterator.closed
        if live and self._progress is not None and self._progress.finished:
            # The next epoch runs on these persistent workers, drawing no base seed.
            quiet = self._seed_source.quiet_preview()
            if quiet is not None:
                state["next_base_seed"] = quiet
        if self._autopilot is not None:  # a resumed run starts where the climb was
            state["autopilot"] = dict(self._auto_choice) or {
                "num_workers": self.num_workers, "prefetch_factor": self.prefetch_factor}
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
        state = dict(state)
        choice = state.pop("autopilot", None)
        checked = check_state(rebase_to_split(state, self), self, self._rng_sources())
        check_dataset_section(checked, self)
        if choice is not None and self._autopilot is not None:
            self._auto_choice.update(_checked_choice(choice))
            self._auto_climb = None  # a new climb, from the state's choice
        self._pending_state = checked
