"""Whole batches of an in-memory image dataset (MNIST's, CIFAR's ``data``), when the transforms allow.

Sample by sample, such a dataset makes a PIL image of ``data[i]`` and runs the
transform on it.  When that transform is ``ToArray()``, optionally followed by
``Normalize`` steps (alone or in ``Compose``s, fastload's own classes), and
there is no ``target_transform``, the DataLoader can skip the PIL images: one
kernel call (``_core.gather_image_rows``) writes the whole batch, channels
first, straight into its ring slot.  The values are the per-sample path's, bit
for bit: ``ToArray`` moves bytes, and ``Normalize`` applies the same float32
operations to every pixel of a channel, so its result on a byte is looked up in
a table the transform itself computes (256 values per channel).

``WholeBatch`` is what ``fastload._loading.fetch`` asks a dataset for
(``dataset._fastload_batch(rows)``); None means "sample by sample".
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from operator import itemgetter
from typing import Any

import numpy as np

from .. import _core
from .transforms import Compose, Normalize, ToArray
from .vision import VisionDataset

__all__ = ["WholeBatch", "pixel_table", "InMemoryImages"]


@dataclass(frozen=True)
class WholeBatch:
    """A batch a dataset writes itself: one ``(dtype, shape)`` per column of the
    collated batch (shape includes the batch axis), and ``fill(outs)``, which
    writes each column into the C-contiguous array given for it.  The batch is
    the list of columns, or with ``keys`` the dict of them; ``tensors``: torch
    tensors whatever the loader's ``output`` (as samples of tensors collate)."""

    columns: tuple[tuple[np.dtype, tuple[int, ...]], ...]
    fill: Callable[[Sequence[np.ndarray]], None]
    keys: tuple[str, ...] | None = None
    tensors: bool = False


def _steps(transform: Any) -> list[Any] | None:
    """The transform as a flat list of steps (fastload ``Compose``s unpacked)."""
    steps: list[Any] = []
    pending = [transform]
    while pending:
        step = pending.pop()
        if isinstance(step, Compose) and type(step).__call__ is Compose.__call__:
            if not isinstance(step.transforms, (list, tuple)):
                return None
            pending.extend(reversed(step.transforms))
        else:
            steps.append(step)
    return steps


def pixel_table(transform: Any, channels: int) -> tuple[np.dtype, np.ndarray | None] | None:
    """How ``transform`` maps a uint8 image with ``channels`` channels, when it can be
    done to whole batches: ``(uint8, None)`` for ``ToArray()`` alone,
    ``(float32, table)`` for ``ToArray()`` then ``Normalize`` steps, where
    ``table[c, v]`` is the output for byte ``v`` in channel ``c``.  None for
    any other transform (no transform at all: samples are PIL images)."""
    if transform is None:
        return None
    steps = _steps(transform)
    if not steps or not isinstance(steps[0], ToArray) or type(steps[0]).__call__ is not ToArray.__call__:
        return None
    rest = steps[1:]
    if not rest:
        return np.dtype(np.uint8), None
    if not all(isinstance(step, Normalize) and type(step).__call__ is Normalize.__call__
               for step in rest):
        return None
    key = _table_key(rest, channels)
    table = _TABLES.get(key) if key is not None else None
    if table is None:
        table = _normalize_table(rest, channels)
        if table is not None and key is not None:
            if len(_TABLES) >= _KEPT_TABLES:
                _TABLES.clear()
            _TABLES[key] = table
    return None if table is None else (np.dtype(np.float32), table)


# Tables already computed, by (channels, each Normalize's mean and std): a batch
# then costs a dict lookup, not a Normalize call.  Only plain numbers are keys
# (an array or a tensor could change in place; those are computed each batch).
_TABLES: dict[tuple, np.ndarray] = {}
_KEPT_TABLES = 64


def _number_key(value: Any) -> Any:
    if type(value) in (int, float):
        return value
    if type(value) in (tuple, list) and all(type(v) in (int, float) for v in value):
        return tuple(value)
    return None


def _table_key(normalizes: list[Any], channels: int) -> tuple | None:
    key: list[Any] = [channels]
    for step in normalizes:
        mean, std = _number_key(step.mean), _number_key(step.std)
        if mean is None or std is None:
            return None
        key.append((mean, std))
    return tuple(key)


def _normalize_table(normalizes: list[Any], channels: int) -> np.ndarray | None:
    """Each byte of each channel through the ``Normalize`` steps: ``(channels, 256)``
    float32, read-only; None when the steps refuse such an image."""
    values: Any = np.broadcast_to(np.arange(256, dtype=np.uint8), (channels, 1, 256)).copy()
    try:
        for step in normalizes:
            values = step(values)
    except (TypeError, ValueError, RuntimeError):
        # The sample-by-sample path meets the same error, and reports it with
        # its sample: leave it to that path.
        return None
    if not isinstance(values, np.ndarray) or values.dtype != np.float32 \
            or values.shape != (channels, 1, 256):
        return None
    table = np.ascontiguousarray(values.reshape(channels, 256))
    table.flags.writeable = False
    return table


def _target_column(targets: Any, rows: np.ndarray, as_int: bool) -> tuple[np.dtype, Any] | None:
    """``(dtype, values)`` of a batch's targets as default_collate would make them from
    the per-sample targets (``int(t)`` when ``as_int``, else ``t`` as stored), or None."""
    if isinstance(targets, np.ndarray):
        # (A scalar of a byte-swapped array is native: its column would not be.)
        if targets.ndim != 1 or targets.dtype.kind not in "iu" or not targets.dtype.isnative \
                or (targets.dtype.kind == "u" and targets.itemsize >= 8):
            return None
        return (np.dtype(np.int64) if as_int else targets.dtype), targets[rows]
    if as_int or not isinstance(targets, list):
        return None
    keys = rows.tolist()
    values = [targets[keys[0]]] if len(keys) == 1 else itemgetter(*keys)(targets)
    # Python ints (not bools, not numpy scalars) collate to int64.
    if set(map(type, values)) != {int}:
        return None
    return np.dtype(np.int64), values


class InMemoryImages(VisionDataset):
    """The part MNIST and CIFAR share: ``data`` (uint8 images), ``targets``, the batch plan.

    Subclasses set ``_channels`` (1 for ``(N, H, W)`` data, 3 for ``(N, H, W,
    3)``), ``_int_targets`` (whether ``__getitem__`` returns ``int(target)``)
    and ``_plain_getitem`` (their own ``__getitem__``: a subclass that
    overrides it is loaded sample by sample).
    """

    _channels = 1
    _int_targets = False
    _plain_getitem: Callable | None = None

    def __len__(self) -> int:
        return len(self.data)

    def _fastload_batch(self, rows: np.ndarray) -> WholeBatch | None:
        """The whole batch of ``rows`` (int64), or None: sample by sample then."""
        if type(self).__getitem__ is not type(self)._plain_getitem \
                or self.target_transform is not None:
            return None
        data = self.data
        channels = self._channels
        if not isinstance(data, np.ndarray) or data.dtype != np.uint8 \
                or not data.flags.c_contiguous or len(rows) == 0 \
                or data.ndim != (3 if channels == 1 else 4) \
                or (channels != 1 and data.shape[3] != channels):
            return None
        pixels = pixel_table(self.transform, channels)
        if pixels is None:
            return None
        target = _target_column(self.targets, rows, self._int_targets)
        if target is None:
            return None
        (image_dtype, table), (target_dtype, target_values) = pixels, target
        count = len(rows)
        columns = ((image_dtype, (count, channels) + data.shape[1:3]), (target_dtype, (count,)))

        def fill(outs: Sequence[np.ndarray]) -> None:
            _core.gather_image_rows(data, rows, outs[0], table)
            outs[1][...] = target_values

        return WholeBatch(columns, fill)
