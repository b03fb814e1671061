"""Elastic resume: an epoch of a ``DistributedSampler`` finished on another world size.

A loader state taken at a step every rank reached determines the samples the
whole job has seen without listing them.  The epoch's order ``O`` (``n``
indices) depends on ``seed + epoch`` alone, rank ``r`` of ``W`` takes the
positions ``r, r + W, ...`` of ``O`` padded (or cut) to a multiple of ``W``, and
every rank has handed out the same ``b`` batches of ``B``: together the ranks
have seen exactly the first ``b * B * W`` positions of ``O``.  What is left is
the suffix ``O[start:]``.  Another world size (or another rank) resumes the
epoch by splitting that suffix as ``DistributedSampler`` splits an epoch,
torch's padding or ``drop_last`` rule applied to what is left; a resume there
again only moves ``start`` on, so a state stays three integers
(``"distributed"``: the world size and rank it was taken on, and ``start``)
beside the loader's usual ones.

The same world size resumes through the loader's usual path, exact to the
batch, on every rank from any one rank's state (all reached the same step, so
each continues its own share, padding included); a suffix (``start > 0``) is
then replayed and its handed batches skipped as an epoch's are.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass
from typing import Any, Iterator

import numpy as np

from fastload.resume import sampler_places
from fastload.sampler import BatchSampler, DistributedSampler

__all__ = ["DistributedSplit", "distributed_split", "record_split", "rebase_to_split",
           "remainder_stream", "order_start_of"]

_DISTRIBUTED_SAMPLERS = (DistributedSampler, ("torch.utils.data.distributed", "DistributedSampler"))
_BATCH_SAMPLERS = (BatchSampler, ("torch.utils.data.sampler", "BatchSampler"))


def _is_one_of(obj: Any, classes: tuple) -> bool:
    """``obj`` is exactly fastload's class or torch's ``(module, name)`` (named, so as
    not to import torch); a subclass may order or batch otherwise."""
    cls = type(obj)
    return cls is classes[0] or (cls.__module__, cls.__qualname__) == classes[1]


@dataclass(frozen=True)
class DistributedSplit:
    """A loader whose batches are a ``DistributedSampler``'s share, batched plainly.

    ``batch_size`` None: no batching (``batch_size=None`` loaders take each index).
    """

    place: str            # the DistributedSampler's place, as in a state's description
    batch_place: str | None
    sampler: Any
    batch_size: int | None
    drop_last: bool


def distributed_split(loader: Any) -> DistributedSplit | None:
    """The loader's split, if its order is fastload's or torch's ``DistributedSampler``
    (alone, or in fastload's or torch's ``BatchSampler``); None otherwise."""
    places = sampler_places(loader)
    if len(places) == 1 and _is_one_of(places[0][1], _DISTRIBUTED_SAMPLERS):
        return DistributedSplit(places[0][0], None, places[0][1], None, False)
    if len(places) == 2 and _is_one_of(places[0][1], _BATCH_SAMPLERS) \
            and _is_one_of(places[1][1], _DISTRIBUTED_SAMPLERS):
        batcher = places[0][1]
        return DistributedSplit(places[1][0], places[0][0], places[1][1],
                                int(batcher.batch_size), bool(batcher.drop_last))
    return None


def share_length(remaining: int, world: int, drop_last: bool) -> int:
    """Indices per rank when ``world`` ranks split ``remaining`` (torch's rule)."""
    if drop_last and remaining % world != 0:
        return math.ceil((remaining - world) / world)
    return math.ceil(remaining / world)


def _batches_in(share: int, batch_size: int | None, drop_last: bool) -> int:
    if batch_size is None:
        return share
    return share // batch_size if drop_last else math.ceil(share / batch_size)


def record_split(state: dict, loader: Any, progress: Any) -> dict:
    """``state`` with the ``"distributed"`` record, when the loader has a split."""
    split = distributed_split(loader)
    if split is None:
        return state
    started = progress is not None and not progress.finished
    state["distributed"] = {"num_replicas": int(split.sampler.num_replicas),
                            "rank": int(split.sampler.rank),
                            "start": int(order_start_of(progress)) if started else 0}
    return state


def order_start_of(progress: Any) -> int:
    return getattr(progress, "order_start", 0) or 0


def _is_count(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool) and value >= 0


def _checked_record(state: dict) -> tuple[int, int, int]:
    record = state["distributed"]
    names = ("num_replicas", "rank", "start")
    if not isinstance(record, dict) or not all(_is_count(record.get(name)) for name in names) \
            or record["num_replicas"] < 1 or record["rank"] >= record["num_replicas"]:
        raise ValueError(f"DataLoader state_dict: 'distributed' must hold num_replicas >= 1, "
                         f"a rank below it and start, all ints >= 0; got {record!r:.200}")
    return record["num_replicas"], record["rank"], record["start"]


def rebase_to_split(state: Any, loader: Any) -> Any:
    """``state`` as a state of ``loader``'s world size and rank (elastic resume).

    Taken on the same world size and rank, it is returned as it is.  Otherwise
    the samples the old ranks had seen move into ``start``, the batches count
    from 0 again, and the description's world size, rank and lengths become this
    loader's, so that ``check_state`` then compares everything else (dataset
    length, batch size, seed, shuffle, drop_last) and refuses a mismatch.
    """
    split = distributed_split(loader)
    if not isinstance(state, dict):
        return state
    if split is None:
        _refuse_another_world_without_split(state, loader)
    if "distributed" not in state or split is None:
        return state
    world, rank, start = _checked_record(state)
    n = len(split.sampler.dataset)
    if start > n:
        raise ValueError(f"this state_dict's epoch had reached sample {start} of its order, "
                         f"but this loader's dataset has {n} samples")
    new_world, new_rank = int(split.sampler.num_replicas), int(split.sampler.rank)
    if (world, rank) == (new_world, new_rank):
        return state
    if world == new_world and not state.get("yielded_after"):
        # Every rank reached the same step: this rank continues its own share,
        # padding included, as the uninterrupted run does (rank 0's state serves all).
        rebased = dict(state)
        rebased.update(distributed={"num_replicas": world, "rank": new_rank, "start": start},
                       loader=_described_for(state.get("loader"), split))
        return rebased
    if state.get("yielded_after"):
        raise ValueError(f"this state_dict was taken with batches {state['yielded_after']!r} "
                         f"handed out ahead of batch {state.get('batches_yielded')!r} "
                         f"(in_order=False), so the samples the other ranks had seen are not "
                         f"known; it resumes only on its own world size ({world}) and rank "
                         f"({rank})")
    handed = state.get("batches_yielded")
    if not _is_count(handed):
        raise ValueError(f"DataLoader state_dict: batches_yielded={handed!r} must be an int >= 0")
    share = share_length(n - start, world, bool(split.sampler.drop_last))
    if handed >= _batches_in(share, split.batch_size, split.drop_last):
        new_start = n  # every old rank had finished its share: nothing of the epoch is left
    else:
        new_start = min(n, start + handed * (split.batch_size or 1) * world)
    rebased = dict(state)
    rebased.update(batches_yielded=0, yielded_after=[],
                   distributed={"num_replicas": new_world, "rank": new_rank, "start": new_start},
                   loader=_described_for(state.get("loader"), split))
    return rebased


def _refuse_another_world_without_split(state: dict, loader: Any) -> None:
    """A clear reason when a loader that cannot resume elastically is given a state of
    another world size or rank (rather than the first description field that differs)."""
    recorded = state.get("loader")
    samplers = recorded.get("samplers") if isinstance(recorded, dict) else None
    if not isinstance(samplers, dict):
        return
    for place, sampler in sampler_places(loader):
        entry = samplers.get(place)
        if not isinstance(entry, dict) or "num_replicas" not in entry:
            continue
        old = (entry.get("num_replicas"), entry.get("rank"))
        new = (getattr(sampler, "num_replicas", None), getattr(sampler, "rank", None))
        if old != new:
            raise ValueError(f"this state_dict comes from a DataLoader with {place}.num_replicas="
                             f"{old[0]!r} and rank={old[1]!r}, this one has {place}.num_replicas="
                             f"{new[0]!r} and rank={new[1]!r}; only fastload's or torch's "
                             f"DistributedSampler (alone or in their BatchSampler) resumes on "
                             f"another world size or rank, not {type(sampler).__qualname__}")


def _described_for(recorded: Any, split: DistributedSplit) -> Any:
    """The recorded description with the world size, rank and the lengths that follow
    from them set to ``split``'s, so that only the other settings are compared."""
    if not isinstance(recorded, dict) or not isinstance(recorded.get("samplers"), dict):
        return recorded
    samplers = dict(recorded["samplers"])
    for place, names in ((split.place, ("num_replicas", "rank", "num_samples", "length")),
                         (split.batch_place, ("length",))):
        entry = samplers.get(place)
        if place is None or not isinstance(entry, dict):
            continue
        entry = dict(entry)
        sampler = split.sampler if place == split.place else None
        for name in names:
            if name in entry:
                entry[name] = _current(split, sampler, name)
        samplers[place] = entry
    return {**recorded, "samplers": samplers}


def _current(split: DistributedSplit, sampler: Any, name: str) -> int:
    if sampler is not None:
        return int(len(sampler)) if name == "length" else int(getattr(sampler, name))
    return _batches_in(len(split.sampler), split.batch_size, split.drop_last)


def epoch_order(sampler: Any) -> np.ndarray:
    """The whole epoch's order of ``sampler`` (its current epoch), before padding: what
    the sampler on a world of one yields.  A sampler of the same class is asked, so the
    order is the sampler's own (fastload's kernel, or torch's randperm)."""
    alone = type(sampler)(sampler.dataset, num_replicas=1, rank=0, shuffle=sampler.shuffle,
                          seed=sampler.seed, drop_last=False)
    alone.set_epoch(sampler.epoch)
    if hasattr(alone, "_epoch_indices"):
        return np.asarray(alone._epoch_indices(), dtype=np.int64)
    return np.fromiter(iter(alone), dtype=np.int64, count=len(alone))


def rank_share(order: np.ndarray, start: int, world: int, rank: int, drop_last: bool) -> np.ndarray:
    """Rank ``rank`` of ``world``'s indices of ``order[start:]``, split as
    ``DistributedSampler`` splits an epoch (padding repeats from the suffix's head)."""
    rest = order[start:]
    total = share_length(rest.shape[0], world, drop_last) * world
    if rest.shape[0] == 0:
        return rest
    positions = np.arange(rank, total, world, dtype=np.int64)
    return rest[positions % rest.shape[0]]


def remainder_stream(split: DistributedSplit, start: int, arrays: bool) -> Iterator[Any]:
    """This rank's batches of the epoch's suffix ``order[start:]``: int64 arrays
    (``arrays``, our BatchSampler's kernel batches) or lists of ints, or single
    ints without batching."""
    sampler = split.sampler
    share = rank_share(epoch_order(sampler), start, int(sampler.num_replicas),
                       int(sampler.rank), bool(sampler.drop_last))
    if split.batch_size is None:
        return iter(share.tolist())
    size = split.batch_size
    stop = share.shape[0] - (share.shape[0] % size if split.drop_last else 0)
    batches = (share[first:first + size] for first in range(0, stop, size))
    return batches if arrays else (batch.tolist() for batch in batches)
