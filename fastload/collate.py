"""Collation: ``default_collate`` / ``default_convert`` and the batch *layout*.

A batch is described by a small tree, the ``BatchLayout``: containers
(mappings, namedtuples, lists, tuples, other sequences) whose leaves are either
``ArraySlot``s -- an array living at a byte offset of one flat buffer -- or
``Value``s, Python objects (strings, arbitrary leaves) carried as they are.

Collating is then three steps, all in ``collate_into``, the same whether the
buffer is a private numpy array (``default_collate``, ``num_workers=0``) or a
slot of the shared-memory ring (a worker writing in place):

1. ``plan_collate(samples)`` walks the first sample and lays out one leaf per
   array / number / string, with torch's rules for what each becomes;
2. the caller's ``allocate`` gives ``layout.nbytes`` bytes;
3. ``_fill_leaf`` lets the ``_core`` kernels copy every sample's leaves into
   place, validating dtype and shape as they go; a batch that fails there is
   checked again in torch's order, to raise the fault torch would (NOTE
   [ The fault torch meets first ]).

``layout.build(buffer)`` turns a filled buffer into the batch (numpy views),
which is all the main process does with a batch a worker wrote.
"""

from __future__ import annotations

import collections.abc
import copy
import math
import re
import sys
import weakref
from typing import Any, Callable, Sequence

import numpy as np

from fastload import _core

__all__ = [
    "default_collate",
    "default_convert",
    "collate",
    "default_collate_fn_map",
    "collate_numpy_array_fn",
    "collate_numpy_scalar_fn",
    "collate_float_fn",
    "collate_int_fn",
    "collate_str_fn",
    "collate_tensor_fn",
    "BatchLayout",
    "ArraySlot",
    "Value",
    "plan_collate",
    "collate_into",
    "private_buffer",
    "is_string_or_object_dtype",
    "pack_into",
    "to_torch",
    "pad_collate",
    "Padded",
]

# numpy dtypes default_collate refuses, as torch does: strings, bytes, objects.
_STR_OBJ_DTYPE = re.compile(r"[SaUO]")
_ERR_FORMAT = ("default_collate: batch must contain tensors, numpy arrays, numbers, "
               "dicts or lists; found {}")


def is_string_or_object_dtype(dtype: np.dtype) -> bool:
    """A dtype ``default_collate`` refuses: torch's ``[SaUO]`` test on ``dtype.str``,
    and a structured dtype holding objects (which no tensor can take either)."""
    return _STR_OBJ_DTYPE.search(dtype.str) is not None or dtype.hasobject


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


class StructureMismatchError(TypeError, RuntimeError):
    """A sample's leaf is not what the first sample's is (e.g. None where it had a number).

    A ``TypeError`` for what it is, and a ``RuntimeError`` because that is
    what torch raises there ("Could not infer dtype of NoneType"), so code
    written against either catches it.
    """


def _refusal(found: Any, path: tuple, index: int = 0) -> str:
    """torch's message for a leaf its collate refuses, and where the leaf sits."""
    return _ERR_FORMAT.format(found) + f" (at {format_path(path, index)})"


def _align(n: int) -> int:
    return (n + _ALIGN - 1) // _ALIGN * _ALIGN


def format_path(path: tuple, index: int | None = None) -> str:
    """``batch[3]['image']``: where a leaf sits, for error messages."""
    head = "batch" if index is None else f"batch[{index}]"
    return head + "".join(f"[{key!r}]" for key in path)


# --------------------------------------------------------------------------
# Layout nodes.  They are small, picklable, and know how to rebuild their part
# of a batch from a buffer; workers send them to the main process in place of
# the batch itself.
# --------------------------------------------------------------------------

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
        # Each new layout crosses the result pipe (see layout_wire): a plain
        # tuple and the dtype's string (when it says everything) pickle
        # several times faster than the default slot state with a dtype object.
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


def _check_all_tensors(values: list, path: tuple) -> None:
    """Every sample's leaf at ``path`` is a tensor, as the first one is."""
    for i, value in enumerate(values):
        if not _is_torch_tensor(value):
            raise TypeError(f"default_collate: {format_path(path, i)} is {type(value).__name__}, "
                            f"but {format_path(path, 0)} is a tensor; every sample must have "
                            f"the structure of the first")


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
    torch, first = sys.modules.get("torch"), values[0]
    if _is_torch_tensor(first) and (first.is_quantized or first.is_nested or not first.is_cpu
                                    or first.layout is not torch.strided):
        return True
    return any(getattr(value, "requires_grad", False) for value in values)


def _same_key_types(keys: list, other_keys: list) -> bool:
    """Whether two lists of equal keys also have the same types: ``1``, ``True``
    and ``1.0`` are equal, but a batch keeps its own sample's keys."""
    for key, other in zip(keys, other_keys):  # a loop: a third faster than all() (per batch)
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
        try:
            if self.template is not None:
                clone = copy.copy(self.template)
                clone.update(values)
                return clone
            return self.mapping_type(values)
        except TypeError:
            return values


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
        try:
            return self.sequence_type(items)
        except TypeError:
            return items


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
        of a layout sent without them (see ``layout_wire``)."""
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


# --------------------------------------------------------------------------
# default_collate as plan + fill.
# --------------------------------------------------------------------------

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
        # torch's type (its batch[0] fails), with a message that says why.
        raise IndexError("default_collate: cannot collate an empty batch (no samples)")
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
        for leaf in layout.leaves():
            if isinstance(leaf, ArraySlot):
                leaf.as_torch = True
    layout.assign_offsets()
    return layout


# A loader keeps at most this many planned layouts: batches whose layout keeps
# changing (a new shape each time) must not grow them without end.
_KEPT_LAYOUTS = 16


class PlannedLayouts:
    """The layouts one loader's batches were planned with, by the ``_core.layout_key``
    of their first sample (NOTE [ Layouts planned once ] in ``_plan_key.pxi``).

    A kept layout is handed out for every batch with its key, so it never
    changes once kept: a batch that needs promotion (mixed dtypes) or fails
    is made with a layout planned afresh, which is not kept.  Between batches
    a kept layout holds no values: whoever takes a batch's layout takes them
    out (``detach_values``).  Not for sharing between threads: while a batch
    is made, its layout holds that batch's values.
    """

    def __init__(self) -> None:
        # key -> (layout, the dtypes the key names by id, kept alive with it)
        self._layouts: dict[tuple, tuple[BatchLayout, list]] = {}

    def lookup(self, samples: list) -> tuple[BatchLayout | None, tuple | None]:
        """``(the layout kept for these samples or None, ticket)``; the ticket
        (None for samples without a key) is what ``keep`` takes."""
        dtypes: list = []
        key = _core.layout_key(samples[0], dtypes)
        if key is None:
            return None, None
        ticket = ((len(samples), key), dtypes)
        kept = self._layouts.get(ticket[0])
        return (kept[0] if kept is not None else None), ticket

    def keep(self, ticket: tuple, layout: BatchLayout) -> None:
        """Keep ``layout`` (planned and filled without promotion) for later batches."""
        key, dtypes = ticket
        if len(self._layouts) >= _KEPT_LAYOUTS:
            self._layouts.clear()
        self._layouts[key] = (layout, dtypes)


def _walk_error(samples: Sequence, path: tuple, error: Exception) -> Exception:
    """Re-walk ``path`` to say which sample lacks which key: a level at a time,
    as torch gathers a key from every sample before it looks inside."""
    nodes = list(samples)
    for depth, key in enumerate(path):
        # torch takes a namedtuple's fields with zip(*batch) and rebuilds it
        # from them: an item there that is not iterable, or is shorter, is a TypeError.
        in_namedtuple = isinstance(nodes[0], tuple) and hasattr(nodes[0], "_fields")
        for i, node in enumerate(nodes):
            try:
                nodes[i] = node[key]
            except (KeyError, IndexError, TypeError) as exc:
                message = (f"default_collate: {format_path(path[:depth], i)} has no item "
                           f"{key!r}, but {format_path(path[:depth], 0)} does ({exc!r}); every "
                           f"sample must have the structure of the first")
                return TypeError(message) if in_namedtuple else _retyped(exc, message)
    # Every sample has the leaf: one of another kind failed (e.g. len() of an int).
    other = next((i for i, node in enumerate(nodes) if type(node) is not type(nodes[0])), None)
    if other is not None:
        return _retyped(error, f"default_collate: {format_path(path, other)} is "
                               f"{type(nodes[other]).__name__}, but {format_path(path, 0)} is "
                               f"{type(nodes[0]).__name__}; every sample must have the "
                               f"structure of the first ({error})")
    return _retyped(error, f"default_collate: at {format_path(path)}: {error}")


def _leaf_objects(samples: list, path: tuple) -> list:
    """Every sample's leaf at ``path``; a sample that lacks it is named."""
    try:
        return _core.collect_leaf_objects(samples, path)
    except (KeyError, IndexError, TypeError) as exc:
        raise _walk_error(samples, path, exc) from exc


def _retyped(error: Exception, message: str) -> Exception:
    """``error``'s type with ``message``; its built-in base when the type takes other arguments."""
    try:
        return type(error)(message)
    except Exception:
        base = next(kind for kind in (KeyError, IndexError, TypeError) if isinstance(error, kind))
        return base(message)


# torch's type promotion goes by category first: the highest category present
# (bool < integer < floating < complex) wins, and only values of that category
# decide the width.  numpy instead widens (int64 + float32 -> float64), so the
# slow paths promote the torch way.  Python numbers count as torch infers them.
_CATEGORY = {"b": 0, "u": 1, "i": 1, "f": 2, "c": 3}


def _python_float_dtypes() -> tuple[np.dtype, np.dtype]:
    """The dtypes torch infers for a Python float and a Python complex: its
    default dtype's, float32 and complex64 unless the process imported torch
    and changed it (``torch.set_default_dtype(torch.float64)``: float64 and
    complex128).  numpy has no complex32, nor bfloat16: a half default gives
    float16 and complex64, a bfloat16 one float32 and complex64."""
    torch = sys.modules.get("torch")
    if torch is not None:
        default = torch.get_default_dtype()
        if default == torch.float64:
            return np.dtype(np.float64), np.dtype(np.complex128)
        if default == torch.float16:
            return np.dtype(np.float16), np.dtype(np.complex64)
    return np.dtype(np.float32), np.dtype(np.complex64)


def _as_tensor_dtype(value: Any) -> np.dtype | None:
    """The dtype ``torch.as_tensor(value)`` has (None: not numeric data)."""
    if _is_torch_tensor(value):
        value = tensor_as_numpy(value)
        if value.dtype.metadata:  # bfloat16 and the like: not data numpy can promote
            return None
    if isinstance(value, (np.ndarray, np.generic)):
        dtype = value.dtype
    elif isinstance(value, (list, tuple)):
        try:
            dtype = np.asarray(value).dtype
        except (TypeError, ValueError):
            return None
        # Python floats become torch's default dtype, not float64; numpy
        # scalars keep their width (a float64 one makes the list float64).
        if (dtype == np.float64 or dtype == np.complex128) and not _holds_numpy_double(value):
            dtype = _python_float_dtypes()[dtype.kind == "c"]
    elif isinstance(value, (bool, int)):
        return np.dtype(np.bool_) if isinstance(value, bool) else np.dtype(np.int64)
    elif isinstance(value, (float, complex)):
        return _python_float_dtypes()[isinstance(value, complex)]
    else:
        return None
    return dtype if dtype.kind in "biufc" else None


def _holds_numpy_double(value: Any) -> bool:
    """Whether a (nested) list holds a numpy float64 or complex128, scalar or array."""
    if isinstance(value, (list, tuple)):
        return any(_holds_numpy_double(item) for item in value)
    return isinstance(value, (np.ndarray, np.generic)) and value.dtype in (np.float64,
                                                                         np.complex128)


def _is_number(value: Any) -> bool:
    """A value ``torch.tensor(batch)`` takes as one number: a 0-d numeric array, or
    a tensor of one element (it converts those as their ``item()``)."""
    if isinstance(value, np.ndarray):
        return value.ndim == 0 and value.dtype.kind in "biufc"
    if _is_torch_tensor(value):
        return value.numel() == 1
    return isinstance(value, (bool, int, float, complex, np.bool_, np.number))


# torch has uint16, uint32 and uint64 but few promotion rules for them: one
# promoted with anything but itself or a float dtype raises.
_UNPROMOTABLE = frozenset(np.dtype(name) for name in ("u2", "u4", "u8"))


def torch_promote(dtypes: list, tensorised: bool = False) -> np.dtype:
    """The dtype torch gives when it stacks (or, ``tensorised``, makes one
    tensor of: ``torch.as_tensor(batch)``) values of ``dtypes``.

    Raises ``RuntimeError``, as torch does, where its promotion, folded over
    the dtypes in order, meets uint16/32/64 and another dtype that is not a
    float: (bool, float32, uint16) is float32, (bool, uint16, float32) fails.
    Making one tensor, torch stops looking once the fold reaches complex128.
    """
    # Byte order aside (a big-endian uint16 is uint16 to torch's rule).  In
    # order, as torch folds: a dtype met again later may meet another result.
    native = [d if d.isnative else d.newbyteorder("=") for d in dtypes]
    so_far = native[0]
    for dtype in native[1:]:
        if dtype == so_far:
            continue
        if tensorised and so_far == np.complex128:
            break
        for wide, other in ((so_far, dtype), (dtype, so_far)):
            if wide in _UNPROMOTABLE and other.kind != "f":
                raise RuntimeError(f"Promotion for uint16, uint32, uint64 types is not "
                                   f"supported, attempted to promote {wide} and {other}")
        so_far = _promoted([so_far, dtype])
    return _promoted(dtypes)


def _promoted(dtypes: list) -> np.dtype:
    """torch's promotion of ``dtypes`` where it has one (not for uint16/32/64
    beside another integer: see ``torch_promote``)."""
    top = max(_CATEGORY.get(d.kind, 2) for d in dtypes)
    # A complex result keeps the floats' precision (complex64 with float64 is
    # complex128 in torch too); integers never widen a float or a complex.
    lowest = _CATEGORY["f"] if top == _CATEGORY["c"] else top
    return np.result_type(*(d for d in dtypes if _CATEGORY.get(d.kind, 2) >= lowest))


def _overflow(where: str, value: Any, dtype: np.dtype = np.dtype(np.int64)) -> Exception:
    """A Python int too large for ``dtype``, with torch's type: ValueError for an
    integer tensor, OverflowError for a floating one."""
    if dtype.kind in "fc":
        return OverflowError(f"default_collate: {where}: int too large to convert to float")
    return ValueError(f"default_collate: {where}: {value!r} does not fit in int64 "
                      f"(Overflow when unpacking long long)")


def _unequal_shapes(path: tuple, index: int, shape: tuple, first_shape: tuple) -> RuntimeError:
    """torch.stack's error, with the samples' paths in place of its entry numbers."""
    return RuntimeError(f"stack expects each tensor to be equal size, but got {first_shape} at "
                        f"{format_path(path, 0)} and {tuple(shape)} at {format_path(path, index)}")


def _unlike_first(values: list, path: tuple, index: int, first_is: str) -> StructureMismatchError:
    """The value at ``index`` is of another kind than the first sample's (``first_is``)."""
    return StructureMismatchError(
        f"default_collate: {format_path(path, index)} is {type(values[index]).__name__}, but "
        f"{format_path(path, 0)} is {first_is}; every sample must have the structure of the first")


def _fill_cast(samples: list, leaf: ArraySlot, out: np.ndarray) -> None:
    """Slow path for leaves torch would promote: per-sample numpy assignment.

    Beside an array, torch turns each value into a tensor of its own first
    (``torch.as_tensor``: a Python float becomes float32, rounded, before the
    stack widens it again); a batch of numbers is one ``torch.tensor(batch)``
    of the promoted dtype.
    """
    values = _leaf_objects(samples, leaf.path)
    row_shape = leaf.shape[1:]
    each_as_tensor = leaf.kind == _CAST_ARRAY
    arrays = []
    for i, value in enumerate(values):
        if _is_torch_tensor(value):
            value = tensor_as_numpy(value)
            if not each_as_tensor and value.size == 1:
                value = value.reshape(())  # one number of torch.tensor(batch)
        try:
            if isinstance(value, np.ndarray):
                array = value
            else:
                own = _as_tensor_dtype(value) if each_as_tensor else None
                array = np.asarray(value, dtype=own or leaf.dtype)
        except OverflowError:
            raise _overflow(format_path(leaf.path, i), value, own or leaf.dtype) from None
        except (TypeError, ValueError):
            array = np.asarray(value, dtype=object)
        if is_string_or_object_dtype(array.dtype):
            raise TypeError(_refusal(type(value), leaf.path, i))
        arrays.append(array)
    # Every value is converted before any shape is compared, as torch makes
    # all the tensors before it stacks them: a later value it cannot convert fails first.
    for i, array in enumerate(arrays):
        if array.shape != row_shape:
            raise _unequal_shapes(leaf.path, i, array.shape, row_shape)
        out[i] = array


def _fill_tensors(samples: list, leaf: ArraySlot, out: np.ndarray) -> bool:
    """Stack tensors one sample at a time, promoted as ``torch.stack`` promotes them;
    False when the dtype changed (lay out again)."""
    import torch

    values = _leaf_objects(samples, leaf.path)
    _check_all_tensors(values, leaf.path)
    try:
        dtype = values[0].dtype
        for value in values[1:]:
            if value.dtype != dtype:
                dtype = torch.promote_types(dtype, value.dtype)
        shapes = [tuple(value.shape) for value in values]
    except Exception:
        # A later sample's tensor of another kind than the first's (quantized,
        # nested, on the meta device...): torch.stack's own error.
        torch.stack(values)
        raise
    promoted = _numpy_dtype_of(dtype)
    if promoted != leaf.dtype or promoted.metadata != leaf.dtype.metadata:
        leaf.dtype = promoted
        return False
    row_shape = leaf.shape[1:]
    for i, shape in enumerate(shapes):
        if shape != row_shape:
            raise _unequal_shapes(leaf.path, i, shape, row_shape)
    try:
        for i, value in enumerate(values):
            out[i] = tensor_as_numpy(value.to(dtype))
    except Exception:
        torch.stack(values)  # as above
        raise
    return True


def _fill_leaf(samples: list, leaf: ArraySlot, buffer: np.ndarray) -> bool:
    """Fill one array leaf; return False when the leaf had to be promoted (re-plan)."""
    out = leaf.view(buffer)
    if leaf.kind == _CAST_ARRAY or leaf.kind == _CAST_SCALARS:
        _fill_cast(samples, leaf, out)
        return True
    if leaf.kind == _TENSOR:
        return _fill_tensors(samples, leaf, out)
    try:
        if leaf.kind == _ARRAY:
            index, code = _core.collate_array_leaf(samples, leaf.path, leaf.dtype, leaf.shape[1:], out)
        else:
            index, code = _core.collate_scalar_leaf(samples, leaf.path, leaf.kind, out)
    except (KeyError, IndexError, TypeError) as exc:
        raise _walk_error(samples, leaf.path, exc) from exc
    if code == _core.COPY_OK:
        return True
    where, first = format_path(leaf.path, index), format_path(leaf.path, 0)
    values = _leaf_objects(samples, leaf.path)  # a later sample may lack the leaf
    bad = values[index]
    if leaf.kind == _ARRAY:
        # torch makes a tensor of each value before stacking them: an array of
        # strings or objects, or a Python value that is no number (None, a
        # str), fails there, whatever the shapes.
        not_data = next((i for i, value in enumerate(values) if isinstance(value, np.ndarray)
                         and is_string_or_object_dtype(value.dtype)),
                        None)
        if not_data is not None:
            raise TypeError(_refusal(values[not_data].dtype, leaf.path, not_data))
        not_numeric = next((i for i, value in enumerate(values)
                            if not isinstance(value, (np.ndarray, np.generic))
                            and not _is_torch_tensor(value) and _as_tensor_dtype(value) is None),
                           None)
        if not_numeric is not None:
            raise _unlike_first(values, leaf.path, not_numeric, "a numpy array")
        if code == _core.COPY_BAD_SHAPE:
            raise _unequal_shapes(leaf.path, index, bad.shape, leaf.shape[1:])
        _refuse_unpromotable(values, leaf.path)
        # Mixed dtypes, or numbers and sequences beside the arrays: torch makes a
        # tensor of every value and stacks them, promoting; so do we (its rules).
        dtypes = []
        for i, value in enumerate(values):
            dtype = _as_tensor_dtype(value)
            if dtype is None and _is_torch_tensor(value):
                raise _dtype_numpy_lacks(values, leaf.path, i)
            if dtype is None:
                raise _unlike_first(values, leaf.path, i, "a numpy array")
            dtypes.append(dtype)
        leaf.dtype = _promote_at(leaf, dtypes)
        leaf.kind = _CAST_ARRAY
        return False
    _refuse_unpromotable(values, leaf.path)
    # Promotion makes one tensor of them all, as torch.tensor(batch) does: every
    # value must be a number (a 0-d array counts), not only the one that differed.
    wrong = next((i for i, value in enumerate(values) if not _is_number(value)), None)
    if wrong is not None:
        raise _unlike_first(values, leaf.path, wrong, type(values[0]).__name__)
    lacking = next((i for i, value in enumerate(values) if _as_tensor_dtype(value) is None), None)
    if lacking is not None:
        raise _dtype_numpy_lacks(values, leaf.path, lacking)
    if leaf.kind == _SCALAR_FLOAT:
        dtype = np.dtype(np.float64)  # torch.tensor(batch, dtype=torch.float64)
        complex_at = next((i for i, value in enumerate(values)
                           if _as_tensor_dtype(value).kind == "c"), None)
        if complex_at is not None:
            # torch raises for a Python complex or a 0-d array (and drops the
            # imaginary part of a numpy complex scalar, with a warning).
            raise TypeError(f"default_collate: {format_path(leaf.path, complex_at)} is "
                            f"complex, but {first} is a float: a batch of floats cannot hold "
                            f"it (torch.tensor(batch, dtype=torch.float64))")
    else:
        dtype = _promote_at(leaf, [_as_tensor_dtype(value) for value in values], tensorised=True)
    if code == _core.COPY_OVERFLOW and dtype.kind in "biu":
        # Past int64 only matters when the batch stays integer: beside a float
        # torch makes float32 of it all.
        raise _overflow(where, bad)
    leaf.dtype = dtype
    leaf.kind = _CAST_SCALARS
    return False


def _dtype_numpy_lacks(values: list, path: tuple, index: int) -> TypeError:
    """A tensor of a dtype numpy lacks (bfloat16, the float8s) beside values of
    other types: its bytes stack only with tensors of its own dtype."""
    return TypeError(f"default_collate: {format_path(path, index)} is a {values[index].dtype} "
                     f"tensor, but {format_path(path, 0)} is {type(values[0]).__name__}: "
                     f"fastload promotes mixed values only among dtypes numpy has; give "
                     f"every sample one type there (e.g. tensor.float())")


def _refuse_unpromotable(values: list, path: tuple) -> None:
    """TypeError naming the first numpy value whose dtype torch cannot hold
    (datetimes, timedeltas): a batch of one such dtype is stacked as it is,
    but promotion goes through torch's rules, which have none for it."""
    for i, value in enumerate(values):
        if isinstance(value, (np.ndarray, np.generic)) and value.dtype.kind not in "biufcSUO":
            raise TypeError(f"default_collate: {format_path(path, i)} has dtype {value.dtype}, "
                            f"which cannot be promoted with the others (torch cannot convert "
                            f"numpy.{value.dtype.type.__name__})")


def _promote_at(leaf: ArraySlot, dtypes: list, tensorised: bool = False) -> np.dtype:
    """``torch_promote`` for one leaf, its refusal naming the leaf."""
    try:
        return torch_promote(dtypes, tensorised)
    except RuntimeError as exc:
        raise RuntimeError(f"default_collate: {format_path(leaf.path)}: {exc}") from None


def private_buffer(nbytes: int) -> np.ndarray:
    """A fresh flat buffer: the ``allocate`` of batches made outside the ring."""
    return np.empty(nbytes, dtype=np.uint8)


def collate_into(samples: Sequence, allocate: Callable[[int], np.ndarray] = private_buffer,
                 planned: PlannedLayouts | None = None) -> tuple[BatchLayout, np.ndarray]:
    """Collate ``samples`` as ``default_collate`` does, into a buffer from ``allocate``.

    ``allocate(nbytes)`` returns a flat uint8 array of at least ``nbytes``
    (a private array, or a slot of the shared-memory ring).  It may be called
    again if a leaf turns out to need promotion (mixed dtypes), which changes
    the batch's size.  ``planned``: a loader's layouts, reused for a batch
    laid out as an earlier one (the layout returned is then that one).
    """
    first = _first_sample(samples)
    if isinstance(first, (str, bytes)):
        # torch's collate_str_fn returns the batch object itself: the caller's
        # list, a tuple from zip(*batch), or (batch_size=None) a str sample.
        return BatchLayout(Value(samples)), allocate(0)
    if type(samples) is not list:  # the kernels take exactly a list
        samples = _sample_list(samples, first)
    ticket = None
    if planned is not None:
        layout, ticket = planned.lookup(samples)
        if layout is not None:
            buffer = _fill_kept(samples, layout, allocate)
            if buffer is not None:
                return layout, buffer
            ticket = None  # the batch is made below, as if nothing were kept, and not kept
    layout = plan_collate(samples)
    leaves = layout.leaves()
    try:
        _check_lengths(samples, layout)
        while True:
            buffer = allocate(layout.nbytes)
            if _fill_arrays(samples, leaves, buffer):
                break
            ticket = None  # a promoted layout is this batch's alone
            layout.assign_offsets()  # a leaf was promoted: sizes changed, lay out again
        _fill_values(samples, layout)
        if ticket is not None:
            planned.keep(ticket, layout)
        return layout, buffer
    except Exception as error:
        fault = error
    # Out of the handler, so that the fault raised does not show this one as
    # its context; ``fault`` itself when no check fails again (an ``allocate``
    # that failed, samples that change when read).
    try:
        _check_in_torch_order(samples, layout.root, ())  # NOTE [ The fault torch meets first ]
        raise fault
    finally:
        del fault  # this frame, in its traceback, would hold it (and the samples) in a cycle


def _fill_arrays(samples: list, leaves: list, buffer: np.ndarray, restore: bool = False) -> bool:
    """Fill the array leaves; False when one had to be promoted (it was, unless
    ``restore``: then it is left as it was, for a layout that must not change)."""
    for leaf in leaves:
        if isinstance(leaf, ArraySlot):
            dtype, kind = leaf.dtype, leaf.kind
            try:
                filled = _fill_leaf(samples, leaf, buffer)
            finally:
                if restore:
                    leaf.dtype, leaf.kind = dtype, kind
            if not filled:
                return False
    return True


def _fill_kept(samples: list, layout: BatchLayout, allocate: Callable[[int], np.ndarray]
               ) -> np.ndarray | None:
    """Fill a kept layout (``PlannedLayouts``) with ``samples``: the buffer; or None,
    the layout left as it was and without values, when a leaf needs promotion
    or anything fails.  Such a batch is then made as if nothing were kept,
    which raises its fault as torch meets it (those checks may promote leaves)."""
    try:
        _check_lengths(samples, layout)
        buffer = allocate(layout.nbytes)
        if _fill_arrays(samples, layout.leaves(), buffer, restore=True):
            _fill_values(samples, layout)
            return buffer
    except Exception:
        layout.detach_values()
    return None


def _check_lengths(samples: list, layout: BatchLayout) -> None:
    for path, expected in layout.length_checks:
        _check_length(samples, path, expected)


def _fill_values(samples: list, layout: BatchLayout) -> None:
    for leaf in layout.value_leaves():
        _fill_value(samples, leaf)


def _check_length(samples: list, path: tuple, expected: int | None) -> None:
    """torch's check of the sequences at ``path``: every sample has one, of
    ``expected`` items; or, ``expected`` None, of the empty mapping there: every
    sample has it."""
    if expected is None:
        _leaf_objects(samples, path)
        return
    try:
        index = _core.first_length_mismatch(samples, path, expected)
    except (KeyError, IndexError, TypeError) as exc:
        raise _walk_error(samples, path, exc) from exc
    if index >= 0:
        # torch gathers the sequences from every sample before it compares
        # their lengths: a later sample without one fails first.
        items = _leaf_objects(samples, path)
        raise _unequal_lengths(path, index, len(items[index]), expected)


def _unequal_lengths(path: tuple, index: int, length: int, expected: int) -> RuntimeError:
    """torch's error for sequences of unequal lengths, naming the two samples."""
    return RuntimeError(f"each element in list of batch should be of equal size "
                        f"({format_path(path, index)} has length {length}, "
                        f"{format_path(path, 0)} has {expected})")


def _fill_value(samples: list, leaf: Value) -> None:
    """Set a ``Value`` leaf to the batch's objects there (or raise its refusal)."""
    values = _leaf_objects(samples, leaf.path)  # torch gathers them before it looks at them
    if isinstance(leaf, RefusedLeaf):
        raise TypeError(leaf.message)
    if isinstance(leaf, TorchStacked):
        leaf.value = leaf.stack(values)
    else:
        leaf.value = tuple(values) if leaf.as_tuple else values


# NOTE [ The fault torch meets first ]
# torch's collate goes depth first through the first sample: under a mapping,
# key by key, it gathers the key's items from every sample (a sample that
# lacks it: KeyError) and collates them before the next key; a sequence has
# its lengths compared before its items are collated.  collate_into checks by
# kind instead -- every length, then every array leaf, then the other leaves
# -- which keeps the kernels' loops together, but in a batch with two faults
# (a later sample lacking "name" and with another shape of "image") it would
# name another than torch, and often with another type.  So once a fault is
# known, the checks run again, in torch's order, and the first that fails is
# raised.  That costs a second pass, but only for a batch that fails anyway.

def _check_in_torch_order(samples: list, node: Any, path: tuple) -> None:
    """Run the checks of ``node``'s part of the batch (at ``path``) in torch's
    order (NOTE [ The fault torch meets first ])."""
    if isinstance(node, ArraySlot):
        # Into scratch memory: pages untouched below the leaf's offset cost nothing.
        while not _fill_leaf(samples, node, private_buffer(node.offset + node.nbytes)):
            pass  # promoted: again, in its new dtype
    elif isinstance(node, Value):
        _fill_value(samples, node)
    elif isinstance(node, MappingNode):
        if not node.keys:
            _check_length(samples, path, None)
        for key, child in zip(node.keys, node.children):
            _check_in_torch_order(samples, child, path + (key,))
    else:
        if isinstance(node, SequenceNode):
            _check_length(samples, path, len(node.children))
        for i, child in enumerate(node.children):
            _check_in_torch_order(samples, child, path + (i,))


def _first_sample(batch: Any) -> Any:
    """``batch[0]``, where torch's collate starts: a batch it cannot index fails
    with torch's error (IndexError for a 0-d array, TypeError for a generator
    or a set, KeyError for a mapping of columns)."""
    try:
        return batch[0]
    except (IndexError, KeyError, TypeError) as error:
        try:
            empty = isinstance(error, IndexError) and len(batch) == 0
        except TypeError:  # the len() of a 0-d array
            empty = False
        if empty:  # torch's type, with a message that says why
            raise IndexError("default_collate: cannot collate an empty batch (no samples)"
                             ) from None
        error.add_note(_not_samples(batch))
        raise


def _not_samples(batch: Any) -> str:
    hint = " (does __getitems__ return a collated batch?)" \
        if isinstance(batch, collections.abc.Mapping) else ""
    return f"default_collate takes a sequence of samples, got a {type(batch).__name__}{hint}"


def _sample_list(batch: Any, first: Any) -> list:
    """The samples of a batch given as another sequence than a list, whose
    ``batch[0]`` is ``first``; refused where torch's collate refuses them."""
    if isinstance(batch, collections.abc.Mapping):
        # A __getitems__ that returns a collated batch (a dict of columns) with
        # a key 0: iterating it would collate its keys.
        raise TypeError(_not_samples(batch))
    if isinstance(batch, bytes):
        # Its items are ints, which torch makes one tensor of: torch.tensor(bytes) refuses.
        raise TypeError(f"default_collate: invalid data type '{type(batch).__name__}': "
                        f"{_not_samples(batch)}")
    if _is_torch_tensor(first) and not isinstance(batch, (list, tuple)):
        raise TypeError(f"stack(): argument 'tensors' (position 1) must be tuple of Tensors, "
                        f"not {type(batch).__name__}: default_collate stacks tensors as "
                        f"torch.stack does, from a list or a tuple")
    return list(batch)


def default_collate(batch: Sequence) -> Any:
    """Stack a list of samples into a batch, with torch's rules, in numpy.

    Arrays are stacked on a new first axis; Python ints, floats and bools
    become int64, float64 and bool arrays; numpy scalars keep their dtype;
    a batch of strings or bytes is returned as it is (so inside a sample's
    sequence they come as a tuple, from ``zip(*batch)``, and under a mapping
    as a list); mappings are collated key by key (the first sample's keys),
    namedtuples stay namedtuples, other sequences are transposed (a tuple
    becoming a list).  Errors are the first torch's collate would raise, and
    name the offending path, e.g. ``batch[3]['image']``.
    """
    if default_collate_fn_map == _PRISTINE_FN_MAP:  # NOTE [ The collate_fn_map ]
        return _collate_by_layout(batch)
    return collate(batch, collate_fn_map=default_collate_fn_map)


def _collate_by_layout(batch: Sequence) -> Any:
    """``default_collate`` as fastload makes it: one layout, filled by the kernels."""
    layout, buffer = collate_into(batch)
    return layout.build(buffer)


# --------------------------------------------------------------------------
# collate(batch, collate_fn_map=...): torch's extension point.
# --------------------------------------------------------------------------

# NOTE [ The collate_fn_map ]
# torch's default_collate is collate(batch, collate_fn_map=default_collate_fn_map):
# a batch whose first element's type (exactly, else by isinstance over the
# keys in order) is a key goes to that key's function, mappings, namedtuples
# and sequences are taken apart and collated again with the same map.  Code
# written for torch adds its own types to the map (or calls collate() with a
# map of its own), so fastload has both, with numpy's types as keys and
# fastload's own collation (_collate_by_layout) behind every built-in key.
#
# fastload's default_collate is not that recursion but one layout filled by
# the kernels (collate_into), which is also how a worker writes a batch into
# its ring slot.  It gives what the recursion gives as long as the map holds
# only fastload's entries, so it is taken while default_collate_fn_map equals
# the snapshot taken at import, _PRISTINE_FN_MAP.  That comparison is the whole
# cost of the extension point on the fast path: a dict compare of a handful of
# entries whose values are the same objects.  Once the map is
# changed (a type added, an entry replaced), default_collate, and the
# DataLoader's default collation (see BatchSource), is torch's recursion over
# it; restoring the entries brings the fast path back.
#
# torch.Tensor is torch's first key.  fastload never imports torch, so the key
# is there only once torch is: put first at import when torch is loaded
# already, else by the first collate() over the default map after torch is
# (_key_torch_tensor), in the snapshot too, so that it is no change.

# torch's annotation of a collate_fn_map.
CollateFnMap = dict[type | tuple[type, ...], Callable[..., Any]]


def collate_numpy_array_fn(batch: Sequence, *, collate_fn_map: CollateFnMap | None = None
                           ) -> Any:
    """Arrays (``np.memmap`` too) stacked on a new first axis, as ``default_collate``
    stacks them (torch's promotion, its refusal of strings and objects)."""
    return _collate_by_layout(batch)


def collate_numpy_scalar_fn(batch: Sequence, *, collate_fn_map: CollateFnMap | None = None
                            ) -> Any:
    """numpy scalars as one array of their dtype, as ``default_collate`` makes them."""
    return _collate_by_layout(batch)


def collate_float_fn(batch: Sequence, *, collate_fn_map: CollateFnMap | None = None) -> Any:
    """Python floats as a float64 array, as ``default_collate`` makes them."""
    return _collate_by_layout(batch)


def collate_int_fn(batch: Sequence, *, collate_fn_map: CollateFnMap | None = None) -> Any:
    """Python ints (bools) as an int64 (bool) array, as ``default_collate`` makes them."""
    return _collate_by_layout(batch)


def collate_str_fn(batch: Sequence, *, collate_fn_map: CollateFnMap | None = None) -> Any:
    """Strings and bytes: the batch itself, as torch's (and ``default_collate``) returns it."""
    return batch


def collate_tensor_fn(batch: Sequence, *, collate_fn_map: CollateFnMap | None = None) -> Any:
    """torch tensors stacked as ``torch.stack`` stacks them, as ``default_collate`` does."""
    return _collate_by_layout(batch)


# torch's keys, in torch's order, with numpy's types (np.memmap is an
# ndarray: found by isinstance, as in torch).  torch.Tensor: NOTE [ The collate_fn_map ].
default_collate_fn_map: CollateFnMap = {
    np.ndarray: collate_numpy_array_fn,
    # The scalars of numpy's hierarchy but its strings (str and bytes, below).
    (np.bool_, np.number, np.object_): collate_numpy_scalar_fn,
    float: collate_float_fn,
    int: collate_int_fn,
    str: collate_str_fn,
    bytes: collate_str_fn,
}
_PRISTINE_FN_MAP: CollateFnMap = dict(default_collate_fn_map)
_torch_keyed = False


def _key_torch_tensor() -> None:
    """torch.Tensor as the first key of the default map and its snapshot, once torch is
    loaded (NOTE [ The collate_fn_map ]); an entry of the caller's for it is kept."""
    global _torch_keyed
    tensor_type = getattr(sys.modules.get("torch"), "Tensor", None)
    if tensor_type is None:
        return
    _torch_keyed = True
    for fn_map in (_PRISTINE_FN_MAP, default_collate_fn_map):
        if tensor_type not in fn_map:
            # A dict puts a new key last; torch's order has it first.
            entries = list(fn_map.items())
            fn_map.clear()
            fn_map[tensor_type] = collate_tensor_fn
            fn_map.update(entries)


_key_torch_tensor()


def fn_map_is_pristine() -> bool:
    """Whether ``default_collate_fn_map`` holds only fastload's own entries, so that
    ``default_collate`` is the layout path (NOTE [ The collate_fn_map ])."""
    return default_collate_fn_map == _PRISTINE_FN_MAP


def collate(batch: Sequence, *, collate_fn_map: CollateFnMap | None = None) -> Any:
    """torch's general collate: the first element's type, exactly and then by
    ``isinstance`` over the keys in order, picks a function of ``collate_fn_map``,
    called as ``fn(batch, collate_fn_map=collate_fn_map)``; else mappings,
    namedtuples and sequences are collated element-wise with the same map (a
    tuple becoming a list); anything else is a ``TypeError``.

    ``default_collate(batch)`` is ``collate(batch, collate_fn_map=default_collate_fn_map)``.
    """
    if not _torch_keyed and collate_fn_map is default_collate_fn_map:
        _key_torch_tensor()
    return _collate(batch, collate_fn_map, ())


def _collate(batch: Sequence, collate_fn_map: CollateFnMap | None, path: tuple) -> Any:
    """``collate`` of the items at ``path`` of the samples: torch's recursion, step for
    step (its errors, and its second pass when a mapping cannot be rebuilt)."""
    elem = _first_sample(batch)
    elem_type = type(elem)
    if collate_fn_map is not None:
        if elem_type in collate_fn_map:
            return collate_fn_map[elem_type](batch, collate_fn_map=collate_fn_map)
        for collate_type in collate_fn_map:
            if isinstance(elem, collate_type):
                return collate_fn_map[collate_type](batch, collate_fn_map=collate_fn_map)

    def column(samples: Sequence, key: Any) -> Any:
        return _collate(samples, collate_fn_map, path + (key,))

    if isinstance(elem, collections.abc.Mapping):
        def by_key() -> dict:
            return {key: column([d[key] for d in batch], key) for key in elem}

        try:
            if isinstance(elem, collections.abc.MutableMapping):
                # A clone keeps what a mapping type holds beside its items.
                clone = copy.copy(elem)
                clone.update(by_key())
                return clone
            return elem_type(by_key())
        except TypeError:
            return by_key()  # a type that cannot be cloned or rebuilt so: a dict
    if isinstance(elem, tuple) and hasattr(elem, "_fields"):
        return elem_type(*(column(samples, i) for i, samples in enumerate(zip(*batch))))
    if isinstance(elem, collections.abc.Sequence):
        expected = len(elem)
        for index, sample in enumerate(batch):
            if len(sample) != expected:
                raise _unequal_lengths(path, index, len(sample), expected)
        transposed = list(zip(*batch))

        def by_position() -> list:
            return [column(samples, i) for i, samples in enumerate(transposed)]

        if isinstance(elem, tuple):
            return by_position()  # a list, as torch's ("backwards compatibility")
        try:
            if isinstance(elem, collections.abc.MutableSequence):
                clone = copy.copy(elem)
                for i, samples in enumerate(transposed):
                    clone[i] = column(samples, i)
                return clone
            return elem_type(by_position())
        except TypeError:
            return by_position()  # e.g. a range: a list
    raise TypeError(_refusal(elem_type, path))


# --------------------------------------------------------------------------
# Packing: the output of a custom collate_fn, moved as it is into a buffer.
# --------------------------------------------------------------------------

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
    if _is_plain_torch_tensor(obj) and obj.device.type == "cpu" and not obj.requires_grad \
            and str(obj.layout) == "torch.strided" and not obj.is_nested and not obj.is_quantized:
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


# --------------------------------------------------------------------------
# default_convert (batch_size=None) and torch interop.
# --------------------------------------------------------------------------

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
        try:
            if isinstance(data, collections.abc.MutableMapping):
                clone = copy.copy(data)
                clone.update(converted)
                return clone
            return type(data)(converted)
        except TypeError:
            return converted
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
        try:
            if isinstance(data, collections.abc.MutableSequence):
                clone = copy.copy(data)
                for i, item in enumerate(items):
                    clone[i] = item
                return clone
            return type(data)(items)
        except TypeError:
            return items
    return leaf(data)


def _is_torch_tensor(obj: Any) -> bool:
    """A ``torch.Tensor``, subclasses included (``Parameter``, torchvision's tv_tensors)."""
    # Never import torch here: a tensor exists only if the user loaded torch.
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(obj, torch.Tensor)


def _is_plain_torch_tensor(obj: Any) -> bool:
    """Exactly a ``torch.Tensor``: a subclass carries more than its bytes."""
    torch = sys.modules.get("torch")
    return torch is not None and type(obj) is torch.Tensor


def tensor_as_numpy(tensor: Any) -> np.ndarray:
    """A CPU tensor's data as an ndarray (shared where torch allows).

    A dtype numpy lacks (bfloat16, the float8s, complex32) comes as unsigned
    ints of its size, its dtype tagged with the torch dtype's name, so that
    ``ArraySlot.build`` can view the bytes as that dtype again.
    """
    tensor = tensor.detach().cpu()
    try:
        return tensor.numpy()
    except RuntimeError:
        if not (tensor.is_conj() or tensor.is_neg()):
            raise
        # A lazy conj() or negation (a bit on the tensor, not in its bytes),
        # which numpy() refuses: its values, materialized, as torch's collate takes them.
        return tensor_as_numpy(tensor.resolve_conj().resolve_neg())
    except TypeError:
        import torch

        size = tensor.element_size()
        array = tensor.view(getattr(torch, f"uint{8 * size}")).numpy()
        return array.view(np.dtype(f"u{size}", metadata={"torch_dtype": str(tensor.dtype)}))


def _numpy_dtype_of(torch_dtype: Any) -> np.dtype:
    """The dtype of ``tensor_as_numpy`` for tensors of ``torch_dtype``."""
    import torch

    return tensor_as_numpy(torch.empty((), dtype=torch_dtype)).dtype


# NOTE [ Tensors keep their slot ]
# A tensor made by torch.from_numpy keeps its array (and so the ring slot
# under it) alive through its storage's memory.  torch's share_memory_(),
# which torch.multiprocessing's queues call too, moves a storage that is not
# in torch's shared memory to new memory and lets go of the old; a numpy view
# taken from the tensor before (``.numpy()``, based on a tensor sharing the
# storage) would then point into a slot given to a later batch.  So the
# array is also kept for as long as the storage object lives: torch keeps a
# storage's Python object as long as any tensor uses the storage, and a weak
# reference to it dies with the last.  Its callback is the dict's own
# ``pop``: no Python code runs then (see NOTE [ Leases ] in ring.py), and the
# slot comes back at once.
_arrays_of_storages: dict = {}


def _tensor_keeping(array: np.ndarray, torch: Any) -> Any:
    """``torch.from_numpy(array)``, keeping ``array`` while the tensor's storage lives
    (NOTE [ Tensors keep their slot ])."""
    tensor = torch.from_numpy(_as_torch_can_share(array))
    _arrays_of_storages[weakref.ref(tensor.untyped_storage(), _arrays_of_storages.pop)] = array
    return tensor


def _as_torch_can_share(array: np.ndarray) -> np.ndarray:
    """``array``, or a copy torch can make a tensor of: torch has no big-endian
    tensors and no negative strides (fastload collates big-endian arrays, and a
    ``collate_fn`` may return a reversed view; ``output="torch"`` gives their
    values), nor read-only ones (a tensor over a read-only map, ``np.memmap``'s
    mode "r", crashes the process when written)."""
    if not array.dtype.isnative:
        return array.astype(array.dtype.newbyteorder("="))
    if not array.flags.writeable or any(stride < 0 for stride in array.strides):
        return array.copy()
    return array


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


# Padding collation lives in its own module, built on this one's layout machinery;
# imported last so that it finds every name here defined.
from fastload.padding import Padded, pad_collate  # noqa: E402
