"""Batch layouts cross the result pipe once per worker, not once per batch.

A worker answers each batch with its layout (see ``collate.BatchLayout``):
where each array sits in the slot, plus the values of the leaves that are not
array data (strings, objects).  A worker's batches nearly always share one
layout, so each distinct layout is sent once, under a number, and later
batches send only that number and their values.  Unpickling a layout costs
the main process several microseconds per batch (a Python call per node),
which on small batches was a fifth of its work.

The numbers are per worker, and a worker's answers arrive in the order it
sent them, so the main process keeps one ``LayoutReceiver`` per worker and
decodes each answer as it arrives.

NOTE [ Strings travel joined ]
A string field of the samples (a file name, a record id) collates to a list
of str, pickled with every batch: an opcode and a memo entry per string, on
both sides.  A list (or tuple) of plain strings without NUL characters
travels instead as one str, the strings joined by NULs, which the main
process splits back (``_core.join_strings`` checks what makes that exact).
For the `dict` workload's 128 names a batch that cut the main process's
decoding from 4.7 to 4.0 microseconds (CPU time per batch), and the worker's
pickling too: paired alternating runs of the `epoch_costs.py` loop, 40
epochs a run, made `dict` epochs 1.8 % shorter at the median with persistent
workers (12 pairs, 12 faster) and 1.6 % with new ones (12 pairs, 10 faster).
"""

from __future__ import annotations

import pickle

from fastload._core import join_strings
from fastload.collate import BatchLayout

__all__ = ["LayoutSender", "LayoutReceiver"]

# A worker remembers at most this many layouts; past that (batches whose
# shapes keep changing) a layout travels whole and is not kept.
_MAX_LAYOUTS = 64
_NOT_KEPT = -1


class LayoutSender:
    """A worker's side: a batch's layout as ``(layout_id, layout_bytes or None, values_bytes or None)``.

    Everything is pickled here, so a batch whose values cannot be pickled
    fails here, before a new layout number is taken: the main process never
    hears of a number whose layout did not reach it.
    """

    def __init__(self) -> None:
        self._ids: dict[bytes, int] = {}
        # The layout last sent, with its number: the next batch is compared
        # with it node by node, which is cheaper than pickling it again.
        self._last: tuple[BatchLayout, int] | None = None

    def encode(self, layout: BatchLayout) -> tuple[int, bytes | None, bytes | None]:
        last = self._last
        if last is not None:
            values: list = []
            # The ArrayDataset path reuses one layout object, with no values.
            if last[0] is layout or last[0].matches(layout, values):
                return last[1], None, _pickle_values(values)
        values = layout.detach_values()
        values_bytes = _pickle_values(values)
        structure = pickle.dumps(layout, protocol=pickle.HIGHEST_PROTOCOL)
        layout_id = self._ids.get(structure)
        if layout_id is None:
            if len(self._ids) >= _MAX_LAYOUTS:
                return _NOT_KEPT, structure, values_bytes
            layout_id = self._ids[structure] = len(self._ids)
            structure_sent: bytes | None = structure
        else:
            structure_sent = None
        self._last = (layout, layout_id)
        return layout_id, structure_sent, values_bytes


def _pickle_values(values: list) -> bytes | None:
    """The values of a batch's ``Value`` leaves as ``(values, joined)``, where
    ``joined`` lists ``(position, was_tuple)`` of the values sent as one joined
    str (NOTE [ Strings travel joined ])."""
    if not values:
        return None
    sent, joined = [], []
    for position, value in enumerate(values):
        text = join_strings(value)
        if text is None:
            sent.append(value)
        else:
            sent.append(text)
            joined.append((position, type(value) is tuple))
    return pickle.dumps((sent, joined), protocol=pickle.HIGHEST_PROTOCOL)


def _unpickle_values(data: bytes) -> list:
    values, joined = pickle.loads(data)
    for position, was_tuple in joined:
        strings = values[position].split("\0")
        values[position] = tuple(strings) if was_tuple else strings
    return values


class LayoutLost(RuntimeError):
    """A batch refers to a layout whose arrival an exception interrupted (one a
    signal handler of the caller's raised, say): the worker must send its
    layouts again (``RESEND_LAYOUTS``)."""


# Told to a worker whose layout was lost: it numbers its layouts afresh and so
# sends each again with its next use.  Batches it made before reading this
# still refer to the old numbers; those the main process has stay valid,
# since a worker's answers arrive in the order it sends them.
RESEND_LAYOUTS = ("resend_layouts",)


class LayoutReceiver:
    """The main process's side, for one worker: ``(layout, values)`` from what it sent."""

    def __init__(self) -> None:
        self._layouts: dict[int, BatchLayout] = {}

    def decode(self, wire: tuple[int, bytes | None, bytes | None]) -> tuple[BatchLayout, list | None]:
        layout_id, structure, values_bytes = wire
        if structure is None:
            layout = self._layouts.get(layout_id)
            if layout is None:
                raise LayoutLost(f"the batch's layout (number {layout_id}), which the worker "
                                 f"sent with an earlier batch, was lost in the main process: "
                                 f"an exception interrupted its arrival; the worker sends it "
                                 f"again with its next batches")
        else:
            # Kept before the values are unpickled: the worker sends this
            # layout once, so a batch whose values fail to unpickle here must
            # not leave the later batches without it.
            layout = pickle.loads(structure)
            if layout_id != _NOT_KEPT:
                self._layouts[layout_id] = layout
        values = _unpickle_values(values_bytes) if values_bytes is not None else None
        return layout, values
