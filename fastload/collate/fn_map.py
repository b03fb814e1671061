"""torch's ``collate`` and its ``collate_fn_map``, and ``default_collate``, which
is that collate over the default map and, while the map is fastload's own,
one layout filled by the kernels (NOTE [ The collate_fn_map ])."""

from __future__ import annotations

import collections.abc
import sys
from typing import Any, Callable, Iterator, Sequence

import numpy as np

from fastload.collate.containers import rebuilt_mapping, rebuilt_sequence
from fastload.collate.faults import _first_sample, _refusal, _unequal_lengths
from fastload.collate.fill import collate_into


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
    step (its errors, and its second pass when a container cannot be rebuilt)."""
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

        mutable = isinstance(elem, collections.abc.MutableMapping)
        return rebuilt_mapping(elem_type, elem if mutable else None, by_key)
    if isinstance(elem, tuple) and hasattr(elem, "_fields"):
        return elem_type(*(column(samples, i) for i, samples in enumerate(zip(*batch))))
    if isinstance(elem, collections.abc.Sequence):
        expected = len(elem)
        for index, sample in enumerate(batch):
            if len(sample) != expected:
                raise _unequal_lengths(path, index, len(sample), expected)
        transposed = list(zip(*batch))

        def by_position() -> Iterator:
            # Lazily: a clone takes each item as it is made, as torch's does.
            return (column(samples, i) for i, samples in enumerate(transposed))

        if isinstance(elem, tuple):
            return list(by_position())  # a list, as torch's ("backwards compatibility")
        mutable = isinstance(elem, collections.abc.MutableSequence)
        return rebuilt_sequence(elem_type, elem if mutable else None, by_position)
    raise TypeError(_refusal(elem_type, path))
