"""Weak registries whose objects can be dropped without running Python code.

``weakref.WeakSet`` removes a dead object in a weakref callback written in
Python, and CPython drops a KeyboardInterrupt raised inside one: a Ctrl-C
landing there, as the caller drops an iterator, would be lost (NOTE [ Ctrl-C
held over fork and teardown ] in interrupts.py).  A ``WeakRegistry`` keeps
plain weak references, with no callback, and prunes the dead ones as objects
are added.  It takes no lock: ``add`` may run again inside itself (a garbage
collection there runs a ``__del__`` that makes a loader) and an at-fork hook
may read it while another thread was adding; it reads copies, and each dict
operation is atomic, so neither loses an entry.
"""

from __future__ import annotations

import itertools
import weakref
from typing import Any

__all__ = ["WeakRegistry"]


class WeakRegistry:
    """Objects of this process, held weakly (for at-fork hooks to visit)."""

    __slots__ = ("_refs", "_keys")

    def __init__(self) -> None:
        self._refs: dict[int, weakref.ref] = {}
        self._keys = itertools.count()

    def add(self, obj: Any) -> None:
        # Over a copy (made in C, without running Python code): a collection
        # while the entries are walked may add to the registry.
        for key, ref in self._refs.copy().items():
            if ref() is None:
                self._refs.pop(key, None)
        self._refs[next(self._keys)] = weakref.ref(obj)

    def live(self) -> list:
        """The objects still alive."""
        return [obj for ref in self._refs.copy().values() if (obj := ref()) is not None]

    def clear(self) -> None:
        self._refs.clear()
