# Whole batches of in-memory images (MNIST's, CIFAR's ``data``) made as
# ``ToArray()`` (and ``Normalize``) would make them sample by sample: rows
# gathered, channels moved first, and uint8 values optionally mapped through a
# per-channel table of floats, in one pass with no per-sample Python.
#
# The table is exact, not an approximation: ``Normalize`` applies the same
# float32 operations to every pixel of a channel, so its result depends only on
# (channel, byte value); the caller computes the 256 values per channel with
# the transform itself, and this loop looks them up.

cimport cython
cimport numpy as cnp
from libc.stdint cimport int64_t, uint8_t


@cython.boundscheck(False)
@cython.wraparound(False)
cdef void _image_rows_bytes(uint8_t* dst, const uint8_t* src, const int64_t* rows,
                            Py_ssize_t count, Py_ssize_t pixels, Py_ssize_t channels) noexcept nogil:
    cdef Py_ssize_t i, p, c
    cdef const uint8_t* image
    cdef Py_ssize_t image_bytes = pixels * channels
    for i in range(count):
        image = src + rows[i] * image_bytes
        if channels == 1:
            memcpy(dst, image, pixels)
        else:
            for c in range(channels):
                for p in range(pixels):
                    dst[c * pixels + p] = image[p * channels + c]
        dst += image_bytes


@cython.boundscheck(False)
@cython.wraparound(False)
cdef void _image_rows_table(float* dst, const uint8_t* src, const int64_t* rows, Py_ssize_t count,
                            Py_ssize_t pixels, Py_ssize_t channels, const float* table) noexcept nogil:
    cdef Py_ssize_t i, p, c
    cdef const uint8_t* image
    cdef const float* channel_table
    cdef Py_ssize_t image_bytes = pixels * channels
    for i in range(count):
        image = src + rows[i] * image_bytes
        for c in range(channels):
            channel_table = table + c * 256
            for p in range(pixels):
                dst[c * pixels + p] = channel_table[image[p * channels + c]]
        dst += image_bytes


def gather_image_rows(cnp.ndarray source, const int64_t[::1] rows, cnp.ndarray out,
                      table=None):
    """``out[i] = ToArray()(source[rows[i]])``, or ``table[c][...]`` of it when given.

    ``source`` is a C-contiguous uint8 array of images, ``(N, H, W)`` (one
    channel) or ``(N, H, W, C)``; ``out`` is C-contiguous ``(len(rows), C, H,
    W)``, uint8 without ``table``, float32 with one (a C-contiguous float32
    ``(C, 256)`` array: the value of each byte in each channel).  Rows are
    checked once (negatives wrap as numpy's); the copy runs without the GIL.
    """
    if source.dtype != np.uint8 or not cnp.PyArray_IS_C_CONTIGUOUS(source) \
            or source.ndim not in (3, 4):
        raise ValueError(f"source must be a C-contiguous uint8 array (N, H, W) or (N, H, W, C), "
                         f"got {source.dtype} {(<object> source).shape}")
    cdef Py_ssize_t length = source.shape[0]
    cdef Py_ssize_t height = source.shape[1]
    cdef Py_ssize_t width = source.shape[2]
    cdef Py_ssize_t channels = source.shape[3] if source.ndim == 4 else 1
    cdef Py_ssize_t count = rows.shape[0]
    expected = (count, channels, height, width)
    out_dtype = np.uint8 if table is None else np.float32
    if not cnp.PyArray_IS_C_CONTIGUOUS(out) or out.dtype != out_dtype \
            or (<object> out).shape != expected:
        raise ValueError(f"out must be a C-contiguous {np.dtype(out_dtype)} array of shape "
                         f"{expected}, got {out.dtype} {(<object> out).shape}")
    cdef cnp.ndarray table_array
    if table is not None:
        table_array = <cnp.ndarray> table
        if table_array.dtype != np.float32 or not cnp.PyArray_IS_C_CONTIGUOUS(table_array) \
                or (<object> table_array).shape != (channels, 256):
            raise ValueError(f"table must be a C-contiguous float32 array of shape "
                             f"({channels}, 256), got {table_array.dtype} "
                             f"{(<object> table_array).shape}")
    cdef const int64_t[::1] wrapped = _rows_in_range(rows, length)
    if count == 0:
        return out
    cdef const uint8_t* src = <const uint8_t*> cnp.PyArray_DATA(source)
    cdef const float* table_data
    if table is None:
        with nogil:
            _image_rows_bytes(<uint8_t*> cnp.PyArray_DATA(out), src, &wrapped[0], count,
                              height * width, channels)
    else:
        table_data = <const float*> cnp.PyArray_DATA(table_array)
        with nogil:
            _image_rows_table(<float*> cnp.PyArray_DATA(out), src, &wrapped[0], count,
                              height * width, channels, table_data)
    return out
