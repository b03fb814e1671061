# Padding variable-length leaves into a batch (``fastload.collate.pad_collate``).
#
# ``measure_padded_leaf`` checks the leaf at one path of every sample (an
# ndarray of the first sample's dtype and trailing shape, any leading length)
# and returns the leaves with their lengths; the Python side then knows the
# padded shape, lays the batch out and has the buffer allocated (a ring slot
# in a worker).  ``pad_rows`` copies each leaf's rows to the head of its row
# of the output, fills the rest with the padding value's bytes and, if asked,
# writes the mask.  As with the collate kernels, a bad leaf is reported as
# ``(index, reason)`` so that the message can name the batch path.
#
# Included after _copy.pxi, whose leaf walk, leaf check, reason codes and
# strided copy it uses.

from libc.string cimport memset


@cython.boundscheck(False)
@cython.wraparound(False)
cdef void _fill_pattern(char* dst, Py_ssize_t nbytes, const char* pattern,
                        Py_ssize_t itemsize, bint uniform) noexcept nogil:
    """``dst[:nbytes]`` = the ``itemsize`` bytes of ``pattern``, repeated.

    ``uniform``: every byte of the pattern is the same (zero, most often): one
    memset.  Otherwise one item is written, then the filled head is copied
    onto the rest, doubling, so the loop runs log2 times, not once per item.
    """
    if nbytes <= 0:
        return
    if uniform:
        memset(dst, (<const unsigned char*> pattern)[0], nbytes)
        return
    cdef Py_ssize_t done = itemsize if itemsize < nbytes else nbytes
    memcpy(dst, pattern, done)
    cdef Py_ssize_t step
    while done < nbytes:
        step = done if done < nbytes - done else nbytes - done
        memcpy(dst + done, dst, step)
        done += step


def measure_padded_leaf(list samples, tuple path, cnp.dtype dtype, tuple trailing):
    """The leaves at ``path`` of every sample, and their lengths (first dimension).

    Each must be an ndarray of ``dtype`` (equivalent), with ``1 + len(trailing)``
    dimensions whose trailing ones equal ``trailing``.  Returns
    ``(leaves, lengths, longest, -1, COPY_OK)``, or ``(None, None, 0, i, reason)`` for the
    first sample that is not (COPY_BAD_TYPE: not an array of at least one
    dimension; COPY_BAD_SHAPE; COPY_BAD_DTYPE).  Walking the path may raise
    (a sample without the key): the caller names the sample.
    """
    cdef Py_ssize_t n = len(samples)
    cdef int ndim = 1 + len(trailing)
    _check_ndim(ndim)
    cdef cnp.npy_intp want[_MAX_DIMS]
    cdef int d
    for d in range(1, ndim):
        want[d] = trailing[d - 1]
    cdef list leaves = [None] * n
    lengths = np.empty(n, dtype=np.int64)
    cdef int64_t[::1] length_view = lengths
    cdef Py_ssize_t i
    cdef object leaf
    cdef int fault
    cdef cnp.npy_intp length
    cdef int64_t longest = 0
    for i in range(n):
        leaf = _walk(samples[i], path)
        fault = _array_leaf_fault(leaf, ndim, want, 1, dtype)
        if fault != COPY_OK:
            return None, None, 0, i, fault
        leaves[i] = leaf
        length = cnp.PyArray_DIMS(<cnp.ndarray> leaf)[0]
        length_view[i] = length
        if length > longest:
            longest = length
    return leaves, lengths, longest, -1, COPY_OK


@cython.boundscheck(False)
@cython.wraparound(False)
def pad_rows(list leaves, cnp.ndarray out, cnp.ndarray padding, cnp.ndarray mask=None):
    """``out[i, :len(leaves[i])] = leaves[i]``, the rest of ``out[i]`` = ``padding``.

    ``out``: C-contiguous, shape ``(len(leaves), L) + trailing``; every leaf an
    ndarray of ``out``'s dtype, shape ``(length,) + trailing`` with
    ``length <= L`` (as ``measure_padded_leaf`` found them; checked again
    here, ValueError if not).  ``padding``: one item of ``out``'s dtype.
    ``mask`` (optional): C-contiguous bool ``(len(leaves), L)``, True where a
    leaf's rows are.
    """
    cdef Py_ssize_t n = len(leaves)
    cdef int ndim = cnp.PyArray_NDIM(out)
    if not cnp.PyArray_IS_C_CONTIGUOUS(out) or ndim < 2 or cnp.PyArray_DIMS(out)[0] != n:
        raise ValueError("out must be a C-contiguous array of at least 2 dimensions with one "
                         "row per leaf")
    cdef cnp.dtype dtype = <cnp.dtype> cnp.PyArray_DESCR(out)
    if cnp.PyArray_SIZE(padding) != 1 or not cnp.PyArray_EquivTypes(
            <cnp.dtype> cnp.PyArray_DESCR(padding), dtype):
        raise ValueError(f"padding must be one item of dtype {dtype}")
    padding = np.ascontiguousarray(padding)
    cdef Py_ssize_t longest = cnp.PyArray_DIMS(out)[1]
    if mask is not None and (not cnp.PyArray_IS_C_CONTIGUOUS(mask) or mask.dtype != np.bool_
                             or (<object> mask).shape != (n, longest)):
        raise ValueError(f"mask must be a C-contiguous bool array of shape {(n, longest)}")
    cdef Py_ssize_t itemsize = dtype.itemsize
    cdef Py_ssize_t item_row = itemsize  # bytes of one step along the padded dimension
    cdef int d
    for d in range(2, ndim):
        item_row *= cnp.PyArray_DIMS(out)[d]
    cdef Py_ssize_t out_row = item_row * longest
    cdef const char* pattern = <const char*> cnp.PyArray_DATA(padding)
    cdef bint uniform = True
    for d in range(1, itemsize):
        uniform = uniform and pattern[d] == pattern[0]
    cdef char* dst = <char*> cnp.PyArray_DATA(out)
    cdef char* mask_dst = <char*> cnp.PyArray_DATA(mask) if mask is not None else NULL
    cdef Py_ssize_t i, length, used
    cdef cnp.ndarray arr
    cdef object leaf
    cdef cnp.npy_intp* got
    for i in range(n):
        leaf = leaves[i]
        if not cnp.PyArray_Check(leaf):
            raise ValueError(f"leaf {i} is not a numpy array")
        arr = <cnp.ndarray> leaf
        got = cnp.PyArray_DIMS(arr)
        if cnp.PyArray_NDIM(arr) != ndim - 1 or got[0] > longest \
                or not cnp.PyArray_EquivTypes(<cnp.dtype> cnp.PyArray_DESCR(arr), dtype):
            raise ValueError(f"leaf {i} does not fit a row of out")
        for d in range(1, ndim - 1):
            if got[d] != cnp.PyArray_DIMS(out)[d + 1]:
                raise ValueError(f"leaf {i} does not fit a row of out")
        length = got[0]
        used = length * item_row
        if used > 0:
            _copy_array(dst + i * out_row, arr, used)
        if used >= _NOGIL_COPY_BYTES or out_row - used >= _NOGIL_COPY_BYTES:
            with nogil:
                _fill_pattern(dst + i * out_row + used, out_row - used, pattern, itemsize, uniform)
        else:
            _fill_pattern(dst + i * out_row + used, out_row - used, pattern, itemsize, uniform)
        if mask_dst != NULL:
            memset(mask_dst + i * longest, 1, length)
            memset(mask_dst + i * longest + length, 0, longest - length)
    return out
