"""Weak registries whose objects can be dropped without running Python code.

``weakref.WeakSet`` removes a dead object in a weakref callback written in
Python, and CPython drops a KeyboardInterrupt raised inside one: a Ctrl-C
landing there, as the caller drops an iterator, would be lost (NOTE [ Ctrl-C
held over fork and teardown ] in interrupts.py).  A ``WeakRegistry`` keeps
plain weak references, with no callback, and prunes the dead ones as objects
are added.
"""

from __future__ import annotations

import os
import threading
import weakref
from typing import Any

__all__ = ["WeakRegistry"]


class WeakRegistry:
    """Objects of this process, held weakly (for at-fork hooks to visit)."""

    __slots__ = ("_refs", "_lock")

    def __init__(self) -> None:
        self._refs: list[weakref.ref] = []
        self._lock = threading.Lock()
        if hasattr(os, "register_at_fork"):
            # Another thread may hold the lock as this process forks: the
            # child's copy would stay locked for good.
            os.register_at_fork(after_in_child=self._new_lock)

    def _new_lock(self) -> None:
        self._lock = threading.Lock()

    def add(self, obj: Any) -> None:
        with self._lock:
            self._refs = [ref for ref in self._refs if ref() is not None]
            self._refs.append(weakref.ref(obj))

    def live(self) -> list:
        """The objects still alive (the registry is read, never locked: an at-fork
        hook may run while another thread held the lock)."""
        return [obj for ref in self._refs if (obj := ref()) is not None]

    def clear(self) -> None:
        self._refs = []
