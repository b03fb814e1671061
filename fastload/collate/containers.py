"""How a collated (or converted) container is rebuilt in the caller's type.

torch's collate and default_convert agree on one rule: a mutable container is
cloned and its items replaced, so that what its type holds beside them (a
defaultdict's factory, a subclass's attributes) survives; another is built
from a dict or a list of the new items; a type that refuses either (a
``TypeError``) gives a plain dict or list.  The layout's nodes, torch's
recursion over a ``collate_fn_map`` and ``default_convert`` all rebuild
through these two functions.

``items`` is a function that makes the new items: torch's collate makes them
again when the rebuild fails (its second pass), and a clone takes a
sequence's items one by one as they are made.
"""

from __future__ import annotations

import copy
from typing import Any, Callable, Iterable


def rebuilt_mapping(mapping_type: type, template: Any, items: Callable[[], dict]) -> Any:
    """``items()`` in a mapping of ``mapping_type``: a clone of ``template`` (a
    mutable mapping, or None) updated with them, else ``mapping_type(items())``;
    the dict itself when the type refuses."""
    try:
        if template is not None:
            clone = copy.copy(template)
            clone.update(items())
            return clone
        return mapping_type(items())
    except TypeError:
        return items()


def rebuilt_sequence(sequence_type: type, template: Any, items: Callable[[], Iterable]) -> Any:
    """``items()`` in a sequence of ``sequence_type``: a clone of ``template`` (a
    mutable sequence, or None) with its items replaced in order, else
    ``sequence_type`` of their list; the list itself when the type refuses."""
    try:
        if template is not None:
            clone = copy.copy(template)
            for i, item in enumerate(items()):
                clone[i] = item
            return clone
        return sequence_type(list(items()))
    except TypeError:
        return list(items())
