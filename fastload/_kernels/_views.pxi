# Zero-copy arrays over a ring slot: what the main process makes for every
# batch it hands out (fastload/_ring/slots.py leases the slot, the layout
# in fastload/collate/layout.py says where each array sits in it).
#
# numpy's own constructors cost more than the arrays: ``np.asarray(lease)``
# discovers what kind of array-like the lease is, and ``np.ndarray(shape,
# dtype, buffer, offset)`` parses its arguments by keyword.  The layout already
# knows every shape, dtype and offset, so these make the same arrays directly.

cimport numpy as cnp
from cpython.ref cimport Py_INCREF
from cpython.object cimport PyTypeObject

cdef extern from "Python.h":
    const Py_ssize_t PY_SSIZE_T_MAX

cdef extern from "numpy/arrayobject.h":
    PyTypeObject PyArray_Type
    # Steals a reference to ``descr``.
    object PyArray_NewFromDescr(PyTypeObject* subtype, cnp.dtype descr, int nd,
                                cnp.npy_intp* dims, cnp.npy_intp* strides, void* data,
                                int flags, object obj)

cdef cnp.dtype _UINT8 = np.dtype(np.uint8)


def lease_array(object lease, cnp.ndarray memory):
    """A uint8 array over ``memory``'s bytes whose base is ``lease`` (writeable
    if ``memory`` is).

    ``lease`` must keep ``memory`` mapped for as long as it lives (it holds
    the segment); the array keeps ``lease`` alive, so the slot stays out of
    circulation while any view of it exists.
    """
    if not cnp.PyArray_IS_C_CONTIGUOUS(memory) or cnp.PyArray_ITEMSIZE(memory) != 1:
        raise ValueError("lease_array needs a contiguous array of bytes")
    cdef cnp.npy_intp size = cnp.PyArray_SIZE(memory)
    cdef int flags = cnp.NPY_ARRAY_C_CONTIGUOUS | cnp.NPY_ARRAY_ALIGNED
    if cnp.PyArray_ISWRITEABLE(memory):
        flags |= cnp.NPY_ARRAY_WRITEABLE
    Py_INCREF(_UINT8)  # PyArray_NewFromDescr steals it
    cdef cnp.ndarray array = PyArray_NewFromDescr(
        &PyArray_Type, _UINT8, 1, &size, NULL, cnp.PyArray_DATA(memory), flags, None)
    cnp.set_array_base(array, lease)
    return array


def slot_view(cnp.ndarray buffer, cnp.dtype dtype, tuple shape, Py_ssize_t offset):
    """``np.ndarray(shape, dtype, buffer, offset)``: a C-contiguous view of
    ``buffer``'s bytes from ``offset`` (``buffer`` a contiguous byte array)."""
    cdef int ndim = len(shape)
    cdef cnp.npy_intp dims[_MAX_DIMS]
    cdef Py_ssize_t nbytes = dtype.itemsize
    cdef int axis
    _check_ndim(ndim)
    if not cnp.PyArray_IS_C_CONTIGUOUS(buffer) or cnp.PyArray_ITEMSIZE(buffer) != 1:
        raise ValueError("slot_view needs a contiguous array of bytes")
    for axis in range(ndim):
        dims[axis] = shape[axis]
        if dims[axis] < 0:
            raise ValueError(f"negative dimension in shape {shape}")
        if dims[axis] and nbytes > PY_SSIZE_T_MAX // dims[axis]:
            raise ValueError(f"a view of shape {shape} is larger than memory")
        nbytes *= dims[axis]
    cdef Py_ssize_t size = cnp.PyArray_SIZE(buffer)
    if offset < 0 or offset > size or nbytes > size - offset:
        raise ValueError(f"a view of {nbytes} bytes at offset {offset} does not fit "
                         f"a buffer of {size}")
    Py_INCREF(dtype)  # PyArray_NewFromDescr steals it
    cdef int flags = cnp.NPY_ARRAY_C_CONTIGUOUS
    if cnp.PyArray_ISWRITEABLE(buffer):
        flags |= cnp.NPY_ARRAY_WRITEABLE
    cdef cnp.ndarray view = PyArray_NewFromDescr(
        &PyArray_Type, dtype, ndim, dims, NULL,
        <char*>cnp.PyArray_DATA(buffer) + offset, flags, None)
    # Whether the dtype's alignment holds at this offset: numpy sets ALIGNED
    # itself only for memory it allocates.
    cnp.PyArray_UpdateFlags(view, cnp.NPY_ARRAY_ALIGNED)
    cnp.set_array_base(view, buffer)
    return view
