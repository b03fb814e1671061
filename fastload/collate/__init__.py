"""Collation: ``default_collate`` / ``default_convert``, torch's ``collate`` with its
``collate_fn_map``, ``pad_collate``, and the batch layout a worker fills in place.

Inside, imports go one way, each module only below it:
``tensors``, ``containers`` < ``faults`` < ``promotion``, ``layout`` < ``plan``,
``leaves``, ``kept``, ``pack``, ``convert`` < ``fill`` < ``fn_map``, ``pad``.
"""

from fastload.collate.convert import default_convert, to_torch
from fastload.collate.faults import StructureMismatchError, is_string_or_object_dtype
from fastload.collate.fill import collate_into
from fastload.collate.fn_map import (collate, collate_float_fn, collate_int_fn,
                                     collate_numpy_array_fn, collate_numpy_scalar_fn,
                                     collate_str_fn, collate_tensor_fn, default_collate,
                                     default_collate_fn_map, fn_map_is_pristine)
from fastload.collate.kept import PlannedLayouts
from fastload.collate.layout import (ArraySlot, BatchLayout, MappingNode, NamedTupleNode,
                                     SequenceNode, Value, private_buffer)
from fastload.collate.pack import pack_into
from fastload.collate.pad import PadCollate, Padded, pad_collate
from fastload.collate.plan import plan_collate
# tests check that no batch is kept alive by it
from fastload.collate.tensors import _arrays_of_storages

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
