# Resampling from packed pixels: Pillow's whole resize, from pixels where they
# lie (a memory map of stored RGB, or an RGBX buffer) to the channel-first
# output, with no copy in between.
#
# The vertical pass is ``_resample.pxi``'s row pass, reading rows in place
# (any row stride, channels interleaved: every byte is filtered on its own).
# The horizontal pass here reads packed pixels (3 or 4 bytes apart) and writes
# each channel to its own plane, mirrored when asked, so it is also the
# conversion to the channel-first layout.  It is vectorised over 8 output
# pixels of a row: their input pixels are gathered (one 32-bit load per pixel,
# the channels then taken apart by shifts), and the weights are kept tap-major
# so that 8 outputs' weights for one tap are one load.  Same integer
# arithmetic as Pillow's pass, in the same fixed point, so the same bits.

from cpython.mem cimport PyMem_Calloc

cdef extern from *:
    """
    #include <stdint.h>
    #include <stddef.h>
    #include <string.h>

    #define FL_HALF (1 << (FL_PRECISION_BITS - 1))

    /* Pillow's horizontal pass for output pixels x0..out_w-1 of one row of
       packed pixels, ps bytes apart; channel c goes to planes[c]. */
    static void fl_hpass_row_scalar(const uint8_t *row, int ps, int x0, int out_w,
                                    const int32_t *bounds, const int32_t *weights,
                                    int ksize, uint8_t *d0, uint8_t *d1, uint8_t *d2,
                                    int flip) {
        for (int x = x0; x < out_w; x++) {
            int taps = bounds[2 * x + 1];
            const uint8_t *p = row + (ptrdiff_t)bounds[2 * x] * ps;
            const int32_t *w = weights + (ptrdiff_t)x * ksize;
            int32_t a0 = FL_HALF, a1 = FL_HALF, a2 = FL_HALF;
            for (int t = 0; t < taps; t++, p += ps) {
                a0 += p[0] * w[t];
                a1 += p[1] * w[t];
                a2 += p[2] * w[t];
            }
            int at = flip ? out_w - 1 - x : x;
            d0[at] = FL_CLIP8(a0);
            d1[at] = FL_CLIP8(a1);
            d2[at] = FL_CLIP8(a2);
        }
    }

    #define FL_HPASS_ARGS const uint8_t *src, ptrdiff_t stride, int ps, int rows,     \\
        int safe_rows, int out_w, const int32_t *bounds, const int32_t *weights,     \\
        int ksize, const int32_t *offsets, const int32_t *tap_weights, uint8_t *out, \\
        ptrdiff_t out_stride, ptrdiff_t plane, int flip

    static void fl_hpass_generic(FL_HPASS_ARGS) {
        (void)safe_rows; (void)offsets; (void)tap_weights;
        for (int y = 0; y < rows; y++) {
            uint8_t *d0 = out + (ptrdiff_t)y * out_stride;
            fl_hpass_row_scalar(src + (ptrdiff_t)y * stride, ps, 0, out_w, bounds, weights,
                                ksize, d0, d0 + plane, d0 + 2 * plane, flip);
        }
    }

    #if defined(__GNUC__) && defined(__x86_64__)
    #include <immintrin.h>

    /* 8 sums -> 8 clipped bytes (the two saturating packs are the clip), stored
       at b, or mirrored. */
    __attribute__((target("avx2")))
    static inline void fl_store8(uint8_t *d, __m256i acc, int b, int out_w, int flip) {
        __m256i s = _mm256_srai_epi32(acc, FL_PRECISION_BITS);
        s = _mm256_packs_epi32(s, s);
        s = _mm256_packus_epi16(s, s);
        uint64_t v = (uint64_t)(uint32_t)_mm256_extract_epi32(s, 0)
                     | ((uint64_t)(uint32_t)_mm256_extract_epi32(s, 4) << 32);
        if (flip) {
            v = __builtin_bswap64(v);
            memcpy(d + out_w - 8 - b, &v, 8);
        } else {
            memcpy(d + b, &v, 8);
        }
    }

    /* offsets / tap_weights: [ksize][out_w], the byte offset of each tap's pixel
       (clamped inside the row where the weight is 0) and its weight.  A row is
       gathered only if 4 bytes can be read at its last pixel (rows < safe_rows). */
    __attribute__((target("avx2")))
    static void fl_hpass_avx2(FL_HPASS_ARGS) {
        const __m256i byte = _mm256_set1_epi32(0xff), half = _mm256_set1_epi32(FL_HALF);
        int blocks_end = out_w & ~7;
        for (int y = 0; y < rows; y++) {
            const uint8_t *row = src + (ptrdiff_t)y * stride;
            uint8_t *d0 = out + (ptrdiff_t)y * out_stride, *d1 = d0 + plane, *d2 = d1 + plane;
            int b = 0;
            if (y < safe_rows) {
                for (; b < blocks_end; b += 8) {
                    __m256i a0 = half, a1 = half, a2 = half;
                    for (int t = 0; t < ksize; t++) {
                        __m256i at = _mm256_loadu_si256(
                            (const __m256i *)(offsets + (ptrdiff_t)t * out_w + b));
                        __m256i w = _mm256_loadu_si256(
                            (const __m256i *)(tap_weights + (ptrdiff_t)t * out_w + b));
                        __m256i v = _mm256_i32gather_epi32((const int *)row, at, 1);
                        a0 = _mm256_add_epi32(a0, _mm256_mullo_epi32(
                            _mm256_and_si256(v, byte), w));
                        a1 = _mm256_add_epi32(a1, _mm256_mullo_epi32(
                            _mm256_and_si256(_mm256_srli_epi32(v, 8), byte), w));
                        a2 = _mm256_add_epi32(a2, _mm256_mullo_epi32(
                            _mm256_and_si256(_mm256_srli_epi32(v, 16), byte), w));
                    }
                    fl_store8(d0, a0, b, out_w, flip);
                    fl_store8(d1, a1, b, out_w, flip);
                    fl_store8(d2, a2, b, out_w, flip);
                }
            }
            fl_hpass_row_scalar(row, ps, b, out_w, bounds, weights, ksize, d0, d1, d2, flip);
        }
    }
    #else
    static void fl_hpass_avx2(FL_HPASS_ARGS) {
        fl_hpass_generic(src, stride, ps, rows, safe_rows, out_w, bounds, weights, ksize,
                         offsets, tap_weights, out, out_stride, plane, flip);
    }
    #endif
    """
    void fl_hpass_generic(const uint8_t* src, Py_ssize_t stride, int ps, int rows,
                          int safe_rows, int out_w, const int32_t* bounds,
                          const int32_t* weights, int ksize, const int32_t* offsets,
                          const int32_t* tap_weights, uint8_t* out, Py_ssize_t out_stride,
                          Py_ssize_t plane, int flip) noexcept nogil
    void fl_hpass_avx2(const uint8_t* src, Py_ssize_t stride, int ps, int rows,
                       int safe_rows, int out_w, const int32_t* bounds,
                       const int32_t* weights, int ksize, const int32_t* offsets,
                       const int32_t* tap_weights, uint8_t* out, Py_ssize_t out_stride,
                       Py_ssize_t plane, int flip) noexcept nogil


cdef struct _Pass:
    # One pass's weights as Pillow computes them: per output pixel its first
    # input pixel and tap count (bounds), and ksize fixed-point weights.  For a
    # horizontal pass under AVX2, the same tap-major: the byte offset of each
    # tap's pixel (kept inside the row where the weight is 0) and its weight.
    int ksize
    int32_t* bounds
    int32_t* weights
    int32_t* offsets
    int32_t* tap_weights


cdef int _pass_init(_Pass* p, int kind, int in_size, float in0, float in1, int out_size,
                    bint identity) except -1:
    """Fill ``p`` (all pointers NULL first, so ``_pass_free`` is always safe)."""
    cdef int x
    cdef double* scratch
    p.offsets = p.tap_weights = NULL
    p.ksize = 1 if identity else _taps_bound(kind, in0, in1, out_size)
    p.bounds = <int32_t*>PyMem_Malloc(2 * out_size * sizeof(int32_t))
    p.weights = <int32_t*>PyMem_Calloc(<size_t>out_size * p.ksize, sizeof(int32_t))
    if p.bounds == NULL or p.weights == NULL:
        raise MemoryError()
    if identity:   # the pass Pillow skips, as an exact copy
        for x in range(out_size):
            p.bounds[2 * x], p.bounds[2 * x + 1] = x, 1
            p.weights[x] = 1 << _PRECISION_BITS
        return 0
    scratch = <double*>PyMem_Malloc(p.ksize * sizeof(double))
    if scratch == NULL:
        raise MemoryError()
    _weights(kind, in_size, in0, in1, out_size, p.ksize, p.bounds, p.weights, scratch)
    PyMem_Free(scratch)
    return 0


cdef int _pass_tap_major(_Pass* p, int in_size, int out_size, int ps) except -1:
    cdef int x, t, pixel
    p.offsets = <int32_t*>PyMem_Malloc(<size_t>out_size * p.ksize * sizeof(int32_t))
    p.tap_weights = <int32_t*>PyMem_Malloc(<size_t>out_size * p.ksize * sizeof(int32_t))
    if p.offsets == NULL or p.tap_weights == NULL:
        raise MemoryError()
    for t in range(p.ksize):
        for x in range(out_size):
            pixel = p.bounds[2 * x] + t
            p.offsets[t * out_size + x] = (pixel if pixel < in_size else in_size - 1) * ps
            p.tap_weights[t * out_size + x] = p.weights[x * p.ksize + t]
    return 0


cdef void _pass_free(_Pass* p) noexcept:
    PyMem_Free(p.bounds)
    PyMem_Free(p.weights)
    PyMem_Free(p.offsets)
    PyMem_Free(p.tap_weights)


cdef void _vertical(const uint8_t* src, Py_ssize_t stride, Py_ssize_t n, int out_rows,
                    _Pass* p, uint8_t* out, Py_ssize_t out_stride) noexcept nogil:
    if _HAVE_AVX2:
        fl_resample_rows_avx2(src, stride, n, out_rows, p.bounds, p.weights, p.ksize, out,
                              out_stride)
    else:
        fl_resample_rows_generic(src, stride, n, out_rows, p.bounds, p.weights, p.ksize, out,
                                 out_stride)


cdef void _horizontal(const uint8_t* src, Py_ssize_t stride, int ps, int rows, int safe_rows,
                      int out_w, _Pass* p, uint8_t* out, Py_ssize_t out_stride,
                      Py_ssize_t plane, bint flip) noexcept nogil:
    if p.offsets != NULL:
        fl_hpass_avx2(src, stride, ps, rows, safe_rows, out_w, p.bounds, p.weights, p.ksize,
                      p.offsets, p.tap_weights, out, out_stride, plane, flip)
    else:
        fl_hpass_generic(src, stride, ps, rows, safe_rows, out_w, p.bounds, p.weights, p.ksize,
                         NULL, NULL, out, out_stride, plane, flip)


@cython.boundscheck(False)
@cython.wraparound(False)
def resize_packed_to_chw(const uint8_t[::1] data not None, Py_ssize_t offset,
                         Py_ssize_t row_bytes, int pixel_bytes, int width, int height,
                         box, int out_width, int out_height, int resample,
                         bint vertical_first, bint flip):
    """Pillow's ``resize((out_width, out_height), resample, box)`` of the ``width`` x
    ``height`` image whose packed pixels (``pixel_bytes`` = 3 or 4, channels 0..2
    are R, G, B) start at ``data[offset]``, rows ``row_bytes`` apart, as a
    ``(3, out_height, out_width)`` uint8 array, mirrored left-right when ``flip``.

    ``vertical_first``: Pillow runs the vertical pass first for this size.  A
    pass Pillow skips (same size, whole extent) is an exact copy here.
    """
    cdef double left, top, right, bottom
    left, top, right, bottom = box
    if resample not in RESAMPLE_FILTERS:
        raise ValueError(f"resize_packed_to_chw: resample={resample} is not one of Pillow's "
                         f"convolution filters {sorted(RESAMPLE_FILTERS)}")
    if pixel_bytes not in (3, 4) or width < 1 or height < 1 or out_width < 1 or out_height < 1:
        raise ValueError(f"resize_packed_to_chw: cannot resize {width}x{height} pixels of "
                         f"{pixel_bytes} bytes to {out_width}x{out_height}")
    if offset < 0 or row_bytes < <Py_ssize_t>width * pixel_bytes or \
            offset + (height - 1) * row_bytes + <Py_ssize_t>width * pixel_bytes > data.shape[0]:
        raise ValueError(f"resize_packed_to_chw: a {width}x{height} image at offset {offset}, "
                         f"rows {row_bytes} bytes apart, is not inside {data.shape[0]} bytes")
    cdef float l = left, t = top, r = right, btm = bottom   # Pillow's box is C floats
    if not (0 <= l < r <= width and 0 <= t < btm <= height):
        raise ValueError(f"resize_packed_to_chw: box {tuple(box)} is not inside "
                         f"{width}x{height}")
    out = np.empty((3, out_height, out_width), dtype=np.uint8)
    cdef uint8_t[:, :, ::1] o = out
    cdef _Pass xs, ys
    xs.bounds = xs.weights = xs.offsets = xs.tap_weights = NULL
    ys.bounds = ys.weights = ys.offsets = ys.tap_weights = NULL
    try:
        _resize_packed(&data[0] + offset, row_bytes, pixel_bytes, width, height,
                       data.shape[0] - offset, l, t, r, btm, resample, vertical_first, flip,
                       &xs, &ys, &o[0, 0, 0], out_width, out_height)
    finally:
        _pass_free(&xs)
        _pass_free(&ys)
    return out


@cython.boundscheck(False)   # indexes 0 of arrays just made non-empty
@cython.wraparound(False)
cdef int _resize_packed(const uint8_t* src, Py_ssize_t row_bytes, int ps, int width,
                        int height, Py_ssize_t available, float left, float top, float right,
                        float bottom, int resample, bint vertical_first, bint flip,
                        _Pass* xs, _Pass* ys, uint8_t* out, int out_width, int out_height
                        ) except -1:
    # Pillow skips a pass that would change nothing (same size, whole extent).
    cdef bint along_x = out_width != width or left != 0 or right != out_width
    cdef bint along_y = out_height != height or top != 0 or bottom != out_height
    cdef Py_ssize_t plane = <Py_ssize_t>out_height * out_width, stride
    cdef int first, last, y, c, safe
    cdef uint8_t[:, ::1] mid
    _pass_init(xs, resample, width, left, right, out_width, not along_x)
    if _HAVE_AVX2:
        _pass_tap_major(xs, width, out_width, ps)
    if along_y and vertical_first:
        _pass_init(ys, resample, height, top, bottom, out_height, False)
        stride = <Py_ssize_t>width * ps + 4   # room for the last pixel's 4-byte load
        mid = np.empty((out_height, stride), dtype=np.uint8)
        with nogil:
            _vertical(src, row_bytes, <Py_ssize_t>width * ps, out_height, ys, &mid[0, 0],
                      stride)
            _horizontal(&mid[0, 0], stride, ps, out_height, out_height, out_width, xs, out,
                        out_width, plane, flip)
        return 0
    # Horizontal first: only the rows the vertical pass reads, as Pillow does.
    _pass_init(ys, resample, height, top, bottom, out_height, not along_y)
    first = ys.bounds[0]
    last = ys.bounds[2 * (out_height - 1)] + ys.bounds[2 * (out_height - 1) + 1]
    for y in range(out_height):
        ys.bounds[2 * y] -= first
    src += first * row_bytes
    safe = _safe_rows(available - first * row_bytes, row_bytes, last - first,
                      (width - 1) * ps + 4)
    if not along_y:
        with nogil:
            _horizontal(src, row_bytes, ps, out_height, safe, out_width, xs, out, out_width,
                        plane, flip)
        return 0
    mid = np.empty((3 * (last - first), out_width), dtype=np.uint8)
    with nogil:
        _horizontal(src, row_bytes, ps, last - first, safe, out_width, xs, &mid[0, 0],
                    out_width, <Py_ssize_t>(last - first) * out_width, flip)
        for c in range(3):
            _vertical(&mid[c * (last - first), 0], out_width, out_width, out_height, ys,
                      out + c * plane, out_width)
    return 0


cdef int _safe_rows(Py_ssize_t available, Py_ssize_t row_bytes, int rows, Py_ssize_t reach):
    """How many rows, from the first, have ``reach`` bytes readable at their start."""
    if available < reach:
        return 0
    return <int>min(rows, (available - reach) // row_bytes + 1)


def _resample_use_avx2(bint on):
    """Choose the AVX2 or the baseline copy of the resampling loops (where the CPU
    has AVX2); returns the previous choice.  For tests: both must give the same bits."""
    global _HAVE_AVX2
    previous = _HAVE_AVX2
    _HAVE_AVX2 = on and fl_cpu_has_avx2()
    return previous
