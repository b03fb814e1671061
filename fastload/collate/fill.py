"""``collate_into``: a batch planned, allocated and filled, in one buffer.

The same whether the buffer is a private numpy array (``default_collate``,
``num_workers=0``) or a slot of the shared-memory ring (a worker writing in
place):

1. ``plan_collate(samples)`` lays out one leaf per array / number / string
   (or a loader's ``PlannedLayouts`` hands out the layout an earlier batch
   like this one was made with);
2. the caller's ``allocate`` gives ``layout.nbytes`` bytes;
3. the leaves are filled (``leaves.py``); a batch that fails there is
   checked again in torch's order, to raise the fault torch would (NOTE
   [ The fault torch meets first ]).
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np

from fastload.collate.faults import _samples_or_strings
from fastload.collate.kept import PlannedLayouts
from fastload.collate.layout import (ArraySlot, BatchLayout, MappingNode, SequenceNode, Value,
                                     private_buffer)
from fastload.collate.leaves import (_check_length, _check_lengths, _fill_arrays, _fill_leaf,
                                     _fill_value, _fill_values)
from fastload.collate.plan import plan_collate


def collate_into(samples: Sequence, allocate: Callable[[int], np.ndarray] = private_buffer,
                 planned: PlannedLayouts | None = None) -> tuple[BatchLayout, np.ndarray]:
    """Collate ``samples`` as ``default_collate`` does, into a buffer from ``allocate``.

    ``allocate(nbytes)`` returns a flat uint8 array of at least ``nbytes``
    (a private array, or a slot of the shared-memory ring).  It may be called
    again if a leaf turns out to need promotion (mixed dtypes), which changes
    the batch's size.  ``planned``: a loader's layouts, reused for a batch
    laid out as an earlier one (the layout returned is then that one).
    """
    sample_list = _samples_or_strings(samples)
    if sample_list is None:
        return BatchLayout(Value(samples)), allocate(0)
    samples = sample_list
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
