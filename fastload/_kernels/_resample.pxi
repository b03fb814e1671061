# Resampling: one axis of Pillow's antialiased resize, bit for bit.
#
# Pillow resamples 8-bit images in two separable passes (libImaging/Resample.c),
# each rounded to uint8.  Each output pixel's weights come from the filter
# over the input pixels its support covers (clamped to the image), are
# normalised to sum to one and turned into 22-bit fixed point; a sum starts at
# half a unit and is clipped to 0..255.  ``resample_rows`` does one such pass
# along the first axis of a 2-D byte array, with exactly that arithmetic, so
# a resize built from two of them (vision/resample.py, which also chooses the
# pass order Pillow uses) gives exactly Pillow's pixels.
#
# Why one axis only: along the first axis every output row is a weighted sum
# of a few whole input rows, element by element over contiguous memory, which
# vectorises; Pillow's horizontal pass reads a few pixels per output pixel
# and its vertical pass walks down columns, neither of which does.  The other
# axis is brought to the first by a transpose, which for 4-byte pixels is a
# cheap 32-bit transpose.

from libc.math cimport ceil, cos, sin, M_PI
from libc.stdint cimport int32_t

# Pillow's filter codes (PIL.Image.Resampling); NEAREST (0) is not a
# convolution and stays with Pillow.
cdef enum:
    RESAMPLE_LANCZOS = 1
    RESAMPLE_BILINEAR = 2
    RESAMPLE_BICUBIC = 3
    RESAMPLE_BOX = 4
    RESAMPLE_HAMMING = 5
RESAMPLE_FILTERS = frozenset({RESAMPLE_LANCZOS, RESAMPLE_BILINEAR, RESAMPLE_BICUBIC, RESAMPLE_BOX,
                              RESAMPLE_HAMMING})

cdef enum:
    _PRECISION_BITS = 22          # 32 - 8 bits of result - 2 bits of headroom, as Pillow


cdef inline double _sinc(double x) noexcept nogil:
    if x == 0.0:
        return 1.0
    x = x * M_PI
    return sin(x) / x


cdef double _filter(int kind, double x) noexcept nogil:
    cdef float hamming_a = 0.54, hamming_b = 0.46   # float constants in Pillow too
    if kind == RESAMPLE_BOX:
        return 1.0 if -0.5 < x <= 0.5 else 0.0
    if kind == RESAMPLE_LANCZOS:   # sinc windowed by sinc, 3 lobes
        if -3.0 <= x < 3.0:
            return _sinc(x) * _sinc(x / 3)
        return 0.0
    if x < 0.0:
        x = -x
    if kind == RESAMPLE_BILINEAR:
        return 1.0 - x if x < 1.0 else 0.0
    if kind == RESAMPLE_BICUBIC:   # a = -0.5
        if x < 1.0:
            return ((-0.5 + 2.0) * x - (-0.5 + 3.0)) * x * x + 1
        if x < 2.0:
            return (((x - 5) * x + 8) * x - 4) * -0.5
        return 0.0
    # HAMMING
    if x == 0.0:
        return 1.0
    if x >= 1.0:
        return 0.0
    x = x * M_PI
    return sin(x) / x * (hamming_a + hamming_b * cos(x))


cdef double _support(int kind) noexcept nogil:
    if kind == RESAMPLE_BOX:
        return 0.5
    if kind == RESAMPLE_BICUBIC:
        return 2.0
    if kind == RESAMPLE_LANCZOS:
        return 3.0
    return 1.0   # BILINEAR, HAMMING


cdef int _taps_bound(int kind, float in0, float in1, int out_size) noexcept nogil:
    """The most input pixels one output pixel can read (Pillow's ``ksize``)."""
    cdef double filterscale = <double>(in1 - in0) / out_size
    if filterscale < 1.0:
        filterscale = 1.0
    return <int>ceil(_support(kind) * filterscale) * 2 + 1


@cython.cdivision(True)
cdef void _weights(int kind, int in_size, float in0, float in1, int out_size, int ksize,
                   int32_t* bounds, int32_t* weights, double* scratch) noexcept nogil:
    """Per output pixel: first input pixel, tap count, and fixed-point weights."""
    cdef double scale = <double>(in1 - in0) / out_size
    cdef double filterscale = scale if scale > 1.0 else 1.0
    cdef double support = _support(kind) * filterscale
    cdef double center, total, w, inverse = 1.0 / filterscale
    cdef int xx, x, xmin, xmax
    for xx in range(out_size):
        center = in0 + (xx + 0.5) * scale
        xmin = <int>(center - support + 0.5)
        if xmin < 0:
            xmin = 0
        xmax = <int>(center + support + 0.5)
        if xmax > in_size:
            xmax = in_size
        xmax -= xmin
        total = 0.0
        for x in range(xmax):
            w = _filter(kind, (x + xmin - center + 0.5) * inverse)
            scratch[x] = w
            total += w
        for x in range(xmax):
            if total != 0.0:
                scratch[x] /= total
            if scratch[x] < 0:
                weights[xx * ksize + x] = <int32_t>(-0.5 + scratch[x] * (1 << _PRECISION_BITS))
            else:
                weights[xx * ksize + x] = <int32_t>(0.5 + scratch[x] * (1 << _PRECISION_BITS))
        bounds[2 * xx] = xmin
        bounds[2 * xx + 1] = xmax


# The loop is written in C (below) so that it can be compiled twice, once for
# the baseline CPU and once for AVX2 (8 x 32-bit lanes, with the 32-bit
# multiply that SSE2 lacks), and the AVX2 copy chosen at run time where the
# CPU has it; it is the same integer arithmetic either way, so both give the
# same bits.  Sums stay in registers for a block of 32 elements across all
# taps instead of going through memory.
cdef extern from *:
    """
    #include <stdint.h>
    #include <stddef.h>

    #define FL_PRECISION_BITS 22   /* _PRECISION_BITS */
    #define FL_BLOCK 32            /* elements whose sums stay in registers */

    #define FL_CLIP8(sum) ((uint8_t)((sum) >> FL_PRECISION_BITS < 0 ? 0 :            \
        ((sum) >> FL_PRECISION_BITS > 255 ? 255 : (sum) >> FL_PRECISION_BITS)))

    /* out row r = clip(sum over taps t of src row (bounds[2r] + t) * weight),
       element by element over rows of n bytes, rows src_stride / dst_stride
       bytes apart (so a pass can read stored pixels in place). */
    #define FL_RESAMPLE_ROWS_BODY                                                    \
        for (int r = 0; r < out_rows; r++) {                                         \
            int taps = bounds[2 * r + 1];                                            \
            const uint8_t *first = src + (ptrdiff_t)bounds[2 * r] * src_stride;      \
            const int32_t *w = weights + (ptrdiff_t)r * ksize;                       \
            uint8_t *dst = out + (ptrdiff_t)r * dst_stride;                          \
            ptrdiff_t i = 0;                                                         \
            for (; i + FL_BLOCK <= n; i += FL_BLOCK) {                               \
                int32_t acc[FL_BLOCK];                                               \
                for (int j = 0; j < FL_BLOCK; j++) acc[j] = 1 << (FL_PRECISION_BITS - 1); \
                for (int t = 0; t < taps; t++) {                                     \
                    const uint8_t *line = first + (ptrdiff_t)t * src_stride + i;     \
                    int32_t wt = w[t];                                               \
                    for (int j = 0; j < FL_BLOCK; j++) acc[j] += line[j] * wt;       \
                }                                                                    \
                for (int j = 0; j < FL_BLOCK; j++) dst[i + j] = FL_CLIP8(acc[j]);    \
            }                                                                        \
            for (; i < n; i++) {                                                     \
                int32_t acc = 1 << (FL_PRECISION_BITS - 1);                          \
                for (int t = 0; t < taps; t++) acc += first[(ptrdiff_t)t * src_stride + i] * w[t]; \
                dst[i] = FL_CLIP8(acc);                                              \
            }                                                                        \
        }

    #define FL_RESAMPLE_ROWS_ARGS const uint8_t *src, ptrdiff_t src_stride, ptrdiff_t n, \
        int out_rows, const int32_t *bounds, const int32_t *weights, int ksize,      \
        uint8_t *out, ptrdiff_t dst_stride

    static void fl_resample_rows_generic(FL_RESAMPLE_ROWS_ARGS) { FL_RESAMPLE_ROWS_BODY }

    #if defined(__GNUC__) && defined(__x86_64__)
    __attribute__((target("avx2")))
    static void fl_resample_rows_avx2(FL_RESAMPLE_ROWS_ARGS) { FL_RESAMPLE_ROWS_BODY }
    static int fl_cpu_has_avx2(void) {
        __builtin_cpu_init();
        return __builtin_cpu_supports("avx2");
    }
    #else
    static void fl_resample_rows_avx2(FL_RESAMPLE_ROWS_ARGS) { FL_RESAMPLE_ROWS_BODY }
    static int fl_cpu_has_avx2(void) { return 0; }
    #endif
    """
    void fl_resample_rows_generic(const uint8_t* src, Py_ssize_t src_stride, Py_ssize_t n,
                                  int out_rows, const int32_t* bounds, const int32_t* weights,
                                  int ksize, uint8_t* out, Py_ssize_t dst_stride) noexcept nogil
    void fl_resample_rows_avx2(const uint8_t* src, Py_ssize_t src_stride, Py_ssize_t n,
                               int out_rows, const int32_t* bounds, const int32_t* weights,
                               int ksize, uint8_t* out, Py_ssize_t dst_stride) noexcept nogil
    int fl_cpu_has_avx2() noexcept nogil

cdef bint _HAVE_AVX2 = fl_cpu_has_avx2()


@cython.boundscheck(False)   # every index below is 0 of a buffer proven non-empty
@cython.wraparound(False)
def resample_rows(const uint8_t[:, ::1] src not None, double start, double stop,
                  uint8_t[:, ::1] out not None, int resample):
    """One pass of Pillow's resize along the first axis: ``src`` rows ``start..stop``
    (floats allowed, Pillow's box) resampled to ``out.shape[0]`` rows.

    Every column (second axis) is filtered independently; ``out`` has the same
    number of columns.  Bit for bit what Pillow's pass computes for each
    channel of each pixel in a column.
    """
    cdef int in_size = src.shape[0], out_size = out.shape[0]
    cdef Py_ssize_t n = src.shape[1]
    if resample not in RESAMPLE_FILTERS:
        raise ValueError(f"resample_rows: resample={resample} is not one of Pillow's "
                         f"convolution filters {sorted(RESAMPLE_FILTERS)}")
    if out.shape[1] != n:
        raise ValueError(f"resample_rows: src has {n} columns and out {out.shape[1]}")
    if in_size < 1 or out_size < 1 or n < 1:
        raise ValueError(f"resample_rows: empty array ({in_size}x{n} -> {out_size}x{n})")
    # Pillow parses its box as C floats: round the same way.
    cdef float in0 = start, in1 = stop
    if not 0 <= in0 < in1 <= in_size:
        raise ValueError(f"resample_rows: rows {start}..{stop} are not inside 0..{in_size}")
    cdef int ksize = _taps_bound(resample, in0, in1, out_size)
    bounds = np.empty(2 * out_size, dtype=np.int32)
    weights = np.zeros(<Py_ssize_t>out_size * ksize, dtype=np.int32)
    scratch = np.empty(ksize, dtype=np.float64)
    cdef int32_t[::1] b = bounds, w = weights
    cdef double[::1] tmp = scratch
    with nogil:
        _weights(resample, in_size, in0, in1, out_size, ksize, &b[0], &w[0], &tmp[0])
        if _HAVE_AVX2:
            fl_resample_rows_avx2(&src[0, 0], n, n, out_size, &b[0], &w[0], ksize, &out[0, 0], n)
        else:
            fl_resample_rows_generic(&src[0, 0], n, n, out_size, &b[0], &w[0], ksize, &out[0, 0],
                                     n)
