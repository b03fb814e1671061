# Helpers more than one kernel uses, written once.  _core.pyx includes this
# file first, so every kernel after it may use them.

cimport numpy as cnp
from libc.stdint cimport int64_t

import numpy as np

cnp.import_array()


# ---------------------------------------------------------------------------
# How many dimensions an array may have: numpy's own limit, from the headers
# the extension is built against.  Scratch with one entry per axis is sized
# by it, so no array numpy can make overruns one, and a kernel accepts every
# array numpy accepts (numpy 2 allows more axes than numpy 1 did).
# ---------------------------------------------------------------------------

cdef enum:
    _MAX_DIMS = cnp.NPY_MAXDIMS


cdef inline int _check_ndim(Py_ssize_t ndim) except -1:
    if ndim > _MAX_DIMS:
        raise ValueError(f"arrays of {ndim} dimensions are not supported (at most {_MAX_DIMS})")
    return 0


# ---------------------------------------------------------------------------
# NOTE [ Prefetching the rows of a gather ]
# A shuffled batch reads its rows from all over a dataset far larger than the
# caches, so every row starts with a miss to memory, which the hardware
# prefetcher cannot foresee (it follows strides, not an index list), and a
# small row (3-4 KiB) ends before its streaming has paid off.  The copy loops
# ask for the row _PREFETCH_AHEAD places ahead while copying this one, up to
# _PREFETCH_BYTES of it; past that, the hardware prefetcher keeps up
# (bench/bench_kernels.py measures the collate copy).  The alias draws
# prefetch their table rows with the same ``fl_prefetch``.
# ---------------------------------------------------------------------------

cdef enum:
    _PREFETCH_AHEAD = 2
    _PREFETCH_BYTES = 4096
    _CACHE_LINE = 64

cdef extern from *:
    """
    /* A hint, to be read soon and kept in every cache level; nothing where the
       compiler has no such builtin. */
    #if defined(__GNUC__) || defined(__clang__)
    #define fl_prefetch(p) __builtin_prefetch((p), 0, 3)
    #else
    #define fl_prefetch(p) ((void)(p))
    #endif
    """
    void fl_prefetch(const void* p) noexcept nogil


cdef inline void _prefetch_row(const char* row, Py_ssize_t nbytes) noexcept nogil:
    cdef Py_ssize_t offset = 0
    cdef Py_ssize_t stop = nbytes if nbytes < _PREFETCH_BYTES else _PREFETCH_BYTES
    while offset < stop:
        fl_prefetch(row + offset)
        offset += _CACHE_LINE


# ---------------------------------------------------------------------------
# The rows a gather reads (ArrayDataset's batches, in-memory images).
# ---------------------------------------------------------------------------

cdef const int64_t[::1] _rows_in_range(const int64_t[::1] rows, Py_ssize_t length):
    """``rows`` with negatives wrapped as numpy's indexing wraps them.

    Checked once, here, so the copy loops can trust every row; IndexError
    names the first one out of range.  ``rows`` itself when none is negative.
    """
    cdef Py_ssize_t i
    cdef int64_t r
    cdef bint any_negative = False
    for i in range(rows.shape[0]):
        r = rows[i]
        if r < 0:
            any_negative = True
            r += length
        if r < 0 or r >= length:
            raise IndexError(f"index {rows[i]} is out of range for a dataset of length {length}")
    if any_negative:
        return np.where(np.asarray(rows) < 0, np.asarray(rows) + length, np.asarray(rows))
    return rows
