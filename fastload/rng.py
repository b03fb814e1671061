"""Where fastload's randomness comes from.

Two streams, kept apart on purpose:

* ``SeedSource`` turns the ``generator`` argument of samplers, ``random_split``
  and the DataLoader (None, an int seed, a ``numpy.random.Generator`` or a
  ``torch.Generator``) into a stream of 63-bit seeds.  Each epoch draws one seed
  and hands it to a ``_core`` kernel, so index streams depend only on that seed
  and are identical on every platform.  The stream's state can be captured and
  restored, which is how ``DataLoader.load_state_dict`` replays an epoch.
  With ``None`` and torch imported, the seeds come from torch's default
  generator (NOTE [ torch's global seed ]).

* ``transform_rng()`` is the generator random transforms draw from.  The
  loader reseeds it before every batch from ``(base_seed, batch_no)``, so a
  sample gets the same crop whichever worker (or the main process) loads it:
  a seeded loader gives the same images for any ``num_workers``.  Each
  thread has its own, so loaders iterated in several threads keep that.
"""

from __future__ import annotations

import base64
import contextlib
import copy
import os
import sys
import threading
import weakref
from collections import deque
from typing import Any, Callable, Iterator

import numpy as np

__all__ = ["SeedSource", "transform_rng", "seed_transform_rng"]

_SEED_BITS = 63  # seeds fit an int64, as torch's do


def _is_torch_generator(obj: Any) -> bool:
    cls = type(obj)
    return cls.__name__ == "Generator" and cls.__module__.startswith("torch")


# NOTE [ torch's global seed ]
# Training scripts make runs repeatable with ``torch.manual_seed(s)``: torch's
# samplers, random_split and loader, given no generator, draw from torch's default
# generator.  So does a fastload source built from ``None`` while torch is imported
# (never importing it: without torch, OS entropy), making the draws torch makes, at
# the moments torch makes them, so the script's later torch draws (weight init,
# dropout) are what they would be under torch's loader:
# * ``draw()``: one ``torch.empty((), dtype=torch.int64).random_()``, as torch's
#   RandomSampler at its first ``next()`` and its loader's base seed per iterator;
# * ``run_on_torch_default(op)``: torch's own op on the default generator
#   (``randperm``, ``multinomial``), whose result is then the order itself;
# * ``draw_quiet()``: a seed where torch draws nothing (a persistent iterator's
#   later epochs keep their base seed in torch), derived from the last draw.
# A state of such a source is the values its draws gave since the epoch began
# (a ``_DrawLog``); restoring it replays them, without touching the global
# generator, then draws from that generator again.  A script that restores
# ``torch.set_rng_state`` alongside the loader's state therefore continues as
# an uninterrupted run would.  A state taken between epochs holds the global
# generator's state then (``pinned_state``, a ``_PIN`` string): the first draw
# after restoring it draws from the global generator if it is in that state
# again (the script restored it, or reseeded to it), else from a private
# generator set to it, so the next epoch's order is the uninterrupted run's
# either way, and the global generator is left alone.

_PIN = "torch-rng:"  # a pinned state's entry: the global generator's state, base64


def _pin_of(torch: Any, generator: Any) -> str:
    return _PIN + base64.b64encode(generator.get_state().numpy().tobytes()).decode("ascii")


def _generator_of_pin(torch: Any, pin: str) -> Any:
    """A new torch.Generator in the state a pin holds."""
    generator = torch.Generator()
    generator.set_state(torch.frombuffer(bytearray(base64.b64decode(pin[len(_PIN):])),
                                         dtype=torch.uint8))
    return generator


def _is_pin(value: Any) -> bool:
    return isinstance(value, str) and value.startswith(_PIN)


class _DrawLog:
    """The values a torch-default stream gave since a state was taken: a live
    record until the state is copied or pickled, which makes it a tuple."""

    __slots__ = ("values", "skip", "__weakref__")

    def __init__(self, pending: Any) -> None:
        self.values = list(pending)  # replays still to come are part of the state
        self.skip = len(self.values)

    def __reduce__(self) -> tuple:
        return (tuple, (tuple(self.values),))


def _fitting_replay(value: Any, want: type) -> Any:
    if not isinstance(value, want):
        raise ValueError(f"a restored DataLoader state_dict does not fit this loader: its "
                         f"seed stream replays {type(value).__name__} where this loader "
                         f"draws {want.__name__}; build the loader with the same samplers")
    return value


def _derived_seed(last: int) -> int:
    """A seed made from the last one, where torch draws none (``draw_quiet``)."""
    mixed = np.random.SeedSequence([last, 0x717569657421])  # "quiet!"
    return int(mixed.generate_state(1, np.uint64)[0]) >> (64 - _SEED_BITS)


def _is_seed(value: Any) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_)) \
        and 0 <= value < 1 << _SEED_BITS


class _TorchDefaultDraws:
    """What a ``None`` source knows of its draws from torch's default generator
    (shared by the sources sharing its stream)."""

    __slots__ = ("pending", "logs", "last", "pinned", "private")

    def __init__(self) -> None:
        # A private torch.Generator drawn from instead of the global one, set by a
        # pinned state the global generator no longer matches (NOTE above).
        self.private: Any = None
        self.pending: deque = deque()  # values a restored state replays, in order
        self.logs: weakref.WeakSet = weakref.WeakSet()  # live states, recording each draw
        self.last: int | None = None  # the last seed drawn, which draw_quiet derives from
        self.pinned = False  # restored from a state taken without torch: OS entropy

    def __getstate__(self) -> tuple:
        # The live records stay behind: they are this process's states.
        private = None if self.private is None else self.private.get_state()
        return (list(self.pending), self.last, self.pinned, private)

    def __setstate__(self, state: tuple) -> None:
        pending, self.last, self.pinned, private = state
        self.pending = deque(pending)
        self.logs = weakref.WeakSet()
        self.private = None
        if private is not None:
            import torch  # a private generator was made, so torch is there

            self.private = torch.Generator()
            self.private.set_state(private)

    def settle_pin(self, torch: Any) -> None:
        """A pinned state at the head of the replays: draw from the global
        generator if it is in that state, else from a private one set to it."""
        if not (self.pending and _is_pin(self.pending[0])):
            return
        pin = self.pending.popleft()
        self.private = None
        if pin != _pin_of(torch, torch.default_generator):
            self.private = _generator_of_pin(torch, pin)

    def generator(self, torch: Any) -> Any:
        """The generator this stream's next draw comes from."""
        return torch.default_generator if self.private is None else self.private

    def record(self, value: Any, replayed: bool) -> None:
        for log in list(self.logs):
            if replayed and log.skip:
                log.skip -= 1  # it holds this value already
            else:
                log.values.append(value)

    def replayed(self, want: type) -> Any:
        value = _fitting_replay(self.pending.popleft(), want)
        self.record(value, replayed=True)
        return value


def _torch_default_draws(source: "SeedSource") -> tuple[Any, _TorchDefaultDraws] | None:
    """``(torch, draws)`` when ``source`` follows torch's default generator now."""
    draws = source._default
    if draws is None or draws.pinned:
        return None
    torch = sys.modules.get("torch")
    if torch is None or getattr(torch, "default_generator", None) is None:
        return None  # not imported, or still being imported
    return torch, draws


class SeedSource:
    """A reproducible stream of 63-bit seeds built from a ``generator`` argument.

    ``None`` draws from torch's default generator when torch is imported
    (NOTE [ torch's global seed ]), else from fresh OS entropy drawn once, at
    construction; an ``int`` seeds a PCG64 stream; a ``numpy.random.Generator``
    is used as given (so its state advances, as a torch.Generator's does); a
    ``torch.Generator`` is drawn from with torch's own RNG.

    ``given`` is the ``generator`` argument as the caller passed it (to the
    source this one shares its stream with, if it was built from one).
    """

    __slots__ = ("_numpy", "_torch", "_default", "given", "_last")

    def __init__(self, generator: Any = None) -> None:
        self._numpy: np.random.Generator | None = None
        self._torch = None
        self._default: _TorchDefaultDraws | None = None
        self._last: int | None = None  # the last seed drawn from a given torch.Generator
        self.given = generator
        if isinstance(generator, SeedSource):
            # Share the stream: a DataLoader's sampler and its worker seeds
            # then draw from one generator, as torch's do.
            self._numpy, self._torch = generator._numpy, generator._torch
            self._default = generator._default
            self.given = generator.given
        elif generator is None:
            entropy = int.from_bytes(os.urandom(16), "little")
            self._numpy = np.random.Generator(np.random.PCG64(entropy))
            self._default = _TorchDefaultDraws()
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
        """The next seed of the stream, in [0, 2**63): with ``None`` and torch
        imported, one draw of torch's default generator (as torch makes one)."""
        if self._torch is not None:
            import torch  # only reachable when the caller passed a torch.Generator

            self._last = int(torch.empty((), dtype=torch.int64).random_(generator=self._torch).item())
            return self._last
        draws = self._default
        following = _torch_default_draws(self)
        if following is not None:
            following[1].settle_pin(following[0])
        if draws is not None and draws.pending:  # a restored state's (needs no torch)
            value = draws.last = int(draws.replayed(int))
            return value
        if following is not None:
            torch, draws = following
            value = draws.last = int(torch.empty((), dtype=torch.int64).random_(
                generator=draws.generator(torch)).item())
            draws.record(value, replayed=False)
            return value
        return int(self._numpy.integers(0, 1 << _SEED_BITS, dtype=np.int64))

    def draw_quiet(self) -> int:
        """A seed at a moment torch's loader draws none: from a ``None`` source
        following torch, derived from its last draw (the global generator is
        left alone); from a given torch.Generator, likewise derived from its last
        draw (torch's persistent iterator draws nothing from it either); from
        any other, the next seed, as ``draw()``."""
        if self._torch is not None:
            if self._last is None:
                return self.draw()
            self._last = _derived_seed(self._last)
            return self._last
        draws = self._default
        following = _torch_default_draws(self)
        if following is not None:
            following[1].settle_pin(following[0])
        if draws is None or not draws.pending and (
                draws.last is None or _torch_default_draws(self) is None):
            # Not following torch, or nothing to derive from (a loader's first
            # iterator draws for real, so this is only a stray call).
            return self.draw()
        if draws.pending:
            value = int(draws.replayed(int))
        else:
            value = _derived_seed(draws.last)
            draws.record(value, replayed=False)
        draws.last = value
        return value

    def peek(self, after: "SeedSource | None" = None, after_quiet: bool = False) -> int:
        """The seed ``draw()`` will return, drawing from no generator anyone
        else sees (private copies are drawn from instead); ``after``: once that
        source has drawn (``draw_quiet()`` with ``after_quiet``), as a loader
        draws its base seed before its sampler's."""
        ahead = _Lookahead()
        if after is not None:
            ahead.draw(after, quiet=after_quiet)
        return ahead.draw(self)

    def run_on_torch(self, op: Callable[[Any, Any], Any]) -> Any:
        """``op(torch, generator)`` on the torch generator this source draws
        from: the ``torch.Generator`` the caller gave, or torch's default one
        (``run_on_torch_default``); else None (nothing run).

        Where torch decides an order with its own op on a generator
        (``random_split``'s ``randperm``, ``multinomial``), running that op on
        the caller's torch.Generator is what gives torch's order for it.
        """
        if self._torch is not None:
            import torch  # only reachable when the caller passed a torch.Generator

            return op(torch, self._torch)
        return self.run_on_torch_default(op)

    def quiet_preview(self) -> int | None:
        """What ``draw_quiet()`` would give now, without giving it, for a ``None``
        source following torch (a persistent iterator's next epoch); else None."""
        draws = self._default
        if draws is None or draws.pending or draws.last is None \
                or _torch_default_draws(self) is None:
            return None
        mixed = np.random.SeedSequence([draws.last, 0x717569657421])  # as draw_quiet
        return int(mixed.generate_state(1, np.uint64)[0]) >> (64 - _SEED_BITS)

    def take_quiet(self, value: int) -> None:
        """A resumed persistent epoch's base seed ``value`` (``quiet_preview``), as if
        ``draw_quiet()`` had given it."""
        draws = self._default
        draws.record(value, replayed=False)
        draws.last = value

    @contextlib.contextmanager
    def global_draws(self) -> Iterator[None]:
        """Within: torch's global generator draws as this source does: from a
        private generator a pinned state set (its state swapped in, then back,
        the private one advanced), else from itself.  For a sampler of the
        caller's that draws from the global generator, drawn whole at once."""
        following = _torch_default_draws(self)
        if following is None:
            yield
            return
        torch, draws = following
        draws.settle_pin(torch)
        private = draws.private
        if private is None:
            yield
            return
        caller_state = torch.default_generator.get_state()
        torch.default_generator.set_state(private.get_state())
        try:
            yield
        finally:
            private.set_state(torch.default_generator.get_state())
            torch.default_generator.set_state(caller_state)

    def run_on_torch_default(self, op: Callable[[Any, Any], Any]) -> Any:
        """``op(torch, generator)`` on torch's default generator, when this is a
        ``None`` source and torch is imported; else None (nothing run).

        For the orders torch draws straight from the default generator
        (``randperm``, ``multinomial``): running torch's op is the only way to
        advance it as torch does, and its result is then the order.  A restored
        state replays it on a private generator set to the state it ran from.
        """
        following = _torch_default_draws(self)
        if following is None:
            return None
        torch, draws = following
        draws.settle_pin(torch)
        if draws.pending:
            generator = torch.Generator()
            generator.set_state(torch.frombuffer(bytearray(draws.replayed(bytes)),
                                                 dtype=torch.uint8))
            return op(torch, generator)
        generator = draws.generator(torch)
        if draws.logs:  # a state is being kept: it must replay this op
            draws.record(generator.get_state().numpy().tobytes(), replayed=False)
        return op(torch, generator)

    def get_state(self) -> Any:
        """An opaque, picklable snapshot of the stream (a live record of the
        draws since, for a ``None`` source following torch: copy it to keep it)."""
        if self._torch is not None:
            # With the last seed, which a quiet draw derives from.
            return ("torch", self._torch.get_state(), self._last)
        draws = self._default
        if draws is not None and (draws.pending or _torch_default_draws(self) is not None):
            log = _DrawLog(draws.pending)
            draws.logs.add(log)
            return ("torch.default_generator", log)
        return ("numpy", self._numpy.bit_generator.state)

    def pinned_state(self) -> Any:
        """A state taken between epochs: for a ``None`` source following torch,
        the global generator's state now (NOTE [ torch's global seed ]); else ``get_state()``."""
        following = _torch_default_draws(self)
        if following is None or following[1].pending:
            return self.get_state()
        torch, draws = following
        return ("torch.default_generator", (_pin_of(torch, draws.generator(torch)),))

    def set_state(self, state: Any) -> None:
        kind, value, *last = state
        if kind == "torch" and self._torch is not None:
            self._torch.set_state(value)
            self._last = last[0] if last else None
        elif kind == "numpy" and self._numpy is not None:
            self._numpy.bit_generator.state = value
            if self._default is not None:
                # Taken without torch: its order continues from OS entropy's stream.
                self._default.pending.clear()
                self._default.pinned = True
        elif kind == "torch.default_generator" and self._default is not None:
            values = value.values if isinstance(value, _DrawLog) else value
            if not isinstance(values, (list, tuple)) \
                    or not all(_is_seed(v) or isinstance(v, bytes) or _is_pin(v) for v in values):
                raise ValueError(f"not a state of torch's default generator's draws: {value!r:.80}")
            self._default.pending = deque(int(v) if _is_seed(v) else v for v in values)
            self._default.pinned = False
            self._default.private = None
        else:
            raise ValueError(f"cannot restore a {kind!r} generator state into this generator")


def _one_seed(torch: Any, generator: Any) -> int:
    """One seed drawn from a torch generator, as torch's loader draws its base seed."""
    return int(torch.empty((), dtype=torch.int64).random_(generator=generator).item())


class _Lookahead:
    """Private copies of the streams seed sources draw from, drawn from in their
    place: what ``draw()`` will give, while every real generator (torch's global
    one above all) stays as it was.  Sources sharing a stream share its copy."""

    def __init__(self) -> None:
        self._copies: dict = {}

    def _copy(self, key: Any, make: Callable[[], Any]) -> Any:
        if key not in self._copies:
            self._copies[key] = make()
        return self._copies[key]

    def _twin(self, torch: Any, generator: Any) -> Any:
        def clone() -> Any:
            twin = torch.Generator(device=generator.device)
            twin.set_state(generator.get_state())
            return twin
        return self._copy(("torch", id(generator)), clone)

    def _default_twin(self, torch: Any, draws: "_TorchDefaultDraws", pending: deque) -> Any:
        """The copy of the generator a ``None`` source following torch draws from
        next: as ``settle_pin`` would choose, a pinned state at the head of the
        replays taken off them first."""
        chosen = ("stream", id(draws))
        if pending and _is_pin(pending[0]):
            pin = pending.popleft()
            self._copies[chosen] = None if pin == _pin_of(torch, torch.default_generator) else pin
        pin = self._copies.get(chosen, "as now")
        if pin == "as now":
            return self._twin(torch, draws.generator(torch))
        if pin is None:
            return self._twin(torch, torch.default_generator)
        return self._copy(("pin", id(draws)), lambda: _generator_of_pin(torch, pin))

    def draw(self, source: SeedSource, quiet: bool = False) -> int | None:
        """``source.draw()`` (``draw_quiet()`` with ``quiet``) on the copies; None
        for a quiet draw derived from the last seed, which moves no stream."""
        if source._torch is not None:
            if quiet and source._last is not None:
                return None
            import torch  # only reachable when the caller passed a torch.Generator

            return _one_seed(torch, self._twin(torch, source._torch))
        draws = source._default
        if draws is not None:
            pending = self._copy(("pending", id(draws)), lambda: deque(draws.pending))
            following = _torch_default_draws(source)
            twin = None if following is None else self._default_twin(following[0], draws, pending)
            if pending:
                return int(_fitting_replay(pending.popleft(), int))
            if quiet and draws.last is not None and following is not None:
                return None
            if twin is not None:
                return _one_seed(following[0], twin)
        numpy_stream = self._copy(("numpy", id(source._numpy)),
                                  lambda: copy.deepcopy(source._numpy))
        return int(numpy_stream.integers(0, 1 << _SEED_BITS, dtype=np.int64))


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
