"""WeakRegistry: weak references with no callback, safe to re-enter."""

from __future__ import annotations

import gc

import pytest

from fastload._lifetime.weak_registry import WeakRegistry


class _Thing:
    pass


def test_live_objects_only_and_dead_ones_pruned():
    registry = WeakRegistry()
    kept = [_Thing() for _ in range(3)]
    for thing in kept:
        registry.add(thing)
    for _ in range(5):
        registry.add(_Thing())  # dies at once
    assert registry.live() == kept
    registry.add(kept[0])
    assert len(registry._refs) <= 4 + 1  # the dead were pruned as objects were added
    registry.clear()
    assert registry.live() == []


@pytest.mark.timeout(30)
def test_add_may_run_again_inside_itself():
    # A collection inside add() may run a __del__ that adds to the same
    # registry (a loader made there): no lock to wait on, no entry lost.
    registry = WeakRegistry()
    kept = []
    left = [100]

    class Cycle:
        def __init__(self):
            self.me = self

        def __del__(self):
            if left[0] > 0:
                left[0] -= 1
                Cycle()  # cyclic garbage for the next collection
                thing = _Thing()
                kept.append(thing)
                registry.add(thing)

    Cycle()
    outer = [_Thing() for _ in range(50)]
    threshold = gc.get_threshold()
    gc.set_threshold(1)  # a collection at nearly every allocation, inside add() too
    try:
        for thing in outer:
            registry.add(thing)
    finally:
        gc.set_threshold(*threshold)
    left[0] = 0
    gc.collect()
    assert left[0] == 0 and kept, "no collection ran inside add()"
    live = registry.live()
    assert all(any(obj is thing for obj in live) for thing in outer + kept)
