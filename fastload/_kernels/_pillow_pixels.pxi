# An RGB image's pixels out of Pillow in one copy, for the decoded-image cache.
#
# ``Image.tobytes()`` runs Pillow's raw encoder chunk by chunk and joins the
# chunks: two copies, and Python work per chunk.  Pillow (11.2 and later)
# also exports its pixel memory through the Arrow C data interface, a stable
# ABI: an RGB image is a fixed-size list of 4 bytes per pixel (R, G, B, pad)
# over one block of Pillow's memory, lent without a copy.  ``pack_rgb_arrow``
# reads that and writes the packed 3-byte pixels the cache stores;
# ``resize_arrow_rgb_to_chw`` resizes straight from it.

from cpython.pycapsule cimport PyCapsule_GetPointer, PyCapsule_IsValid
from libc.stdint cimport int64_t
from libc.string cimport strcmp



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

    /* RGBX -> RGB, from pixel ``done`` on. */
    static void fl_pack_rgbx_generic(const uint8_t *src, int64_t pixels, uint8_t *dst,
                                     int64_t done) {
        for (int64_t i = done; i < pixels; i++) {
            dst[3 * i] = src[4 * i];
            dst[3 * i + 1] = src[4 * i + 1];
            dst[3 * i + 2] = src[4 * i + 2];
        }
    }

    #if defined(__GNUC__) && defined(__x86_64__)
    #include <immintrin.h>
    /* 4 pixels a step with one byte shuffle: 16 bytes in, 12 out (each 16-byte
       store runs 4 bytes into the next step's place, so the last steps are
       left to the loop above). */
    __attribute__((target("ssse3")))
    static void fl_pack_rgbx_ssse3(const uint8_t *src, int64_t pixels, uint8_t *dst) {
        const __m128i pick = _mm_setr_epi8(0, 1, 2, 4, 5, 6, 8, 9, 10, 12, 13, 14,
                                           -1, -1, -1, -1);
        int64_t i = 0;
        for (; i + 6 <= pixels; i += 4) {
            __m128i v = _mm_loadu_si128((const __m128i *)(src + 4 * i));
            _mm_storeu_si128((__m128i *)(dst + 3 * i), _mm_shuffle_epi8(v, pick));
        }
        fl_pack_rgbx_generic(src, pixels, dst, i);
    }
    static int fl_cpu_has_ssse3(void) {
        __builtin_cpu_init();
        return __builtin_cpu_supports("ssse3");
    }
    static void fl_pack_rgbx(const uint8_t *src, int64_t pixels, uint8_t *dst) {
        static int ssse3 = -1;
        if (ssse3 < 0)
            ssse3 = fl_cpu_has_ssse3();
        if (ssse3)
            fl_pack_rgbx_ssse3(src, pixels, dst);
        else
            fl_pack_rgbx_generic(src, pixels, dst, 0);
    }
    #else
    static void fl_pack_rgbx(const uint8_t *src, int64_t pixels, uint8_t *dst) {
        fl_pack_rgbx_generic(src, pixels, dst, 0);
    }
    #endif
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
    void fl_pack_rgbx(const uint8_t* src, int64_t pixels, uint8_t* dst) noexcept nogil


cdef const uint8_t* _arrow_rgbx(schema_capsule, array_capsule, Py_ssize_t pixels):
    """Pillow's memory of an RGB image of ``pixels`` pixels as exported (one block of
    4-byte pixels), or NULL when the export is anything else."""
    if pixels < 1 or not (PyCapsule_IsValid(schema_capsule, "arrow_schema")
                          and PyCapsule_IsValid(array_capsule, "arrow_array")):
        return NULL
    cdef FlArrowSchema* schema = <FlArrowSchema*>PyCapsule_GetPointer(schema_capsule,
                                                                     "arrow_schema")
    cdef FlArrowArray* array = <FlArrowArray*>PyCapsule_GetPointer(array_capsule, "arrow_array")
    if schema.format == NULL or strcmp(schema.format, "+w:4") != 0 or schema.n_children != 1 \
            or schema.children[0].format == NULL or strcmp(schema.children[0].format, "C") != 0:
        return NULL
    if array.length != pixels or array.offset != 0 or array.null_count != 0 \
            or array.n_children != 1:
        return NULL
    cdef FlArrowArray* child = array.children[0]
    if child.length != 4 * pixels or child.offset != 0 or child.null_count != 0 \
            or child.n_buffers != 2 or child.buffers[1] == NULL:
        return NULL
    return <const uint8_t*>child.buffers[1]


@cython.boundscheck(False)
@cython.wraparound(False)
def pack_rgb_arrow(schema_capsule, array_capsule, Py_ssize_t pixels, uint8_t[::1] out not None):
    """Write the ``pixels`` RGB pixels Pillow exported (``Image.__arrow_c_array__()``'s
    two capsules) into ``out`` as packed 3-byte pixels; returns True, or None
    when the export is not one block of 4-byte pixels (the caller then uses
    ``tobytes``)."""
    if out.shape[0] != 3 * pixels:
        return None
    cdef const uint8_t* src = _arrow_rgbx(schema_capsule, array_capsule, pixels)
    if src == NULL:
        return None
    with nogil:
        fl_pack_rgbx(src, pixels, &out[0])
    return True


def resize_arrow_rgb_to_chw(schema_capsule, array_capsule, int width, int height, box,
                            int out_width, int out_height, int resample, bint vertical_first,
                            bint flip):
    """``resize_packed_to_chw`` of the ``width`` x ``height`` RGB image Pillow exported
    (``Image.__arrow_c_array__()``'s two capsules), read in Pillow's memory; None
    when the export is not one block of 4-byte pixels."""
    cdef Py_ssize_t pixels = <Py_ssize_t>width * height
    cdef const uint8_t* src = _arrow_rgbx(schema_capsule, array_capsule, pixels)
    if src == NULL:
        return None
    # A view of Pillow's block, alive while the capsules are (they hold the image).
    cdef uint8_t[::1] data = <uint8_t[:4 * pixels]><uint8_t*>src
    return resize_packed_to_chw(data, 0, 4 * width, 4, width, height, box, out_width,
                                out_height, resample, vertical_first, flip)
