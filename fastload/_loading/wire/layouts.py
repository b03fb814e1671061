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
That spares both sides the per-string pickling work on every batch.

NOTE [ Pickled as torch's workers pickle ]
The values, and a layout (a mapping's clone, its keys), hold the caller's
objects: a custom collate_fn's dataclass or tuple subclass, a tensor that
rides pickled.  torch's workers send theirs through multiprocessing queues,
which pickle with ``ForkingPickler``; torch registers reductions there that
move a tensor's storage to shared memory and send a handle.  Plain pickling
is not the same: in torch 2.13 a uint16, uint32, uint64, float8 or
complex32 tensor so pickled does not unpickle.  So these bytes are written
with ForkingPickler's reductions (a caller's ``ForkingPickler.register``
too), which take precedence over copyreg's as they do there.
ForkingPickler itself copies its tables (some 80 entries once torch is
loaded) for every pickle: 5 us, where a small value pickles in 0.5 us;
``picklers.WirePickler`` asks the registry (``reducer_override``) only about the
objects that are not plain Python values, 1.8 us in all.  Values that are
all of ``_PLAIN_TYPES`` (the joined strings, numbers: nearly every batch)
reach no reduction, so ``pickle.dumps`` writes them, as before.

Where torch's reduction gives wrong values it is passed over: it rebuilds
a tensor from its storage, offset, size and stride, so a quantized tensor
lost its quantizer and a lazily conjugated or negated one its bit.  Their
own pickling is exact.

A reduction may hand over a resource once: a tensor's shared memory goes
as a file descriptor that the worker's ``resource_sharer`` thread keeps
open until a process unpickling the bytes fetches it.  So each such pickle
is unpickled once, while its worker lives (the main process decodes every
answer as it arrives): a layout holding one is sent whole every time and
not kept (equal bytes do not mean that the main process has it), and a
batch whose layout fails to arrive still has its values unpickled.

The other way, a task holding a sampler's batch as it was yielded is
pickled by ``picklers.dumps_task`` (NOTE [ Tasks that may hold tensors ]).
"""

from __future__ import annotations

import pickle

from fastload._core import join_strings
from fastload.collate import BatchLayout
from fastload._loading.wire.picklers import dumps_with_reductions

__all__ = ["LayoutSender", "LayoutReceiver"]

# A worker remembers at most this many layouts; past that (batches whose
# shapes keep changing) a layout travels whole and is not kept.  Padded
# batches (pad_collate) have one layout per padded length: a bucketed epoch
# of lognormal lengths up to 2,000 gives a worker about 300, so 256 keeps
# nearly all of them (the main process then unpickles a layout for a third
# of the batches instead of nearly all), while a loader of 64 workers holds
# at most some 16 MiB of them.
_MAX_LAYOUTS = 256
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
            if last[0] is layout:
                # A layout kept for the worker's batches (the ArrayDataset
                # path's, with no values; a kept collate plan, NOTE [ Layouts
                # planned once ]): never changed, so only its values are new.
                return last[1], None, _pickle_values(layout.detach_values())
            values: list = []
            if last[0].matches(layout, values):
                layout.detach_values()  # a kept layout holds none between batches
                return last[1], None, _pickle_values(values)
        values = layout.detach_values()
        values_bytes = _pickle_values(values)
        structure, handed_over = dumps_with_reductions(layout)
        if handed_over:  # see NOTE [ Pickled as torch's workers pickle ]
            return _NOT_KEPT, structure, values_bytes
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
    plain = True
    for position, value in enumerate(values):
        text = join_strings(value)
        if text is None:
            sent.append(value)
            plain = plain and type(value) in _PLAIN_TYPES
        else:
            sent.append(text)
            joined.append((position, type(value) is tuple))
    if plain:  # no reduction applies (NOTE [ Pickled as torch's workers pickle ])
        return pickle.dumps((sent, joined), protocol=pickle.HIGHEST_PROTOCOL)
    return dumps_with_reductions((sent, joined))[0]


# Values of these types the pickler writes itself, never reducing them.
_PLAIN_TYPES = frozenset({str, int, float, bool, type(None), bytes})


def _unpickle_values(data: bytes) -> list:
    values, joined = pickle.loads(data)
    for position, was_tuple in joined:
        strings = values[position].split("\0")
        values[position] = tuple(strings) if was_tuple else strings
    return values


class LayoutLost(RuntimeError):
    """A batch refers to a layout whose arrival an exception interrupted (one a
    signal handler of the caller's raised, say): the worker must send its
    layouts again (``messages.RESEND_LAYOUTS``)."""


class LayoutReceiver:
    """The main process's side, for one worker: ``(layout, values)`` from what it sent."""

    def __init__(self) -> None:
        self._layouts: dict[int, BatchLayout] = {}

    def decode(self, wire: tuple[int, bytes | None, bytes | None]) -> tuple[BatchLayout, list | None]:
        layout_id, structure, values_bytes = wire
        if structure is None:
            layout = self._layouts.get(layout_id)
            if layout is None:
                _let_go(values_bytes)
                raise LayoutLost(f"the batch's layout (number {layout_id}), which the worker "
                                 f"sent with an earlier batch, was lost in the main process: "
                                 f"an exception interrupted its arrival; the worker sends it "
                                 f"again with its next batches")
        else:
            # Kept before the values are unpickled: the worker sends this
            # layout once, so a batch whose values fail to unpickle here must
            # not leave the later batches without it.
            try:
                layout = pickle.loads(structure)
            except Exception:
                _let_go(values_bytes)
                raise
            if layout_id != _NOT_KEPT:
                self._layouts[layout_id] = layout
        values = _unpickle_values(values_bytes) if values_bytes is not None else None
        return layout, values


def _let_go(values_bytes: bytes | None) -> None:
    """Unpickle the values of a batch that failed, only to drop them: one may
    hold a resource that its worker keeps until then (NOTE [ Pickled as
    torch's workers pickle ]).  The batch's own error is the one reported."""
    if values_bytes is not None:
        try:
            _unpickle_values(values_bytes)
        except Exception:
            pass
