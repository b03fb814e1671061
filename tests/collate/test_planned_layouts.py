"""Layouts planned once per loader (NOTE [ Layouts planned once ] in fastload/_kernels/_plan_key.pxi).

A loader keeps the layout it planned for a batch and reuses it for every
later batch whose first sample has the same ``layout_key``.  These tests
check that the key tells apart every pair of samples that are laid out
differently, that a kept layout never changes (a batch needing promotion is
planned afresh) and holds no batch's values, and that batches through the
loader, with and without workers, stay torch's when their layout changes
from batch to batch.
"""

from __future__ import annotations

import collections

import numpy as np
import pytest
from batch_compare import assert_same_as_torch

import fastload
from fastload import _core
from fastload.collate import PlannedLayouts, collate_into, default_collate


def key(sample):
    return _core.layout_key(sample, [])


# --- the key --------------------------------------------------------------------------------

def test_samples_laid_out_alike_share_a_key_whatever_their_values():
    a = {"x": np.zeros(4, np.float32), "y": 3, "name": "a", "pair": (1.5, b"u")}
    b = {"x": np.ones(4, np.float32), "y": -7, "name": "bb", "pair": (2.5, b"vw")}
    assert key(a) == key(b)
    assert hash(key(a)) == hash(key(b))


@pytest.mark.parametrize("first, second", [
    ({"a": 1, "b": 2}, {"b": 2, "a": 1}),                           # key order
    ({1: 0}, {"1": 0}),                                              # key type
    (np.zeros(3, np.float32), np.zeros(3, np.float64)),              # dtype
    (np.zeros(3, np.float32), np.zeros(4, np.float32)),              # shape
    (np.zeros((2, 3)), np.zeros((3, 2))),
    (np.zeros(2, np.int64), np.zeros(2, np.longlong)),              # equal dtypes, other char
    (1, 1.0), (1, True), (1.0, True),                                # Python scalars
    (np.float32(1), np.float64(1)), (np.int64(1), 1),                # numpy scalars
    ("a", b"a"),
    ([1, 2], (1, 2)), ([1, 2], [1, 2, 3]), ([[1]], [1]),             # sequences
    ({"a": [1]}, {"a": (1,)}),
    ({"a": {"b": 1}}, {"a": {"c": 1}}),                              # nested keys
], ids=lambda value: type(value).__name__)
def test_samples_laid_out_differently_have_different_keys(first, second):
    assert key(first) is not None and key(second) is not None
    assert key(first) != key(second)


class _Sub(np.ndarray):
    pass


@pytest.mark.parametrize("sample", [
    collections.OrderedDict(a=1),                  # a mapping subclass: its clone carries state
    collections.namedtuple("Point", "x y")(1, 2),
    {1.0: 2}, {True: 2}, {b"k": 1},                # keys equal to others of another type
    np.array(["a"]), np.array([object()]),         # arrays torch refuses
    np.zeros(2, "datetime64[s]"), np.datetime64(1, "s"),
    np.zeros(2).view(_Sub),                        # an ndarray subclass
    object(), None, {"a": [object()]},
], ids=lambda value: type(value).__name__)
def test_samples_it_cannot_describe_exactly_have_no_key(sample):
    assert key(sample) is None


def test_a_deep_nesting_has_no_key():
    sample = 1
    for _ in range(40):
        sample = [sample]
    assert key(sample) is None
    assert key([[[1]]]) is not None


def test_the_key_names_each_dtype_by_id_and_hands_the_dtypes_over_to_be_kept():
    keep = []
    big_endian = np.zeros(2, ">f4")  # not numpy's shared dtype: a new object per array
    assert _core.layout_key({"x": big_endian, "s": np.float32(1)}, keep) is not None
    assert keep[0] is big_endian.dtype
    assert keep[1] is np.dtype(np.float32)
    # Equal dtypes that are other objects give other keys: a plan too many, never a wrong one.
    other = np.zeros(2, ">f4")
    assert other.dtype is not big_endian.dtype
    assert key(other) != key(big_endian)


# --- PlannedLayouts and collate_into ----------------------------------------------------

def _buffer(nbytes):
    return np.empty(nbytes, np.uint8)


def test_a_batch_laid_out_as_an_earlier_one_reuses_its_layout():
    planned = PlannedLayouts()
    first = [{"x": np.full(3, i, np.float32), "n": i, "s": str(i)} for i in range(4)]
    second = [{"x": np.full(3, -i, np.float32), "n": 10 + i, "s": "t" * i} for i in range(4)]
    layout, buffer = collate_into(first, _buffer, planned)
    values = layout.detach_values()
    assert layout.build(buffer, values)["s"] == ["0", "1", "2", "3"]
    again, buffer = collate_into(second, _buffer, planned)
    assert again is layout
    batch = again.build(buffer, again.detach_values())
    assert_same_as_default_collate(batch, second)
    # A batch of another size is laid out anew.
    assert collate_into(second[:3], _buffer, planned)[0] is not layout


def assert_same_as_default_collate(batch, samples):
    expected = default_collate(samples)
    assert list(batch) == list(expected)
    for name in expected:
        if isinstance(expected[name], np.ndarray):
            assert batch[name].dtype == expected[name].dtype
            np.testing.assert_array_equal(batch[name], expected[name])
        else:
            assert batch[name] == expected[name]


def test_a_batch_that_needs_promotion_leaves_the_kept_layout_as_it_was():
    planned = PlannedLayouts()
    ints = [{"n": i, "x": np.arange(2, dtype=np.int32)} for i in range(4)]
    layout, _ = collate_into(ints, _buffer, planned)
    mixed = [{"n": 1, "x": np.arange(2, dtype=np.int32)}, {"n": 2.5, "x": np.arange(2.0)}] * 2
    promoted, buffer = collate_into(mixed, _buffer, planned)
    assert promoted is not layout
    assert_same_as_default_collate(promoted.build(buffer), mixed)
    assert [leaf.dtype for leaf in layout.leaves()] == [np.dtype(np.int64), np.dtype(np.int32)]
    # The batches after it take the kept layout again, not the promoted one.
    after, buffer = collate_into(ints, _buffer, planned)
    assert after is layout
    assert_same_as_default_collate(after.build(buffer), ints)


@pytest.mark.parametrize("failing", [
    [{"s": "c", "n": 3}, {"s": "d"}],                  # a sample lacks a key
    [{"s": "c", "n": 3}, {"s": "d", "n": "x"}],        # a str where the first has an int
    [{"s": "c", "n": 3}, {"s": "d", "n": 2.5}, {"s": "e"}],  # a promotion, then a missing key
], ids=["missing", "refused", "promoted-then-missing"])
def test_a_failed_batch_fails_as_without_kept_layouts_and_leaves_them_as_they_were(failing):
    planned = PlannedLayouts()
    good = [{"s": "a", "n": 1}, {"s": "b", "n": 2}]
    good = good + good[:1] if len(failing) == 3 else good  # the same key as the failing batch
    layout, _ = collate_into(good, _buffer, planned)
    layout.detach_values()
    with pytest.raises(Exception) as expected:
        default_collate(failing)
    with pytest.raises(expected.type) as got:
        collate_into(failing, _buffer, planned)
    assert str(got.value) == str(expected.value)
    assert [leaf.value for leaf in layout.value_leaves()] == [None]
    assert [leaf.dtype for leaf in layout.leaves() if hasattr(leaf, "dtype")] == [np.dtype(np.int64)]
    again, buffer = collate_into(good, _buffer, planned)
    assert again is layout
    assert_same_as_default_collate(again.build(buffer, again.detach_values()), good)


def test_planned_layouts_stay_bounded():
    planned = PlannedLayouts()
    for size in range(1, 60):
        samples = [np.zeros(size, np.float32), np.ones(size, np.float32)]
        layout, buffer = collate_into(samples, _buffer, planned)
        np.testing.assert_array_equal(layout.build(buffer), np.stack(samples))
    assert len(planned._layouts) <= 16


# --- through the loader, against torch ----------------------------------------------------

class ChangingLayouts:
    """Samples whose layout changes every ``period`` batches of ``batch_size``, and
    within some batches from one sample to the next (promotion, a bool key)."""

    def __init__(self, batch_size: int, period: int, count: int = 96) -> None:
        self.batch_size, self.period, self.count = batch_size, period, count

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, i: int):
        batch, within = divmod(i, self.batch_size)
        kind = (batch // self.period) % 4
        if kind == 0:
            return {"x": np.full(3, i, np.float32), "n": i, "name": f"s{i}"}
        if kind == 1:
            # The same keys, other types: an int that becomes a float mid-batch.
            return {"x": np.full(3, i, np.float32), "n": i + 0.5 if within == 1 else i,
                    "name": f"s{i}"}
        if kind == 2:
            return {"x": np.full((2, 2), i, np.int16), "name": f"s{i}", "n": float(i)}
        return {True: np.int64(i), "pair": (i, f"p{i}")}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("period", [1, 2, 3])
def test_batches_whose_layout_changes_are_torchs(torch, no_leaks, num_workers, period):
    dataset = ChangingLayouts(batch_size=4, period=period)
    ours = list(fastload.DataLoader(dataset, batch_size=4, num_workers=num_workers))
    theirs = list(torch.utils.data.DataLoader(dataset, batch_size=4))
    assert len(ours) == len(theirs)
    for i, (mine, torchs) in enumerate(zip(ours, theirs)):
        assert_same_as_torch(mine, torchs, path=f"batch {i}")


@pytest.mark.timeout(120)
@pytest.mark.parametrize("num_workers", [0, 2])
def test_batches_kept_while_later_ones_reuse_their_layout_keep_their_values(no_leaks, num_workers):
    samples = [{"x": np.full(2, i, np.float32), "name": f"n{i}", "pair": (i, f"p{i}")}
               for i in range(40)]
    batches = list(fastload.DataLoader(samples, batch_size=4, num_workers=num_workers))
    for b, batch in enumerate(batches):
        expected = samples[4 * b:4 * b + 4]
        assert batch["name"] == [s["name"] for s in expected]
        assert batch["pair"][1] == tuple(s["pair"][1] for s in expected)
        np.testing.assert_array_equal(batch["x"], np.stack([s["x"] for s in expected]))
