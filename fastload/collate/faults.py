"""Where a batch goes wrong, said as torch says it: batch paths
(``batch[3]['image']``), torch's messages and exception types, and the sample
that lacks what the first sample has.

default_collate, collate and pad_collate take their messages from here, so
that an error names a place in the batch the same way wherever it is raised.
"""

from __future__ import annotations

import collections.abc
import re
from typing import Any, Sequence

import numpy as np

from fastload import _core
from fastload.collate.tensors import _is_torch_tensor


# numpy dtypes default_collate refuses, as torch does: strings, bytes, objects.
_STR_OBJ_DTYPE = re.compile(r"[SaUO]")
_ERR_FORMAT = ("default_collate: batch must contain tensors, numpy arrays, numbers, "
               "dicts or lists; found {}")


def is_string_or_object_dtype(dtype: np.dtype) -> bool:
    """A dtype ``default_collate`` refuses: torch's ``[SaUO]`` test on ``dtype.str``,
    and a structured dtype holding objects (which no tensor can take either)."""
    return _STR_OBJ_DTYPE.search(dtype.str) is not None or dtype.hasobject


class StructureMismatchError(TypeError, RuntimeError):
    """A sample's leaf is not what the first sample's is (e.g. None where it had a number).

    A ``TypeError`` for what it is, and a ``RuntimeError`` because that is
    what torch raises there ("Could not infer dtype of NoneType"), so code
    written against either catches it.
    """


def _refusal(found: Any, path: tuple, index: int = 0) -> str:
    """torch's message for a leaf its collate refuses, and where the leaf sits."""
    return _ERR_FORMAT.format(found) + f" (at {format_path(path, index)})"


def format_path(path: tuple, index: int | None = None) -> str:
    """``batch[3]['image']``: where a leaf sits, for error messages."""
    head = "batch" if index is None else f"batch[{index}]"
    return head + "".join(f"[{key!r}]" for key in path)


def _empty_batch() -> IndexError:
    """torch's type for a batch without samples (its ``batch[0]`` fails), with a
    message that says why."""
    return IndexError("default_collate: cannot collate an empty batch (no samples)")


def _check_all_tensors(values: list, path: tuple) -> None:
    """Every sample's leaf at ``path`` is a tensor, as the first one is."""
    for i, value in enumerate(values):
        if not _is_torch_tensor(value):
            raise TypeError(f"default_collate: {format_path(path, i)} is {type(value).__name__}, "
                            f"but {format_path(path, 0)} is a tensor; every sample must have "
                            f"the structure of the first")


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


def _dtype_numpy_lacks(values: list, path: tuple, index: int) -> TypeError:
    """A tensor of a dtype numpy lacks (bfloat16, the float8s) beside values of
    other types: its bytes stack only with tensors of its own dtype."""
    return TypeError(f"default_collate: {format_path(path, index)} is a {values[index].dtype} "
                     f"tensor, but {format_path(path, 0)} is {type(values[0]).__name__}: "
                     f"fastload promotes mixed values only among dtypes numpy has; give "
                     f"every sample one type there (e.g. tensor.float())")


def _unequal_lengths(path: tuple, index: int, length: int, expected: int) -> RuntimeError:
    """torch's error for sequences of unequal lengths, naming the two samples."""
    return RuntimeError(f"each element in list of batch should be of equal size "
                        f"({format_path(path, index)} has length {length}, "
                        f"{format_path(path, 0)} has {expected})")


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
        if empty:
            raise _empty_batch() from None
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


def _samples_or_strings(batch: Sequence) -> list | None:
    """The samples of ``batch`` as the list the kernels take; None when its first
    sample is a str or bytes: torch's collate_str_fn returns such a batch as it
    is (the caller's list, a tuple from zip(*batch), or with batch_size=None a
    str sample)."""
    first = _first_sample(batch)
    if isinstance(first, (str, bytes)):
        return None
    return batch if type(batch) is list else _sample_list(batch, first)
