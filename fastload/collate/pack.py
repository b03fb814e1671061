"""Packing: the output of a custom ``collate_fn``, moved as it is into a buffer
(a ring slot, in a worker), so that its arrays cross to the main process
without being pickled."""

from __future__ import annotations

import collections.abc
from typing import Any, Callable

import numpy as np

from fastload.collate.layout import (ArraySlot, BatchLayout, MappingNode, NamedTupleNode,
                                     SequenceNode, Value, private_buffer)
from fastload.collate.tensors import _is_plain_torch_tensor, tensor_as_numpy, tensor_is_its_bytes


# Array types whose whole state is their data, so a view of the buffer stands in
# for them.  Other subclasses (a masked array's mask, a matrix's type) travel
# as values, pickled with what makes them what they are.
_PLAIN_ARRAY_TYPES = (np.ndarray, np.memmap)


def _plan_packing(obj: Any, sources: list) -> Any:
    if type(obj) in _PLAIN_ARRAY_TYPES and not obj.dtype.hasobject and obj.dtype.kind not in "SaU":
        sources.append(obj)
        return ArraySlot(obj.dtype, obj.shape)
    # A tensor subclass rides as a value, as an ndarray subclass does: its
    # bytes alone would come back as a plain tensor; so do tensors that are
    # more than their bytes (quantized, nested: see TorchStacked).
    if _is_plain_torch_tensor(obj) and tensor_is_its_bytes(obj):
        array = tensor_as_numpy(obj)
        sources.append(array)
        return ArraySlot(array.dtype, array.shape, as_torch=True)
    obj_type = type(obj)
    if obj_type is dict or (isinstance(obj, collections.abc.Mapping) and obj_type.__module__ == "collections"):
        return MappingNode(obj, [_plan_packing(value, sources) for value in obj.values()])
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):
        return NamedTupleNode(obj_type, [_plan_packing(item, sources) for item in obj])
    if obj_type is list or obj_type is tuple:
        return SequenceNode(obj_type, [_plan_packing(item, sources) for item in obj])
    return Value(obj)


def pack_into(obj: Any, allocate: Callable[[int], np.ndarray] = private_buffer
              ) -> tuple[BatchLayout, np.ndarray]:
    """Lay out any batch (e.g. a custom collate_fn's output) and copy its arrays in.

    Arrays (and CPU torch tensors) inside dicts, lists, tuples and namedtuples
    are copied into the buffer; everything else is carried as a Python value.
    """
    sources: list = []
    layout = BatchLayout(_plan_packing(obj, sources))
    layout.assign_offsets()
    buffer = allocate(layout.nbytes)
    slots = [leaf for leaf in layout.leaves() if isinstance(leaf, ArraySlot)]
    for slot, source in zip(slots, sources):
        np.copyto(slot.view(buffer), source, casting="no")
    return layout, buffer
