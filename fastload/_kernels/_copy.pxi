# Moving bytes: the collate-into-buffer copies and the ArrayDataset row gather.
#
# The Python side (fastload/collate/) decides *where* every leaf of a batch
# goes (the BatchLayout); these loops walk the samples and put the bytes
# there.  Each kernel validates per sample what it must (type, dtype, shape)
# and, instead of raising, returns the index of the first sample it could not
# take plus a reason code: the Python side then builds an error message that
# names the batch path (``batch[3]['image']``), or falls back to a slower
# promoting path where torch would promote dtypes.

cimport cython
cimport numpy as cnp
from cpython.bool cimport PyBool_Check
from cpython.float cimport PyFloat_AsDouble, PyFloat_Check
from cpython.long cimport PyLong_AsLongLong, PyLong_Check
from cpython.mem cimport PyMem_Free, PyMem_Malloc
from cpython.object cimport PyObject_GetItem
from libc.stdint cimport int64_t, uint8_t
from libc.string cimport memcpy

import numpy as np

# Reason codes returned by the collate kernels (read by collate/leaves.py); a
# cpdef enum, so the C checks and Python read the same values.
cpdef enum:
    COPY_OK = 0
    COPY_BAD_TYPE = 1      # the leaf is not of the kind the layout expects
    COPY_BAD_DTYPE = 2     # an array leaf of another dtype (torch would promote)
    COPY_BAD_SHAPE = 3     # an array leaf of another shape (torch raises)
    COPY_OVERFLOW = 4      # a Python int that does not fit int64 (float64 for a float leaf)

# Scalar leaf kinds (read by collate/layout.py).
SCALAR_INT = 1      # Python int  -> int64
SCALAR_FLOAT = 2    # Python float -> float64
SCALAR_BOOL = 3     # Python bool -> bool
SCALAR_NUMPY = 4    # numpy scalar -> its own dtype

# Past this many bytes (per sample, or per batch for a batch of contiguous
# samples), a copy releases the GIL: threads in the same process (a user's
# prefetch thread, say) can run meanwhile, and the cost of dropping the GIL is
# noise next to the memcpy.
cdef Py_ssize_t _NOGIL_COPY_BYTES = 1 << 16

cdef inline object _walk(object sample, tuple path):
    """``sample[path[0]][path[1]]...``: the leaf a layout path names."""
    cdef object obj = sample
    for key in path:
        obj = obj[key]
    return obj


cdef inline int _array_leaf_fault(object leaf, int ndim, const cnp.npy_intp* want,
                                  int first_fixed, cnp.dtype dtype) noexcept:
    """COPY_OK if ``leaf`` is an ndarray of ``dtype`` (equivalent) with ``ndim``
    dimensions, equal to ``want`` from axis ``first_fixed`` on; else why not.

    The axes before ``first_fixed`` may have any length (padding's leading
    one); an array without them is not the kind of leaf asked for.
    """
    if not cnp.PyArray_Check(leaf):
        return COPY_BAD_TYPE
    cdef int got_ndim = cnp.PyArray_NDIM(<cnp.ndarray> leaf)
    if got_ndim < first_fixed:
        return COPY_BAD_TYPE
    if got_ndim != ndim:
        return COPY_BAD_SHAPE
    cdef cnp.npy_intp* got = cnp.PyArray_DIMS(<cnp.ndarray> leaf)
    cdef int d
    for d in range(first_fixed, ndim):
        if got[d] != want[d]:
            return COPY_BAD_SHAPE
    if not cnp.PyArray_EquivTypes(<cnp.dtype> cnp.PyArray_DESCR(<cnp.ndarray> leaf), dtype):
        return COPY_BAD_DTYPE
    return COPY_OK


@cython.boundscheck(False)
@cython.wraparound(False)
cdef void _copy_strided(char* dst, const char* src, int ndim, const cnp.npy_intp* shape,
                        const cnp.npy_intp* strides, Py_ssize_t itemsize) noexcept nogil:
    """Copy a strided array into C-contiguous ``dst``, one contiguous run at a time."""
    cdef int inner = ndim
    cdef Py_ssize_t block = itemsize
    # Fold trailing dimensions that are already contiguous into one memcpy.
    while inner > 0 and strides[inner - 1] == block:
        block *= shape[inner - 1]
        inner -= 1
    cdef cnp.npy_intp counter[_MAX_DIMS]
    cdef int d
    cdef const char* src_pos
    cdef Py_ssize_t total_blocks = 1
    for d in range(inner):
        total_blocks *= shape[d]
        counter[d] = 0
    cdef Py_ssize_t b
    cdef Py_ssize_t e
    for b in range(total_blocks):
        src_pos = src
        for d in range(inner):
            src_pos += counter[d] * strides[d]
        memcpy(dst, src_pos, block)
        dst += block
        # Odometer increment over the outer dimensions.
        d = inner - 1
        while d >= 0:
            counter[d] += 1
            if counter[d] < shape[d]:
                break
            counter[d] = 0
            d -= 1


cdef inline void _copy_array(char* dst, cnp.ndarray src, Py_ssize_t nbytes) noexcept:
    cdef char* src_data = <char*> cnp.PyArray_DATA(src)
    cdef int ndim = cnp.PyArray_NDIM(src)
    cdef cnp.npy_intp* shape = cnp.PyArray_DIMS(src)
    cdef cnp.npy_intp* strides = cnp.PyArray_STRIDES(src)
    cdef Py_ssize_t itemsize = cnp.PyArray_ITEMSIZE(src)
    if cnp.PyArray_IS_C_CONTIGUOUS(src):
        if nbytes >= _NOGIL_COPY_BYTES:
            with nogil:
                memcpy(dst, src_data, nbytes)
        else:
            memcpy(dst, src_data, nbytes)
    elif nbytes >= _NOGIL_COPY_BYTES:
        with nogil:
            _copy_strided(dst, src_data, ndim, shape, strides, itemsize)
    else:
        _copy_strided(dst, src_data, ndim, shape, strides, itemsize)


@cython.boundscheck(False)
@cython.wraparound(False)
cdef void _copy_rows(char* dst, const char** sources, Py_ssize_t count,
                     Py_ssize_t row_bytes) noexcept nogil:
    """``dst`` row i = ``row_bytes`` from ``sources[i]``, prefetching ahead."""
    # See NOTE [ Prefetching the rows of a gather ].
    cdef Py_ssize_t i
    for i in range(min(count, _PREFETCH_AHEAD)):
        _prefetch_row(sources[i], row_bytes)
    for i in range(count):
        if i + _PREFETCH_AHEAD < count:
            _prefetch_row(sources[i + _PREFETCH_AHEAD], row_bytes)
        memcpy(dst + i * row_bytes, sources[i], row_bytes)


def collate_array_leaf(list samples, tuple path, cnp.dtype dtype, tuple shape, cnp.ndarray out):
    """Copy the array leaf at ``path`` of every sample into row i of ``out``.

    ``out`` is C-contiguous, of ``dtype`` and shape ``(len(samples),) + shape``.
    Returns ``(-1, COPY_OK)``, or ``(i, reason)`` for the first sample whose
    leaf is not an ndarray of exactly that dtype and shape (nothing is raised,
    so the caller can explain or promote).  Every leaf is checked before any
    is copied, so the copies can run as one prefetching loop.
    """
    cdef Py_ssize_t n = len(samples)
    cdef int ndim = len(shape)
    _check_ndim(ndim)
    if not cnp.PyArray_IS_C_CONTIGUOUS(out) or cnp.PyArray_NDIM(out) < 1 \
            or cnp.PyArray_DIMS(out)[0] != n or out.dtype != dtype:
        raise ValueError("out must be a C-contiguous array of the leaf's dtype with one row per sample")
    cdef cnp.npy_intp want[_MAX_DIMS]
    cdef Py_ssize_t row_bytes = dtype.itemsize
    cdef int d
    for d in range(ndim):
        want[d] = shape[d]
        row_bytes *= want[d]
    cdef char* dst = <char*> cnp.PyArray_DATA(out)
    cdef Py_ssize_t i
    cdef object leaf
    cdef int fault
    # The leaves stay referenced here until copied: a sample may build its
    # leaf on access (a custom mapping), and nothing else would keep it alive.
    cdef list leaves = [None] * n
    cdef bint contiguous = True
    cdef const char** sources = <const char**> PyMem_Malloc((n if n > 0 else 1) * sizeof(char*))
    if sources == NULL:
        raise MemoryError()
    try:
        for i in range(n):
            leaf = _walk(samples[i], path)
            fault = _array_leaf_fault(leaf, ndim, want, 0, dtype)
            if fault != COPY_OK:
                return i, fault
            leaves[i] = leaf
            sources[i] = <const char*> cnp.PyArray_DATA(<cnp.ndarray> leaf)
            contiguous = contiguous and cnp.PyArray_IS_C_CONTIGUOUS(<cnp.ndarray> leaf)
        if not contiguous:
            for i in range(n):
                _copy_array(dst + i * row_bytes, <cnp.ndarray> leaves[i], row_bytes)
        elif n * row_bytes >= _NOGIL_COPY_BYTES:
            with nogil:
                _copy_rows(dst, sources, n, row_bytes)
        else:
            _copy_rows(dst, sources, n, row_bytes)
    finally:
        PyMem_Free(sources)
    return -1, COPY_OK


def collate_scalar_leaf(list samples, tuple path, int kind, cnp.ndarray out):
    """Write the scalar leaf at ``path`` of every sample into ``out[i]``.

    ``kind`` is SCALAR_INT (int64 out; bools count as ints, as torch.tensor
    does), SCALAR_FLOAT (float64 out; ints and bools accepted), SCALAR_BOOL
    (bool out; only bools) or SCALAR_NUMPY (numpy scalars of exactly
    ``out.dtype``).  Returns ``(-1, COPY_OK)`` or ``(i, reason)``.
    """
    cdef Py_ssize_t n = len(samples)
    if not cnp.PyArray_IS_C_CONTIGUOUS(out) or cnp.PyArray_NDIM(out) != 1 \
            or cnp.PyArray_DIMS(out)[0] != n:
        raise ValueError("out must be a C-contiguous 1-D array with one element per sample")
    cdef char* dst = <char*> cnp.PyArray_DATA(out)
    cdef Py_ssize_t i
    cdef object leaf
    cdef long long ivalue
    cdef double fvalue
    cdef cnp.dtype want = out.dtype
    cdef Py_ssize_t itemsize = want.itemsize
    if kind == SCALAR_INT and want.num != cnp.NPY_INT64:
        raise ValueError("SCALAR_INT needs an int64 out")
    if kind == SCALAR_FLOAT and want.num != cnp.NPY_FLOAT64:
        raise ValueError("SCALAR_FLOAT needs a float64 out")
    if kind == SCALAR_BOOL and want.num != cnp.NPY_BOOL:
        raise ValueError("SCALAR_BOOL needs a bool out")
    for i in range(n):
        leaf = _walk(samples[i], path)
        if kind == SCALAR_INT:
            if not PyLong_Check(leaf):
                return i, COPY_BAD_TYPE
            try:
                ivalue = PyLong_AsLongLong(leaf)
            except OverflowError:
                return i, COPY_OVERFLOW
            (<int64_t*> dst)[i] = ivalue
        elif kind == SCALAR_FLOAT:
            if not (PyFloat_Check(leaf) or PyLong_Check(leaf)):
                return i, COPY_BAD_TYPE
            try:
                fvalue = PyFloat_AsDouble(leaf)
            except OverflowError:  # an int past float64
                return i, COPY_OVERFLOW
            (<double*> dst)[i] = fvalue
        elif kind == SCALAR_BOOL:
            if not PyBool_Check(leaf):
                return i, COPY_BAD_TYPE
            (<uint8_t*> dst)[i] = 1 if leaf is True else 0
        else:
            if not isinstance(leaf, np.generic):
                return i, COPY_BAD_TYPE
            if not cnp.PyArray_EquivTypes(cnp.PyArray_DescrFromScalar(leaf), want):
                return i, COPY_BAD_DTYPE
            cnp.PyArray_ScalarAsCtype(leaf, dst + i * itemsize)
    return -1, COPY_OK


def collect_leaf_objects(list samples, tuple path):
    """``[sample[path] for sample in samples]`` without a Python-level loop."""
    cdef Py_ssize_t n = len(samples)
    cdef list values = [None] * n
    cdef Py_ssize_t i
    for i in range(n):
        values[i] = _walk(samples[i], path)
    return values


def first_length_mismatch(list samples, tuple path, Py_ssize_t expected):
    """Index of the first sample whose node at ``path`` has ``len != expected``, else -1."""
    cdef Py_ssize_t i
    for i in range(len(samples)):
        if len(_walk(samples[i], path)) != expected:
            return i
    return -1


@cython.boundscheck(False)
@cython.wraparound(False)
cdef void _gather_contiguous(char* dst, const char* src, const int64_t* rows,
                             Py_ssize_t count, Py_ssize_t row_bytes) noexcept nogil:
    # See NOTE [ Prefetching the rows of a gather ].
    cdef Py_ssize_t i
    for i in range(min(count, _PREFETCH_AHEAD)):
        _prefetch_row(src + rows[i] * row_bytes, row_bytes)
    for i in range(count):
        if i + _PREFETCH_AHEAD < count:
            _prefetch_row(src + rows[i + _PREFETCH_AHEAD] * row_bytes, row_bytes)
        memcpy(dst + i * row_bytes, src + rows[i] * row_bytes, row_bytes)


def gather_rows(cnp.ndarray source, const int64_t[::1] rows, cnp.ndarray out):
    """``out[i] = source[rows[i]]`` for every i: one batch of an ArrayDataset.

    Rows are validated once (range, negatives wrapped as numpy does); the copy
    loop then runs without the GIL.  ``out`` must be C-contiguous with
    ``len(rows)`` rows of ``source``'s row shape and dtype.  A source that is
    not C-contiguous (a strided view, a Fortran-order memmap) is gathered by
    numpy's ``take`` instead.
    """
    cdef object source_shape = (<object> source).shape
    cdef object out_shape = (<object> out).shape
    cdef Py_ssize_t count = rows.shape[0]
    if source.ndim == 0:
        raise ValueError("gather_rows needs an array with at least one dimension")
    cdef Py_ssize_t length = source_shape[0]
    if not cnp.PyArray_IS_C_CONTIGUOUS(out) or out.dtype != source.dtype \
            or out_shape != (count,) + source_shape[1:]:
        raise ValueError(f"out must be a C-contiguous {source.dtype} array of shape "
                         f"{(count,) + source_shape[1:]}, got {out.dtype} {out_shape}")
    cdef const int64_t[::1] wrapped = _rows_in_range(rows, length)
    if not cnp.PyArray_IS_C_CONTIGUOUS(source):
        np.take(source, np.asarray(wrapped), axis=0, out=out)
        return out
    cdef Py_ssize_t i
    cdef Py_ssize_t row_bytes = source.itemsize
    for i in range(1, source.ndim):
        row_bytes *= cnp.PyArray_DIMS(source)[i]
    cdef char* dst = <char*> cnp.PyArray_DATA(out)
    cdef const char* src = <const char*> cnp.PyArray_DATA(source)
    if count > 0:
        with nogil:
            _gather_contiguous(dst, src, &wrapped[0], count, row_bytes)
    return out
