"""The helpers every kernel shares (_kernels/_shared.pxi), and the leaf check
the collate and padding kernels share (_kernels/_copy.pxi).

Each is written once and used by several kernels, so each rule is checked
here through every kernel that uses it: numpy's dimension limit (one limit,
one message), a gather's row check (negatives wrap as numpy's, one
IndexError), and what makes a leaf bad (one reason code per fault).
"""

from __future__ import annotations

import numpy as np
import pytest
from batch_compare import assert_same_as_torch

import fastload
from fastload import _core
from fastload.collate import default_collate
from fastload.collate import pad_collate


def _numpy_allows(ndim: int) -> bool:
    try:
        np.empty((1,) * ndim, np.uint8)
    except ValueError:
        return False
    return True


# numpy's own limit (64 since numpy 2, 32 before), found the way a user meets it.
NUMPY_MAX_DIMS = max(k for k in (32, 64) if _numpy_allows(k))


def _limit_message(ndim: int) -> str:
    return f"arrays of {ndim} dimensions are not supported \\(at most {NUMPY_MAX_DIMS}\\)"


# --- numpy's dimension limit ----------------------------------------------------------------

@pytest.mark.skipif(NUMPY_MAX_DIMS <= 33, reason="numpy 1 makes no array of 33 dimensions")
@pytest.mark.parametrize("num_workers", [0, 1])
def test_samples_of_more_than_32_dimensions_collate_as_torchs(torch, no_leaks, num_workers):
    rng = np.random.default_rng(0)
    samples = [rng.random((2,) + (1,) * 31 + (3,)).astype(np.float32) for _ in range(4)]
    assert samples[0].ndim == 33
    theirs = list(torch.utils.data.DataLoader(samples, batch_size=2))
    ours = list(fastload.DataLoader(samples, batch_size=2, num_workers=num_workers))
    assert len(ours) == len(theirs) == 2
    for mine, torchs in zip(ours, theirs):
        assert mine.ndim == 34
        assert_same_as_torch(mine, torchs)


@pytest.mark.skipif(NUMPY_MAX_DIMS <= 33, reason="numpy 1 makes no array of 33 dimensions")
def test_leaves_of_more_than_32_dimensions_pad():
    short = np.arange(3, dtype=np.int32).reshape((3,) + (1,) * 32)
    long = np.arange(5, dtype=np.int32).reshape((5,) + (1,) * 32)
    padded = pad_collate(padding_value=-1)([short, long])
    expected = np.full((2, 5) + (1,) * 32, -1, np.int32)
    expected[0, :3] = short
    expected[1] = long
    np.testing.assert_array_equal(padded.values, expected)
    np.testing.assert_array_equal(padded.lengths, [3, 5])


def test_a_batch_past_numpys_limit_is_refused_with_the_one_message():
    # A sample of numpy's most dimensions needs a batch of one more.
    sample = np.zeros((1,) * NUMPY_MAX_DIMS, np.float32)
    with pytest.raises(ValueError, match=_limit_message(NUMPY_MAX_DIMS + 1)):
        default_collate([sample, sample])


@pytest.mark.parametrize("kernel", ["collate_array_leaf", "measure_padded_leaf", "slot_view"])
def test_every_kernel_states_the_limit_alike(kernel):
    too_many = NUMPY_MAX_DIMS + 1
    shape = (1,) * too_many
    with pytest.raises(ValueError, match=_limit_message(too_many)):
        if kernel == "collate_array_leaf":
            _core.collate_array_leaf([], (), np.dtype(np.uint8), shape, np.empty(0, np.uint8))
        elif kernel == "measure_padded_leaf":
            _core.measure_padded_leaf([], (), np.dtype(np.uint8), shape[1:])
        else:
            _core.slot_view(np.zeros(8, np.uint8), np.dtype(np.uint8), shape, 0)


def test_every_kernel_takes_numpys_most_dimensions():
    most = NUMPY_MAX_DIMS
    sample = np.arange(2, dtype=np.uint8).reshape((2,) + (1,) * (most - 1))
    out = np.empty((1, 2), np.uint8)  # a batch of one more axis is past numpy: flat rows
    assert _core.collate_array_leaf([sample], (), sample.dtype, sample.shape, out) == (-1, 0)
    np.testing.assert_array_equal(out[0], sample.ravel())
    leaves, lengths, longest, bad, _ = _core.measure_padded_leaf(
        [sample], (), sample.dtype, sample.shape[1:])
    assert (list(lengths), longest, bad) == ([2], 2, -1)
    view = _core.slot_view(np.arange(4, dtype=np.uint8), np.dtype(np.uint8), sample.shape, 1)
    np.testing.assert_array_equal(view.ravel(), [1, 2])


def test_a_strided_leaf_of_numpys_most_dimensions_is_copied_whole():
    # The strided copy keeps a counter per axis: sized by numpy's limit, it
    # holds every axis of any array numpy makes.
    most = NUMPY_MAX_DIMS
    base = np.arange(2 * 3, dtype=np.int16).reshape((2, 3) + (1,) * (most - 2))
    leaf = base[:, ::-1]  # not contiguous along an outer axis
    assert not leaf.flags.c_contiguous
    out = np.empty((1, leaf.size), np.int16)  # flat rows, as above
    assert _core.collate_array_leaf([leaf], (), leaf.dtype, leaf.shape, out) == (-1, 0)
    np.testing.assert_array_equal(out[0], leaf.ravel())


# --- a gather's rows -------------------------------------------------------------------------

def _gather_rows(source, rows):
    out = np.empty((len(rows),) + source.shape[1:], source.dtype)
    return _core.gather_rows(source, rows, out)


def _gather_image_rows(source, rows):
    out = np.empty((len(rows), 1) + source.shape[1:], np.uint8)
    return _core.gather_image_rows(source, rows, out)[:, 0]


@pytest.mark.parametrize("gather", [_gather_rows, _gather_image_rows])
def test_both_gathers_wrap_negative_rows_as_numpy(gather):
    source = np.arange(5 * 2 * 3, dtype=np.uint8).reshape(5, 2, 3)
    rows = np.array([-1, 0, -5, 4, 2], np.int64)
    np.testing.assert_array_equal(gather(source, rows), source[rows])
    assert list(rows) == [-1, 0, -5, 4, 2]  # the caller's rows are left as they were


@pytest.mark.parametrize("gather", [_gather_rows, _gather_image_rows])
@pytest.mark.parametrize("bad", [5, -6, 2**40])
def test_both_gathers_name_the_first_row_out_of_range(gather, bad):
    source = np.zeros((5, 2, 3), np.uint8)
    rows = np.array([1, bad, 7], np.int64)
    with pytest.raises(IndexError,
                       match=f"^index {bad} is out of range for a dataset of length 5$"):
        gather(source, rows)


# --- what makes a leaf bad -------------------------------------------------------------------

F4 = np.dtype(np.float32)
CASES = [
    # leaf                                    collate (shape (3, 2))      pad (trailing (2,))
    (np.zeros((3, 2), F4),                    _core.COPY_OK,              _core.COPY_OK),
    (np.zeros((3, 2), np.dtype(F4, metadata={"unit": "m"})),
                                              _core.COPY_OK,              _core.COPY_OK),
    (np.zeros((4, 2), F4),                    _core.COPY_BAD_SHAPE,       _core.COPY_OK),
    (np.zeros((3, 3), F4),                    _core.COPY_BAD_SHAPE,       _core.COPY_BAD_SHAPE),
    (np.zeros((3, 2, 1), F4),                 _core.COPY_BAD_SHAPE,       _core.COPY_BAD_SHAPE),
    (np.zeros(3, F4),                         _core.COPY_BAD_SHAPE,       _core.COPY_BAD_SHAPE),
    (np.zeros((), F4),                        _core.COPY_BAD_SHAPE,       _core.COPY_BAD_TYPE),
    (np.zeros((3, 2), np.float64),            _core.COPY_BAD_DTYPE,       _core.COPY_BAD_DTYPE),
    (np.zeros((3, 2), F4.newbyteorder("S")),  _core.COPY_BAD_DTYPE,       _core.COPY_BAD_DTYPE),
    ([[0.0, 0.0]] * 3,                        _core.COPY_BAD_TYPE,        _core.COPY_BAD_TYPE),
    (np.float32(0),                           _core.COPY_BAD_TYPE,        _core.COPY_BAD_TYPE),
]


@pytest.mark.parametrize("leaf, for_collate, for_pad", CASES)
def test_collate_and_pad_find_the_same_faults(leaf, for_collate, for_pad):
    good = np.ones((3, 2), F4)
    samples = [{"x": good}, {"x": leaf}]
    out = np.zeros((2, 3, 2), F4)
    bad, reason = _core.collate_array_leaf(samples, ("x",), F4, (3, 2), out)
    assert (bad, reason) == ((-1, 0) if for_collate == _core.COPY_OK else (1, for_collate))
    if for_collate == _core.COPY_OK:
        np.testing.assert_array_equal(out, [good, leaf])
    leaves, lengths, longest, bad, reason = _core.measure_padded_leaf(samples, ("x",), F4, (2,))
    if for_pad == _core.COPY_OK:
        assert (bad, reason) == (-1, 0)
        assert leaves[1] is leaf
        assert list(lengths) == [3, len(leaf)] and longest == max(3, len(leaf))
    else:
        assert (leaves, lengths, longest, bad, reason) == (None, None, 0, 1, for_pad)


def test_the_reason_codes_are_plain_distinct_ints():
    codes = [_core.COPY_OK, _core.COPY_BAD_TYPE, _core.COPY_BAD_DTYPE, _core.COPY_BAD_SHAPE,
             _core.COPY_OVERFLOW]
    assert all(type(code) is int for code in codes)
    assert codes == [0, 1, 2, 3, 4]
