"""``default_convert`` (what a loader without batching gives) and ``to_torch``
(``output="torch"`` where no layout says which leaves are data): a sample's
leaves converted, its containers rebuilt as torch rebuilds them."""

from __future__ import annotations

import collections.abc
from typing import Any, Callable

import numpy as np

from fastload.collate.containers import rebuilt_mapping, rebuilt_sequence
from fastload.collate.faults import is_string_or_object_dtype
from fastload.collate.tensors import _as_torch_can_share, _is_torch_tensor, _tensor_keeping


def default_convert(data: Any) -> Any:
    """torch's ``default_convert`` in numpy: arrays stay arrays, numpy scalars
    become 0-d arrays, containers are converted element-wise (a tuple
    becoming a list, as torch does).

    Data that holds torch tensors is converted as torch converts it: every
    array and numpy scalar becomes a tensor (as ``default_collate`` makes a
    batch of such samples torch's batch).
    """
    holds_tensors: list = []

    def leaf(value: Any) -> Any:
        if isinstance(value, np.generic) and not isinstance(value, (np.str_, np.bytes_)):
            return np.asarray(value)
        if isinstance(value, np.matrix):  # torch makes a plain tensor of it
            return np.asarray(value)
        if not holds_tensors and _is_torch_tensor(value):
            holds_tensors.append(True)
        return value

    converted = _convert_containers(data, leaf, tuples_as_lists=True)
    return to_torch(converted) if holds_tensors else converted


def _convert_containers(data: Any, leaf: Callable[[Any], Any], tuples_as_lists: bool) -> Any:
    """torch's ``default_convert`` recursion, with ``leaf`` for what is not a container.

    Mappings are cloned and updated (a defaultdict keeps its factory, a dict
    subclass its attributes) or rebuilt from a dict, namedtuples stay
    namedtuples, tuples become lists (``tuples_as_lists``, torch's rule) or
    stay tuples, other sequences are cloned or rebuilt; a type that cannot be
    rebuilt so gives a dict or a list.
    """
    if isinstance(data, (np.ndarray, np.generic, str, bytes)) or _is_torch_tensor(data):
        return leaf(data)

    def convert(item: Any) -> Any:
        return _convert_containers(item, leaf, tuples_as_lists)

    if isinstance(data, collections.abc.Mapping):
        converted = {key: convert(data[key]) for key in data}
        mutable = isinstance(data, collections.abc.MutableMapping)
        return rebuilt_mapping(type(data), data if mutable else None, lambda: converted)
    if isinstance(data, tuple) and hasattr(data, "_fields"):
        return type(data)(*(convert(item) for item in data))
    if isinstance(data, tuple):  # a tuple subclass too: torch's rule gives a list
        items = [convert(item) for item in data]
        if tuples_as_lists:
            return items
        try:
            return type(data)(items)
        except TypeError:
            return tuple(items)
    if isinstance(data, collections.abc.Sequence):
        items = [convert(item) for item in data]
        mutable = isinstance(data, collections.abc.MutableSequence)
        return rebuilt_sequence(type(data), data if mutable else None, lambda: items)
    return leaf(data)


def to_torch(data: Any) -> Any:
    """``data`` with every numpy array (bar strings and objects) and numpy scalar
    a tensor, sharing the array's memory; containers keep their types (rebuilt
    as torch's ``default_convert`` rebuilds them, tuples staying tuples).

    For ``output="torch"`` where no batch layout says which leaves are data
    (``batch_size=None``, a custom ``collate_fn``); ``BatchLayout.as_torch``
    does it for collated batches.
    """
    import torch

    def leaf(value: Any) -> Any:
        # numpy's own array types, as torch's default_convert picks them: a
        # masked array (numpy.ma) or a subclass of the caller's stays as it is.
        if isinstance(value, np.ndarray) and type(value).__module__ == "numpy":
            if is_string_or_object_dtype(value.dtype):
                return value
            return _tensor_keeping(value, torch)
        if isinstance(value, np.generic) and not isinstance(value, (np.str_, np.bytes_)):
            # Through a 0-d array: torch.as_tensor refuses an np.uint64 scalar.
            return torch.as_tensor(_as_torch_can_share(np.asarray(value)))
        return value

    return _convert_containers(data, leaf, tuples_as_lists=False)
