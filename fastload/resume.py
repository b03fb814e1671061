"""Resuming an epoch: what a loader's ``state_dict`` holds, and how it is checked.

A state is the seed streams' state at the start of the epoch, the batches the
caller has been handed (as a batch or as the error making it raised), the
sampler's epoch, and a description of the loader it came from.  Resuming
restores the streams, replays the epoch's index batches and skips the handed
ones without fetching them (NOTE [ Determinism ] in dataloader.py).

``EpochProgress`` is kept by the loader, not only by its iterator, so a
state taken after the loop has ended -- a ``break``, an exception, Ctrl-C,
which drop the iterator -- still says where the epoch stopped.

A dataset's own state (torchdata's convention; the code is ``dataset_state.py``):
a dataset, map-style or iterable, that defines ``state_dict()`` and
``load_state_dict(state)`` is saved and restored through them, and so is the
iterator an IterableDataset's ``__iter__`` returns, under the state's
``"dataset"`` key; a stream with neither is replayed and skipped (with a
warning); a map-style dataset without them resumes by its sampler alone.
A sampler fastload does not own keeps its order through its own state, its
generator, or the epoch's batches as drawn (``order_keeping``).

* ``num_workers=0``: the dataset's state when the state is taken (the main
  process makes each batch when it is asked for, so that is the boundary the
  caller has seen), and whether its stream gave its last, short batch.
* Workers: a worker snapshots its copy with every ``snapshot_every_n_steps``-th
  answer it sends; the main process keeps per worker the snapshot of the
  last such answer it handed out and the batches that worker made since
  (workers run ahead by the prefetch), which a resume replays.  For an IterableDataset also the
  round-robin's place: torch's, and fastload's, batching takes batch ``k``
  from the next worker in turn that is not exhausted, so the state keeps the
  worker after the last one handed out, the workers found exhausted, the
  next batch number and the count of batches handed out.
* Resuming, ``iter()`` gives each copy its state (and replays) before it makes
  a batch and continues the turn from that worker: the rest of the epoch is the rest of
  the uninterrupted run, batch for batch (``in_order=False``: each worker's
  stream continues exactly; their interleaving follows arrival, as in any
  such run; with a map-style dataset each copy resumes at the last batch of
  it handed out).  A worker with nothing handed out yet this epoch resumes
  with its copy as it came from the main process (a persistent worker's, as
  the last epoch left it, its stream started over).  Between epochs a state
  holds what the next epoch starts from: the dataset's state, persistent
  workers' copies, or nothing for new workers, which copy the main process's
  dataset again.
* A state of other ``num_workers`` is refused when a dataset part is in it:
  each worker reads its own stream of an IterableDataset (sharded by
  ``get_worker_info()``), and each copy of a map-style dataset has its own
  state.  A map-style state without a dataset part (taken before) still loads.
* Seeds: as for map-style datasets, the resumed epoch replays the base seed the
  epoch drew (between epochs, persistent workers' next one: ``next_base_seed``), so workers get the same ``get_worker_info().seed`` and seed
  numpy's and Python's generators with it once, at start; what a dataset drew
  from them before the cut is not replayed: keep such a generator in the
  dataset's state.  Persistent workers resumed in a later epoch are new
  processes, seeded from that epoch's base seed.
"""

from __future__ import annotations

import copy
import hashlib
import numbers
import sys
from typing import Any

import numpy as np

from fastload.rng import SeedSource

STATE_VERSION = 2
_READABLE_VERSIONS = (1, 2)  # version 1 had no loader description and no out-of-order list


class EpochProgress:
    """The batches of one epoch handed to the caller, by batch number.

    ``handed``: every batch below it was handed out; ``after``: those handed
    out beyond it (out of order, ``in_order=False``).  A batch counts once the
    caller has it or the exception raised in making it: resuming skips it.
    """

    __slots__ = ("rng_states", "sampler_epoch", "handed", "after", "finished", "datasets",
                 "order_start", "order", "sampler_state")

    def __init__(self, rng_states: list, sampler_epoch: Any, handed: int = 0,
                 after: frozenset = frozenset()) -> None:
        self.rng_states = rng_states
        self.sampler_epoch = sampler_epoch
        self.handed = handed
        self.after = set(after)
        self.finished = False
        # The dataset copies' snapshots, for a dataset with state_dict (dataset_state.py).
        self.datasets: Any = None
        # A DistributedSampler epoch resumed from elsewhere: where in the epoch's
        # order its suffix starts (fastload/elastic.py).
        self.order_start = 0
        # A sampler fastload does not own (order_keeping): the epoch's batches as
        # drawn, or its state_dict() at the epoch's start.
        self.order: list | None = None
        self.sampler_state: Any = None
        self._advance()

    def hand(self, batch_no: int) -> None:
        if batch_no == self.handed and not self.after:  # in order: once per batch
            self.handed = batch_no + 1
        elif batch_no >= self.handed:
            self.after.add(batch_no)
            self._advance()

    def _advance(self) -> None:
        while self.handed in self.after:
            self.after.remove(self.handed)
            self.handed += 1


def describe(loader: Any) -> dict:
    """What a state must agree with to resume the same epoch."""
    try:
        length = len(loader.dataset)
    except TypeError:
        length = None
    return {"dataset_length": length, "batch_size": loader.batch_size,
            "drop_last": loader.drop_last, "samplers": _sampler_settings(loader),
            "seed_streams": [label for label, _ in seed_streams(loader)]}


# The arguments torch's samplers and fastload's share that shape an epoch's
# batches (seeds and generators are the state itself, restored, not compared).
_SAMPLER_SETTINGS = ("batch_size", "drop_last", "replacement", "num_samples", "num_replicas",
                     "rank", "shuffle", "seed", "bucket_size_multiplier", "max_tokens")

# fastload's samplers: their order is saved (seed streams, epoch) and their
# contents are what they were built with.
_OWN_SAMPLER_MODULES = ("fastload.sampler",)


def _sampler_settings(loader: Any) -> dict:
    """Each sampler that decides the batches, by its place: its type, its
    settings, its length."""
    settings = {}
    for place, sampler in sampler_places(loader):
        entry: dict = {"type": _type_name(sampler)}
        for name in _SAMPLER_SETTINGS:
            try:
                value = getattr(sampler, name)
            except Exception:  # absent, or a property of the caller's that fails
                continue
            if isinstance(value, (bool, np.bool_)):
                entry[name] = bool(value)
            elif isinstance(value, numbers.Integral):
                entry[name] = int(value)
        try:
            # e.g. SubsetRandomSampler's indices; not a length that follows the
            # epoch's draws (BucketBatchSampler's with max_tokens: _resumed_length).
            if not getattr(sampler, "_length_from_draws", False):
                entry["length"] = len(sampler)
        except Exception:
            pass
        for name, values in _sampler_contents(sampler):
            digest = _sampled_digest(values)
            if digest is not None:
                entry[name] = digest
        settings[place] = entry
    return settings


_CONTENTS = ("indices", "weights", "lengths")


def _sampler_contents(sampler: Any) -> list[tuple[str, Any]]:
    """What a sampler draws from besides its settings: a subset's indices, the
    weights, or the sampler itself when it is a plain sequence of indices.

    Only for fastload's and torch's samplers, whose ``indices`` and ``weights``
    are what they were built with: a caller's sampler may rebuild such an
    attribute every epoch.
    """
    if isinstance(sampler, (list, tuple, range, np.ndarray)):
        return [("indices", sampler)]
    if type(sampler).__module__ not in (*_OWN_SAMPLER_MODULES, "torch.utils.data.sampler"):
        return []
    contents = [(name, getattr(sampler, name, None)) for name in _CONTENTS]
    return [(name, values) for name, values in contents if values is not None]


_DIGEST_PICKS = 1024


def _sampled_digest(values: Any) -> str | None:
    """A digest of up to ``_DIGEST_PICKS`` evenly spaced entries of ``values``:
    enough to tell another subset or other weights apart, without reading
    millions of indices at every ``state_dict()``.  None if they cannot be read
    as numbers."""
    try:
        step = max(1, len(values) // _DIGEST_PICKS)
        if isinstance(values, (list, tuple, range)):
            picks = values[::step]
        elif hasattr(values, "__array__"):  # numpy arrays, torch tensors: no copy
            picks = np.asarray(values)[::step]
        else:
            picks = [values[i] for i in range(0, len(values), step)]
        sample = np.asarray(picks, dtype=np.float64)
    except Exception:  # a caller's sequence we cannot index or turn into numbers
        return None
    return f"<digest {hashlib.blake2b(sample.tobytes(), digest_size=8).hexdigest()}>"


# Types a state saved by an earlier fastload names by a path since renamed.
_RENAMED = {"fastload.bucket_sampler.BucketBatchSampler": "fastload.sampler.BucketBatchSampler"}


def _differences(recorded: dict, current: dict) -> list[tuple[str, Any, Any]]:
    """``(name, recorded, current)`` of each setting the two descriptions disagree on,
    samplers named by place (``batch_sampler.batch_size``), the innermost first: a
    change there (a subset's length) shows in the samplers around it too."""
    found = []
    for key, value in current.items():
        if key not in recorded or recorded[key] == value:
            continue
        if key == "samplers" and isinstance(recorded[key], dict):
            places = sorted(set(recorded[key]) | set(value), key=lambda p: (-p.count("."), p))
            for place in places:
                old, new = recorded[key].get(place, {}), value.get(place, {})
                if old.get("type") in _RENAMED:
                    old = {**old, "type": _RENAMED[old["type"]]}
                if old.get("type") != new.get("type"):
                    found.append((place, old.get("type"), new.get("type")))
                    continue
                # A readable setting first; a digest of the contents only if
                # they alone differ, and if the state has one (states saved
                # before digests were kept have none).
                names = sorted(set(old) | set(new), key=lambda n: (n in _CONTENTS, n))
                found += [(f"{place}.{name}", old.get(name), new.get(name))
                          for name in names if old.get(name) != new.get(name)
                          and (name in old or name not in _CONTENTS)]
        else:
            found.append((key, recorded[key], value))
    return found


def _type_name(obj: Any) -> str | None:
    return None if obj is None else f"{type(obj).__module__}.{type(obj).__qualname__}"


def make_state(rng_states: list, progress: EpochProgress | None, loader: Any) -> dict:
    """A state: mid-epoch from ``progress``, else at the start of the next epoch."""
    started = progress is not None and not progress.finished
    return {"version": STATE_VERSION,
            # A copy: a stream following torch's default generator keeps a live
            # record of its draws (NOTE [ torch's global seed ] in rng.py).
            "rng_states": copy.deepcopy(progress.rng_states if started else rng_states),
            "batches_yielded": progress.handed if started else 0,
            "yielded_after": sorted(progress.after) if started else [],
            # Between epochs the caller sets the next epoch itself (set_epoch).
            "sampler_epoch": progress.sampler_epoch if started else None,
            "loader": describe(loader)}


def check_state(state: Any, loader: Any, sources: list) -> dict:
    """``state`` made whole and checked against ``loader``; ValueError naming what is wrong."""
    if not isinstance(state, dict) or state.get("version") not in _READABLE_VERSIONS:
        raise ValueError(f"not a fastload DataLoader state_dict (version {STATE_VERSION}): "
                         f"{state!r:.200}")
    state = dict(state)
    for key, default in (("yielded_after", []), ("sampler_epoch", None), ("loader", None)):
        state.setdefault(key, default)
    for key in ("rng_states", "batches_yielded"):
        if key not in state:
            raise ValueError(f"DataLoader state_dict has no {key!r}: {state!r:.200}")
    recorded = state["loader"]
    if recorded is not None:
        differences = _differences(recorded, describe(loader))
        if differences:
            name, old, new = differences[0]
            raise ValueError(f"this state_dict comes from a DataLoader with {name}={old!r}, "
                             f"this one has {name}={new!r}; build the loader with the same "
                             f"dataset, samplers and arguments")
    if not isinstance(state["rng_states"], (list, tuple)) \
            or len(state["rng_states"]) != len(sources):
        raise ValueError("this state_dict comes from a DataLoader with other random samplers; "
                         "build the loader with the same arguments")
    order = state.get("order")
    if order is not None and not isinstance(order, list):
        raise ValueError(f"DataLoader state_dict: 'order' must be the epoch's batches (a list), "
                         f"got {type(order).__name__}")
    quiet = state.get("next_base_seed")
    if quiet is not None and not (_is_count(quiet) and quiet < 1 << 63):
        raise ValueError(f"DataLoader state_dict: next_base_seed={quiet!r} must be a seed "
                         f"(an int in [0, 2**63))")
    handed = state["batches_yielded"]
    after = state["yielded_after"]
    if not _is_count(handed) or not all(_is_count(b) and b > handed for b in after):
        raise ValueError(f"DataLoader state_dict: batches_yielded={handed!r} and "
                         f"yielded_after={after!r} must be batch numbers (ints >= 0), the "
                         f"second all above the first")
    batches = _resumed_length(loader, state, sources)
    if batches is not None and max([handed - 1, *after]) >= batches:
        raise ValueError(f"DataLoader state_dict: batch {max([handed - 1, *after])} was handed "
                         f"out, but this loader has {batches} batches an epoch")
    # Every stream takes its state now, so a wrong one fails here, not at iter().
    for source, new in zip(sources, state["rng_states"]):
        old = source.get_state()
        try:
            source.set_state(new)
        except Exception as error:
            raise ValueError(f"DataLoader state_dict: a seed stream's state does not fit this "
                             f"loader's generator ({type(error).__name__}: {error})") from error
        finally:
            source.set_state(old)
    return state


def _resumed_length(loader: Any, state: dict, sources: list) -> int | None:
    """``len(loader)`` for the epoch ``state`` resumes (None without a length).

    A batch sampler whose number of batches depends on the epoch's draws
    (``BucketBatchSampler`` with ``max_tokens``: ``_length_from_draws``) is
    asked with the state's streams and epoch in place, then put back.
    """
    if getattr(loader, "_iterable", False):
        # An IterableDataset's len() is not asked: torch's loader remembers it
        # (for its warning), and a stream's batches are counted by the dataset part.
        return None
    sampler = loader.batch_sampler
    if not getattr(sampler, "_length_from_draws", False):
        try:
            return len(loader)
        except TypeError:
            return None
    olds = [source.get_state() for source in sources]
    old_epoch = getattr(sampler, "epoch", None)
    try:
        for source, new in zip(sources, state["rng_states"]):
            source.set_state(new)
        if state["sampler_epoch"] is not None:
            sampler.set_epoch(state["sampler_epoch"])
        return len(loader)
    except Exception:
        return None  # a state that does not fit is refused below, with its reason
    finally:
        for source, old in zip(sources, olds):
            source.set_state(old)
        if old_epoch is not None:
            sampler.set_epoch(old_epoch)


def _is_count(value: Any) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool) and value >= 0


def _is_plain_batch_sampler(obj: Any) -> bool:
    cls = type(obj)
    return cls.__name__ == "BatchSampler" and cls.__module__ in ("fastload.sampler",
                                                                 "torch.utils.data.sampler")


def _is_torch_class(obj: Any, module: str, name: str) -> bool:
    """``obj`` is exactly torch's ``module.name`` (without importing torch)."""
    cls = type(obj)
    return cls.__module__ == module and cls.__name__ == name


def sampler_chain(loader: Any) -> list:
    """The loader's batch sampler (or sampler), then each ``.sampler`` it wraps."""
    chain, node = [], loader.batch_sampler if loader.batch_sampler is not None else loader.sampler
    while node is not None and len(chain) < 8:
        chain.append(node)
        node = getattr(node, "sampler", None)
    return chain


def sampler_places(loader: Any) -> list[tuple[str, Any]]:
    """``sampler_chain`` with each sampler's place: ``batch_sampler``,
    ``batch_sampler.sampler``, ... (or ``sampler`` without a batch sampler)."""
    root = "batch_sampler" if loader.batch_sampler is not None else "sampler"
    return [(".".join([root] + ["sampler"] * depth), sampler)
            for depth, sampler in enumerate(sampler_chain(loader))]


def epoch_sampler(loader: Any) -> Any:
    """The sampler whose ``set_epoch`` shapes the epoch (a DistributedSampler,
    also inside a batch sampler), or None: a state records its epoch.

    The first with an ``epoch`` to record too (a batch sampler of the
    caller's may only pass ``set_epoch`` on to the sampler it wraps).
    """
    with_set_epoch = [sampler for sampler in sampler_chain(loader)
                      if callable(getattr(sampler, "set_epoch", None))]
    for sampler in with_set_epoch:
        if hasattr(sampler, "epoch"):
            return sampler
    return with_set_epoch[0] if with_set_epoch else None


def seed_streams(loader: Any) -> list[tuple[str, Any]]:
    """Every seed stream an epoch draws from, to snapshot and restore: the
    loader's, then each sampler's own ``SeedSource`` or torch.Generator.

    Each comes with a label naming its place, and the place whose stream it
    shares if it shares one (``shuffle=True`` makes the loader's RandomSampler
    draw from the loader's generator): a state for two streams drawn in turn
    from one generator does not resume a loader whose two streams are apart,
    though their states fit.
    """
    streams: list[tuple[str, Any]] = []
    taken: list = []  # sources and torch.Generators (a state's layout: each once)
    first_place: dict[int, str] = {}

    def take(place: str, source: Any, key: Any) -> None:
        taken.append(key)
        shared = first_place.setdefault(id(source.stream), place)
        streams.append((place if shared == place else f"{place} (draws from {shared})",
                        source))

    take("generator", loader._seed_source, loader._seed_source)
    for place, sampler in sampler_places(loader):
        source = getattr(sampler, "_seed_source", None)
        if isinstance(source, SeedSource):
            # fastload's sampler: its torch.Generator, if it was given one, is
            # the source's stream, snapshotted through the source.
            if all(source is not t for t in taken):
                take(place, source, source)
            continue
        generator = torch_generator_of(sampler)
        if generator is not None and all(generator is not t for t in taken):
            take(place, TorchGeneratorState(generator), generator)
    return streams


def torch_generator_of(sampler: Any) -> Any:
    """The ``torch.Generator`` a (torch) sampler draws its order from, if it was given one."""
    torch = sys.modules.get("torch")
    generator = getattr(sampler, "generator", None)
    return generator if torch is not None and isinstance(generator, torch.Generator) else None


class TorchGeneratorState:
    """A torch sampler's own ``torch.Generator`` as a seed stream to snapshot and restore
    (torch's RandomSampler, SubsetRandomSampler, WeightedRandomSampler given one)."""

    def __init__(self, generator: Any) -> None:
        self.generator = generator

    @property
    def stream(self) -> Any:
        return self.generator

    def get_state(self) -> tuple:
        return ("torch.Generator", self.generator.get_state())

    pinned_state = get_state  # between epochs as within

    def set_state(self, state: tuple) -> None:
        if not (isinstance(state, tuple) and len(state) == 2 and state[0] == "torch.Generator"):
            raise TypeError(f"not a torch.Generator state: {state!r:.80}")
        self.generator.set_state(state[1])
