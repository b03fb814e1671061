"""torch's dtype promotion, in numpy dtypes: what ``torch.stack`` or
``torch.tensor(batch)`` makes of values of mixed dtypes.

The slow paths of filling a leaf (``leaves.py``) use these rules when the
kernels meet a batch whose values do not share the first sample's dtype.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

import numpy as np

from fastload.collate.faults import format_path
from fastload.collate.tensors import _is_torch_tensor, tensor_as_numpy

if TYPE_CHECKING:
    from fastload.collate.layout import ArraySlot


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
