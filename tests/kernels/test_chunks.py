"""``_core.ChunkedRows``: rows of several arrays gathered as one array's would be."""

import numpy as np
import pytest

from fastload import _core


def _chunks(sizes, row_shape=(3,), dtype=np.float32):
    whole = np.arange(sum(sizes) * int(np.prod(row_shape)), dtype=dtype).reshape(
        (sum(sizes),) + row_shape)
    bounds = np.cumsum([0] + list(sizes))
    return whole, [whole[a:b].copy() for a, b in zip(bounds[:-1], bounds[1:])]


@pytest.mark.parametrize("sizes", [[10], [1, 1, 1], [4, 0, 7, 0, 0, 3], [0, 5]])
def test_a_gather_is_numpys_over_the_concatenation(sizes):
    whole, chunks = _chunks(sizes)
    rows_ = _core.ChunkedRows(chunks, np.float32, (3,))
    assert len(rows_) == len(whole)
    rng = np.random.default_rng(1)
    for rows in (rng.integers(-len(whole), len(whole), 50), np.arange(len(whole)),
                 np.arange(len(whole))[::-1], np.empty(0, np.int64)):
        rows = rows.astype(np.int64)
        out = np.empty((len(rows), 3), np.float32)
        rows_.gather(rows, out)
        np.testing.assert_array_equal(out, whole[rows])


def test_a_row_out_of_range_is_named():
    _, chunks = _chunks([2, 3])
    with pytest.raises(IndexError, match="index 5 is out of range for a dataset of length 5"):
        _core.ChunkedRows(chunks, np.float32, (3,)).gather(np.array([0, 5]),
                                                           np.empty((2, 3), np.float32))


def test_chunks_and_outputs_of_another_shape_or_dtype_are_refused():
    _, chunks = _chunks([2, 3])
    with pytest.raises(ValueError, match="C-contiguous float32 array of rows"):
        _core.ChunkedRows(chunks + [np.zeros((2, 4), np.float32)], np.float32, (3,))
    with pytest.raises(ValueError, match="C-contiguous float32 array of rows"):
        _core.ChunkedRows([chunks[0][:, ::2]], np.float32, (2,))
    rows_ = _core.ChunkedRows(chunks, np.float32, (3,))
    with pytest.raises(ValueError, match=r"out must be a C-contiguous float32 array of shape \(1, 3\)"):
        rows_.gather(np.array([0]), np.empty((1, 3), np.float64))


def test_the_chunks_stay_alive_while_the_rows_are_read():
    whole, chunks = _chunks([3, 4])
    rows_ = _core.ChunkedRows(chunks, np.float32, (3,))
    del chunks
    out = np.empty((2, 3), np.float32)
    np.testing.assert_array_equal(rows_.gather(np.array([6, 0]), out), whole[[6, 0]])
