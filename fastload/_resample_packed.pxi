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


cdef class _PassWeights:
    """One pass's bounds and fixed-point weights (Pillow's), or the identity."""
    cdef public object bounds, weights
    cdef public int ksize

    @cython.boundscheck(False)   # indexes 0 of buffers proven non-empty
    @cython.wraparound(False)
    def __init__(self, int kind, int in_size, double start, double stop, int out_size,
                 bint identity):
        cdef float in0 = start, in1 = stop   # Pillow parses its box as C floats
        if identity:
            self.ksize = 1
            self.bounds = np.stack([np.arange(out_size, dtype=np.int32),
                                    np.ones(out_size, dtype=np.int32)], axis=1).reshape(-1)
            self.weights = np.full(out_size, 1 << _PRECISION_BITS, dtype=np.int32)
            return
        self.ksize = _taps_bound(kind, in0, in1, out_size)
        self.bounds = np.empty(2 * out_size, dtype=np.int32)
        self.weights = np.zeros(<Py_ssize_t>out_size * self.ksize, dtype=np.int32)
        scratch = np.empty(self.ksize, dtype=np.float64)
        cdef int32_t[::1] b = self.bounds, w = self.weights
        cdef double[::1] tmp = scratch
        with nogil:
            _weights(kind, in_size, in0, in1, out_size, self.ksize, &b[0], &w[0], &tmp[0])


@cython.boundscheck(False)   # indexes 0 of buffers proven non-empty
@cython.wraparound(False)
cdef void _vertical(const uint8_t* src, Py_ssize_t stride, Py_ssize_t n, int out_rows,
                    _PassWeights p, uint8_t* out, Py_ssize_t out_stride):
    cdef int32_t[::1] b = p.bounds, w = p.weights
    if _HAVE_AVX2:
        fl_resample_rows_avx2(src, stride, n, out_rows, &b[0], &w[0], p.ksize, out, out_stride)
    else:
        fl_resample_rows_generic(src, stride, n, out_rows, &b[0], &w[0], p.ksize, out,
                                 out_stride)


@cython.boundscheck(False)   # indexes 0 of buffers proven non-empty
@cython.wraparound(False)
cdef void _horizontal(const uint8_t* src, Py_ssize_t stride, int ps, int rows, int safe_rows,
                      int in_size, int out_w, _PassWeights p, uint8_t* out,
                      Py_ssize_t out_stride, Py_ssize_t plane, bint flip):
    cdef int32_t[::1] b = p.bounds, w = p.weights
    cdef int ksize = p.ksize
    if not _HAVE_AVX2:
        fl_hpass_generic(src, stride, ps, rows, safe_rows, out_w, &b[0], &w[0], ksize,
                         NULL, NULL, out, out_stride, plane, flip)
        return
    # Tap-major tables: for tap t of output x, its pixel's byte offset (kept
    # inside the row where the tap is past the pixel's own count: weight 0).
    taps = np.arange(ksize, dtype=np.int32)[:, None]
    bounds = np.asarray(p.bounds).reshape(-1, 2)
    offsets = np.ascontiguousarray(
        np.minimum(bounds[:, 0][None, :] + taps, in_size - 1) * ps, dtype=np.int32)
    tap_weights = np.ascontiguousarray(np.asarray(p.weights).reshape(out_w, ksize).T)
    cdef int32_t[::1] o = offsets.reshape(-1), tw = tap_weights.reshape(-1)
    fl_hpass_avx2(src, stride, ps, rows, safe_rows, out_w, &b[0], &w[0], ksize, &o[0], &tw[0],
                  out, out_stride, plane, flip)


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
    cdef float l = left, t = top, r = right, btm = bottom
    if not (0 <= l < r <= width and 0 <= t < btm <= height):
        raise ValueError(f"resize_packed_to_chw: box {tuple(box)} is not inside "
                         f"{width}x{height}")
    # Pillow skips a pass that would change nothing (same size, whole extent).
    cdef bint along_x = out_width != width or left != 0 or right != out_width
    cdef bint along_y = out_height != height or top != 0 or bottom != out_height
    xs = _PassWeights(resample, width, left, right, out_width, not along_x)
    out = np.empty((3, out_height, out_width), dtype=np.uint8)
    cdef uint8_t[:, :, ::1] o = out
    cdef Py_ssize_t plane = <Py_ssize_t>out_height * out_width
    cdef const uint8_t* src = &data[0] + offset
    cdef int safe
    cdef Py_ssize_t stride
    cdef uint8_t[:, ::1] mid
    cdef uint8_t[:, :, ::1] planes
    cdef int c
    if along_y and vertical_first:
        ys = _PassWeights(resample, height, top, bottom, out_height, False)
        stride = <Py_ssize_t>width * pixel_bytes + 4   # room for the last pixel's 4-byte load
        mid = np.empty((out_height, stride), dtype=np.uint8)
        _vertical(src, row_bytes, <Py_ssize_t>width * pixel_bytes, out_height, ys, &mid[0, 0],
                  stride)
        _horizontal(&mid[0, 0], stride, pixel_bytes, out_height, out_height, width, out_width,
                    xs, &o[0, 0, 0], out_width, plane, flip)
        return out
    # Horizontal first: only the rows the vertical pass reads, as Pillow does.
    ys = _PassWeights(resample, height, top, bottom, out_height, not along_y)
    ybounds = ys.bounds.reshape(-1, 2)
    cdef int first = ybounds[0, 0], last = ybounds[-1, 0] + ybounds[-1, 1]
    ybounds[:, 0] -= first
    safe = _safe_rows(data.shape[0] - offset - first * row_bytes, row_bytes, last - first,
                      (width - 1) * pixel_bytes + 4)
    if not along_y:
        _horizontal(src, row_bytes, pixel_bytes, out_height, safe, width, out_width, xs,
                    &o[0, 0, 0], out_width, plane, flip)
        return out
    planes = np.empty((3, last - first, out_width), dtype=np.uint8)
    _horizontal(src + first * row_bytes, row_bytes, pixel_bytes, last - first, safe, width,
                out_width, xs, &planes[0, 0, 0], out_width,
                <Py_ssize_t>(last - first) * out_width, flip)
    for c in range(3):
        _vertical(&planes[c, 0, 0], out_width, out_width, out_height, ys, &o[c, 0, 0],
                  out_width)
    return out


cdef int _safe_rows(Py_ssize_t available, Py_ssize_t row_bytes, int rows, Py_ssize_t reach):
    """How many rows, from the first, have ``reach`` bytes readable at their start."""
    if available < reach:
        return 0
    return min(rows, <int>((available - reach) // row_bytes) + 1)


def _resample_use_avx2(bint on):
    """Choose the AVX2 or the baseline copy of the resampling loops (where the CPU
    has AVX2); returns the previous choice.  For tests: both must give the same bits."""
    global _HAVE_AVX2
    previous = _HAVE_AVX2
    _HAVE_AVX2 = on and fl_cpu_has_avx2()
    return previous
