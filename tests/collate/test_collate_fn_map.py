"""``collate(batch, collate_fn_map=...)`` and ``default_collate_fn_map``: torch's
extension point of collation, differential against torch.

While the map holds fastload's own entries, ``default_collate`` is the layout
path (``collate_into``); once it is changed, ``default_collate`` and the
DataLoader's default collation are torch's recursion over it.  Every test runs
with both libraries' maps restored afterwards (``restore_maps``).
"""

from __future__ import annotations

import collections
import subprocess
import sys
from typing import NamedTuple

import numpy as np
import pytest
from batch_compare import assert_same, assert_same_as_torch

import fastload
import fastload.collate as fl_collate
import fastload._loading.fetch
from fastload.collate import collate, default_collate, default_collate_fn_map


class Box:
    """A type no collate knows: a sample's leaf that a registered function collates."""

    def __init__(self, value: float, label: str) -> None:
        self.value = value
        self.label = label


class Point(NamedTuple):
    x: object
    y: object


Pair = collections.namedtuple("Pair", ["left", "right"])


def box_fn_for(collate_fn):
    """A collate function for ``Box`` that collates its fields with the library's
    ``collate`` and the map it was given, as library code written for torch does."""

    def collate_box_fn(batch, *, collate_fn_map=None):
        return {"value": collate_fn([b.value for b in batch], collate_fn_map=collate_fn_map),
                "label": collate_fn([b.label for b in batch], collate_fn_map=collate_fn_map)}

    return collate_box_fn


def _box_sample(i: int) -> dict:
    return {"image": np.arange(6, dtype=np.float32).reshape(2, 3) + i,
            "box": Box(0.5 * i, f"b{i}"),
            "pair": (Box(float(i), "p"), i),
            "point": Point(x=Box(-1.0 * i, "q"), y=np.float32(i)),
            "name": f"s{i}"}


class BoxDataset(fastload.Dataset):
    """Samples holding ``Box``es, for fastload's and torch's loaders alike."""

    def __len__(self) -> int:
        return 6

    def __getitem__(self, i: int) -> dict:
        return _box_sample(i)


def _sum_fn(batch, *, collate_fn_map=None):
    return sum(batch)


@pytest.fixture(autouse=True)
def restore_maps(request):
    """Every test leaves fastload's map (and torch's, when loaded) as it found them."""
    maps = [default_collate_fn_map]
    if "torch" in request.fixturenames:  # import it now, not in the test: its map is saved
        request.getfixturevalue("torch")
        # torch loaded after fastload is keyed by the first collate() over the default
        # map (NOTE [ The collate_fn_map ]): here, so that the map saved has the key.
        collate([0], collate_fn_map=default_collate_fn_map)
    if sys.modules.get("torch") is not None:
        from torch.utils.data._utils.collate import default_collate_fn_map as theirs

        maps.append(theirs)
    saved = [dict(fn_map) for fn_map in maps]
    yield
    for fn_map, entries in zip(maps, saved):
        fn_map.clear()
        fn_map.update(entries)


def _register_box(torch) -> None:
    """``Box`` in both libraries' maps, each with its own ``collate``."""
    from torch.utils.data._utils.collate import collate as torch_collate
    from torch.utils.data._utils.collate import default_collate_fn_map as theirs

    theirs[Box] = box_fn_for(torch_collate)
    default_collate_fn_map[Box] = box_fn_for(collate)


# --- the map ---------------------------------------------------------------------------

def test_the_map_has_torchs_keys_in_torchs_order_with_numpy_types(torch):
    from torch.utils.data._utils.collate import default_collate_fn_map as theirs

    assert list(default_collate_fn_map) == list(theirs)
    assert default_collate_fn_map[torch.Tensor] is fl_collate.collate_tensor_fn
    assert default_collate_fn_map[np.ndarray] is fl_collate.collate_numpy_array_fn
    assert default_collate_fn_map[bytes] is fl_collate.collate_str_fn


def test_torch_loaded_after_fastload_is_keyed_first_and_fastload_does_not_import_it():
    code = (
        "import sys, numpy as np\n"
        "import fastload.collate as c\n"
        "assert 'torch' not in sys.modules, 'torch imported'\n"
        "assert all(getattr(k, '__module__', '') != 'torch' for k in c.default_collate_fn_map)\n"
        "class Box:\n"
        "    pass\n"
        "c.default_collate_fn_map[Box] = lambda batch, *, collate_fn_map=None: len(batch)\n"
        "import torch\n"
        "out = c.default_collate([{'t': torch.ones(2), 'b': Box()}] * 3)\n"
        "assert torch.equal(out['t'], torch.ones(3, 2)) and out['b'] == 3, out\n"
        "assert next(iter(c.default_collate_fn_map)) is torch.Tensor\n"
        "del c.default_collate_fn_map[Box]\n"
        "assert c.fn_map_is_pristine()\n")
    subprocess.run([sys.executable, "-c", code], check=True)


def _spy_on_collate_into(monkeypatch) -> list:
    """The sample lists ``collate_into`` (the layout path) is called with, from now on,
    by ``default_collate`` or by a loader's batch source."""
    calls = []
    collate_into = fl_collate.collate_into

    def spy(samples, *args, **kwargs):
        calls.append(samples)
        return collate_into(samples, *args, **kwargs)

    monkeypatch.setattr(fl_collate.fn_map, "collate_into", spy)  # default_collate's
    monkeypatch.setattr(fastload._loading.fetch, "collate_into", spy)
    return calls


# --- default_collate with a changed map ---------------------------------------------------

def test_a_registered_type_collates_as_torchs_in_dicts_tuples_and_namedtuples(torch):
    _register_box(torch)
    batch = [_box_sample(i) for i in range(4)]
    theirs = torch.utils.data.default_collate(batch)
    ours = default_collate(batch)
    assert_same_as_torch(ours, theirs)
    assert isinstance(ours["point"], Point)


def test_every_built_in_leaf_gives_what_the_layout_path_gives(tmp_path, torch):
    rows = np.memmap(tmp_path / "rows.bin", dtype=np.int32, mode="w+", shape=(3, 2))
    rows[:] = np.arange(6).reshape(3, 2)
    batch = [{"memmap": rows[i], "mixed": np.arange(2, dtype=[np.int8, np.float32][i % 2]),
              "np": np.uint16(i), "f": 0.5 * i, "i": i, "b": bool(i), "s": f"s{i}",
              "by": b"x", "seq": (np.float16(i), "t")}
             for i in range(3)]
    tensors = [{"t": torch.full((2,), i, dtype=torch.bfloat16)} for i in range(3)]
    pristine, pristine_tensors = default_collate(batch), default_collate(tensors)
    default_collate_fn_map[Box] = box_fn_for(collate)
    assert_same(default_collate(batch), pristine)
    changed_tensors = default_collate(tensors)
    assert torch.equal(changed_tensors["t"], pristine_tensors["t"])
    assert changed_tensors["t"].dtype == torch.bfloat16


def test_replacing_an_entry_is_a_change_too(torch):
    from torch.utils.data._utils.collate import default_collate_fn_map as theirs

    theirs[int] = _sum_fn
    default_collate_fn_map[int] = _sum_fn
    batch = [{"n": i, "x": np.full(2, i, dtype=np.int16), "xs": [i, float(i)]} for i in range(3)]
    assert_same_as_torch(default_collate(batch), torch.utils.data.default_collate(batch))
    assert default_collate(batch)["n"] == 3


def test_restoring_the_map_brings_back_the_layout_path(monkeypatch):
    batch = [{"a": np.arange(3) + i, "b": float(i), "box": Box(i, "x")} for i in range(4)]
    layouts = _spy_on_collate_into(monkeypatch)

    default_collate_fn_map[Box] = box_fn_for(collate)
    changed = default_collate(batch)
    # Torch's recursion: each leaf of numbers is collated by itself, a layout of
    # its own ("a", "b", the boxes' values; their labels are strings, left as they are).
    assert [len(samples) for samples in layouts] == [4, 4, 4]
    assert changed["a"].base is not changed["b"].base

    del default_collate_fn_map[Box]
    assert fl_collate.fn_map_is_pristine()
    layouts.clear()
    restored = default_collate([{"a": np.arange(3) + i, "b": float(i)} for i in range(4)])
    # One layout for the whole batch: every array views one buffer.
    assert len(layouts) == 1 and layouts[0][0].keys() == {"a", "b"}
    assert restored["a"].base is restored["b"].base
    np.testing.assert_array_equal(restored["a"], changed["a"])


# --- collate() with a map of the caller's -------------------------------------------------

def test_collate_with_a_map_overriding_int_matches_torch(torch):
    from torch.utils.data._utils.collate import collate as torch_collate
    from torch.utils.data._utils.collate import default_collate_fn_map as theirs

    batch = [{"n": i, "flag": bool(i % 2), "x": np.arange(2.0) * i, "t": (i, "s")}
             for i in range(3)]
    our_map = {**default_collate_fn_map, int: _sum_fn}
    their_map = {**theirs, int: _sum_fn}
    assert_same_as_torch(collate(batch, collate_fn_map=our_map),
                         torch_collate(batch, collate_fn_map=their_map))
    assert collate(batch, collate_fn_map=our_map)["flag"] == 1  # a bool is an int: isinstance


class Base:
    def __init__(self, v: int) -> None:
        self.v = v


class Derived(Base):
    pass


class MoreDerived(Derived):
    pass


def _tagged(tag):
    def collate_tagged(batch, *, collate_fn_map=None):
        return (tag, [b.v for b in batch])

    return collate_tagged


@pytest.mark.parametrize("cls,expected",
                         [(Derived, "derived"), (MoreDerived, "base"), (Base, "base")])
def test_collate_dispatches_exact_type_then_isinstance_in_order(torch, cls, expected):
    from torch.utils.data._utils.collate import collate as torch_collate

    # MoreDerived is an instance of both keys: the first in the map's order wins.
    fn_map = {Base: _tagged("base"), Derived: _tagged("derived")}
    batch = [Pair(cls(i), [cls(i), cls(-i)]) for i in range(3)]
    ours = collate(batch, collate_fn_map=fn_map)
    assert ours == torch_collate(batch, collate_fn_map=fn_map)
    assert ours == Pair((expected, [0, 1, 2]), [(expected, [0, 1, 2]), (expected, [0, -1, -2])])


def test_collate_without_a_map_takes_containers_apart_only(torch):
    from torch.utils.data._utils.collate import collate as torch_collate

    fn_map = {Box: lambda batch, *, collate_fn_map=None: len(batch)}
    batch = [{"a": [Box(1, ""), Box(2, "")], "b": (Box(3, ""),)}] * 2
    assert collate(batch, collate_fn_map=fn_map) == torch_collate(batch, collate_fn_map=fn_map)
    with pytest.raises(TypeError) as theirs:
        torch_collate([{"a": 1}], collate_fn_map=None)
    with pytest.raises(TypeError) as ours:
        collate([{"a": 1}], collate_fn_map=None)
    assert str(ours.value).startswith(str(theirs.value))


# --- errors --------------------------------------------------------------------------------

def test_an_unhandled_type_is_torchs_type_error_naming_its_path(torch):
    _register_box(torch)
    batch = [{"box": Box(1, "a"), "rest": [1, object()]}] * 2
    with pytest.raises(TypeError) as theirs:
        torch.utils.data.default_collate(batch)
    with pytest.raises(TypeError) as ours:
        default_collate(batch)
    assert str(theirs.value) == ("default_collate: batch must contain tensors, numpy arrays, "
                                 "numbers, dicts or lists; found <class 'object'>")
    assert str(ours.value) == f"{theirs.value} (at batch[0]['rest'][1])"
    # The layout path says the same of the same fault.
    del default_collate_fn_map[Box]
    with pytest.raises(TypeError) as layout:
        default_collate([{"rest": [1, object()]}] * 2)
    assert str(layout.value) == str(ours.value)


def test_sequences_of_unequal_lengths_are_torchs_runtime_error(torch):
    _register_box(torch)
    batch = [{"box": Box(1, "a"), "xs": [1, 2]}, {"box": Box(2, "b"), "xs": [1, 2, 3]}]
    with pytest.raises(RuntimeError) as theirs:
        torch.utils.data.default_collate(batch)
    with pytest.raises(RuntimeError) as ours:
        default_collate(batch)
    assert str(ours.value).startswith(str(theirs.value))
    assert "batch[1]['xs'] has length 3, batch[0]['xs'] has 2" in str(ours.value)


# --- the DataLoader ------------------------------------------------------------------------

@pytest.mark.timeout(60)
@pytest.mark.parametrize("num_workers", [0, 2])
def test_the_loader_honours_a_changed_map_as_torchs(torch, num_workers, no_leaks):
    _register_box(torch)
    theirs = list(torch.utils.data.DataLoader(BoxDataset(), batch_size=4))
    ours = list(fastload.DataLoader(BoxDataset(), batch_size=4, num_workers=num_workers))
    assert_same_as_torch(ours, theirs)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("num_workers", [0, 2])
def test_the_loader_gives_torchs_tensors_with_a_changed_map(torch, num_workers, no_leaks):
    _register_box(torch)
    theirs = list(torch.utils.data.DataLoader(BoxDataset(), batch_size=4))
    ours = list(fastload.DataLoader(BoxDataset(), batch_size=4, num_workers=num_workers,
                                    output="torch"))
    assert_same_as_torch(ours, theirs, tensors=True)


@pytest.mark.timeout(60)
@pytest.mark.parametrize("num_workers", [0, 2])
def test_an_array_dataset_is_not_gathered_past_a_changed_map(num_workers, no_leaks):
    # The gather kernel is default_collate's fast path: an ndarray entry replaced must win.
    def rows_fn(batch, *, collate_fn_map=None):
        return {"rows": len(batch), "sum": np.sum(batch, axis=0)}

    dataset = fastload.ArrayDataset(np.arange(12.0).reshape(6, 2))
    default_collate_fn_map[np.ndarray] = rows_fn
    batches = list(fastload.DataLoader(dataset, batch_size=4, num_workers=num_workers))
    assert [b[0]["rows"] for b in batches] == [4, 2]
    np.testing.assert_array_equal(batches[1][0]["sum"], [18.0, 20.0])


@pytest.mark.timeout(60)
def test_the_loader_takes_the_layout_path_again_once_the_map_is_restored(monkeypatch, no_leaks):
    default_collate_fn_map[Box] = box_fn_for(collate)
    del default_collate_fn_map[Box]
    layouts = _spy_on_collate_into(monkeypatch)
    samples = [{"a": np.arange(3) + i, "b": i} for i in range(6)]
    batches = list(fastload.DataLoader(samples, batch_size=4))
    assert [len(samples) for samples in layouts] == [4, 2]
    assert all(b["a"].base is b["b"].base for b in batches)
