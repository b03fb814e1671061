"""``pad_collate``: variable-length leaves padded into a batch, inside the ring.

A collate function for samples whose arrays differ in their first dimension
(token ids, audio frames).  It makes the batch ``default_collate`` makes, but
every numpy array leaf of at least one dimension is padded to the batch's
longest along its first dimension (rounded up to ``pad_to_multiple_of``) with
``padding_value``, instead of having to match.

It is collated the way ``default_collate`` is (``collate_into``'s
plan and fill): the batch is laid out as a ``BatchLayout`` whose padded
leaves have the padded shapes, the buffer is allocated at that size (a ring
slot, when a worker makes the batch: the DataLoader recognises a
``PadCollate``; see _loading/fetch.py), and ``_core.pad_rows`` copies each sample's rows
and writes the padding and the mask in place.  No stacked temporary, no array
bytes pickled; a slot too small for a longer batch is regrown by the ring, and
batches already handed out keep their own slots.
"""

from __future__ import annotations

import collections.abc
import numbers
from typing import Any, Callable, NamedTuple, Sequence

import numpy as np

from fastload import _core
from fastload.collate.faults import (_leaf_objects, _samples_or_strings, _walk_error,
                                     format_path, is_string_or_object_dtype)
from fastload.collate.layout import (ArraySlot, BatchLayout, MappingNode, NamedTupleNode,
                                     SequenceNode, Value, private_buffer)
from fastload.collate.leaves import _check_lengths, _fill_leaf, _fill_value
from fastload.collate.plan import _plan_node
from fastload.collate.tensors import _is_plain_torch_tensor, tensor_as_numpy, tensor_is_its_bytes

__all__ = ["Padded", "PadCollate", "pad_collate"]

# ArraySlot kinds of the padded leaves (beside layout.py's kinds, which stay below 20).
_PADDED_VALUES = 20
_PADDED_LENGTHS = 21
_PADDED_MASK = 22

# The path of a Value that stands for a part not asked for (lengths or mask): None.
_ABSENT = ("<absent>",)


class Padded(NamedTuple):
    """One padded leaf of a batch.

    ``values``: ``(B, L, *trailing)``, sample ``i``'s rows first, then
    ``padding_value``; ``lengths``: int64 ``(B,)``, each sample's own length
    (None unless ``return_lengths``); ``mask``: bool ``(B, L)``, True on the
    sample's rows (None unless ``return_mask``).
    """

    values: Any
    lengths: Any = None
    mask: Any = None


class PadCollate:
    """The collate function ``pad_collate(...)`` returns (see ``pad_collate``)."""

    def __init__(self, padding_value: Any = 0, pad_to_multiple_of: int | None = None,
                 return_lengths: bool = True, return_mask: bool = False) -> None:
        if not isinstance(padding_value, (numbers.Number, np.bool_, np.number)):
            raise TypeError(f"padding_value should be a number, but got "
                            f"{type(padding_value).__name__} {padding_value!r}")
        if pad_to_multiple_of is not None and (
                not isinstance(pad_to_multiple_of, numbers.Integral)
                or isinstance(pad_to_multiple_of, bool) or pad_to_multiple_of <= 0):
            raise ValueError(f"pad_to_multiple_of should be a positive integer value or None, "
                             f"but got pad_to_multiple_of={pad_to_multiple_of!r}")
        for name, value in (("return_lengths", return_lengths), ("return_mask", return_mask)):
            if not isinstance(value, (bool, np.bool_)):
                raise ValueError(f"{name} should be a boolean value, but got {name}={value!r}")
        self.padding_value = padding_value
        self.pad_to_multiple_of = None if pad_to_multiple_of is None else int(pad_to_multiple_of)
        self.return_lengths = bool(return_lengths)
        self.return_mask = bool(return_mask)
        self._paddings: dict[np.dtype, np.ndarray] = {}

    def __repr__(self) -> str:
        return (f"pad_collate(padding_value={self.padding_value!r}, "
                f"pad_to_multiple_of={self.pad_to_multiple_of!r}, "
                f"return_lengths={self.return_lengths}, return_mask={self.return_mask})")

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["_paddings"] = {}
        return state

    def __call__(self, batch: Sequence) -> Any:
        layout, buffer = self.collate_into(batch)
        return layout.build(buffer, layout.detach_values())

    # -- plan ----------------------------------------------------------------

    def collate_into(self, samples: Sequence,
                     allocate: Callable[[int], np.ndarray] = private_buffer
                     ) -> tuple[BatchLayout, np.ndarray]:
        """The batch laid out and written into ``allocate(nbytes)``'s buffer
        (a private array, or a ring slot in a worker); ``(layout, buffer)``."""
        sample_list = _samples_or_strings(samples)
        if sample_list is None:
            return BatchLayout(Value(samples)), allocate(0)
        samples, first = sample_list, sample_list[0]
        measured: dict[Any, Any] = {"tensors": []}
        length_checks: list = []
        layout = BatchLayout(self._plan(first, (), samples, length_checks, measured, False),
                             length_checks)
        _check_lengths(samples, layout)
        leaves = layout.leaves()
        if measured["tensors"]:
            # Samples that hold tensors make a batch of tensors, as default_collate's.
            layout.as_torch()
        while True:
            layout.assign_offsets()
            buffer = allocate(layout.nbytes)
            if self._fill(samples, leaves, buffer, measured):
                break  # else a plain leaf was promoted (mixed dtypes): sizes changed
        for leaf in layout.value_leaves():
            if leaf.path is not _ABSENT:
                _fill_value(samples, leaf)
        return layout, buffer

    def _plan(self, elem: Any, path: tuple, samples: list, length_checks: list,
              measured: dict, in_sequence: bool) -> Any:
        """``plan._plan_node`` with the array leaves padded; containers as it lays them out."""
        n = len(samples)
        kind = type(elem)
        if (kind is np.ndarray or isinstance(elem, np.ndarray)) and elem.ndim >= 1 \
                and not is_string_or_object_dtype(elem.dtype):
            return self._plan_padded(elem, path, samples, measured)
        if kind is int or kind is float or kind is str:  # the common leaves, without the ABCs
            return _plan_node(elem, path, n, length_checks, [], in_sequence)
        if _is_plain_torch_tensor(elem) and elem.dim() >= 1 and tensor_is_its_bytes(elem):
            measured["tensors"].append(path)
            return self._plan_padded(elem, path, samples, measured)
        if (kind is dict or isinstance(elem, collections.abc.Mapping)) and elem:
            node = MappingNode(elem, [])
            node.children = [self._plan(elem[key], path + (key,), samples, length_checks,
                                        measured, False) for key in node.keys]
            return node
        if isinstance(elem, tuple) and hasattr(elem, "_fields"):
            return NamedTupleNode(type(elem), [
                self._plan(item, path + (i,), samples, length_checks, measured, True)
                for i, item in enumerate(elem)])
        if kind is list or kind is tuple or (isinstance(elem, collections.abc.Sequence)
                                             and not isinstance(elem, (str, bytes))):
            length_checks.append((path, len(elem)))
            children = [self._plan(item, path + (i,), samples, length_checks, measured, True)
                        for i, item in enumerate(elem)]
            return SequenceNode(None if isinstance(elem, tuple) else type(elem), children)
        # Numbers, strings, 0-d arrays and tensors, empty mappings: as default_collate.
        return _plan_node(elem, path, n, length_checks, measured["tensors"], in_sequence)

    def _plan_padded(self, elem: Any, path: tuple, samples: list, measured: dict) -> Any:
        if isinstance(elem, np.ndarray):
            source, where = samples, path
        else:  # a tensor: every sample's, as arrays sharing its memory
            source, where = [(array,) for array in _tensor_arrays(samples, path)], (0,)
            elem = source[0][0]
        trailing = elem.shape[1:]
        try:
            leaves, lengths, longest, index, code = _core.measure_padded_leaf(
                source, where, elem.dtype, trailing)
        except (KeyError, IndexError, TypeError) as exc:
            raise _walk_error(samples, path, exc) from exc
        if code != _core.COPY_OK:
            raise self._mismatch(source, where, path, index, code, elem)
        multiple = self.pad_to_multiple_of
        if multiple is not None:
            longest = -(-longest // multiple) * multiple
        n = len(samples)
        values = ArraySlot(elem.dtype, (n, longest) + trailing, path, _PADDED_VALUES)
        measured[id(values)] = (leaves, lengths)
        if not (self.return_lengths or self.return_mask):
            return values
        lengths_leaf = ArraySlot(np.int64, (n,), path, _PADDED_LENGTHS) if self.return_lengths \
            else Value(None, _ABSENT)
        mask_leaf = ArraySlot(np.bool_, (n, longest), path, _PADDED_MASK) if self.return_mask \
            else Value(None, _ABSENT)
        measured[id(lengths_leaf)] = measured[id(mask_leaf)] = (leaves, lengths)
        return NamedTupleNode(Padded, [values, lengths_leaf, mask_leaf])

    @staticmethod
    def _mismatch(source: list, where: tuple, path: tuple, index: int, code: int,
                  first: np.ndarray) -> Exception:
        leaf = _core.collect_leaf_objects(source, where)[index]
        where, head = format_path(path, index), format_path(path, 0)
        if code == _core.COPY_BAD_TYPE:
            kind = "a 0-d array" if isinstance(leaf, np.ndarray) else type(leaf).__name__
            return TypeError(f"pad_collate: {where} is {kind}, but {head} is a numpy array of "
                             f"{first.ndim} dimension(s): every sample must have the structure "
                             f"of the first")
        if code == _core.COPY_BAD_DTYPE:
            return TypeError(f"pad_collate: {where} has dtype {leaf.dtype}, but {head} has "
                             f"{first.dtype}: padded leaves must share one dtype")
        return RuntimeError(f"pad_collate: {where} has shape {tuple(leaf.shape)}, but {head} "
                            f"has {tuple(first.shape)}: only the first dimension may differ")

    # -- fill ----------------------------------------------------------------

    def _padding(self, dtype: np.dtype, path: tuple) -> np.ndarray:
        padding = self._paddings.get(dtype)
        if padding is None:
            value = self.padding_value
            try:
                padding = np.array(value).astype(dtype)
                exact = bool(padding == np.array(value)) or (value != value and padding != padding)
            except (OverflowError, TypeError, ValueError):
                exact = False
            if not exact:
                raise ValueError(f"pad_collate: padding_value={value!r} cannot be stored "
                                 f"exactly in {format_path(path)}'s dtype {dtype}")
            self._paddings[dtype] = padding = padding.reshape(1)
        return padding

    def _fill(self, samples: list, leaves: list, buffer: np.ndarray, measured: dict) -> bool:
        for leaf in leaves:
            if not isinstance(leaf, ArraySlot):
                continue
            if leaf.kind == _PADDED_VALUES:
                rows, _ = measured[id(leaf)]
                _core.pad_rows(rows, leaf.view(buffer), self._padding(leaf.dtype, leaf.path))
            elif leaf.kind == _PADDED_LENGTHS:
                leaf.view(buffer)[:] = measured[id(leaf)][1]
            elif leaf.kind == _PADDED_MASK:
                lengths = measured[id(leaf)][1]
                np.less(np.arange(leaf.shape[1]), lengths[:, None], out=leaf.view(buffer))
            elif not _fill_leaf(samples, leaf, buffer):
                return False
        return True


def _tensor_arrays(samples: list, path: tuple) -> list:
    """The tensors at ``path`` of every sample as ndarrays (sharing their memory)."""
    values = _leaf_objects(samples, path)
    arrays = []
    for i, value in enumerate(values):
        if not _is_plain_torch_tensor(value):
            raise TypeError(f"pad_collate: {format_path(path, i)} is {type(value).__name__}, "
                            f"but {format_path(path, 0)} is a tensor: every sample must have "
                            f"the structure of the first")
        if not tensor_is_its_bytes(value):
            raise TypeError(f"pad_collate: {format_path(path, i)} is a tensor that is more "
                            f"than its bytes (on {value.device}, requires_grad, nested, "
                            f"quantized or sparse), which pad_collate cannot pad")
        array = tensor_as_numpy(value)
        if array.dtype.metadata:
            raise TypeError(f"pad_collate: {format_path(path, i)} is a {value.dtype} tensor, "
                            f"which numpy has no dtype for: pad tensors of numpy's dtypes "
                            f"(e.g. tensor.float())")
        arrays.append(array)
    return arrays


def pad_collate(padding_value: Any = 0, pad_to_multiple_of: int | None = None,
                return_lengths: bool = True, return_mask: bool = False) -> PadCollate:
    """A collate function that pads variable-length arrays to the batch's longest.

    The batch is ``default_collate``'s, with one difference: every numpy
    array leaf with at least one dimension (at any depth of dicts, tuples,
    lists, namedtuples), and every CPU torch tensor leaf likewise, may differ
    from sample to sample in its first dimension; it is padded at the end of
    that dimension to the batch's longest ``L`` (rounded up to a multiple of
    ``pad_to_multiple_of``) with ``padding_value``.  Its other dimensions and
    its dtype must match across the batch (else an error naming the batch
    path, e.g. ``batch[3]['ids']``).  Fixed-size arrays are padded leaves too
    (their lengths are then all equal): the structure of a batch does not
    depend on its contents.  Numbers, strings, 0-d arrays and the rest collate
    as ``default_collate`` collates them.  Python lists are containers, as in
    ``default_collate``, not sequences to pad: give token ids as arrays.
    Samples holding tensors give a batch of tensors (lengths and mask too),
    as ``default_collate`` does; a tensor numpy has no dtype for (bfloat16)
    is refused.

    Each padded leaf becomes, in place of the stacked array:

    * with ``return_lengths`` or ``return_mask``: a ``Padded(values, lengths,
      mask)`` namedtuple, ``values`` of shape ``(B, L, *trailing)``,
      ``lengths`` int64 ``(B,)`` (None unless ``return_lengths``), ``mask``
      bool ``(B, L)``, True on each sample's rows (None unless
      ``return_mask``);
    * with neither: the padded ``values`` array alone.

    So a sample ``{'ids': array, 'label': int}`` gives ``{'ids': Padded(values
    (B, L), lengths (B,), None), 'label': (B,) int64}``; a sample ``(array,
    int)`` gives ``[Padded(...), (B,) int64]`` (a tuple becoming a list, as in
    ``default_collate``); a bare array sample gives ``Padded(...)``.

    ``padding_value`` must be representable exactly in each padded leaf's
    dtype (else ValueError naming the leaf).  In a DataLoader with workers
    the batch is written straight into the shared-memory ring.
    """
    return PadCollate(padding_value, pad_to_multiple_of, return_lengths, return_mask)
