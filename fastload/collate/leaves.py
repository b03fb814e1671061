"""Filling a layout's leaves with every sample's values.

An array leaf is copied by the ``_core`` kernels, which validate dtype and
shape as they go; when they refuse a batch, the slow paths here find what
torch would do with it: promote the dtype (``promotion.py``), or raise the
fault torch raises, naming the sample.  A ``Value`` leaf takes the samples'
objects as they are, and the sequences' lengths are checked as torch checks
them.
"""

from __future__ import annotations

import numpy as np

from fastload import _core
from fastload.collate.faults import (_dtype_numpy_lacks, _leaf_objects, _overflow, _refusal,
                                     _unequal_lengths, _unequal_shapes, _unlike_first,
                                     _walk_error, _check_all_tensors, format_path,
                                     is_string_or_object_dtype)
from fastload.collate.layout import (_ARRAY, _CAST_ARRAY, _CAST_SCALARS, _SCALAR_FLOAT, _TENSOR,
                                     ArraySlot, BatchLayout, RefusedLeaf, TorchStacked, Value)
from fastload.collate.promotion import (_as_tensor_dtype, _is_number, _promote_at,
                                        _refuse_unpromotable)
from fastload.collate.tensors import _is_torch_tensor, _numpy_dtype_of, tensor_as_numpy


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
    values = _leaf_objects(samples, leaf.path)  # a later sample may lack the leaf
    if leaf.kind == _ARRAY:
        _promote_array_leaf(values, leaf, index, code)
    else:
        _promote_scalar_leaf(values, leaf, index, code)
    return False


def _promote_array_leaf(values: list, leaf: ArraySlot, index: int, code: int) -> None:
    """The kernel refused sample ``index``'s array (``code``): raise torch's fault,
    or promote the leaf as torch.stack would (its kind becomes ``_CAST_ARRAY``)."""
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
        raise _unequal_shapes(leaf.path, index, values[index].shape, leaf.shape[1:])
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


def _promote_scalar_leaf(values: list, leaf: ArraySlot, index: int, code: int) -> None:
    """The kernel refused sample ``index``'s number (``code``): raise torch's fault,
    or promote the leaf as torch.tensor(batch) would (its kind becomes ``_CAST_SCALARS``)."""
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
                            f"complex, but {format_path(leaf.path, 0)} is a float: a batch of "
                            f"floats cannot hold it (torch.tensor(batch, dtype=torch.float64))")
    else:
        dtype = _promote_at(leaf, [_as_tensor_dtype(value) for value in values], tensorised=True)
    if code == _core.COPY_OVERFLOW and dtype.kind in "biu":
        # Past int64 only matters when the batch stays integer: beside a float
        # torch makes float32 of it all.
        raise _overflow(format_path(leaf.path, index), values[index])
    leaf.dtype = dtype
    leaf.kind = _CAST_SCALARS


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


def _fill_value(samples: list, leaf: Value) -> None:
    """Set a ``Value`` leaf to the batch's objects there (or raise its refusal)."""
    values = _leaf_objects(samples, leaf.path)  # torch gathers them before it looks at them
    if isinstance(leaf, RefusedLeaf):
        raise TypeError(leaf.message)
    if isinstance(leaf, TorchStacked):
        leaf.value = leaf.stack(values)
    else:
        leaf.value = tuple(values) if leaf.as_tuple else values
