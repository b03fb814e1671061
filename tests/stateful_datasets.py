"""Datasets with their own ``state_dict`` / ``load_state_dict`` (torchdata's
convention), for the resume tests; a subprocess imports them by name."""

from __future__ import annotations

import sys

import numpy as np

import fastload as fl


def shard_bounds(total: int, num_workers: int) -> list[tuple[int, int]]:
    """Uneven shards: worker ``w`` of ``n`` gets a share ``n - w``, so the
    first worker's stream lasts longest and they end at different times."""
    weights = [num_workers - w for w in range(num_workers)]
    cuts = np.cumsum([0] + weights) * total // sum(weights)
    return [(int(a), int(b)) for a, b in zip(cuts[:-1], cuts[1:])]


class CountingStream(fl.IterableDataset):
    """Records ``start..stop`` of its shard, from a counter it keeps, each with
    a draw from a generator it keeps; both are its state.  Once its stream is
    done the counter starts over, so the next epoch is the shard again."""

    def __init__(self, total: int = 23, seed: int = 0) -> None:
        self.total = total
        self.position = 0
        self.rng = np.random.default_rng(seed)

    def _shard(self) -> range:
        info = fl.get_worker_info()
        if info is None and "torch" in sys.modules:  # a torch worker (differential tests)
            info = sys.modules["torch"].utils.data.get_worker_info()
        if info is None:
            return range(self.total)
        start, stop = shard_bounds(self.total, info.num_workers)[info.id]
        return range(start, stop)

    def __iter__(self):
        shard = self._shard()
        while self.position < len(shard):
            record = shard[self.position]
            self.position += 1
            yield {"record": record, "noise": int(self.rng.integers(1 << 40))}
        self.position = 0

    def state_dict(self) -> dict:
        return {"position": self.position, "rng": self.rng.bit_generator.state}

    def load_state_dict(self, state: dict) -> None:
        self.position = state["position"]
        self.rng.bit_generator.state = state["rng"]


class PlainStream(fl.IterableDataset):
    """An IterableDataset without state methods."""

    def __iter__(self):
        return iter(range(10))


class NoisyTable(fl.Dataset):
    """A map-style dataset whose samples depend on its state: a generator it
    draws from and how many samples this copy has served."""

    def __init__(self, n: int = 22, seed: int = 0) -> None:
        self.n = n
        self.served = 0
        self.rng = np.random.default_rng(seed)

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict:
        self.served += 1
        return {"record": i, "noise": int(self.rng.integers(1 << 40)), "served": self.served}

    def state_dict(self) -> dict:
        return {"served": self.served, "rng": self.rng.bit_generator.state}

    def load_state_dict(self, state: dict) -> None:
        self.served = state["served"]
        self.rng.bit_generator.state = state["rng"]


class RefusingStream(CountingStream):
    """Its load_state_dict raises."""

    def load_state_dict(self, state: dict) -> None:
        raise KeyError("this stream cannot be restored")


def as_lists(batches) -> list:
    """Each batch (a dict of arrays) as a dict of lists, to compare runs."""
    return [{key: value.tolist() if hasattr(value, "tolist") else value
             for key, value in batch.items()} for batch in batches]
