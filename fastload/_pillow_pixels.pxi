# An RGB image's pixels out of Pillow in one copy, for the decoded-image cache.
#
# ``Image.tobytes()`` runs Pillow's raw encoder chunk by chunk and joins the
# chunks: two copies, and Python work per chunk.  Pillow (11.2 and later)
# also exports its pixel memory through the Arrow C data interface, a stable
# ABI: an RGB image is a fixed-size list of 4 bytes per pixel (R, G, B, pad)
# over one block of Pillow's memory, lent without a copy.  ``pack_rgb_arrow``
# reads that and writes the packed 3-byte pixels the cache stores, summing
# them (``data_checksum``'s sum) as it goes.

from cpython.pycapsule cimport PyCapsule_GetPointer, PyCapsule_IsValid
from libc.stdint cimport int64_t, uint64_t
from libc.string cimport strcmp

import sys


cdef extern from *:
    """
    #include <stdint.h>
    #include <string.h>

    struct FlArrowSchema {
        const char *format; const char *name; const char *metadata;
        int64_t flags; int64_t n_children;
        struct FlArrowSchema **children; struct FlArrowSchema *dictionary;
        void (*release)(struct FlArrowSchema *); void *private_data;
    };
    struct FlArrowArray {
        int64_t length; int64_t null_count; int64_t offset;
        int64_t n_buffers; int64_t n_children;
        const void **buffers; struct FlArrowArray **children;
        struct FlArrowArray *dictionary;
        void (*release)(struct FlArrowArray *); void *private_data;
    };

    /* RGBX -> RGB, and the sum of the packed bytes as little-endian 64-bit words
       (the tail zero-padded), as data_checksum takes it (without the length). */
    static uint64_t fl_pack_rgbx(const uint8_t *src, int64_t pixels, uint8_t *dst) {
        for (int64_t i = 0; i < pixels; i++) {
            dst[3 * i] = src[4 * i];
            dst[3 * i + 1] = src[4 * i + 1];
            dst[3 * i + 2] = src[4 * i + 2];
        }
        int64_t n = 3 * pixels, whole = n / 8 * 8;
        uint64_t total = 0, word;
        for (int64_t i = 0; i < whole; i += 8) {
            memcpy(&word, dst + i, 8);
            total += word;   /* little-endian hosts only: checked by the caller */
        }
        word = 0;
        memcpy(&word, dst + whole, (size_t)(n - whole));
        return total + word;
    }
    """
    struct FlArrowSchema:
        const char* format
        int64_t n_children
        FlArrowSchema** children
    struct FlArrowArray:
        int64_t length
        int64_t null_count
        int64_t offset
        int64_t n_buffers
        int64_t n_children
        const void** buffers
        FlArrowArray** children
    uint64_t fl_pack_rgbx(const uint8_t* src, int64_t pixels, uint8_t* dst) noexcept nogil


@cython.boundscheck(False)
@cython.wraparound(False)
def pack_rgb_arrow(schema_capsule, array_capsule, Py_ssize_t pixels, uint8_t[::1] out not None):
    """Write the ``pixels`` RGB pixels Pillow exported (``Image.__arrow_c_array__()``'s
    two capsules) into ``out`` as packed 3-byte pixels; returns the sum of those
    bytes as 64-bit little-endian words (``data_checksum`` less the length), or
    None when the export is not one block of 4-byte pixels (the caller then
    uses ``tobytes``)."""
    if sys.byteorder != "little" or out.shape[0] != 3 * pixels or pixels < 1:
        return None
    if not (PyCapsule_IsValid(schema_capsule, "arrow_schema")
            and PyCapsule_IsValid(array_capsule, "arrow_array")):
        return None
    cdef FlArrowSchema* schema = <FlArrowSchema*>PyCapsule_GetPointer(schema_capsule,
                                                                     "arrow_schema")
    cdef FlArrowArray* array = <FlArrowArray*>PyCapsule_GetPointer(array_capsule, "arrow_array")
    if schema.format == NULL or strcmp(schema.format, "+w:4") != 0 or schema.n_children != 1 \
            or schema.children[0].format == NULL or strcmp(schema.children[0].format, "C") != 0:
        return None
    if array.length != pixels or array.offset != 0 or array.null_count != 0 \
            or array.n_children != 1:
        return None
    cdef FlArrowArray* child = array.children[0]
    if child.length != 4 * pixels or child.offset != 0 or child.null_count != 0 \
            or child.n_buffers != 2 or child.buffers[1] == NULL:
        return None
    cdef const uint8_t* src = <const uint8_t*>child.buffers[1]
    cdef uint64_t total
    with nogil:
        total = fl_pack_rgbx(src, pixels, &out[0])
    return total
