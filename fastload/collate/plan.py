"""Planning a batch: the ``BatchLayout`` ``default_collate`` fills, laid out
from the first sample with torch's rules for what each leaf becomes."""

from __future__ import annotations

import collections.abc
from typing import Any, Sequence

import numpy as np

from fastload import _core
from fastload.collate.faults import _empty_batch, is_string_or_object_dtype
from fastload.collate.layout import (_ARRAY, _SCALAR_BOOL, _SCALAR_FLOAT, _SCALAR_INT,
                                     _SCALAR_NUMPY, _TENSOR, ArraySlot, BatchLayout,
                                     MappingNode, NamedTupleNode, RefusedLeaf, SequenceNode,
                                     TorchStacked, Value)
from fastload.collate.tensors import _is_torch_tensor, _numpy_dtype_of, tensor_is_its_bytes


def _torch_must_stack(samples: Sequence, path: tuple) -> bool:
    """Whether a tensor at ``path`` is more than the bytes numpy would see
    (``TorchStacked``)."""
    try:
        values = _core.collect_leaf_objects(list(samples), path)
    except (KeyError, IndexError, TypeError):
        return False  # the fill names the sample that lacks it
    # The kind of tensor, from the first (a later one of another kind fails
    # the copy, which then raises torch.stack's error: see _fill_tensors);
    # autograd history, from any (cheap: this runs per batch).
    first = values[0]
    if _is_torch_tensor(first) and not tensor_is_its_bytes(first):
        return True
    return any(getattr(value, "requires_grad", False) for value in values)


def _plan_node(elem: Any, path: tuple, n: int, length_checks: list, tensors: list,
               in_sequence: bool = False, tracked: frozenset = frozenset()) -> Any:
    """The layout node of ``elem``; sequences to check go to ``length_checks``,
    the paths of torch tensors to ``tensors``; ``tracked``: the paths of tensors
    that torch stacks (see ``TorchStacked``)."""
    elem_type = type(elem)
    if isinstance(elem, np.ndarray):
        if is_string_or_object_dtype(elem.dtype):
            return RefusedLeaf(elem.dtype, path)
        return ArraySlot(elem.dtype, (n,) + elem.shape, path, _ARRAY)
    if isinstance(elem, (np.bool_, np.number, np.object_)):
        if isinstance(elem, np.object_):
            return RefusedLeaf(elem_type, path)
        return ArraySlot(elem.dtype, (n,), path, _SCALAR_NUMPY)
    if elem_type is float or (isinstance(elem, float)):
        return ArraySlot(np.float64, (n,), path, _SCALAR_FLOAT)
    if elem_type is bool:
        return ArraySlot(np.bool_, (n,), path, _SCALAR_BOOL)
    if isinstance(elem, int):
        return ArraySlot(np.int64, (n,), path, _SCALAR_INT)
    if isinstance(elem, (str, bytes)):
        return Value(None, path, as_tuple=in_sequence)
    if _is_torch_tensor(elem):
        tensors.append(path)
        if path in tracked or elem.is_nested:  # a nested tensor has no one shape
            return TorchStacked(None, path)
        return ArraySlot(_numpy_dtype_of(elem.dtype), (n,) + tuple(elem.shape), path, _TENSOR,
                         as_torch=True)
    if isinstance(elem, collections.abc.Mapping):
        if not elem:
            # No leaf will look it up, but torch does: every sample must have it.
            length_checks.append((path, None))
        return MappingNode(elem, [_plan_node(elem[key], path + (key,), n, length_checks, tensors,
                                             tracked=tracked)
                                  for key in elem])
    if isinstance(elem, tuple) and hasattr(elem, "_fields"):
        return NamedTupleNode(elem_type, [
            _plan_node(item, path + (i,), n, length_checks, tensors, True, tracked)
            for i, item in enumerate(elem)])
    if isinstance(elem, collections.abc.Sequence):
        length_checks.append((path, len(elem)))
        children = [_plan_node(item, path + (i,), n, length_checks, tensors, True, tracked)
                    for i, item in enumerate(elem)]
        # torch turns a tuple into a list ("backwards compatibility") and
        # rebuilds other sequences as their own type when it can.
        return SequenceNode(None if isinstance(elem, tuple) else elem_type, children)
    return RefusedLeaf(elem_type, path)


def plan_collate(samples: Sequence) -> BatchLayout:
    """Lay out the batch ``default_collate(samples)`` makes, from its first sample.

    A leaf torch refuses is a ``RefusedLeaf``, which raises when filled.
    """
    if len(samples) == 0:
        raise _empty_batch()
    length_checks: list = []
    tensors: list = []
    layout = BatchLayout(_plan_node(samples[0], (), len(samples), length_checks, tensors),
                         length_checks)
    tracked = frozenset(path for path in tensors if _torch_must_stack(samples, path))
    if tracked:  # rare: lay out again, with torch stacking those leaves
        length_checks, tensors = [], []
        layout = BatchLayout(_plan_node(samples[0], (), len(samples), length_checks, tensors,
                                        tracked=tracked), length_checks)
    if tensors:
        # Samples that hold torch tensors make torch's batch: every array a
        # tensor (its numbers too), not tensors beside numpy arrays.
        layout.as_torch()
    layout.assign_offsets()
    return layout
