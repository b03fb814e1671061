# Rows of one column held in several arrays (an Arrow column's record batches,
# memory-mapped from a Hugging Face dataset's cache files or an IPC file),
# gathered as if they were one array: ``ChunkedRows``.  The chunks are checked
# once, when the column is opened; a gather then finds each row's chunk by a
# binary search over the chunks' first rows and copies it without the GIL.
#
# Included after _copy.pxi (cython, memcpy).

from libc.stdint cimport uintptr_t


@cython.boundscheck(False)
@cython.wraparound(False)
cdef void _gather_chunked(char* dst, const uintptr_t* bases, const int64_t* starts,
                          Py_ssize_t nchunks, const int64_t* rows, Py_ssize_t count,
                          Py_ssize_t row_bytes) noexcept nogil:
    cdef Py_ssize_t i, lo, hi, mid, chunk = 0
    cdef int64_t row
    cdef const char* src
    for i in range(count):
        row = rows[i]
        # Neighbouring rows (a sequential sampler) mostly share a chunk.
        if not (starts[chunk] <= row < starts[chunk + 1]):
            lo = 0
            hi = nchunks
            while hi - lo > 1:  # the last chunk whose first row is <= row
                mid = (lo + hi) >> 1
                if starts[mid] <= row:
                    lo = mid
                else:
                    hi = mid
            chunk = lo
        src = <const char*> bases[chunk] + (row - starts[chunk]) * row_bytes
        memcpy(dst + i * row_bytes, src, row_bytes)


cdef class ChunkedRows:
    """The rows of C-contiguous arrays of one dtype and row shape, end to end.

    ``gather(rows, out)`` sets ``out[i]`` to global row ``rows[i]`` (negative
    rows wrap, as numpy's do; IndexError names one out of range).  The chunks
    are kept alive by this object, which reads their memory by address.
    """

    cdef readonly tuple chunks
    cdef readonly object dtype
    cdef readonly tuple row_shape
    cdef readonly Py_ssize_t length
    cdef Py_ssize_t row_bytes
    cdef object _bases
    cdef object _starts

    def __init__(self, chunks, dtype, tuple row_shape):
        self.dtype = np.dtype(dtype)
        self.row_shape = row_shape
        kept = []
        for chunk in chunks:
            array = <cnp.ndarray?> chunk
            if not cnp.PyArray_IS_C_CONTIGUOUS(array) or array.dtype != self.dtype \
                    or (<object> array).shape[1:] != row_shape:
                raise ValueError(f"every chunk must be a C-contiguous {self.dtype} array of rows "
                                 f"{row_shape}, got {array.dtype} {(<object> array).shape}")
            if (<object> array).shape[0] > 0:
                kept.append(array)
        self.chunks = tuple(kept)
        self.row_bytes = self.dtype.itemsize
        for size in row_shape:
            self.row_bytes *= size
        starts = np.zeros(len(kept) + 1, dtype=np.int64)
        starts[1:] = np.cumsum([a.shape[0] for a in kept], dtype=np.int64)
        self._starts = starts
        self.length = int(starts[-1])
        self._bases = np.array([a.ctypes.data for a in kept] or [0], dtype=np.uintp)

    def __len__(self):
        return self.length

    def gather(self, const int64_t[::1] rows, cnp.ndarray out):
        cdef Py_ssize_t count = rows.shape[0]
        if not cnp.PyArray_IS_C_CONTIGUOUS(out) or out.dtype != self.dtype \
                or (<object> out).shape != (count,) + self.row_shape:
            raise ValueError(f"out must be a C-contiguous {self.dtype} array of shape "
                             f"{(count,) + self.row_shape}, got {out.dtype} {(<object> out).shape}")
        cdef const int64_t[::1] wrapped = _rows_in_range(rows, self.length)
        cdef const uintptr_t[::1] bases = self._bases
        cdef const int64_t[::1] starts = self._starts
        cdef char* dst = <char*> cnp.PyArray_DATA(out)
        if count > 0 and self.row_bytes > 0:
            with nogil:
                _gather_chunked(dst, &bases[0], &starts[0], starts.shape[0] - 1, &wrapped[0],
                                count, self.row_bytes)
        return out
