"""Where fastload's randomness comes from.

Two streams, kept apart on purpose:

* ``SeedSource`` turns the ``generator`` argument of samplers, ``random_split``
  and the DataLoader (None, an int seed, a ``numpy.random.Generator`` or a
  ``torch.Generator``) into a stream of 63-bit seeds.  Each epoch draws one seed
  and hands it to a ``_core`` kernel, so index streams depend only on that seed
  and are identical on every platform.  The stream's state can be captured and
  restored, which is how ``DataLoader.load_state_dict`` replays an epoch.

* ``transform_rng()`` is the generator random transforms draw from.  The
  loader reseeds it before every batch from ``(base_seed, batch_no)``, so a
  sample gets the same crop whichever worker (or the main process) loads it:
  a seeded loader gives the same images for any ``num_workers``.  Each
  thread has its own, so loaders iterated in several threads keep that.
"""

from __future__ import annotations

import os
import threading
from typing import Any

import numpy as np

__all__ = ["SeedSource", "transform_rng", "seed_transform_rng"]

_SEED_BITS = 63  # seeds fit an int64, as torch's do


def _is_torch_generator(obj: Any) -> bool:
    cls = type(obj)
    return cls.__name__ == "Generator" and cls.__module__.startswith("torch")


class SeedSource:
    """A reproducible stream of 63-bit seeds built from a ``generator`` argument.

    ``None`` draws fresh OS entropy once, at construction; an ``int`` seeds a
    PCG64 stream; a ``numpy.random.Generator`` is used as given (so its state
    advances, as a torch.Generator's does); a ``torch.Generator`` is drawn from
    with torch's own RNG.

    ``given`` is the ``generator`` argument as the caller passed it (to the
    source this one shares its stream with, if it was built from one).
    """

    __slots__ = ("_numpy", "_torch", "given")

    def __init__(self, generator: Any = None) -> None:
        self._numpy: np.random.Generator | None = None
        self._torch = None
        self.given = generator
        if isinstance(generator, SeedSource):
            # Share the stream: a DataLoader's sampler and its worker seeds
            # then draw from one generator, as torch's do.
            self._numpy, self._torch = generator._numpy, generator._torch
            self.given = generator.given
        elif generator is None:
            entropy = int.from_bytes(os.urandom(16), "little")
            self._numpy = np.random.Generator(np.random.PCG64(entropy))
        elif isinstance(generator, (bool, np.bool_)):
            raise TypeError(f"generator must be None, an int seed, a numpy.random.Generator "
                            f"or a torch.Generator, got {generator!r}")
        elif isinstance(generator, (int, np.integer)):
            if generator < 0:
                raise ValueError(f"generator seed must be non-negative, got {generator}")
            self._numpy = np.random.Generator(np.random.PCG64(int(generator)))
        elif isinstance(generator, np.random.Generator):
            self._numpy = generator
        elif _is_torch_generator(generator):
            self._torch = generator
        else:
            raise TypeError(f"generator must be None, an int seed, a numpy.random.Generator "
                            f"or a torch.Generator, got {type(generator).__name__}")

    @property
    def stream(self) -> Any:
        """The generator drawn from (shared by the sources made from this one)."""
        return self._torch if self._torch is not None else self._numpy

    def draw(self) -> int:
        """The next seed of the stream, in [0, 2**63)."""
        if self._torch is not None:
            import torch  # only reachable when the caller passed a torch.Generator

            return int(torch.empty((), dtype=torch.int64).random_(generator=self._torch).item())
        return int(self._numpy.integers(0, 1 << _SEED_BITS, dtype=np.int64))

    def get_state(self) -> Any:
        """An opaque, picklable snapshot of the stream."""
        if self._torch is not None:
            return ("torch", self._torch.get_state())
        return ("numpy", self._numpy.bit_generator.state)

    def set_state(self, state: Any) -> None:
        kind, value = state
        if kind == "torch" and self._torch is not None:
            self._torch.set_state(value)
        elif kind == "numpy" and self._numpy is not None:
            self._numpy.bit_generator.state = value
        else:
            raise ValueError(f"cannot restore a {kind!r} generator state into this generator")


class _TransformStream(threading.local):
    """The transform generator of one thread: loaders iterated in several
    threads (``num_workers=0``) each seed their own batches' draws."""

    rng: np.random.Generator | None = None
    # (base_seed, batch_no) of the current batch, turned into a generator only
    # when a transform first asks: building one costs more than a batch
    # whose pipeline draws nothing should pay.
    seed: tuple[int, int] | None = None


_transform_stream = _TransformStream()


def transform_rng() -> np.random.Generator:
    """The generator random transforms draw from (reseeded per batch by the
    loader; one per thread)."""
    stream = _transform_stream
    if stream.seed is not None:
        base_seed, batch_no = stream.seed
        stream.seed = None
        stream.rng = np.random.Generator(np.random.PCG64([base_seed & ((1 << 64) - 1), batch_no]))
    elif stream.rng is None:
        stream.rng = np.random.default_rng()
    return stream.rng


def seed_transform_rng(base_seed: int, batch_no: int) -> None:
    """Reseed ``transform_rng()`` of this thread for one batch of one epoch."""
    _transform_stream.seed = (base_seed, batch_no)
