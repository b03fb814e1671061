"""The batch *layout*: a small tree that says how a batch is built from one
flat buffer.

Containers (mappings, namedtuples, lists, tuples, other sequences) whose
leaves are either ``ArraySlot``s -- an array living at a byte offset of the
buffer -- or ``Value``s, Python objects (strings, arbitrary leaves) carried as
they are.  The nodes are small and picklable: a worker sends them to the main
process in place of the batch, and ``layout.build(buffer)`` turns a filled
buffer into the batch (numpy views), which is all the main process does with
a batch a worker wrote.
"""

from __future__ import annotations

import collections.abc
import copy
import math
from typing import Any

import numpy as np

from fastload import _core
from fastload.collate.containers import rebuilt_mapping, rebuilt_sequence
from fastload.collate.faults import _check_all_tensors, _refusal
from fastload.collate.tensors import _tensor_keeping


# Leaves are aligned so every view is aligned for any dtype, and so two
# leaves never share a cache line (workers write them concurrently in other
# slots; within a slot it keeps the arithmetic honest).
_ALIGN = 64

# Leaf kinds; the scalar ones are _core's SCALAR_* codes.
_ARRAY = 0
_SCALAR_INT = _core.SCALAR_INT
_SCALAR_FLOAT = _core.SCALAR_FLOAT
_SCALAR_BOOL = _core.SCALAR_BOOL
_SCALAR_NUMPY = _core.SCALAR_NUMPY
_CAST_ARRAY = 10    # arrays of mixed dtypes, promoted (torch.stack promotes too)
_TENSOR = 11        # torch tensors, stacked as torch.stack does (its promotion rules)
_CAST_SCALARS = 12  # numbers of mixed types, promoted as torch.tensor(batch) does


def _align(n: int) -> int:
    return (n + _ALIGN - 1) // _ALIGN * _ALIGN


class ArraySlot:
    """An array of ``dtype`` and ``shape`` at ``offset`` in the batch buffer.

    ``path`` and ``kind`` say where the leaf comes from in a sample and how
    the kernels read it; they are only needed while filling.
    """

    __slots__ = ("offset", "dtype", "shape", "path", "kind", "as_torch")

    def __init__(self, dtype: np.dtype, shape: tuple, path: tuple = (), kind: int = _ARRAY,
                 as_torch: bool = False) -> None:
        self.offset = 0
        self.dtype = np.dtype(dtype)
        self.shape = tuple(shape)
        self.path = path
        self.kind = kind
        self.as_torch = as_torch

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * self.dtype.itemsize

    def view(self, buffer: np.ndarray) -> np.ndarray:
        # The view's base is the buffer (whose own base is the ring's lease),
        # so the slot lives as long as this view.  ``np.ndarray(shape, dtype,
        # buffer, offset)`` in one kernel call: this runs for every array of
        # every batch the main process hands out.
        return _core.slot_view(buffer, self.dtype, self.shape, self.offset)

    def build(self, buffer: np.ndarray) -> Any:
        array = self.view(buffer)
        if self.as_torch:
            import torch  # only when the samples or a custom collate_fn held tensors

            tensor = _tensor_keeping(array, torch)
            torch_dtype = self.dtype.metadata and self.dtype.metadata.get("torch_dtype")
            if torch_dtype:  # see tensor_as_numpy
                tensor = tensor.view(getattr(torch, torch_dtype.removeprefix("torch.")))
            return tensor
        return array

    def matches(self, other: Any, values: list) -> bool:
        # Equal dtypes may still differ in their scalar type (np.longlong and
        # np.int64 are equal on Linux): char tells them apart.
        return type(other) is ArraySlot and other.offset == self.offset \
            and other.shape == self.shape and other.as_torch == self.as_torch \
            and (other.dtype is self.dtype or (other.dtype == self.dtype
                                               and other.dtype.char == self.dtype.char
                                               and other.dtype.metadata == self.dtype.metadata))

    def __reduce__(self):
        # Each new layout crosses the result pipe (see _loading/wire/layouts.py): a plain
        # tuple and the dtype's string (when it says everything) pickle
        # faster than the default slot state with a dtype object.
        dtype = self.dtype
        token = dtype.str if dtype.fields is None and dtype.metadata is None \
            and dtype.kind not in "OV" else dtype
        if token is not dtype and dtype.isnative and np.dtype(token).char != dtype.char:
            # np.longlong's string is int64's ('<i8'), and so is its pickle: its char is its own.
            token = dtype.char
        return (_rebuild_array_slot, (self.offset, token, self.shape, self.as_torch))


class Value:
    """A leaf that is not array data: it travels as a Python object.

    ``as_tuple``: strings under a sequence come out of torch's ``zip(*batch)``
    as a tuple, under a mapping as a list; the collated value keeps that type.
    """

    __slots__ = ("value", "path", "as_tuple")

    def __init__(self, value: Any = None, path: tuple = (), as_tuple: bool = False) -> None:
        self.value = value
        self.path = path
        self.as_tuple = as_tuple

    def build(self, buffer: np.ndarray) -> Any:
        return self.value

    def matches(self, other: Any, values: list) -> bool:
        # Any value matches; ``values`` collects the other tree's, in tree order.
        if type(other) is not Value:
            return False
        values.append(other.value)
        return True

    def __reduce__(self):
        return (Value, (self.value,))


class TorchStacked(Value):
    """Tensors that are more than their bytes, which ``torch.stack`` makes the
    batch of, as torch's collate does (see ``_torch_must_stack``): with
    autograd history, so that gradients flow back to the dataset's tensors
    (the ring's bytes would cut them off); quantized ones (their scale and
    zero point); on another device than the CPU.  A worker then sends the
    stacked tensor pickled (torch refuses that for a tensor with history, as
    its own workers fail on them).  Nested and sparse ones are refused with
    torch's errors."""

    __slots__ = ()

    def stack(self, values: list) -> Any:
        import torch

        _check_all_tensors(values, self.path)
        first = values[0]
        if first.is_nested:
            raise RuntimeError("Batches of nested tensors are not currently supported by the "
                               "default collate_fn; please provide a custom collate_fn to "
                               "handle them appropriately.")
        if first.layout != torch.strided:
            raise RuntimeError("Batches of sparse tensors are not currently supported by the "
                               "default collate_fn; please provide a custom collate_fn to "
                               "handle them appropriately.")
        return torch.stack(values)


class RefusedLeaf(Value):
    """A leaf of the first sample that torch's collate refuses (a None, a set, an
    array of strings).  Laid out, not raised at once: torch collates depth
    first and may meet another fault before it (NOTE [ The fault torch meets first ]);
    filling it raises the TypeError."""

    __slots__ = ("message",)

    def __init__(self, found: Any, path: tuple) -> None:
        super().__init__(None, path)
        self.message = _refusal(found, path)


def _same_key_types(keys: list, other_keys: list) -> bool:
    """Whether two lists of equal keys also have the same types: ``1``, ``True``
    and ``1.0`` are equal, but a batch keeps its own sample's keys."""
    for key, other in zip(keys, other_keys):  # a loop: cheaper than all() (per batch)
        if type(key) is not type(other):
            return False
    return True


class MappingNode:
    """A mapping; rebuilt as torch rebuilds it (clone of the sample's type when it can)."""

    __slots__ = ("keys", "children", "template", "mapping_type")

    def __init__(self, elem: collections.abc.Mapping, children: list) -> None:
        self.keys = list(elem.keys())
        self.children = children
        self.mapping_type = type(elem)
        self.template = None
        if self.mapping_type is not dict and isinstance(elem, collections.abc.MutableMapping):
            # torch clones the first sample's mapping and updates the clone, so
            # extra state (a defaultdict's factory, attributes) survives.
            try:
                self.template = copy.copy(elem)
            except Exception:
                self.template = None

    def matches(self, other: Any, values: list) -> bool:
        # A template (a mapping subclass's clone) may carry state: not compared, never matches.
        return type(other) is MappingNode and other.mapping_type is self.mapping_type \
            and self.template is None and other.template is None and other.keys == self.keys \
            and _same_key_types(self.keys, other.keys) \
            and _children_match(self.children, other.children, values)

    def __reduce__(self):
        # Sent from a worker, the template travels without the sample's values
        # (the batch's replace them anyway).  A dict subclass: an emptied clone
        # (its own storage, so the sample is untouched).  Another mutable
        # mapping may keep its items anywhere (and take other constructor
        # arguments), so it is deep-copied with each value standing in as None;
        # one that cannot be is sent as the clone itself, as torch sends it.
        template = self.template
        if isinstance(template, dict):
            template = copy.copy(template)
            # Its own clear(): dict.clear would bypass the bookkeeping of a
            # subclass such as OrderedDict (whose pickling then fails).
            template.clear()
        elif template is not None:
            try:
                template = copy.deepcopy(template, {id(value): None for value in template.values()})
            except Exception:
                pass
        return (_rebuild_mapping_node, (self.keys, self.children, template, self.mapping_type))

    def build(self, buffer: np.ndarray) -> Any:
        values = {key: child.build(buffer) for key, child in zip(self.keys, self.children)}
        if self.mapping_type is dict:
            return values
        return rebuilt_mapping(self.mapping_type, self.template, lambda: values)


class NamedTupleNode:
    __slots__ = ("tuple_type", "children")

    def __init__(self, tuple_type: type, children: list) -> None:
        self.tuple_type = tuple_type
        self.children = children

    def matches(self, other: Any, values: list) -> bool:
        return type(other) is NamedTupleNode and other.tuple_type is self.tuple_type \
            and _children_match(self.children, other.children, values)

    def __reduce__(self):
        return (NamedTupleNode, (self.tuple_type, self.children))

    def build(self, buffer: np.ndarray) -> Any:
        return self.tuple_type(*(child.build(buffer) for child in self.children))


class SequenceNode:
    """A sequence: a list, or (``sequence_type`` set) the sample's own type when it rebuilds."""

    __slots__ = ("sequence_type", "children")

    def __init__(self, sequence_type: type | None, children: list) -> None:
        self.sequence_type = sequence_type
        self.children = children

    def matches(self, other: Any, values: list) -> bool:
        return type(other) is SequenceNode and other.sequence_type is self.sequence_type \
            and _children_match(self.children, other.children, values)

    def __reduce__(self):
        return (SequenceNode, (self.sequence_type, self.children))

    def build(self, buffer: np.ndarray) -> Any:
        items = [child.build(buffer) for child in self.children]
        if self.sequence_type is None or self.sequence_type is list:
            return items
        if self.sequence_type is tuple:
            return tuple(items)
        return rebuilt_sequence(self.sequence_type, None, lambda: items)


class BatchLayout:
    """The tree of one batch plus the bytes its arrays need.

    ``length_checks`` lists ``(path, length)`` of the sequence nodes whose
    length every sample must share (torch's "each element in list of batch
    should be of equal size"), and ``(path, None)`` of empty mappings, which
    every sample must merely have; it matters only while filling, so it is
    not pickled.
    """

    __slots__ = ("root", "nbytes", "length_checks", "_leaves", "_value_leaves", "_as_torch")

    def __init__(self, root: Any, length_checks: list | None = None) -> None:
        self.root = root
        self.nbytes = 0
        self.length_checks = length_checks or []
        self._leaves: list | None = None
        self._value_leaves: list | None = None
        self._as_torch = False

    def __reduce__(self):
        return (_rebuild_layout, (self.root, self.nbytes))

    def leaves(self) -> list:
        """The leaves, in tree order (found once: the tree does not change shape)."""
        if self._leaves is None:
            found: list = []
            stack = [self.root]
            while stack:
                node = stack.pop()
                if isinstance(node, (ArraySlot, Value)):
                    found.append(node)
                else:
                    stack.extend(reversed(node.children))
            self._leaves = found
        return self._leaves

    def assign_offsets(self) -> int:
        """Place array leaves one after another, aligned; return the total bytes."""
        offset = 0
        for leaf in self.leaves():
            if isinstance(leaf, ArraySlot):
                leaf.offset = offset
                offset += _align(leaf.nbytes)
        self.nbytes = offset
        return offset

    def matches(self, other: "BatchLayout", values: list) -> bool:
        """Whether ``other`` lays a batch out exactly as this one does (values aside);
        if so, ``values`` ends up holding ``other``'s ``Value`` contents in tree order."""
        return other.nbytes == self.nbytes and self.root.matches(other.root, values)

    def value_leaves(self) -> list:
        """The ``Value`` leaves, in tree order (computed once: the tree does not change shape)."""
        if self._value_leaves is None:
            self._value_leaves = [leaf for leaf in self.leaves() if isinstance(leaf, Value)]
        return self._value_leaves

    def detach_values(self) -> list:
        """Take the ``Value`` leaves' contents out of the tree (before it is sent without them)."""
        leaves = self.value_leaves()
        values = [leaf.value for leaf in leaves]
        for leaf in leaves:
            leaf.value = None
        return values

    def as_torch(self) -> "BatchLayout":
        """Make ``build`` give torch tensors for every array (``output="torch"``).

        Only the arrays: the ``Value`` leaves stay what torch's collate leaves
        them (an array beside a string in a list is still an array).  Marked
        once; the main process keeps a worker's layouts for its later batches.
        """
        if not self._as_torch:
            for leaf in self.leaves():
                if isinstance(leaf, ArraySlot):
                    leaf.as_torch = True
            self._as_torch = True
        return self

    def build(self, buffer: np.ndarray, values: list | None = None) -> Any:
        """The batch, its arrays viewing ``buffer``; ``values`` fill the ``Value`` leaves
        of a layout sent without them (see ``_loading/wire/layouts.py``)."""
        if not values:
            return self.root.build(buffer)
        leaves = self.value_leaves()
        for leaf, value in zip(leaves, values):
            leaf.value = value
        try:
            return self.root.build(buffer)
        finally:
            # A layout is kept for the batches after this one: it must not
            # keep this batch's values alive.
            for leaf in leaves:
                leaf.value = None


def _children_match(mine: list, theirs: list, values: list) -> bool:
    return len(mine) == len(theirs) and all(a.matches(b, values) for a, b in zip(mine, theirs))


_DTYPES: dict[str, np.dtype] = {}


def _rebuild_array_slot(offset: int, token: Any, shape: tuple, as_torch: bool) -> ArraySlot:
    dtype = _DTYPES.get(token) if isinstance(token, str) else token
    if dtype is None:
        dtype = _DTYPES[token] = np.dtype(token)
    slot = ArraySlot.__new__(ArraySlot)
    slot.offset, slot.dtype, slot.shape, slot.as_torch = offset, dtype, shape, as_torch
    slot.path, slot.kind = (), _ARRAY
    return slot


def _rebuild_mapping_node(keys: list, children: list, template: Any, mapping_type: type
                          ) -> MappingNode:
    node = MappingNode.__new__(MappingNode)
    node.keys, node.children, node.template, node.mapping_type = keys, children, template, mapping_type
    return node


def _rebuild_layout(root: Any, nbytes: int) -> BatchLayout:
    layout = BatchLayout(root)
    layout.nbytes = nbytes
    return layout


def private_buffer(nbytes: int) -> np.ndarray:
    """A fresh flat buffer: the ``allocate`` of batches made outside the ring."""
    return np.empty(nbytes, dtype=np.uint8)
