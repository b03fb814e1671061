"""default_collate / default_convert: torch 2.x's rules, in numpy.

Three kinds of checks:

* differential tests against ``torch.utils.data.default_collate`` /
  ``default_convert`` (the ``torch`` fixture skips them when torch is absent):
  same container types, keys and order, and for every tensor an array of
  ``tensor.numpy().dtype``, the same shape and the same values;
* error tests: the exception type torch raises, plus the path of the
  offending leaf (``batch[3]['image']``) that ours adds;
* a hypothesis fuzz against a small pure-numpy reference of torch's rules
  (and against torch itself when it is installed).

Known, deliberate differences from torch (asserted as such below):

* numpy dtypes torch refuses are collated: structured, datetime64,
  longdouble, big-endian arrays, negative strides, uint64 scalars;
* ``np.bool_`` beside integers is promoted (torch's ``as_tensor`` raises a
  ``TypeError`` on such a list).

Mixed dtypes promote with torch's rules, not numpy's (``MIXED_PROMOTION``).
"""

from __future__ import annotations

import collections
import collections.abc
import copy
import functools
import itertools
import operator
import types
import weakref
from typing import NamedTuple

import numpy as np
import pytest
from batch_compare import assert_same, assert_same_as_torch
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import fastload
from fastload import default_collate, default_convert

ERR_START = ("default_collate: batch must contain tensors, numpy arrays, numbers, "
             "dicts or lists; found")

# Every fixed-size dtype torch can hold (uint16/32/64 since torch 2.3).
DTYPES = ["bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
          "float16", "float32", "float64", "complex64", "complex128"]


class Point(NamedTuple):
    x: object
    y: object


Pair = collections.namedtuple("Pair", ["left", "right"])


class ROSeq(collections.abc.Sequence):
    """An immutable Sequence: torch rebuilds it as ``type(elem)(list)``."""

    def __init__(self, data):
        self.data = list(data)

    def __getitem__(self, i):
        return self.data[i]

    def __len__(self):
        return len(self.data)

    def __eq__(self, other):
        return type(other) is type(self) and self.data == other.data


class ROMap(collections.abc.Mapping):
    """An immutable Mapping: torch rebuilds it as ``type(elem)(dict)``."""

    def __init__(self, data):
        self._d = dict(data)

    def __getitem__(self, key):
        return self._d[key]

    def __iter__(self):
        return iter(self._d)

    def __len__(self):
        return len(self._d)


class MyDict(dict):
    pass


class MyList(list):
    pass


class StoreMap(collections.abc.MutableMapping):
    """A MutableMapping wrapping a dict: ``copy.copy`` shares the wrapped dict."""

    def __init__(self, data):
        self._d = data

    def __getitem__(self, key):
        return self._d[key]

    def __setitem__(self, key, value):
        self._d[key] = value

    def __delitem__(self, key):
        del self._d[key]

    def __iter__(self):
        return iter(self._d)

    def __len__(self):
        return len(self._d)


# --------------------------------------------------------------------------
# Comparison helpers.
# --------------------------------------------------------------------------

def torch_ready(obj):
    """A copy of ``obj`` with every array native-endian and positively strided.

    torch refuses byte-swapped arrays and negative strides; ours does not, so
    for those we compare ours against torch on an equal-valued copy.
    """
    if isinstance(obj, np.ndarray):
        return np.array(obj, dtype=obj.dtype.newbyteorder("=")) if obj.dtype.kind != "V" else obj
    if isinstance(obj, dict) and type(obj) is dict:
        return {key: torch_ready(value) for key, value in obj.items()}
    if isinstance(obj, tuple) and hasattr(obj, "_fields"):
        return type(obj)(*(torch_ready(v) for v in obj))
    if type(obj) in (list, tuple):
        return type(obj)(torch_ready(v) for v in obj)
    return obj


def torch_collate(torch, batch):
    from torch.utils.data import default_collate as torch_default_collate

    return torch_default_collate(torch_ready(batch))


def torch_convert(torch, data):
    from torch.utils.data import default_convert as torch_default_convert

    return torch_default_convert(torch_ready(data))


def arrays_of(tree) -> list:
    found = []
    if isinstance(tree, np.ndarray):
        found.append(tree)
    elif isinstance(tree, collections.abc.Mapping):
        for value in tree.values():
            found.extend(arrays_of(value))
    elif isinstance(tree, (list, tuple)):
        for value in tree:
            found.extend(arrays_of(value))
    return found


# --------------------------------------------------------------------------
# Sample structures for the differential tests: make(i) -> sample i.
# --------------------------------------------------------------------------

def _arr(i, shape=(2, 3), dtype="float32"):
    return (np.arange(int(np.prod(shape))).reshape(shape) + 10 * i).astype(dtype)


def _memmap(tmp_path_factory_dir, i):
    m = np.memmap(tmp_path_factory_dir / f"m{i}.bin", dtype="float32", mode="w+", shape=(3, 4))
    m[:] = _arr(i, (3, 4))
    return m


STRUCTURES = {
    "int": lambda i: i * 7 - 3,
    "float": lambda i: i / 3 - 1.5,
    "bool": lambda i: i % 2 == 0,
    "str": lambda i: f"s{i}",
    "bytes": lambda i: bytes([65 + i]),
    "array": lambda i: _arr(i),
    "array_0d": lambda i: np.array(i * 1.5, dtype="float64"),
    "array_empty": lambda i: np.zeros((0, 3), dtype="int16"),
    "array_1elem": lambda i: np.array([i], dtype="uint8"),
    "transposed": lambda i: _arr(i, (3, 5)).T,
    "sliced_step": lambda i: _arr(i, (6, 8))[::2, 1::3],
    "negative_strides": lambda i: _arr(i, (4, 5))[::-1, ::-2],
    "fortran": lambda i: np.asfortranarray(_arr(i, (3, 4, 5))),
    "broadcast": lambda i: np.broadcast_to(np.arange(3, dtype="int32") + i, (4, 3)),
    "readonly": lambda i: _readonly(_arr(i)),
    "dict": lambda i: {"image": _arr(i, (2, 2, 3), "uint8"), "label": i, "name": f"n{i}"},
    "nested_dict": lambda i: {"a": {"b": {"c": _arr(i, (2,)), "d": [i, i + 1.0]}},
                              "e": (True, np.int16(i))},
    "ordered_dict": lambda i: collections.OrderedDict([("z", i), ("a", _arr(i)), ("m", 0.5 * i)]),
    "defaultdict": lambda i: collections.defaultdict(list, {"x": _arr(i), "y": i}),
    "dict_subclass": lambda i: MyDict(x=_arr(i), y=[i, 2 * i]),
    "mapping_proxy": lambda i: types.MappingProxyType({"x": i, "y": _arr(i)}),
    "custom_mapping": lambda i: ROMap({"x": i, "y": _arr(i)}),
    "namedtuple": lambda i: Point(_arr(i), i),
    "namedtuple_nested": lambda i: Pair(Point(i, 1.0 * i), {"k": _arr(i, (4,), "int32")}),
    "tuple": lambda i: (_arr(i), i, 2.5 * i, f"t{i}"),
    "list": lambda i: [_arr(i), [i, i], (i, i)],
    "list_subclass": lambda i: MyList([i, _arr(i)]),
    "custom_sequence": lambda i: ROSeq([i, 1.5 * i]),
    "range": lambda i: range(3),
    "numpy_scalars": lambda i: [np.dtype(d).type(i % 2) for d in DTYPES if d != "uint64"],
    "numpy_str_scalar": lambda i: np.str_(f"np{i}"),
    "float_subclass_np64": lambda i: np.float64(i + 0.25),
    "deep": lambda i: [[[[{"leaf": [_arr(i, (1,))]}]]]],
    "empty_dict": lambda i: {},
    "empty_list": lambda i: [],
}


def _readonly(a):
    a.setflags(write=False)
    return a


@pytest.mark.parametrize("n", [1, 4])
@pytest.mark.parametrize("name", sorted(STRUCTURES))
def test_collate_matches_torch(torch, name, n):
    batch = [STRUCTURES[name](i) for i in range(n)]
    ours = default_collate(batch)
    assert_same_as_torch(ours, torch_collate(torch, batch))


def test_collate_memmap_matches_torch(torch, tmp_path):
    batch = [_memmap(tmp_path, i) for i in range(3)] + [_memmap(tmp_path, 9)[::-1]]
    ours = default_collate(batch)
    assert type(ours) is np.ndarray  # a plain array, not a memmap onto the file
    assert_same_as_torch(ours, torch_collate(torch, batch))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(), (5,), (2, 3, 4)])
def test_collate_array_dtypes_match_torch(torch, dtype, shape):
    rng = np.random.default_rng(0)
    batch = [(rng.integers(0, 100, size=shape) - (0 if dtype.startswith(("u", "b")) else 50)
              ).astype(dtype) for _ in range(3)]
    if dtype.startswith("float") or dtype.startswith("complex"):
        batch[1] = batch[1] / 7  # non-integral values
        batch[1] = batch[1].astype(dtype)
    ours = default_collate(batch)
    if dtype == "uint64" and shape == ():
        # torch 2.13 cannot convert 0-d uint64 arrays ("an integer is required");
        # ours stacks them like any other dtype.
        with pytest.raises(TypeError):
            torch_collate(torch, batch)
        assert ours.dtype == np.uint64
        np.testing.assert_array_equal(ours, np.stack(batch))
        return
    assert_same_as_torch(ours, torch_collate(torch, batch))
    np.testing.assert_array_equal(ours, np.stack(batch))


@pytest.mark.parametrize("dtype", [d for d in DTYPES if d != "uint64"])
def test_collate_numpy_scalars_match_torch(torch, dtype):
    batch = [np.dtype(dtype).type(v) for v in (0, 1, 1)]
    ours = default_collate(batch)
    assert ours.dtype == np.dtype(dtype) and ours.shape == (3,)
    assert_same_as_torch(ours, torch_collate(torch, batch))


def test_collate_uint64_scalars_keep_dtype(torch):
    # torch 2.13 cannot build a tensor from uint64 numpy scalars ("an integer
    # is required"); ours keeps the dtype, values beyond int64 included.
    batch = [np.uint64(2**63 + 5), np.uint64(1)]
    with pytest.raises(TypeError):
        torch_collate(torch, batch)
    ours = default_collate(batch)
    assert ours.dtype == np.uint64
    assert ours.tolist() == [2**63 + 5, 1]


@pytest.mark.parametrize("dtype", [">f4", ">i8", ">c16", ">u2"])
def test_big_endian_collates_with_values_and_byte_order(torch, dtype):
    # torch refuses byte-swapped arrays (ValueError); ours keeps the samples'
    # dtype, byte order included, with the values torch gives for native copies.
    batch = [{"x": _arr(i, (2, 3), dtype)} for i in range(3)]
    from torch.utils.data import default_collate as torch_default_collate

    with pytest.raises(ValueError):
        torch_default_collate(batch)
    ours = default_collate(batch)
    assert ours["x"].dtype == np.dtype(dtype)
    np.testing.assert_array_equal(ours["x"], np.stack([b["x"] for b in batch]))
    theirs = torch_collate(torch, batch)["x"].numpy()
    assert theirs.dtype == ours["x"].dtype.newbyteorder("=")
    np.testing.assert_array_equal(ours["x"], theirs)


@pytest.mark.parametrize("dtype", ["f4", "u2", "u8"])
def test_mixed_byte_order_promotes_to_native(dtype):
    # One dtype in two byte orders: uint16 beside big-endian uint16 is no
    # promotion at all (torch's uint16 rule is about other dtypes).
    batch = [_arr(0, (3,), ">" + dtype), _arr(1, (3,), "<" + dtype)]
    ours = default_collate(batch)
    assert ours.dtype == np.dtype("=" + dtype)
    np.testing.assert_array_equal(ours, [[0, 1, 2], [10, 11, 12]])


def test_structured_arrays_collate_although_torch_refuses(torch):
    dt = np.dtype([("a", "<i4"), ("b", "<f8", (2,))])
    batch = [np.array([(i, (i, -i)), (2 * i, (0.5, 1.5))], dtype=dt) for i in range(3)]
    with pytest.raises(TypeError):  # torch: "can't convert np.ndarray of type numpy.void"
        torch_collate(torch, batch)
    ours = default_collate(batch)
    assert ours.dtype == dt and ours.shape == (3, 2)
    np.testing.assert_array_equal(ours, np.stack(batch))


def test_datetime_and_longdouble_collate_although_torch_refuses(torch):
    dates = [np.array(["2024-01-0%d" % (i + 1)], dtype="M8[D]") for i in range(2)]
    with pytest.raises(TypeError):
        torch_collate(torch, dates)
    out = default_collate(dates)
    assert out.dtype == np.dtype("M8[D]")
    np.testing.assert_array_equal(out, np.stack(dates))
    longs = [np.longdouble(1) / 3, np.longdouble(2)]
    out = default_collate(longs)
    assert out.dtype == np.longdouble
    assert out[0] == np.longdouble(1) / 3


@pytest.mark.parametrize("batch,expected_dtype", [
    ([1, 2, 3], np.int64),
    ([1.0, 2.0], np.float64),
    ([True, False], np.bool_),
    ([np.float32(1), np.float32(2)], np.float32),
    ([np.bool_(True), np.bool_(False)], np.bool_),
])
def test_python_and_numpy_scalars(torch, batch, expected_dtype):
    ours = default_collate(batch)
    assert ours.dtype == expected_dtype
    assert_same_as_torch(ours, torch_collate(torch, batch))


# --------------------------------------------------------------------------
# Mixed types.
# --------------------------------------------------------------------------

# (batch, torch's dtype, ours): fastload promotes mixed batches by torch's
# category-first rules, so the two columns agree everywhere.
MIXED_PROMOTION = [
    # Python scalars: identical to torch.
    ("int_float", [1, 2.5], "float32", "float32"),       # torch.tensor default dtype
    ("bool_int", [True, 2], "int64", "int64"),
    ("float_int", [2.5, 1], "float64", "float64"),
    ("float_bool", [2.5, True], "float64", "float64"),
    ("int_bool", [1, True], "int64", "int64"),
    ("bool_npbool", [True, np.bool_(False)], "bool", "bool"),
    # Arrays of mixed dtypes: torch.stack promotes with torch's rules.
    ("u8_f32", [np.zeros(2, "u1"), np.ones(2, "f4")], "float32", "float32"),
    ("u8_i8", [np.zeros(2, "u1"), np.ones(2, "i1")], "int16", "int16"),
    ("bool_u8", [np.zeros(2, "?"), np.ones(2, "u1")], "uint8", "uint8"),
    ("f32_f64", [np.zeros(2, "f4"), np.ones(2, "f8")], "float64", "float64"),
    ("f32_c64", [np.zeros(2, "f4"), np.ones(2, "c8")], "complex64", "complex64"),
    ("i32_f16", [np.zeros(2, "i4"), np.ones(2, "f2")], "float16", "float16"),
    ("i64_f32", [np.zeros(2, "i8"), np.ones(2, "f4")], "float32", "float32"),
    ("i16_f16", [np.zeros(2, "i2"), np.ones(2, "f2")], "float16", "float16"),
    # numpy scalars of mixed dtypes: torch.as_tensor(list) promotes, torch's rules.
    ("np_u8_i8", [np.uint8(1), np.int8(1)], "int16", "int16"),
    ("np_f32_f64", [np.float32(1), np.float64(2)], "float64", "float64"),
    ("np_i32_f32", [np.int32(1), np.float32(2)], "float32", "float32"),
    ("np_f16_i64", [np.float16(1), np.int64(2)], "float16", "float16"),
    ("np_i32_pyint", [np.int32(1), 2], "int64", "int64"),
    # Numbers and sequences beside arrays: torch.as_tensor of each, then stacked.
    ("arr0d_pyint", [np.array(1), 2], "int64", "int64"),
    ("arr0d_f64_pyint", [np.array(1.5), 2], "float64", "float64"),
    ("arr_list", [np.array([1, 2]), [3, 4]], "int64", "int64"),
    ("arr_tuple", [np.array([1, 2]), (3, 4)], "int64", "int64"),
    ("f32arr_intlist", [np.ones(2, np.float32), [3, 4]], "float32", "float32"),
    ("i32arr_floatlist", [np.zeros(2, "i4"), [1.5, 2.5]], "float32", "float32"),
    ("np_scalar_arr0d", [np.int64(3), np.array(4)], "int64", "int64"),
    ("pyint_arr0d", [3, np.array(4)], "int64", "int64"),
    # A complex result keeps a float64's precision; integers never widen it.
    ("c64_f64", [np.zeros(2, "c8"), np.ones(2, "f8")], "complex128", "complex128"),
    ("np_c64_np_f64", [np.complex64(1 + 1j), np.float64(2.5)], "complex128", "complex128"),
    ("arr0d_f64_pycomplex", [np.array(2.5), 1 + 1j], "complex128", "complex128"),
    ("c64_i64", [np.zeros(2, "c8"), np.ones(2, "i8")], "complex64", "complex64"),
    ("c64_f16", [np.zeros(2, "c8"), np.ones(2, "f2")], "complex64", "complex64"),
    # A Python complex after other numbers: torch.tensor(batch) infers complex64.
    ("pyint_pycomplex", [1, 2 + 1j], "complex64", "complex64"),
    ("bool_pycomplex", [True, 1j], "complex64", "complex64"),
    ("np_u8_pycomplex", [np.uint8(3), 1j], "complex64", "complex64"),
    # Beside an array, a Python float is torch.as_tensor'ed to float32 first:
    # its value is rounded to float32 before the stack widens it (the values
    # are compared below).
    ("f64arr0d_pyfloat", [np.array(1.0), 2.123456789012345], "float64", "float64"),
    ("f64arr_floatlist", [np.zeros(2), [0.1, 2.123456789012345]], "float64", "float64"),
    ("c128arr0d_pycomplex", [np.array(1 + 1j), 0.1 + 2.123456789012345j], "complex128",
     "complex128"),
    # Past int64 beside a float: the batch is float32, no overflow.
    ("bigint_float", [2**63 + 5, 0.5], "float32", "float32"),
    ("u16_u16", [np.zeros(2, "u2"), np.ones(2, "u2")], "uint16", "uint16"),
]


@pytest.mark.parametrize("case", MIXED_PROMOTION, ids=[c[0] for c in MIXED_PROMOTION])
def test_mixed_dtypes_vs_torch(torch, case):
    _, batch, torch_dtype, our_dtype = case
    theirs = torch_collate(torch, batch).numpy()
    assert theirs.dtype == np.dtype(torch_dtype), "torch's behaviour changed: update the table"
    ours = default_collate(batch)
    assert ours.dtype == np.dtype(our_dtype) == theirs.dtype
    assert ours.shape == theirs.shape
    np.testing.assert_array_equal(ours, theirs.astype(ours.dtype))


def test_mixed_dtypes_in_later_samples_with_shapes():
    batch = [np.full((2, 2), 200, "u1"), np.full((2, 2), -1.5, "f4"), np.full((2, 2), 7, "i2")]
    ours = default_collate(batch)
    assert ours.dtype == np.float32
    np.testing.assert_array_equal(ours, np.stack([b.astype("f4") for b in batch]))
    with pytest.raises(RuntimeError, match=r"\(3,\) at batch\[2\]"):
        default_collate([np.zeros(2, "u1"), np.zeros(2, "f4"), np.zeros(3, "f4")])


def test_mixed_dtypes_leave_other_leaves_intact():
    batch = [{"a": np.arange(3, dtype="u1"), "b": [i, 2 * i], "c": f"s{i}",
              "d": np.full(4, i, "i8")} for i in range(3)]
    batch[2]["a"] = np.arange(3, dtype="f8") + 0.5   # forces a re-plan of the buffer
    ours = default_collate(batch)
    assert ours["a"].dtype == np.float64
    np.testing.assert_array_equal(ours["a"], [[0, 1, 2], [0, 1, 2], [0.5, 1.5, 2.5]])
    np.testing.assert_array_equal(ours["b"][1], [0, 2, 4])
    assert ours["c"] == ["s0", "s1", "s2"]
    np.testing.assert_array_equal(ours["d"], [[0] * 4, [1] * 4, [2] * 4])
    _assert_one_buffer(ours)


def test_np_float64_after_python_int_keeps_float64(torch):
    # torch gives float64 (np.float64 is a numpy scalar), not its default
    # float32, which a Python float after a Python int would get.
    batch = [1, np.float64(0.1)]
    theirs = torch_collate(torch, batch).numpy()
    assert theirs.dtype == np.float64
    ours = default_collate(batch)
    assert ours.dtype == np.float64
    assert ours[1] == 0.1


@pytest.mark.parametrize("batch,values", [
    ([np.int8(1), 300], [1, 300]),
    ([np.uint8(1), -1], [1, -1]),
    ([np.float16(1), 1e6], [1, 1e6]),
])
def test_numpy_scalar_then_python_number_keeps_values(torch, batch, values):
    # BUG: ours promotes with np.result_type(np.int8(1), 300) == int8 (NEP 50
    # treats Python numbers as "weak"), then `out[i] = array` wraps silently:
    # [np.int8(1), 300] -> int8 [1, 44]; [np.float16(1), 1e6] -> [1, inf].
    # torch: int64 [1, 300] / float32 [1, 1e6].
    theirs = torch_collate(torch, batch).numpy()
    np.testing.assert_array_equal(theirs, values)
    ours = default_collate(batch)
    np.testing.assert_array_equal(ours, values)


def test_mixed_scalars_with_huge_int_follow_torch(torch):
    # torch.tensor([1, 2.5, 2**70]) is a float32 tensor; ours raised TypeError
    # (np.asarray(2**70) is an object array in _fill_cast).
    batch = [1, 2.5, 2**70]
    theirs = torch_collate(torch, batch).numpy()
    ours = default_collate(batch)
    assert ours.dtype == theirs.dtype
    np.testing.assert_array_equal(ours, theirs)


# --------------------------------------------------------------------------
# Containers.
# --------------------------------------------------------------------------

def test_tuple_becomes_list_and_namedtuple_stays():
    out = default_collate([(1, Point(2, 3.0)), (4, Point(5, 6.0))])
    assert type(out) is list and type(out[1]) is Point
    assert out[1].x.tolist() == [2, 5] and out[1].y.dtype == np.float64


def test_mapping_key_order_is_the_first_samples():
    batch = [{"b": 1, "a": 2, "c": 3}, {"c": 30, "a": 20, "b": 10, "extra": 0}]
    out = default_collate(batch)
    assert list(out) == ["b", "a", "c"]
    assert out["b"].tolist() == [1, 10] and out["c"].tolist() == [3, 30]


def test_defaultdict_factory_survives_and_samples_untouched():
    batch = [collections.defaultdict(int, {"x": np.arange(2) + i}) for i in range(2)]
    snapshot = copy.deepcopy(batch)
    out = default_collate(batch)
    assert type(out) is collections.defaultdict and out.default_factory is int
    assert out["missing"] == 0
    for sample, before in zip(batch, snapshot):
        assert list(sample) == list(before)
        np.testing.assert_array_equal(sample["x"], before["x"])


def test_custom_mutable_mapping_sharing_storage(torch):
    # BUG: MappingNode.__init__ (collate/layout.py) builds its template with
    # copy.copy(elem).clear().  For a MutableMapping whose copy shares its
    # storage (any wrapper class: copy.copy is shallow) that clears the
    # user's first sample, and collation then fails with a nonsensical
    # "batch[0] has no item 'x', but batch[0] does".  torch collates it.
    def make():
        return [StoreMap({"x": i, "y": np.full(2, i, "f4")}) for i in range(3)]

    theirs = torch_collate(torch, make())
    batch = make()
    out = default_collate(batch)
    assert list(batch[0]) == ["x", "y"], "default_collate emptied the caller's sample"
    assert isinstance(out, StoreMap)
    assert_same_as_torch(out, theirs)


def test_strings_inside_sequences_match_torch_container(torch):
    # torch returns a batch of strings as it gets it, and inside a sequence
    # that is a tuple from zip(*batch): [("a", 1), ("b", 2)] ->
    # [("a", "b"), tensor([1, 2])].  Code doing `names + ["x"]` or
    # `isinstance(names, tuple)` would see a list there.
    batch = [("a", 1), ("b", 2)]
    theirs = torch_collate(torch, batch)
    ours = default_collate(batch)
    assert type(ours[0]) is type(theirs[0])
    assert ours[0] == theirs[0]


def test_top_level_and_dict_strings_are_lists(torch):
    assert default_collate(["a", "b"]) == ["a", "b"]
    out = default_collate([{"s": "a"}, {"s": b"b"}])
    assert out == {"s": ["a", b"b"]}
    assert type(torch_collate(torch, [{"s": "a"}, {"s": "b"}])["s"]) is list


def test_str_then_other_types_are_carried_as_is():
    # torch's collate_str_fn returns the batch untouched, whatever follows.
    assert default_collate(["a", 1, None]) == ["a", 1, None]


def test_numpy_str_scalars_stay_strings():
    out = default_collate([np.str_("x"), np.str_("y")])
    assert out == ["x", "y"] and type(out[0]) is np.str_


STRING_BATCHES = {
    "list": lambda: ["a.jpg", "b.jpg"],
    "tuple-from-zip": lambda: tuple(zip(*[("a.jpg", 0), ("b.jpg", 1)]))[0],
    "str-sample": lambda: "ab",
    "bytes-tuple": lambda: (b"x", b"y"),
    "list-subclass": lambda: MyList(["a", "b"]),
    "deque": lambda: collections.deque(["a", "b"]),
    "custom-sequence": lambda: ROSeq(["a", "b"]),
    "str-array": lambda: np.array(["a", "b"]),
    "object-array": lambda: np.array(["a", 1], dtype=object),
    "str-then-others": lambda: ("a", 1, None),
    "numpy-str": lambda: (np.str_("a"), np.str_("b")),
    "mapping-with-key-0": lambda: {0: "a", 1: "b"},
}


@pytest.mark.parametrize("name", sorted(STRING_BATCHES))
def test_a_batch_of_strings_is_returned_as_it_is_as_torchs(torch, name):
    # torch looks at batch[0]: a str or bytes there, and its collate_str_fn
    # returns the batch object itself, whatever holds the strings.
    batch = STRING_BATCHES[name]()
    assert torch.utils.data.default_collate(batch) is batch
    assert default_collate(batch) is batch


@pytest.mark.parametrize("make", [lambda: (x for x in [1, 2]), lambda: iter([1, 2]),
                                  lambda: {1, 2}, lambda: {"a": "x"}.values(), lambda: 5,
                                  lambda: None, lambda: (s for s in ["a", "b"])],
                         ids=["generator", "iterator", "set", "dict-values", "int", "none",
                              "generator-of-str"])
def test_a_batch_that_cannot_be_indexed_is_torchs_type_error(torch, make):
    # torch's first step is batch[0].
    with pytest.raises(TypeError):
        torch.utils.data.default_collate(make())
    with pytest.raises(TypeError, match="not subscriptable"):
        default_collate(make())


@pytest.mark.parametrize("make", [lambda: np.array(5), lambda: np.array(1.5, "f4")],
                         ids=["int", "float32"])
def test_a_0d_array_as_the_batch_is_torchs_index_error(torch, make):
    # The DataLoader's batch_size=None with collate_fn=default_collate, on a
    # dataset of 0-d arrays: torch's batch[0] of a 0-d tensor is an IndexError.
    with pytest.raises(IndexError):
        torch.utils.data.default_collate(torch.as_tensor(make()))
    with pytest.raises(IndexError) as info:
        default_collate(make())
    assert "0-dimensional" in str(info.value)
    assert "takes a sequence of samples" in "".join(info.value.__notes__)
    with pytest.raises(IndexError):
        default_collate(torch.tensor(5))


@pytest.mark.parametrize("make", [lambda: b"ab", lambda: np.bytes_(b"ab")],
                         ids=["bytes", "np.bytes_"])
def test_bytes_as_the_batch_is_torchs_type_error(torch, make):
    # batch[0] of bytes is an int, and torch.tensor(bytes) refuses bytes
    # (a bytearray it takes, as a sequence of ints).
    with pytest.raises(TypeError, match="invalid data type"):
        torch.utils.data.default_collate(make())
    with pytest.raises(TypeError, match="invalid data type"):
        default_collate(make())
    assert_same_as_torch(default_collate(bytearray(b"ab")),
                         torch.utils.data.default_collate(bytearray(b"ab")))


@pytest.mark.parametrize("name", ["int", "float", "array", "dict", "tuple", "namedtuple", "str"])
@pytest.mark.parametrize("outer", [tuple, MyList, collections.deque, ROSeq],
                         ids=lambda t: t.__name__)
def test_any_sequence_of_samples_collates_as_torchs(torch, name, outer):
    batch = outer([STRUCTURES[name](i) for i in range(3)])
    assert_same_as_torch(default_collate(batch), torch.utils.data.default_collate(batch))


@pytest.mark.parametrize("outer", [collections.deque, ROSeq,
                                   lambda t: np.array(t + [None], object)[:2]],
                         ids=["deque", "custom-sequence", "object-array"])
def test_tensors_in_another_sequence_than_a_list_or_tuple_fail_as_torch_stack(torch, outer):
    batch = outer([torch.ones(2), torch.zeros(2)])
    with pytest.raises(TypeError, match="must be tuple of Tensors"):
        torch.utils.data.default_collate(batch)
    with pytest.raises(TypeError, match="must be tuple of Tensors"):
        default_collate(batch)
    assert torch.equal(default_collate(MyList([torch.ones(2), torch.zeros(2)])),
                       torch.stack([torch.ones(2), torch.zeros(2)]))


STRING_DATASETS = {
    # batch_size=None, collate_fn=default_collate: each sample is a "batch"
    "str-samples-unbatched": (["ab", "cd", "ef"], None),
    "tuple-of-str-samples-unbatched": ([("a.jpg", "b.jpg"), ("c.jpg", "d.jpg")], None),
    "list-of-str-samples-unbatched": ([["a.jpg", "b.jpg"], ["c.jpg", "d.jpg"]], None),
    # auto-batching
    "str-samples": (["ab", "cd", "ef", "gh"], 2),
    "tuple-of-str-samples": ([("a.jpg", "cat"), ("b.jpg", "dog"), ("c.jpg", "cow")], 2),
    "dict-with-str-samples": ([{"name": f"n{i}", "y": i} for i in range(4)], 2),
}


@pytest.mark.timeout(120)
@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("name", sorted(STRING_DATASETS))
def test_a_dataset_of_strings_loads_as_torchs(torch, name, num_workers):
    samples, batch_size = STRING_DATASETS[name]
    theirs = list(torch.utils.data.DataLoader(samples, batch_size=batch_size,
                                              collate_fn=torch.utils.data.default_collate))
    ours = list(fastload.DataLoader(samples, batch_size=batch_size, num_workers=num_workers,
                                    collate_fn=default_collate))
    assert_same_as_torch(ours, theirs)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.parametrize("sample,expected", [(np.array(5), IndexError), (b"ab", TypeError)],
                         ids=["0-d-array", "bytes"])
def test_unbatched_samples_default_collate_refuses_fail_as_torchs(torch, sample, expected,
                                                                   num_workers):
    with pytest.raises(expected):
        list(torch.utils.data.DataLoader([sample], batch_size=None,
                                         collate_fn=torch.utils.data.default_collate))
    with pytest.raises(expected):
        list(fastload.DataLoader([sample], batch_size=None, num_workers=num_workers,
                                 collate_fn=default_collate))


def test_samples_holding_tensors_give_torchs_batch_of_tensors(torch):
    # A dataset written for torch: its numbers and numpy arrays become tensors
    # too, as in torch's batch, not numpy arrays beside the tensors.
    class Boxes(torch.Tensor):  # a subclass, as torchvision's tv_tensors are (ours comes
        pass                    # back a plain tensor, with the same values)

    samples = [(torch.full((2,), float(i)), i, {"n": np.int32(i), "a": np.ones(3) * i, "s": "x",
                                                "f": 0.5 * i, "box": torch.ones(4).as_subclass(Boxes)})
               for i in range(4)]
    ours = default_collate(samples)
    assert_same_as_torch(ours, torch.utils.data.default_collate(samples), tensors=True)
    assert ours[2]["s"] == ["x"] * 4
    # Numpy samples stay numpy.
    plain = default_collate([(np.ones(2), i) for i in range(3)])
    assert all(isinstance(leaf, np.ndarray) for leaf in plain)


@pytest.mark.parametrize("first,later", [
    ("int", "tensor-int64"), ("int", "tensor-uint8"), ("int", "tensor-float32"),
    ("int", "tensor-of-one"), ("bool", "tensor-int64"), ("float", "tensor-int32"),
    ("float", "tensor-float64"), ("np-int64", "tensor-int64"), ("np-float32", "tensor-float64"),
])
@pytest.mark.parametrize("num_workers", [0, 2])
def test_numbers_then_one_element_tensors_collate_as_torchs(torch, first, later, num_workers):
    # A label returned as a number by some samples and as torch.tensor(label)
    # by others: torch makes torch.tensor(batch) of them all.
    make = {"int": int, "bool": lambda i: bool(i % 2), "float": lambda i: i + 0.5,
            "np-int64": np.int64, "np-float32": np.float32,
            "tensor-int64": torch.tensor, "tensor-uint8": lambda i: torch.tensor(i, dtype=torch.uint8),
            "tensor-float32": lambda i: torch.tensor(i + 0.5),
            "tensor-float64": lambda i: torch.tensor(i + 0.5, dtype=torch.float64),
            "tensor-int32": lambda i: torch.tensor(i, dtype=torch.int32),
            "tensor-of-one": lambda i: torch.tensor([i])}
    samples = [{"x": np.zeros(2, np.float32), "y": make[first if i % 2 == 0 else later](i)}
               for i in range(4)]
    ours = list(fastload.DataLoader(samples, batch_size=4, num_workers=num_workers,
                                    output="torch"))[0]
    assert_same_as_torch(ours, torch.utils.data.default_collate(samples), tensors=True)


@pytest.mark.parametrize("which", ["all", "a-later-one"])
def test_samples_with_autograd_history_keep_it_in_the_batch_as_torchs(torch, which):
    # Rows of a parameter (an embedding the dataset indexes): torch's batch
    # is torch.stack of them, and gradients reach the parameter.
    def run(collate):
        weight = torch.nn.Parameter(torch.arange(12.0).reshape(6, 2))
        samples = [{"row": weight[i] if which == "all" or i == 2 else weight[i].detach(),
                    "label": i} for i in range(4)]
        batch = collate(samples)
        (batch["row"] * torch.arange(1.0, 5.0)[:, None]).sum().backward()
        return batch, weight.grad

    ours, our_grad = run(default_collate)
    theirs, their_grad = run(torch.utils.data.default_collate)
    assert ours["row"].requires_grad and ours["row"].grad_fn is not None
    assert torch.equal(ours["row"].detach(), theirs["row"].detach())
    assert torch.equal(ours["label"], theirs["label"])
    assert torch.equal(our_grad, their_grad)


@pytest.mark.filterwarnings("ignore:torch.quantize_per_tensor", "ignore:TypedStorage is deprecated")
@pytest.mark.parametrize("num_workers", [0, 2])
def test_quantized_tensors_are_stacked_by_torch(torch, num_workers, no_leaks):
    # Their bytes alone (a uint8 view) lose the scale and zero point.
    samples = [torch.quantize_per_tensor(torch.tensor([1.0, 2.0 * i]), 0.5, 1, torch.quint8)
               for i in range(4)]
    ours, = fastload.DataLoader(samples, batch_size=4, num_workers=num_workers)
    theirs = torch.utils.data.default_collate(samples)
    assert ours.is_quantized and (ours.q_scale(), ours.q_zero_point()) == (0.5, 1)
    assert torch.equal(ours.dequantize(), theirs.dequantize())


@pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors")
@pytest.mark.parametrize("kind", ["nested", "sparse"])
def test_nested_and_sparse_tensors_are_refused_with_torchs_errors(torch, kind):
    make = {"nested": lambda i: torch.nested.nested_tensor([torch.zeros(i + 1)]),
            "sparse": lambda i: torch.eye(2).to_sparse()}[kind]
    samples = [{"x": make(i)} for i in range(2)]
    with pytest.raises(RuntimeError) as theirs:
        torch.utils.data.default_collate(samples)
    with pytest.raises(RuntimeError) as ours:
        default_collate(samples)
    assert str(ours.value) == str(theirs.value)
    assert str(ours.value).startswith(f"Batches of {kind} tensors are not currently supported")


@pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors")
@pytest.mark.timeout(60)
def test_a_custom_collate_returning_nested_tensors_works_with_workers(torch, no_leaks):
    # A nested tensor is no plain strided tensor: it rides pickled, not in the ring.
    def nest(samples):
        return torch.nested.nested_tensor([torch.arange(float(len(s))) for s in samples])

    samples = [[0] * (i + 1) for i in range(4)]
    for num_workers in (0, 2):
        batches = list(fastload.DataLoader(samples, batch_size=2, collate_fn=nest,
                                           num_workers=num_workers))
        assert [[t.tolist() for t in b.unbind()] for b in batches] == \
            [[[0.0], [0.0, 1.0]], [[0.0, 1.0, 2.0], [0.0, 1.0, 2.0, 3.0]]]


@pytest.mark.filterwarnings("ignore:torch.quantize_per_tensor",
                            "ignore:The PyTorch API of nested tensors")
@pytest.mark.parametrize("kind", ["meta", "quantized", "nested"])
def test_a_later_tensor_of_another_kind_fails_as_torch_stack_does(torch, kind):
    make = {"meta": lambda: torch.zeros(2, device="meta"),
            "quantized": lambda: torch.quantize_per_tensor(torch.zeros(2), 0.5, 1, torch.quint8),
            "nested": lambda: torch.nested.nested_tensor([torch.zeros(2)])}[kind]
    samples = [torch.zeros(2), make()]
    with pytest.raises(Exception) as theirs:
        torch.utils.data.default_collate(samples)
    with pytest.raises(Exception) as ours:
        default_collate(samples)
    assert type(ours.value) is type(theirs.value)
    assert str(ours.value) == str(theirs.value)


@pytest.mark.parametrize("first", [2.5, np.float32(2.5), np.array(2.5)], ids=repr)
@pytest.mark.parametrize("dtype", ["bfloat16", "float8_e4m3fn"])
def test_a_tensor_of_a_dtype_numpy_lacks_beside_numbers_is_named(torch, first, dtype):
    # torch converts it with the numbers; fastload cannot promote a dtype
    # numpy lacks, and says which sample and what to do (it crashed before).
    samples = [first, torch.tensor(0.5, dtype=getattr(torch, dtype))]
    with pytest.raises(TypeError, match=rf"default_collate: batch\[1\] is a torch\.{dtype} "
                                        r"tensor, but batch\[0\] is .*e\.g\. tensor\.float"):
        default_collate(samples)


def test_a_number_then_a_tensor_of_several_elements_fails_as_torchs(torch):
    samples = [0, torch.tensor([1, 2])]
    with pytest.raises(TypeError, match=r"batch\[1\] is Tensor"):  # torch's type
        default_collate(samples)
    with pytest.raises(TypeError):
        torch.utils.data.default_collate(samples)


@pytest.mark.parametrize("dtypes", [("bfloat16", "bfloat16"), ("float8_e4m3fn", "float8_e4m3fn"),
                                    ("float32", "float64"), ("int64", "float32"),
                                    ("bfloat16", "float32"), ("float32", "bfloat16"),
                                    ("bfloat16", "float16")])
@pytest.mark.parametrize("num_workers", [0, 2])
def test_tensors_of_any_dtype_stack_and_promote_as_torchs_do(torch, dtypes, num_workers):
    # bfloat16 and the float8s have no numpy dtype: their bytes travel as
    # unsigned ints and come back as the torch dtype.  Mixed dtypes promote
    # with torch's rules (an int64 sample beside a float32 one is not truncated).
    samples = [(torch.tensor([1.5, -2.0, 2.5]) * (i + 1)).to(getattr(torch, dtypes[i % 2]))
               for i in range(4)]
    ours = list(fastload.DataLoader(samples, batch_size=4, num_workers=num_workers))[0]
    theirs = torch.utils.data.default_collate(samples)
    assert isinstance(ours, torch.Tensor) and ours.dtype == theirs.dtype
    assert torch.equal(ours, theirs)


@pytest.mark.parametrize("view", ["conj", "neg"])
@pytest.mark.parametrize("num_workers", [0, 2])
def test_lazily_conjugated_or_negated_tensors_collate_and_travel_as_torchs(torch, view, num_workers):
    # conj() of a complex tensor (and .imag of that) only set a bit that
    # numpy() refuses; torch's collate stacks their values.
    def make(i):
        tensor = torch.tensor([1.0 + 2.0j, float(i) - 1.0j])
        return tensor.conj() if view == "conj" else tensor.conj().imag

    samples = [make(i) for i in range(4)]
    assert samples[0].is_conj() if view == "conj" else samples[0].is_neg()
    ours = list(fastload.DataLoader(samples, batch_size=4, num_workers=num_workers))[0]
    assert torch.equal(ours, torch.utils.data.default_collate(samples))
    # A custom collate_fn's tensor: returned as it is, or moved through the ring.
    packed = list(fastload.DataLoader(samples, batch_size=4, num_workers=num_workers,
                                      collate_fn=lambda batch: {"t": batch[1]}))[0]["t"]
    assert torch.equal(packed, samples[1])


def test_empty_batch_raises_index_error_as_torch(torch):
    with pytest.raises(IndexError, match="empty batch"):
        default_collate([])
    with pytest.raises(IndexError):
        torch.utils.data.default_collate([])


# --------------------------------------------------------------------------
# Errors: torch's type, plus the path.
# --------------------------------------------------------------------------

def _torch_error(torch, batch):
    try:
        torch_collate(torch, batch)
    except Exception as exc:  # noqa: BLE001
        return exc
    raise AssertionError("torch did not raise")


def test_shape_mismatch_names_path_and_shapes(torch):
    batch = [{"image": np.zeros((3, 4), "f4"), "y": i} for i in range(5)]
    batch[3]["image"] = np.zeros((3, 5), "f4")
    with pytest.raises(type(_torch_error(torch, batch))) as info:
        default_collate(batch)
    assert isinstance(info.value, RuntimeError)
    msg = str(info.value)
    assert "batch[3]['image']" in msg
    assert "(3, 5)" in msg and "(3, 4)" in msg


def test_shape_mismatch_ndim_and_nested_sequence_path():
    batch = [[0, (np.zeros(2), "s")], [1, (np.zeros((2, 1)), "t")]]
    with pytest.raises(RuntimeError, match=r"\(2,\) at batch\[0\]\[1\]\[0\] and \(2, 1\) at "
                                           r"batch\[1\]\[1\]\[0\]"):
        default_collate(batch)


SHAPE_MISMATCHES = {
    "arrays": lambda torch: [{"image": np.zeros((3, 4), "f4")}, {"image": np.zeros((3, 5), "f4")}],
    "promoted-arrays": lambda torch: [{"image": np.zeros((3, 4), "u1")},
                                      {"image": np.zeros((3, 5), "f4")}],
    "later-promoted-arrays": lambda torch: [{"image": np.zeros((3, 4), "u1")},
                                            {"image": np.zeros((3, 4), "f4")},
                                            {"image": np.zeros((3, 5), "f4")}],
    "tensors": lambda torch: [{"image": torch.zeros(3, 4)}, {"image": torch.zeros(3, 5)}],
}


@pytest.mark.parametrize("name", sorted(SHAPE_MISMATCHES))
def test_shape_mismatch_says_what_torch_stack_says(torch, name):
    batch = SHAPE_MISMATCHES[name](torch)
    phrase = "stack expects each tensor to be equal size"
    assert phrase in str(_torch_error(torch, batch))
    with pytest.raises(RuntimeError) as info:
        default_collate(batch)
    msg = str(info.value)
    assert msg.startswith(phrase)
    assert "(3, 4) at batch[0]['image']" in msg
    assert f"(3, 5) at batch[{len(batch) - 1}]['image']" in msg


TWO_FAULTS = {
    # A later sample lacks a key and has another shape: torch meets whichever
    # comes first in the first sample's key order.
    "missing-key-first": [{"name": "a", "image": np.zeros(3)}, {"name": "b", "image": np.zeros(3)},
                          {"image": np.zeros(4)}],
    "shape-first": [{"image": np.zeros(3), "name": "a"}, {"image": np.zeros(3), "name": "b"},
                    {"image": np.zeros(4)}],
    "missing-key-before-a-refused-leaf": [{"a": 1, "b": None}, {"b": None}],
    "unequal-lengths-before-a-refused-leaf": [{"s": [1, 2], "n": None}, {"s": [1], "n": None}],
    "shape-before-unequal-lengths": [{"x": np.zeros(2), "s": [1, 2]}, {"x": np.zeros(3), "s": [1]}],
    "missing-key-after-unequal-lengths": [{"s": [1, 2]}, {"s": [1]}, {}],
    "missing-key-before-unequal-lengths": [{"n": "a", "s": [1, 2]}, {"s": [1]}],
    "missing-key-before-tensor-shape": [{"n": "a", "t": "T3"}, {"n": "b", "t": "T3"}, {"t": "T4"}],
    # torch gathers a key from every sample before it looks inside: a later
    # sample lacking it outright fails before an earlier one whose item has no key below.
    "shallow-missing-key-after-deep-one": [{"a": {"b": 1}}, {"a": 5}, {}],
    # torch makes a tensor of every value before it stacks them.
    "str-after-a-shape-mismatch": [np.zeros(2), np.zeros(3), "ab"],
    "overflow-after-a-promoted-shape-mismatch": [np.zeros(2, "u1"), np.zeros(2, "f4"),
                                                 np.zeros(3, "f4"), 2**70],
    "str-in-a-dict-after-a-shape-mismatch": [{"x": np.zeros(2)}, {"x": np.zeros(3)}, {"x": "s"}],
}


def _with_tensors(torch, batch):
    """``batch`` with each "T<n>" a tensor of n zeros."""
    if isinstance(batch, dict):
        return {key: _with_tensors(torch, value) for key, value in batch.items()}
    if isinstance(batch, list):
        return [_with_tensors(torch, value) for value in batch]
    if isinstance(batch, str) and batch.startswith("T"):
        return torch.zeros(int(batch[1:]))
    return batch


@pytest.mark.parametrize("name", sorted(TWO_FAULTS))
def test_of_two_faults_the_one_torch_meets_first_is_raised(torch, name):
    batch = _with_tensors(torch, TWO_FAULTS[name])
    theirs = _torch_error(torch, batch)
    with pytest.raises(type(theirs)) as info:
        default_collate(batch)
    # The same fault, not only the same type: torch's KeyError names the key,
    # its other errors start with their own phrase.
    ours = str(info.value)
    if isinstance(theirs, KeyError):
        assert isinstance(info.value, KeyError) and f"has no item {theirs.args[0]!r}" in ours
    elif "stack expects" in str(theirs):
        assert ours.startswith("stack expects")
    elif "each element in list of batch" in str(theirs):
        assert ours.startswith("each element in list of batch")
    elif "default_collate: batch must contain" in str(theirs):
        assert ours.startswith(ERR_START)
    else:
        assert "stack expects" not in ours and "each element" not in ours


@pytest.mark.parametrize("name", sorted(TWO_FAULTS))
@pytest.mark.parametrize("num_workers", [0, 2])
@pytest.mark.timeout(120)
def test_of_two_faults_a_worker_raises_the_one_torch_meets_first(torch, name, num_workers):
    batch = _with_tensors(torch, TWO_FAULTS[name])
    expected = type(_torch_error(torch, batch))
    with pytest.raises(expected):
        list(fastload.DataLoader(batch, batch_size=len(batch), num_workers=num_workers))


def test_missing_key_raises_keyerror_naming_sample(torch):
    batch = [{"a": 1, "b": 2}, {"a": 1, "b": 2}, {"a": 3}]
    assert isinstance(_torch_error(torch, batch), KeyError)
    with pytest.raises(KeyError) as info:
        default_collate(batch)
    assert "batch[2]" in str(info.value) and "'b'" in str(info.value)


def test_missing_nested_key_names_sample_path():
    batch = [{"m": {"k": "v", "n": 1}}, {"m": {"k": "w"}}]
    with pytest.raises(KeyError) as info:
        default_collate(batch)
    assert "batch[1]['m']" in str(info.value) and "'n'" in str(info.value)


@pytest.mark.parametrize("batch,where", [
    ([[1, 2], [1]], "batch[1]"),
    ([{"s": [1, 2]}, {"s": [1, 2]}, {"s": [1, 2, 3]}], "batch[2]['s']"),
    ([(1, [2, 3]), (1, [2])], "batch[1][1]"),
])
def test_unequal_lengths(torch, batch, where):
    assert isinstance(_torch_error(torch, batch), RuntimeError)
    with pytest.raises(RuntimeError) as info:
        default_collate(batch)
    msg = str(info.value)
    assert msg.startswith("each element in list of batch should be of equal size")
    assert where in msg


@pytest.mark.parametrize("bad", [None, object(), {1, 2}, frozenset(), 1j, Ellipsis],
                         ids=["none", "object", "set", "frozenset", "complex", "ellipsis"])
def test_unsupported_type_top_level(torch, bad):
    batch = [bad, bad]
    assert type(_torch_error(torch, batch)) is TypeError
    with pytest.raises(TypeError) as info:
        default_collate(batch)
    msg = str(info.value)
    assert msg.startswith(ERR_START)
    assert str(type(bad)) in msg and "batch[0]" in msg


def test_unsupported_type_nested_names_path(torch):
    batch = [{"x": 1, "meta": [0, None]}] * 2
    assert type(_torch_error(torch, batch)) is TypeError
    with pytest.raises(TypeError, match=r"^default_collate: batch must contain .*NoneType.*"
                                        r"batch\[0\]\['meta'\]\[1\]"):
        default_collate(batch)


@pytest.mark.parametrize("dtype", ["U3", "S3", "O"])
def test_string_and_object_arrays_raise(torch, dtype):
    batch = [np.array(["a", "b"], dtype=dtype)] * 2
    assert type(_torch_error(torch, batch)) is TypeError
    with pytest.raises(TypeError) as info:
        default_collate([{"k": b} for b in batch])
    assert str(info.value).startswith(ERR_START)
    assert "batch[0]['k']" in str(info.value)


def test_structured_with_object_field_raises_naming_path():
    # Ours raised numpy's bare "Cannot change data-type for array of
    # references" from ArraySlot.view: _plan_node only screens dtype.str with
    # [SaUO], and a structured dtype's str is "|V16" even with an object
    # field.  It must not be memcpy'd either way (no refcounts taken).
    dt = np.dtype([("obj", "O"), ("v", "f8")])
    batch = [{"rec": np.array([(object(), 1.0)], dtype=dt)} for _ in range(2)]
    with pytest.raises(TypeError) as info:
        default_collate(batch)
    assert "batch[0]['rec']" in str(info.value)


def test_structured_with_object_field_never_copies_references():
    class Tracked:
        pass

    dt = np.dtype([("obj", "O"), ("v", "f8")])
    keep = [Tracked() for _ in range(2)]
    refs = [weakref.ref(k) for k in keep]
    batch = [np.array([(keep[i], 1.0)], dtype=dt) for i in range(2)]
    with pytest.raises(TypeError):
        default_collate(batch)
    del batch, keep
    assert all(r() is None for r in refs)


@pytest.mark.parametrize("batch,where", [
    ([2**70, 1], "batch[0]"),
    ([{"n": 1}, {"n": -(2**64)}], "batch[1]['n']"),
    ([1, 2**63], "batch[1]"),
    # Past float64: torch's OverflowError, where the batch is floating.
    ([{"x": 1.0}, {"x": 10**400}], "batch[1]['x']"),
    ([10**400, 1.0], "batch[0]"),
    ([np.float32(1), 10**400], "batch[1]"),
    ([np.array(1.0), 10**400], "batch[1]"),  # each value its own tensor: int64
])
def test_int_overflow_names_path(torch, batch, where):
    # torch's type (ValueError past int64, OverflowError past float64), and the path.
    expected = type(_torch_error(torch, batch))
    with pytest.raises(Exception) as info:
        default_collate(batch)
    assert where in str(info.value)
    assert isinstance(info.value, expected), f"ours {type(info.value)}, torch {expected}"


def test_int64_bounds_are_fine():
    out = default_collate([2**63 - 1, -(2**63)])
    assert out.dtype == np.int64 and out.tolist() == [2**63 - 1, -(2**63)]


def test_type_change_across_samples_names_path():
    with pytest.raises(TypeError, match=r"batch\[1\]\['x'\]"):
        default_collate([{"x": np.zeros(2)}, {"x": "oops"}])
    with pytest.raises(TypeError, match=r"batch\[2\]"):
        default_collate([1, 2, "three"])


@pytest.mark.parametrize("batch", [
    [np.zeros(2, "u1"), np.zeros(2, "f4"), [1, 2]],
    [np.zeros((), "u1"), np.zeros((), "f4"), 3],
    [np.zeros(2, "u1"), np.zeros(2, "u1"), [1, 2]],
], ids=["dtype-change-then-list", "dtype-change-then-int", "list-after-arrays"])
def test_numbers_and_lists_after_arrays_are_stacked_as_torch(torch, batch):
    theirs = torch_collate(torch, batch).numpy()
    ours = default_collate(batch)
    assert ours.dtype == theirs.dtype and ours.shape == theirs.shape
    np.testing.assert_array_equal(ours, theirs)


@pytest.mark.parametrize("batch", [[1, 2.5, "x"], [np.int32(1), np.float32(2), "x"], [1, 2.5, [1]]],
                         ids=["str", "str-after-numpy", "list"])
def test_a_non_number_after_mixed_numbers_raises_typeerror_naming_it_as_torch(torch, batch):
    # The first two differ in type (a promotion); the one to blame is the third.
    with pytest.raises(TypeError):
        torch_collate(torch, batch)
    with pytest.raises(TypeError, match=r"batch\[2\] is (str|list)"):
        default_collate(batch)


@pytest.mark.parametrize("bad", [None, "ab", {"a": 1}, [1, "x"]], ids=repr)
def test_a_non_numeric_value_after_arrays_raises_typeerror_naming_it(bad):
    with pytest.raises(TypeError, match=r"batch\[2\]"):
        default_collate([np.zeros(2, "u1"), np.zeros(2, "f4"), bad])


@pytest.mark.parametrize("batch", [[1, None], [np.float32(1), object()], [np.zeros(2), None]],
                         ids=["none-after-int", "object-after-np-scalar", "none-after-array"])
def test_a_value_without_a_dtype_raises_torchs_runtimeerror_too(torch, batch):
    # torch: RuntimeError("Could not infer dtype of NoneType"); ours says where,
    # and is a TypeError as well.
    assert type(_torch_error(torch, batch)) is RuntimeError
    with pytest.raises(RuntimeError, match=r"batch\[1\] is (NoneType|object)") as info:
        default_collate(batch)
    assert isinstance(info.value, TypeError)


@pytest.mark.parametrize("batch", [
    [np.zeros(2, "u2"), np.zeros(2, "i4")],
    [np.zeros(2, "u4"), np.zeros(2, "?")],
    [np.zeros((), "u2"), 7],
    [np.uint16(1), np.uint8(2)],
    [{"k": np.zeros(2, "u8")}, {"k": np.zeros(2, "u1")}],
    [np.zeros(2, "c8"), np.zeros(2, "u2")],
    [np.zeros(2, "u2"), np.zeros(2, "u4")],
], ids=["u16-i32", "u32-bool", "u16-0d-pyint", "np-u16-u8", "nested-u64-u8", "c64-u16",
        "u16-u32"])
def test_wide_unsigned_ints_refuse_promotion_as_torch(torch, batch):
    assert "Promotion for uint16, uint32, uint64" in str(_torch_error(torch, batch))
    with pytest.raises(RuntimeError, match=r"Promotion for uint16, uint32, uint64 types is not "
                                           r"supported, attempted to promote u"):
        default_collate(batch)


def test_wide_unsigned_int_promotion_folds_in_sample_order_as_torch(torch):
    # torch folds its promotion over the samples in order: (bool, float32,
    # uint16) is float32, (bool, uint16, float32) meets bool and uint16 and fails.
    dtypes = ["bool", "int8", "uint8", "int64", "float16", "float32", "complex64", "uint16",
              "uint32", "uint64"]
    for combo in itertools.product(dtypes, repeat=3):
        batch = [np.ones(2, dtype) for dtype in combo]
        assert _dtype_or_refusal(default_collate, batch) == \
            _dtype_or_refusal(lambda b: torch_collate(torch, b), batch), combo


def _dtype_or_refusal(collate, batch) -> str:
    """The batch's dtype (torch's without its prefix), or "RuntimeError" if refused so."""
    try:
        return str(collate(batch).dtype).removeprefix("torch.")
    except RuntimeError:
        return "RuntimeError"


def test_numpy_scalar_promotion_stops_at_complex128_as_torch(torch):
    # A batch of numbers is one torch.as_tensor(batch), whose dtype inference
    # stops once it reaches complex128: a later uint16 is not refused.
    dtypes = ["int8", "int64", "float32", "complex64", "complex128", "uint16", "uint64"]
    compared = 0
    for combo in itertools.product(dtypes, repeat=3):
        batch = [np.ones((), dtype)[()] for dtype in combo]
        try:
            expected = _dtype_or_refusal(lambda b: torch_collate(torch, b), batch)
        except TypeError:  # torch refuses np.uint64 scalars; fastload takes them
            continue
        assert _dtype_or_refusal(default_collate, batch) == expected, combo
        compared += 1
    assert compared > 200


@pytest.mark.parametrize("batch", [[np.timedelta64(5, "s"), np.int64(3)],
                                   [np.array(np.timedelta64(5, "s")), np.array(True)],
                                   [np.zeros(2, "M8[s]"), np.zeros(2, "f4")]],
                         ids=["scalars", "0-d arrays", "arrays"])
def test_a_timedelta_or_datetime_beside_other_dtypes_is_torchs_type_error(torch, batch):
    with pytest.raises(TypeError):
        torch_collate(torch, batch)
    with pytest.raises(TypeError, match=r"batch\[0\] has dtype (timedelta64|datetime64)\[s\], "
                                        r"which cannot be promoted"):
        default_collate(batch)


@pytest.mark.parametrize("dtypes", [["u2", "f4", "c8", "u2"], ["u2", "f4", "c8"],
                                    ["b1", "f4", "u2", "b1"]], ids="-".join)
def test_a_dtype_met_again_meets_the_promotion_so_far_as_torch(torch, dtypes):
    # uint16 beside float32 is float32, but met again after a complex64 it
    # meets complex64, which torch refuses.
    batch = [np.ones(2, dtype) for dtype in dtypes]
    assert _dtype_or_refusal(default_collate, batch) == \
        _dtype_or_refusal(lambda b: torch_collate(torch, b), batch)


@pytest.mark.parametrize("batch", [{"x": np.zeros((2, 3)), "y": np.arange(2)}, {0: 5, 1: 6}],
                         ids=["columns", "int keys"])
def test_a_mapping_as_the_batch_is_not_collated_as_its_keys(torch, batch):
    # A __getitems__ returning a collated batch (a dict of columns) hands
    # default_collate a mapping: torch fails at its batch[0]; iterating it
    # would have collated the keys.
    with pytest.raises((KeyError, RuntimeError)):
        torch_collate(torch, batch)
    with pytest.raises((KeyError, TypeError)) as info:
        default_collate(batch)
    assert "takes a sequence of samples, got a dict" in "".join(
        [str(info.value), *getattr(info.value, "__notes__", [])])


@pytest.mark.parametrize("batch", [[np.False_, np.int64(5)], [5, np.True_]], ids=repr)
def test_numpy_bools_beside_integers_promote_where_torch_raises(torch, batch):
    with pytest.raises(TypeError):
        torch_collate(torch, batch)
    ours = default_collate(batch)
    assert ours.dtype == np.int64 and ours.tolist() == [int(v) for v in batch]


def test_wide_unsigned_ints_promote_to_floats_as_torch(torch):
    batch = [np.full(2, 60000, "u2"), np.ones(2, "f4")]
    theirs = torch_collate(torch, batch).numpy()
    ours = default_collate(batch)
    assert ours.dtype == theirs.dtype == np.float32
    np.testing.assert_array_equal(ours, theirs)


@pytest.mark.parametrize("batch", [[1.5, 2j], [1.5, np.array(1j)], [0.5, np.complex64(1j)]],
                         ids=["python", "0-d-array", "numpy-scalar"])
def test_a_complex_after_floats_raises_typeerror(torch, batch):
    # torch raises for the first two; for a numpy complex scalar it drops the
    # imaginary part with a warning, which ours never does silently.
    if not isinstance(batch[1], np.complex64):
        with pytest.raises(TypeError):
            torch_collate(torch, batch)
    with pytest.raises(TypeError, match=r"batch\[1\] is complex, but batch\[0\] is a float"):
        default_collate(batch)


@pytest.mark.parametrize("bad", [np.array(["a", "b"]), np.array([1], dtype=object)],
                         ids=["str", "object"])
def test_a_string_array_after_arrays_is_a_typeerror_whatever_its_shape(torch, bad):
    # torch turns each array into a tensor before it compares shapes.
    batch = [np.zeros(3), bad]
    assert type(_torch_error(torch, batch)) is TypeError
    with pytest.raises(TypeError, match=r"^default_collate: batch must contain .*\(at batch\[1\]\)"):
        default_collate(batch)


def test_an_empty_mapping_must_be_in_every_sample_as_torch(torch):
    batch = [{"c": {}, "x": 1}, {"x": 2}]
    assert isinstance(_torch_error(torch, batch), KeyError)
    with pytest.raises(KeyError, match=r"batch\[1\] has no item 'c'"):
        default_collate(batch)
    # Present but of another kind: torch looks no further than the first's keys.
    ours = default_collate([{"c": {}}, {"c": {"d": 1}}])
    assert_same_as_torch(ours, torch_collate(torch, [{"c": {}}, {"c": {"d": 1}}]))


@pytest.mark.parametrize("batch,pattern", [
    ([{"img": [1]}, {"img": 0}], r"batch\[1\]\['img'\] is int, but batch\[0\]\['img'\] is list"),
    ([{"a": 2**63}, {}], r"batch\[1\] has no item 'a'"),
], ids=["len-of-an-int", "missing-key-after-overflow"])
def test_errors_found_late_still_name_the_path(torch, batch, pattern):
    expected = type(_torch_error(torch, batch))
    with pytest.raises(expected, match=pattern):
        default_collate(batch)


# --------------------------------------------------------------------------
# default_convert.
# --------------------------------------------------------------------------

CONVERT_CASES = {
    "array": lambda: _arr(1),
    "array_fortran": lambda: np.asfortranarray(_arr(1, (3, 4))),
    "array_sliced": lambda: _arr(1, (6, 6))[::2, ::3],
    "array_0d": lambda: np.array(3.5),
    "matrix": lambda: np.matrix([[1, 2], [3, 4]]),
    "int": lambda: 3,
    "float": lambda: 2.5,
    "bool": lambda: True,
    "str": lambda: "s",
    "bytes": lambda: b"b",
    "none": lambda: None,
    "str_array": lambda: np.array(["a", "b"]),
    "dict": lambda: {"a": _arr(0), "b": [np.int32(3), "x"], "c": (1, 2.0)},
    "ordered": lambda: collections.OrderedDict(z=np.float32(1), a=_arr(2)),
    "defaultdict": lambda: collections.defaultdict(list, a=_arr(0)),
    "mapping_proxy": lambda: types.MappingProxyType({"a": _arr(0)}),
    "namedtuple": lambda: Point(_arr(0), np.float16(2)),
    "tuple": lambda: (np.int8(1), _arr(0), "s"),
    "list": lambda: [np.uint16(1), [np.bool_(True)]],
    "list_subclass": lambda: MyList([_arr(0), 1]),
    "custom_sequence": lambda: ROSeq([np.int64(1), 2]),
    **{f"scalar_{d}": (lambda d=d: np.dtype(d).type(1)) for d in DTYPES if d != "uint64"},
}


@pytest.mark.parametrize("name", sorted(CONVERT_CASES))
def test_convert_matches_torch(torch, name):
    data = CONVERT_CASES[name]()
    ours = default_convert(data)
    theirs = torch_convert(torch, data)
    if isinstance(theirs, np.ndarray):  # torch leaves string arrays alone
        assert ours is data
        return
    assert_same_as_torch(ours, theirs)


def test_convert_keeps_arrays_and_makes_scalars_0d():
    a = _arr(0)
    assert default_convert(a) is a
    out = default_convert(np.float16(1.5))
    assert isinstance(out, np.ndarray) and out.shape == () and out.dtype == np.float16
    out = default_convert(np.uint64(2**64 - 1))  # torch cannot; ours keeps it
    assert out.dtype == np.uint64 and int(out) == 2**64 - 1


def test_convert_does_not_mutate_input():
    data = {"a": [np.int32(1), (np.float32(2), "x")]}
    snapshot = repr(data)
    out = default_convert(data)
    assert repr(data) == snapshot
    assert isinstance(out["a"][0], np.ndarray) and type(out["a"][1]) is list


class LeafOnAccess(collections.abc.Mapping):
    """A sample that builds its array anew on every access (nothing else holds it)."""

    def __init__(self, i):
        if not isinstance(i, int):
            raise TypeError("a sample index")  # so the batch becomes a plain dict, as torch does
        self.i = i

    def __getitem__(self, key):
        if key != "x":
            raise KeyError(key)
        return np.full(1024, self.i, dtype=np.float32)

    def __iter__(self):
        return iter(["x"])

    def __len__(self):
        return 1


def test_leaves_built_on_access_are_copied_intact():
    # The kernel checks every leaf before copying any: each one must stay alive
    # until its copy, or later allocations would reuse its memory first.
    batch = default_collate([LeafOnAccess(i) for i in range(64)])
    assert batch["x"].shape == (64, 1024)
    assert (batch["x"] == np.arange(64, dtype=np.float32)[:, None]).all()


def test_contiguous_and_strided_samples_mixed_in_one_batch():
    rng = np.random.default_rng(3)
    samples = [rng.integers(0, 1000, (6, 8)).astype(np.int32) for _ in range(9)]
    mixed = [a if i % 3 else np.asfortranarray(a) for i, a in enumerate(samples)]
    mixed[4] = np.repeat(samples[4], 2, axis=0)[::2]
    assert_same(default_collate(mixed), np.stack(samples))


@pytest.mark.parametrize("rows", [1, 2, 3, 300])
def test_large_batches_of_contiguous_rows(rows):
    # 300 rows of 4 KiB: past the size where the copy loop runs without the GIL,
    # and longer than the prefetch distance; 1-3 rows: shorter than it.
    rng = np.random.default_rng(rows)
    source = rng.standard_normal((1000, 1024), dtype=np.float32)
    picks = rng.permutation(1000)[:rows]
    batch = default_collate([{"x": source[i], "y": int(i)} for i in picks])
    assert_same(batch["x"], source[picks])
    assert batch["y"].tolist() == picks.tolist()


# --------------------------------------------------------------------------
# Output buffer: one flat uint8 buffer, aligned, C-contiguous, writeable views.
# --------------------------------------------------------------------------

def _root(a: np.ndarray):
    while isinstance(a.base, np.ndarray):
        a = a.base
    return a


def _assert_one_buffer(batch):
    arrays = arrays_of(batch)
    assert arrays
    roots = {id(_root(a)) for a in arrays}
    assert len(roots) == 1, "arrays are not views of one buffer"
    root = _root(arrays[0])
    assert root.dtype == np.uint8 and root.ndim == 1
    start = root.__array_interface__["data"][0]
    spans = []
    for a in arrays:
        assert a.flags.c_contiguous and a.flags.writeable and a.flags.aligned
        assert a.base is not None and a.flags.owndata is False
        ptr = a.__array_interface__["data"][0]
        assert start <= ptr and ptr + a.nbytes <= start + root.nbytes
        assert ptr % a.dtype.alignment == 0
        spans.append((ptr, ptr + a.nbytes))
    spans.sort()
    for (_, end), (begin, _) in zip(spans, spans[1:]):
        assert end <= begin, "two leaves overlap in the buffer"


def test_output_views_share_one_buffer():
    batch = [{"img": _arr(i, (4, 4, 3), "u1").transpose(1, 0, 2), "y": i, "w": 0.5 * i,
              "flag": bool(i % 2), "s": np.float16(i), "c": np.complex128(i),
              "nest": [np.asfortranarray(_arr(i, (2, 3), "f8")), (np.int16(i), _arr(i, (1,), "?"))],
              "name": f"n{i}"} for i in range(5)]
    out = default_collate(batch)
    _assert_one_buffer(out)
    # Writing through one leaf touches neither the others nor the samples.
    before = {k: out[k].copy() for k in ("y", "w", "s", "c")}
    out["img"][...] = 255
    for key, value in before.items():
        np.testing.assert_array_equal(out[key], value)
    assert batch[0]["img"].max() < 255 or batch[0]["img"].size == 0
    np.testing.assert_array_equal(batch[2]["img"], _arr(2, (4, 4, 3), "u1").transpose(1, 0, 2))


def test_output_is_a_copy_of_the_samples():
    batch = [np.arange(4, dtype="f4") + i for i in range(3)]
    out = default_collate(batch)
    batch[0][:] = -1
    np.testing.assert_array_equal(out[0], [0, 1, 2, 3])


def test_empty_arrays_and_big_endian_views_are_well_formed():
    batch = [{"e": np.zeros((0, 4), "f8"), "b": _arr(i, (3,), ">i4"), "x": np.zeros(3, "c16")}
             for i in range(2)]
    out = default_collate(batch)
    assert out["e"].shape == (2, 0, 4)
    _assert_one_buffer({"b": out["b"], "x": out["x"]})
    assert out["e"].flags.c_contiguous and out["e"].flags.writeable


def test_single_array_batch_is_a_uint8_view():
    out = default_collate([np.ones(3, "f8")] * 2)
    _assert_one_buffer(out)


# --------------------------------------------------------------------------
# Hypothesis fuzz against a reference implementation of torch's rules.
# --------------------------------------------------------------------------

FUZZ_DTYPES = ["bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32",
               "float16", "float32", "float64", "complex64", "complex128"]
_NT_CACHE: dict = {}


def _namedtuple(n: int):
    if n not in _NT_CACHE:
        _NT_CACHE[n] = collections.namedtuple(f"NT{n}", [f"f{i}" for i in range(n)])
    return _NT_CACHE[n]


leaf_schemas = st.one_of(
    st.tuples(st.just("array"), st.sampled_from(FUZZ_DTYPES),
              hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=4),
              st.sampled_from(["c", "f", "step", "neg", "T"])),
    st.tuples(st.just("npscalar"), st.sampled_from(FUZZ_DTYPES)),
    st.just(("int",)),
    st.just(("float",)),
    st.just(("bool",)),
    st.just(("str",)),
)

schemas = st.recursive(
    leaf_schemas,
    lambda children: st.one_of(
        st.tuples(st.just("dict"), st.lists(st.tuples(st.text("abcxyz", min_size=1, max_size=3),
                                                      children),
                                            max_size=4, unique_by=lambda kv: kv[0])),
        st.tuples(st.just("list"), st.lists(children, max_size=4)),
        st.tuples(st.just("tuple"), st.lists(children, max_size=4)),
        st.tuples(st.just("nt"), st.lists(children, min_size=1, max_size=4)),
    ),
    max_leaves=10,
)


def _layout(array: np.ndarray, how: str) -> np.ndarray:
    """The same values, in a memory layout that is not plain C order."""
    if how == "f":
        return np.asfortranarray(array)
    if array.ndim == 0:
        return array
    if how == "step":
        return np.repeat(array, 2, axis=0)[::2]
    if how == "neg":
        return np.ascontiguousarray(array[::-1])[::-1]
    if how == "T":
        return np.ascontiguousarray(array.T).T
    return array


def draw_sample(draw, schema):
    kind = schema[0]
    if kind == "array":
        _, dtype, shape, how = schema
        array = draw(hnp.arrays(dtype, shape))
        return _layout(array, how)
    if kind == "npscalar":
        return draw(hnp.from_dtype(np.dtype(schema[1])))
    if kind == "int":
        return draw(st.integers(-(2**63), 2**63 - 1))
    if kind == "float":
        return draw(st.floats(allow_nan=True, allow_infinity=True))
    if kind == "bool":
        return draw(st.booleans())
    if kind == "str":
        return draw(st.text(max_size=3))
    children = schema[1]
    if kind == "dict":
        return {key: draw_sample(draw, child) for key, child in children}
    items = [draw_sample(draw, child) for child in children]
    if kind == "list":
        return items
    if kind == "tuple":
        return tuple(items)
    return _namedtuple(len(items))(*items)


@st.composite
def batches(draw):
    schema = draw(schemas)
    n = draw(st.integers(1, 6))
    return [draw_sample(draw, schema) for _ in range(n)]


def reference_collate(batch):
    """torch's default_collate rules, in plain numpy (same-typed samples only)."""
    elem = batch[0]
    if isinstance(elem, np.ndarray):
        return np.stack(batch)
    if isinstance(elem, np.generic) and not isinstance(elem, (np.str_, np.bytes_)):
        return np.array(batch, dtype=elem.dtype)
    if isinstance(elem, bool):
        return np.array(batch, dtype=np.bool_)
    if isinstance(elem, float):
        return np.array(batch, dtype=np.float64)
    if isinstance(elem, int):
        return np.array(batch, dtype=np.int64)
    if isinstance(elem, (str, bytes)):
        return batch  # as torch: a list at the top or under a mapping, zip's tuple in a sequence
    if isinstance(elem, collections.abc.Mapping):
        return {key: reference_collate([d[key] for d in batch]) for key in elem}
    if isinstance(elem, tuple) and hasattr(elem, "_fields"):
        return type(elem)(*(reference_collate(s) for s in zip(*batch)))
    if isinstance(elem, (list, tuple)):
        return [reference_collate(s) for s in zip(*batch)]
    raise AssertionError(f"reference cannot collate {type(elem)}")


def _assert_close_nan(ours, expected, path="batch"):
    """assert_same, where NaN equals NaN (np.testing does that already)."""
    assert_same(ours, expected, path)


FUZZ = settings(max_examples=200, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                       HealthCheck.function_scoped_fixture])


@FUZZ
@given(batches())
def test_fuzz_against_reference(batch):
    ours = default_collate(batch)
    _assert_close_nan(ours, reference_collate(batch))
    if arrays_of(ours):
        _assert_one_buffer(ours)


@FUZZ
@given(batch=batches())
def test_fuzz_against_torch(torch, batch):
    assert_same_as_torch(default_collate(batch), torch_collate(torch, batch))


@FUZZ
@given(batch=batches())
def test_fuzz_convert_against_torch(torch, batch):
    sample = batch[0]
    assert_same_as_torch(default_convert(sample), torch_convert(torch, sample))


def _fault_sites(obj, path=()):
    """The paths of the items in ``obj`` whose container can take a fault (a dict's, a list's)."""
    if isinstance(obj, (dict, list, tuple)):
        for key, value in (obj.items() if isinstance(obj, dict) else enumerate(obj)):
            if isinstance(obj, (dict, list)):
                yield path + (key,)
            yield from _fault_sites(value, path + (key,))


@st.composite
def faulty_batches(draw):
    """A batch of ``batches()`` whose later samples have one to three faults:
    an item deleted, replaced by None, or by an array of another shape."""
    batch = draw(batches())
    assume(len(batch) >= 2)
    for _ in range(draw(st.integers(1, 3))):
        sample = batch[draw(st.integers(1, len(batch) - 1))]
        sites = list(_fault_sites(sample))
        assume(sites)
        path = draw(st.sampled_from(sites))
        parent = functools.reduce(operator.getitem, path[:-1], sample)
        fault = draw(st.sampled_from(["delete", "none", "reshape"]))
        if fault == "delete":
            del parent[path[-1]]
        elif fault == "none":
            parent[path[-1]] = None
        else:
            shape = getattr(parent[path[-1]], "shape", ())
            parent[path[-1]] = np.zeros(shape + (1,))
    return batch


@pytest.mark.filterwarnings("ignore:Creating a tensor from a list of numpy.ndarrays")
@FUZZ
@given(batch=faulty_batches())
def test_fuzz_faults_against_torch(torch, batch):
    # Of several faults, the one torch meets first, with its type and phrase.
    try:
        theirs = torch_collate(torch, batch)
    except Exception as exc:  # noqa: BLE001
        with pytest.raises(type(exc)) as info:
            default_collate(batch)
        for phrase in ("stack expects each tensor", "each element in list of batch"):
            assert (phrase in str(exc)) == str(info.value).startswith(phrase), (exc, info.value)
    else:
        assert_same_as_torch(default_collate(batch), theirs)


def test_public_api_exports():
    assert fastload.default_collate is default_collate
    assert fastload.default_convert is default_convert


@pytest.mark.filterwarnings("ignore:ComplexHalf support is experimental")
@pytest.mark.parametrize("default", ["float32", "float64", "float16"])
def test_python_floats_among_other_numbers_take_torchs_default_dtype(torch, default):
    # torch infers a Python float as its default dtype, which the caller may
    # have changed (torch.set_default_dtype): a process that imported torch
    # gets that dtype from fastload's collate too.
    batches = [[1, 2.5], [np.int64(1), 2.5], [True, 2.5], [1, 2j], [np.float32(1), 2.5],
               [np.zeros(2, np.int32), [1.5, 2]], [(1, 2.5), (3, 4)],
               # numpy scalars in a list keep their own dtype
               [np.zeros(2, np.float16), [np.float16(1.5), np.float16(2)]],
               [np.zeros(2, np.float16), [np.float32(1.5), np.float32(2)]],
               [np.zeros(2, np.complex64), [np.complex64(1), np.complex64(2)]],
               [np.zeros(2, np.float32), [np.float64(0.1), np.float64(0.2)]],
               [np.zeros(2, np.float32), [np.complex128(1), np.complex128(2)]],
               [np.zeros(2, np.float16), [np.float64(0.1), 0.2]]]
    before = torch.get_default_dtype()
    torch.set_default_dtype(getattr(torch, default))
    try:
        for batch in batches:
            expected = torch_collate(torch, batch)
            ours = default_collate(batch)
            if isinstance(expected, list):
                assert [o.dtype for o in ours] == [e.numpy().dtype for e in expected], batch
            elif expected.dtype == torch.complex32:  # numpy has no complex32
                assert ours.dtype == np.complex64, batch
            else:
                assert ours.dtype == expected.numpy().dtype, batch
    finally:
        torch.set_default_dtype(before)
