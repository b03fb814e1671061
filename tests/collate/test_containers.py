"""The container-rebuild rule (fastload/collate/containers.py), step for step as torch's.

torch's collate rebuilds a batch of mappings or sequences in the sample's type
and, when that type refuses (a TypeError), collates the items a second time
into a plain dict or list.  The number of times a collate_fn_map entry is called
is what shows the passes, so each test counts them against torch's.
"""

from __future__ import annotations

import collections
import collections.abc

import pytest

from fastload.collate import collate, default_convert


class Box:
    def __init__(self, n: int) -> None:
        self.n = n


class FrozenMapping(collections.abc.Mapping):
    """A mapping whose constructor takes no dict: torch falls back to a dict."""

    def __init__(self, **items) -> None:
        self._items = dict(items)

    def __getitem__(self, key):
        return self._items[key]

    def __iter__(self):
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)


class SetOnceList(collections.UserList):
    """A mutable sequence whose clone refuses to set its second item."""

    def __setitem__(self, index, value) -> None:
        if index == 1:
            raise TypeError("read-only item")
        super().__setitem__(index, value)


class Tagged(dict):
    """A dict subclass with state beside its items, which a clone keeps."""


def _counting_map():
    calls = []

    def sum_boxes(batch, *, collate_fn_map=None):
        calls.append(len(batch))
        return sum(box.n for box in batch)

    return {Box: sum_boxes}, calls


@pytest.mark.parametrize("make", [
    lambda i: FrozenMapping(a=Box(i), b=Box(2 * i)),
    lambda i: SetOnceList([Box(i), Box(i + 1), Box(i + 2)]),
    lambda i: collections.OrderedDict(a=Box(i), b=Box(i)),
    lambda i: SetOnceList([Box(i)]),
], ids=["mapping-refusing-a-dict", "sequence-refusing-an-item", "ordered-dict", "one-item"])
def test_collate_rebuilds_and_falls_back_as_torch_does(torch, make):
    from torch.utils.data._utils.collate import collate as torch_collate

    batch = [make(i) for i in range(3)]
    ours_map, ours_calls = _counting_map()
    theirs_map, theirs_calls = _counting_map()
    ours = collate(batch, collate_fn_map=ours_map)
    theirs = torch_collate(batch, collate_fn_map=theirs_map)
    assert type(ours) is type(theirs)
    assert (dict(ours) if isinstance(ours, collections.abc.Mapping) else list(ours)) == \
        (dict(theirs) if isinstance(theirs, collections.abc.Mapping) else list(theirs))
    assert ours_calls == theirs_calls  # the same passes over the items


def test_a_clone_keeps_the_state_beside_the_items(torch):
    from torch.utils.data._utils.collate import collate as torch_collate

    batch = []
    for i in range(2):
        sample = Tagged(a=Box(i))
        sample.tag = "kept"
        batch.append(sample)
    fn_map, _ = _counting_map()
    ours, theirs = collate(batch, collate_fn_map=fn_map), torch_collate(batch, collate_fn_map=fn_map)
    assert type(ours) is type(theirs) is Tagged
    assert ours.tag == theirs.tag == "kept" and ours == theirs == {"a": 1}


def test_default_convert_rebuilds_as_torch_does(torch):
    from torch.utils.data import default_convert as torch_convert

    defaults = collections.defaultdict(int, a=1)
    for data in (FrozenMapping(a=1), SetOnceList([1, 2]), defaults, Tagged(a=[1, (2, 3)]),
                 range(3)):
        ours, theirs = default_convert(data), torch_convert(data)
        assert type(ours) is type(theirs), data
        assert ours == theirs
    assert default_convert(defaults).default_factory is int
