"""The layouts a loader keeps, so that a batch laid out as an earlier one is
filled without planning it again."""

from __future__ import annotations

from fastload import _core
from fastload.collate.layout import BatchLayout


# A loader keeps at most this many planned layouts: batches whose layout keeps
# changing (a new shape each time) must not grow them without end.
_KEPT_LAYOUTS = 16


class PlannedLayouts:
    """The layouts one loader's batches were planned with, by the ``_core.layout_key``
    of their first sample (NOTE [ Layouts planned once ] in ``_plan_key.pxi``).

    A kept layout is handed out for every batch with its key, so it never
    changes once kept: a batch that needs promotion (mixed dtypes) or fails
    is made with a layout planned afresh, which is not kept.  Between batches
    a kept layout holds no values: whoever takes a batch's layout takes them
    out (``detach_values``).  Not for sharing between threads: while a batch
    is made, its layout holds that batch's values.
    """

    def __init__(self) -> None:
        # key -> (layout, the dtypes the key names by id, kept alive with it)
        self._layouts: dict[tuple, tuple[BatchLayout, list]] = {}

    def lookup(self, samples: list) -> tuple[BatchLayout | None, tuple | None]:
        """``(the layout kept for these samples or None, ticket)``; the ticket
        (None for samples without a key) is what ``keep`` takes."""
        dtypes: list = []
        key = _core.layout_key(samples[0], dtypes)
        if key is None:
            return None, None
        ticket = ((len(samples), key), dtypes)
        kept = self._layouts.get(ticket[0])
        return (kept[0] if kept is not None else None), ticket

    def keep(self, ticket: tuple, layout: BatchLayout) -> None:
        """Keep ``layout`` (planned and filled without promotion) for later batches."""
        key, dtypes = ticket
        if len(self._layouts) >= _KEPT_LAYOUTS:
            self._layouts.clear()
        self._layouts[key] = (layout, dtypes)
