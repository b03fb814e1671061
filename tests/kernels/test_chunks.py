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
    with pytest.raises(ValueError, match=r"C-contiguous float32 array of shape \(1, 3\)"):
        rows_.gather(np.array([0]), np.empty((1, 3), np.float64))


def test_the_chunks_stay_alive_while_the_rows_are_read():
    whole, chunks = _chunks([3, 4])
    rows_ = _core.ChunkedRows(chunks, np.float32, (3,))
    del chunks
    out = np.empty((2, 3), np.float32)
    np.testing.assert_array_equal(rows_.gather(np.array([6, 0]), out), whole[[6, 0]])


def _ragged(lengths_by_chunk, item_shape=()):
    chunks, offsets, rows = [], [], []
    value = 0
    for lengths in lengths_by_chunk:
        starts = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
        items = np.arange(value, value + starts[-1] * int(np.prod(item_shape)),
                          dtype=np.int32).reshape((starts[-1],) + item_shape)
        value += items.size
        chunks.append(items)
        offsets.append(starts)
        rows.extend(items[a:b] for a, b in zip(starts[:-1], starts[1:]))
    return _core.RaggedRows(chunks, offsets, np.int32, item_shape), rows


@pytest.mark.parametrize("item_shape", [(), (2,)])
def test_ragged_rows_are_padded_as_numpy_pads_them(item_shape):
    ragged, reference = _ragged([[3, 0, 5], [], [1, 2], [4]], item_shape)
    assert len(ragged) == 6
    rows = np.array([5, 0, 1, 4, 2, -1, 3], dtype=np.int64)
    lengths = ragged.lengths(rows)
    np.testing.assert_array_equal(lengths, [len(reference[r]) for r in rows])
    out = np.empty((len(rows), 7) + item_shape, np.int32)
    ragged.gather_padded(rows, out, np.array([-2], np.int32))
    for i, r in enumerate(rows):
        np.testing.assert_array_equal(out[i, :lengths[i]], reference[r])
        assert (out[i, lengths[i]:] == -2).all()


def test_ragged_rows_refuse_an_output_shorter_than_the_longest_row():
    ragged, _ = _ragged([[3, 5]])
    with pytest.raises(ValueError, match="fewer than the longest row"):
        ragged.gather_padded(np.array([1]), np.empty((1, 4), np.int32), np.zeros(1, np.int32))
    with pytest.raises(IndexError, match="index 2 is out of range"):
        ragged.lengths(np.array([2]))
    with pytest.raises(ValueError, match="offsets rising"):
        _core.RaggedRows([np.arange(3, dtype=np.int32)], [np.array([0, 4])], np.int32, ())
