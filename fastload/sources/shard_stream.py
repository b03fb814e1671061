"""``ShardStream``: tar shards as a stream, split over ranks x workers, resumable.

Each epoch (``set_epoch``, as ``DistributedSampler``) the shards are taken in
an order seeded by ``seed`` and the epoch, their samples run through a
shuffle buffer of ``shuffle_buffer`` samples (webdataset's: a full buffer
yields a random one of its samples and takes the next in its place), and
the stream is padded by repeating its start to a multiple of ``ranks x
workers`` (or, with ``drop_last``, cut there).  Stream slot ``rank *
num_workers + worker`` takes every ``ranks x workers``-th sample from its
slot on: every slot gets as many samples, so every rank as many batches.

The stream is planned from the shards' member index (``tar_index``: the tar
headers, read once and kept), so the plan costs no data read, and a resumed
stream (``load_state_dict``) skips what it had yielded without reading it.
A state resumes on the same number of ranks and workers only (their slots
are its position); another world size is refused with the reason.
"""

from __future__ import annotations

import numbers
from typing import Any, Callable

import numpy as np

from fastload.dataset import IterableDataset
from fastload.sampler.distributed import _from_environment, _initialized_group
from fastload.sources.tar_shards import TarShards
from fastload._loading.worker_info import get_worker_info

__all__ = ["ShardStream", "buffer_shuffled"]


def buffer_shuffled(items: np.ndarray, size: int, rng: np.random.Generator) -> np.ndarray:
    """``items`` in the order a shuffle buffer of ``size`` gives them."""
    if size <= 1 or len(items) <= 1:
        return items.copy()
    out = np.empty_like(items)
    buffer = list(items[:size].tolist())
    draws = rng.integers(0, size, max(len(items) - size, 0)).tolist()
    at = 0
    for item, slot in zip(items[size:].tolist(), draws):
        out[at] = buffer[slot]
        buffer[slot] = item
        at += 1
    out[at:] = rng.permutation(np.array(buffer, dtype=items.dtype))
    return out


def _check_integer(name: str, value: Any, least: int) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < least:
        raise ValueError(f"ShardStream: {name} should be an integer >= {least}, but got {value!r}")
    return int(value)


class ShardStream(IterableDataset):
    """``ShardStream(urls, shuffle_buffer=1000, seed=0, *, num_replicas=None, rank=None,
    drop_last=False, decode=True, transform=None, index_dir=None, storage_options=None,
    timeout=30.0)``: see the module (URLs as ``TarShards`` reads them)."""

    def __init__(self, urls: Any, shuffle_buffer: int = 1000, seed: int = 0, *,
                 num_replicas: int | None = None, rank: int | None = None,
                 drop_last: bool = False, decode: bool = True,
                 transform: Callable[[dict], Any] | None = None,
                 index_dir: str | None = None, storage_options: dict | None = None,
                 timeout: float = 30.0) -> None:
        self.shuffle_buffer = _check_integer("shuffle_buffer", shuffle_buffer, 1)
        self.seed = _check_integer("seed", seed, 0)
        group = _initialized_group() if num_replicas is None or rank is None else None
        if num_replicas is None:
            num_replicas = group.get_world_size() if group is not None \
                else _from_environment("WORLD_SIZE")
        if rank is None:
            rank = group.get_rank() if group is not None else _from_environment("RANK")
        self.num_replicas = _check_integer("num_replicas", num_replicas, 1)
        self.rank = _check_integer("rank", rank, 0)
        if self.rank >= self.num_replicas:
            raise ValueError(f"Invalid rank {rank}, rank should be in the interval "
                             f"[0, {self.num_replicas - 1}]")
        self.drop_last = bool(drop_last)
        self.samples = TarShards(urls, index_dir=index_dir, decode=decode, transform=transform,
                                 storage_options=storage_options, timeout=timeout)
        shard_of = self.samples._shard_of
        self._shard_starts = np.searchsorted(shard_of, np.arange(len(self.samples.paths) + 1))
        self.epoch = 0
        self._position = 0  # samples this copy's slot has yielded this epoch
        self._resume = None  # a loaded state, applied by the next __iter__

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def _stream(self) -> np.ndarray:
        """The epoch's whole stream of sample indices, padded or cut for the slots."""
        rng = np.random.default_rng([self.seed, self.epoch])
        starts = self._shard_starts
        order = rng.permutation(len(starts) - 1)
        stream = np.concatenate([np.arange(starts[k], starts[k + 1]) for k in order]
                                or [np.empty(0, np.int64)]).astype(np.int64)
        return buffer_shuffled(stream, self.shuffle_buffer, rng)

    def _slots(self) -> tuple[int, int]:
        info = get_worker_info()
        workers, worker = (1, 0) if info is None else (info.num_workers, info.id)
        return self.num_replicas * workers, self.rank * workers + worker

    def __iter__(self):
        slots, slot = self._slots()
        stream = self._stream()
        if self.drop_last:
            stream = stream[:len(stream) // slots * slots]
        elif len(stream) % slots and len(stream):
            stream = np.resize(stream, -(-len(stream) // slots) * slots)  # repeats the start
        mine = stream[slot::slots]
        start = 0
        if self._resume is not None:
            state, self._resume = self._resume, None
            if state["slots"] != slots:
                raise ValueError(f"ShardStream: this state was taken with {state['slots']} "
                                 f"ranks x workers, and the loader now has {slots}; a stream "
                                 f"resumes on the same number of ranks and workers")
            start = state["position"]
        self._position = start
        for index in mine[start:].tolist():
            sample = self.samples[index]
            self._position += 1
            yield sample

    def state_dict(self) -> dict:
        return {"seed": self.seed, "epoch": self.epoch, "position": self._position,
                "slots": self._slots()[0]}

    def load_state_dict(self, state: dict) -> None:
        if state.get("seed") != self.seed:
            raise ValueError(f"ShardStream: the state is of seed {state.get('seed')!r}, "
                             f"this stream's is {self.seed}")
        self.epoch = state["epoch"]
        self._resume = dict(state)
