"""``fixed_width_rows``: which Arrow columns are gathered in place, and their rows."""

import numpy as np
import pytest
from required import deferred

pa = deferred("pyarrow")

from fastload.sources.arrow_columns import chunk_rows, fixed_width_rows  # noqa: E402

pytestmark = pytest.mark.imports_heavy_library


def _rows_of(column):
    rows = fixed_width_rows(column)
    out = np.empty((len(column),) + rows.row_shape, rows.dtype)
    return rows.gather(np.arange(len(column), dtype=np.int64), out)


def test_numbers_lists_and_fixed_size_lists_are_their_numpy_rows():
    values = np.arange(24, dtype=np.int32).reshape(4, 2, 3)
    fixed = pa.FixedSizeListArray.from_arrays(
        pa.FixedSizeListArray.from_arrays(pa.array(values.ravel()), 3), 2)
    column = pa.chunked_array([fixed[:1], fixed[1:]])  # sliced chunks: offsets kept
    np.testing.assert_array_equal(_rows_of(column), values)
    ragged_free = pa.chunked_array([pa.array([[1.5, 2.5], [3.5, 4.5]]), pa.array([[5.5, 6.5]])])
    np.testing.assert_array_equal(_rows_of(ragged_free), [[1.5, 2.5], [3.5, 4.5], [5.5, 6.5]])
    sliced = pa.array([[9, 9], [1, 2], [3, 4], [9, 9]]).slice(1, 2)
    np.testing.assert_array_equal(chunk_rows(sliced), [[1, 2], [3, 4]])
    np.testing.assert_array_equal(_rows_of(pa.chunked_array([pa.array([True, False])])),
                                  [True, False])


# Built in the test, not at collection: pyarrow is imported only when a test needs it.
@pytest.mark.parametrize("make_column", [
    lambda: pa.chunked_array([pa.array([[1], [2, 3]])]),                    # ragged
    lambda: pa.chunked_array([pa.array([[1, 2]]), pa.array([[1, 2, 3]])]),  # widths differ by chunk
    lambda: pa.chunked_array([pa.array([1, None])]),                        # a null
    lambda: pa.chunked_array([pa.array(["a", "b"])]),                       # strings
    lambda: pa.chunked_array([pa.array([[], []], pa.list_(pa.int64()))]),  # empty rows
    lambda: pa.chunked_array([pa.array([15], pa.timestamp("s"))]),          # timestamps
], ids=["ragged", "widths", "null", "strings", "empty", "timestamp"])
def test_columns_that_are_not_fixed_width_are_read_row_by_row(make_column):
    column = make_column()
    assert fixed_width_rows(column) is None
