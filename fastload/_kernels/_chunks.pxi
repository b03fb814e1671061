# Rows of one column held in several arrays (an Arrow column's record batches,
# memory-mapped from a Hugging Face dataset's cache files or an IPC file),
# gathered as if they were one array: ``ChunkedRows``.  The chunks are checked
# once, when the column is opened; a gather then finds each row's chunk by a
# binary search over the chunks' first rows and copies it without the GIL.
#
# Included after _pad.pxi (its padding fill) and _copy.pxi (cython, memcpy).

from libc.stdint cimport uintptr_t


cdef inline Py_ssize_t _chunk_of(const int64_t* starts, Py_ssize_t nchunks, int64_t row,
                                Py_ssize_t guess) noexcept nogil:
    """The chunk holding ``row``: the last whose first row is <= row.  ``guess``
    (the previous row's) first: neighbouring rows mostly share a chunk."""
    if starts[guess] <= row < starts[guess + 1]:
        return guess
    cdef Py_ssize_t lo = 0, hi = nchunks, mid
    while hi - lo > 1:
        mid = (lo + hi) >> 1
        if starts[mid] <= row:
            lo = mid
        else:
            hi = mid
    return lo


@cython.boundscheck(False)
@cython.wraparound(False)
cdef void _gather_chunked(char* dst, const uintptr_t* bases, const int64_t* starts,
                          Py_ssize_t nchunks, const int64_t* rows, Py_ssize_t count,
                          Py_ssize_t row_bytes) noexcept nogil:
    cdef Py_ssize_t i, chunk = 0
    cdef int64_t row
    cdef const char* src
    for i in range(count):
        row = rows[i]
        chunk = _chunk_of(starts, nchunks, row, chunk)
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


@cython.boundscheck(False)
@cython.wraparound(False)
cdef void _gather_ragged(char* dst, Py_ssize_t dst_row_bytes, const uintptr_t* bases,
                         const uintptr_t* offsets, const int64_t* starts, Py_ssize_t nchunks,
                         const int64_t* rows, Py_ssize_t count, Py_ssize_t item_bytes,
                         const char* padding, Py_ssize_t padding_bytes,
                         bint uniform) noexcept nogil:
    cdef Py_ssize_t i, chunk = 0, used
    cdef int64_t row, local, begin
    for i in range(count):
        row = rows[i]
        chunk = _chunk_of(starts, nchunks, row, chunk)
        local = row - starts[chunk]
        begin = (<const int64_t*> offsets[chunk])[local]
        used = ((<const int64_t*> offsets[chunk])[local + 1] - begin) * item_bytes
        memcpy(dst + i * dst_row_bytes, <const char*> bases[chunk] + begin * item_bytes, used)
        _fill_pattern(dst + i * dst_row_bytes + used, dst_row_bytes - used, padding,
                      padding_bytes, uniform)


cdef class RaggedRows:
    """Rows of differing lengths (an Arrow list column's chunks), padded into a batch.

    Chunk ``k`` is ``values[k]``, the C-contiguous items of all its rows end
    to end (each item of shape ``item_shape``), and ``offsets[k]``, where
    each row starts in them (one more than its rows).  ``lengths(rows)`` is
    the rows' lengths; ``gather_padded(rows, out, padding)`` writes each row
    at the head of its ``out`` row and ``padding`` (one item's value) after.
    """

    cdef readonly tuple values
    cdef readonly tuple offsets
    cdef readonly object dtype
    cdef readonly tuple item_shape
    cdef readonly Py_ssize_t length
    cdef Py_ssize_t item_bytes
    cdef object _bases
    cdef object _offset_bases
    cdef object _starts

    def __init__(self, values, offsets, dtype, tuple item_shape):
        self.dtype = np.dtype(dtype)
        self.item_shape = item_shape
        kept_values, kept_offsets = [], []
        for items, starts in zip(values, offsets):
            items = <cnp.ndarray?> items
            starts = np.ascontiguousarray(starts, dtype=np.int64)
            if not cnp.PyArray_IS_C_CONTIGUOUS(items) or items.dtype != self.dtype \
                    or (<object> items).shape[1:] != item_shape or starts.ndim != 1 \
                    or starts.shape[0] < 1 or (np.diff(starts) < 0).any() or starts[0] < 0 \
                    or starts[-1] > (<object> items).shape[0]:
                raise ValueError(f"every chunk must be C-contiguous {self.dtype} items of shape "
                                 f"{item_shape} with offsets rising within them")
            if starts.shape[0] > 1:
                kept_values.append(items)
                kept_offsets.append(starts)
        self.values = tuple(kept_values)
        self.offsets = tuple(kept_offsets)
        self.item_bytes = self.dtype.itemsize
        for size in item_shape:
            self.item_bytes *= size
        chunk_starts = np.zeros(len(kept_offsets) + 1, dtype=np.int64)
        chunk_starts[1:] = np.cumsum([o.shape[0] - 1 for o in kept_offsets], dtype=np.int64)
        self._starts = chunk_starts
        self.length = int(chunk_starts[-1])
        self._bases = np.array([a.ctypes.data for a in kept_values] or [0], dtype=np.uintp)
        self._offset_bases = np.array([o.ctypes.data for o in kept_offsets] or [0], dtype=np.uintp)

    def __len__(self):
        return self.length

    @cython.boundscheck(False)
    @cython.wraparound(False)
    def lengths(self, const int64_t[::1] rows):
        """Each row's length (rows checked as ``ChunkedRows.gather`` checks them)."""
        cdef const int64_t[::1] wrapped = _rows_in_range(rows, self.length)
        found = np.empty(rows.shape[0], dtype=np.int64)
        cdef int64_t[::1] out = found
        cdef const uintptr_t[::1] offset_bases = self._offset_bases
        cdef const int64_t[::1] starts = self._starts
        cdef Py_ssize_t i, chunk = 0
        cdef const int64_t* offsets
        cdef int64_t local
        with nogil:
            for i in range(rows.shape[0]):
                chunk = _chunk_of(&starts[0], starts.shape[0] - 1, wrapped[i], chunk)
                offsets = <const int64_t*> offset_bases[chunk]
                local = wrapped[i] - starts[chunk]
                out[i] = offsets[local + 1] - offsets[local]
        return found

    def gather_padded(self, const int64_t[::1] rows, cnp.ndarray out, cnp.ndarray padding):
        cdef Py_ssize_t count = rows.shape[0]
        cdef object shape = (<object> out).shape
        if not cnp.PyArray_IS_C_CONTIGUOUS(out) or out.dtype != self.dtype or len(shape) < 2 \
                or shape[0] != count or tuple(shape[2:]) != self.item_shape:
            raise ValueError(f"out must be a C-contiguous {self.dtype} array of shape "
                             f"({count}, L) + {self.item_shape}, got {out.dtype} {shape}")
        if padding.dtype != self.dtype or padding.size != 1 \
                or not cnp.PyArray_IS_C_CONTIGUOUS(padding):
            raise ValueError(f"padding must be one contiguous {self.dtype} item")
        cdef const int64_t[::1] wrapped = _rows_in_range(rows, self.length)
        if count and int(self.lengths(rows).max()) > shape[1]:
            raise ValueError(f"out holds {shape[1]} items a row, fewer than the longest row")
        cdef const uintptr_t[::1] bases = self._bases
        cdef const uintptr_t[::1] offset_bases = self._offset_bases
        cdef const int64_t[::1] starts = self._starts
        cdef char* dst = <char*> cnp.PyArray_DATA(out)
        cdef const char* pattern = <const char*> cnp.PyArray_DATA(padding)
        cdef Py_ssize_t dst_row_bytes = shape[1] * self.item_bytes
        cdef bint uniform = True
        cdef Py_ssize_t b, padding_bytes = self.dtype.itemsize
        for b in range(1, padding_bytes):
            if pattern[b] != pattern[0]:
                uniform = False
        if count > 0 and dst_row_bytes > 0:
            with nogil:
                _gather_ragged(dst, dst_row_bytes, &bases[0], &offset_bases[0], &starts[0],
                               starts.shape[0] - 1, &wrapped[0], count, self.item_bytes,
                               pattern, padding_bytes, uniform)
        return out
