# Index streams: the PRNG, permutations and bounded draws (weighted ones are
# in _weighted.pxi).
#
# Included by _core.pyx.  Every stream here and in _weighted.pxi is a pure
# function of (arguments, 64-bit seed) built only from integer arithmetic (the
# one exception, weighted draws *without* replacement, is noted at
# weighted_sample), so a seed gives the same indices on every platform,
# compiler and thread count.
#
# Layout: C-level helpers (``_rng_*``, ``_shuffle_*``) run without the GIL and
# trust their arguments; the Python-visible functions below them check
# arguments once, allocate, and call a helper.

cimport cython
from libc.math cimport ceil, isfinite, log
from libc.stdint cimport int64_t, uint32_t, uint64_t
from libc.stdlib cimport calloc, free, malloc

import operator

import numpy as np

cdef extern from *:
    """
    /* Constants and the one operation C cannot spell portably (the high half
       of a 64x64-bit product), kept in C so no literal goes through Python
       integer handling. */
    #include <stdint.h>
    #define FL_SPLITMIX_GAMMA UINT64_C(0x9e3779b97f4a7c15)
    #define FL_SPLITMIX_MUL1  UINT64_C(0xbf58476d1ce4e5b9)
    #define FL_SPLITMIX_MUL2  UINT64_C(0x94d049bb133111eb)
    #define FL_TWO_POW_53     9007199254740992.0
    #define FL_TWO_POW_M53    (1.0 / 9007199254740992.0)
    #define FL_UINT32_MAX     UINT64_C(0xFFFFFFFF)

    static inline uint64_t fl_mul64(uint64_t a, uint64_t b, uint64_t *lo) {
    #if defined(__SIZEOF_INT128__)
        unsigned __int128 p = (unsigned __int128)a * b;
        *lo = (uint64_t)p;
        return (uint64_t)(p >> 64);
    #else
        /* Schoolbook on 32-bit halves: exact, just slower. */
        uint64_t a_lo = (uint32_t)a, a_hi = a >> 32, b_lo = (uint32_t)b, b_hi = b >> 32;
        uint64_t p0 = a_lo * b_lo, p1 = a_lo * b_hi, p2 = a_hi * b_lo, p3 = a_hi * b_hi;
        uint64_t mid = (p0 >> 32) + (uint32_t)p1 + (uint32_t)p2;
        *lo = (mid << 32) | (uint32_t)p0;
        return p3 + (p1 >> 32) + (p2 >> 32) + (mid >> 32);
    #endif
    }
    """
    const uint64_t FL_SPLITMIX_GAMMA
    const uint64_t FL_SPLITMIX_MUL1
    const uint64_t FL_SPLITMIX_MUL2
    const double FL_TWO_POW_53
    const double FL_TWO_POW_M53
    const uint64_t FL_UINT32_MAX
    uint64_t fl_mul64(uint64_t a, uint64_t b, uint64_t *lo) noexcept nogil


# ---------------------------------------------------------------------------
# The generator: xoshiro256** 1.0 (Blackman & Vigna, "Scrambled linear
# pseudorandom number generators", ACM TOMS 2021), its 256-bit state filled
# from the 64-bit seed by four outputs of SplitMix64 (Steele, Lea & Flood,
# "Fast splittable pseudorandom number generators", OOPSLA 2014), as the
# xoshiro authors recommend.  Chosen because it is tiny, fast, passes BigCrush
# and PractRand, and is fully specified by those papers, so any other
# implementation can reproduce our streams bit for bit.
# ---------------------------------------------------------------------------

cdef struct Xoshiro256:
    uint64_t s0
    uint64_t s1
    uint64_t s2
    uint64_t s3


cdef inline uint64_t _splitmix64(uint64_t *x) noexcept nogil:
    x[0] += FL_SPLITMIX_GAMMA
    cdef uint64_t z = x[0]
    z = (z ^ (z >> 30)) * FL_SPLITMIX_MUL1
    z = (z ^ (z >> 27)) * FL_SPLITMIX_MUL2
    return z ^ (z >> 31)


cdef inline void _rng_seed(Xoshiro256 *rng, uint64_t seed) noexcept nogil:
    # SplitMix64 never yields four zero words in a row, so the state is never
    # the all-zero fixed point.
    rng.s0 = _splitmix64(&seed)
    rng.s1 = _splitmix64(&seed)
    rng.s2 = _splitmix64(&seed)
    rng.s3 = _splitmix64(&seed)


cdef inline uint64_t _rotl(uint64_t x, int k) noexcept nogil:
    return (x << k) | (x >> (64 - k))


cdef inline uint64_t _rng_next(Xoshiro256 *rng) noexcept nogil:
    cdef uint64_t result = _rotl(rng.s1 * 5, 7) * 9
    cdef uint64_t t = rng.s1 << 17
    rng.s2 ^= rng.s0
    rng.s3 ^= rng.s1
    rng.s1 ^= rng.s2
    rng.s0 ^= rng.s3
    rng.s2 ^= t
    rng.s3 = _rotl(rng.s3, 45)
    return result


cdef inline double _rng_double(Xoshiro256 *rng) noexcept nogil:
    # The top 53 bits are the best ones of xoshiro256** and exactly fill a
    # double's mantissa: uniform on the grid k / 2**53, k in [0, 2**53).
    return <double>(_rng_next(rng) >> 11) * FL_TWO_POW_M53


@cython.cdivision(True)
cdef inline uint32_t _rng_below32(Xoshiro256 *rng, uint32_t bound) noexcept nogil:
    # Lemire, "Fast random integer generation in an interval" (ACM TOMACS
    # 2019): the high half of x * bound is uniform on [0, bound) once the
    # (rare) low halves below 2**32 mod bound are rejected.  Unbiased, and the
    # division runs only on the rare path.  Uses the top 32 bits of a draw.
    # Requires bound >= 1.
    cdef uint64_t m = (_rng_next(rng) >> 32) * <uint64_t>bound
    cdef uint32_t low = <uint32_t>m
    cdef uint32_t threshold
    if low < bound:
        threshold = (<uint32_t>0 - bound) % bound
        while low < threshold:
            m = (_rng_next(rng) >> 32) * <uint64_t>bound
            low = <uint32_t>m
    return <uint32_t>(m >> 32)


@cython.cdivision(True)
cdef inline uint64_t _rng_below64(Xoshiro256 *rng, uint64_t bound) noexcept nogil:
    # Lemire's method on the full 64-bit product.  Requires bound >= 1.
    cdef uint64_t low
    cdef uint64_t high = fl_mul64(_rng_next(rng), bound, &low)
    cdef uint64_t threshold
    if low < bound:
        threshold = (<uint64_t>0 - bound) % bound
        while low < threshold:
            high = fl_mul64(_rng_next(rng), bound, &low)
    return high


cdef inline uint64_t _rng_below(Xoshiro256 *rng, uint64_t bound) noexcept nogil:
    # The 32-bit path is chosen by the bound alone, never by the platform, so
    # the stream stays the same everywhere.
    if bound <= FL_UINT32_MAX:
        return _rng_below32(rng, <uint32_t>bound)
    return _rng_below64(rng, bound)


# ---------------------------------------------------------------------------
# Permutations
# ---------------------------------------------------------------------------
#
# Plain Fisher-Yates on a 10**8-element array is bound by memory latency: each
# swap touches a random cache line of an 800 MB array, and the time goes into
# cache and TLB misses, not arithmetic.  Above _PERM_DIRECT_MAX we use the
# two-level scheme of Sanders ("Random permutations on distributed, external
# and hierarchical memory", IPL 1998; also Rao 1961):
#
#   1. give every element an independent uniform bucket in [0, 2**b);
#   2. place the elements bucket by bucket (a counting sort, whose writes are
#      2**b sequential streams);
#   3. Fisher-Yates each bucket, which fits in the L2 cache.
#
# It is exactly uniform: it is the same as giving every element an i.i.d.
# uniform real key and sorting by it, the bucket being the key's leading bits
# and the within-bucket shuffle standing for its remaining bits.  Bucket ids
# are drawn twice from a copy of the generator (to count, then to place),
# which costs less than storing them.  b depends on n only, so the stream is
# still a function of (n, seed) alone.

cdef enum:
    _PERM_DIRECT_MAX = 1 << 17      # 1 MiB of int64: in-cache, no bucketing
    _PERM_BUCKET_LOG2 = 17          # buckets average 2**16..2**17 elements: at most 1 MiB, the L2 size of common x86 cores
    _PERM_MAX_BUCKETS_LOG2 = 16     # bucket ids are 16-bit slices of a draw


@cython.boundscheck(False)
@cython.wraparound(False)
cdef void _shuffle_inplace(int64_t *a, int64_t n, Xoshiro256 *rng) noexcept nogil:
    # Durstenfeld's Fisher-Yates, high end first: a[i] swaps with a uniform
    # a[j], j <= i.
    cdef int64_t i, j, tmp
    i = n - 1
    while i > 0:
        j = <int64_t>_rng_below(rng, <uint64_t>(i + 1))
        tmp = a[i]
        a[i] = a[j]
        a[j] = tmp
        i -= 1


@cython.boundscheck(False)
@cython.wraparound(False)
cdef void _identity_shuffle_direct(int64_t *out, int64_t n, Xoshiro256 *rng) noexcept nogil:
    # "Inside-out" Fisher-Yates: builds a uniform permutation of range(n)
    # without first writing the identity.
    cdef int64_t i, j
    for i in range(n):
        j = <int64_t>_rng_below(rng, <uint64_t>(i + 1))
        out[i] = out[j]
        out[j] = i


cdef int _bucket_log2(int64_t n) noexcept nogil:
    cdef int b = 0
    while b < _PERM_MAX_BUCKETS_LOG2 and (n >> (b + _PERM_BUCKET_LOG2)) > 0:
        b += 1
    return b


@cython.boundscheck(False)
@cython.wraparound(False)
@cython.cdivision(True)
cdef int _identity_shuffle_bucketed(int64_t *out, int64_t n, Xoshiro256 *rng) noexcept nogil:
    # Returns -1 when out of memory (the caller raises), else 0.
    cdef int b = _bucket_log2(n)
    cdef int64_t nb = (<int64_t>1) << b
    cdef int shift = 16 - b
    cdef int64_t *cursor = <int64_t *>calloc(nb, sizeof(int64_t))
    if cursor == NULL:
        return -1
    cdef Xoshiro256 replay = rng[0]
    cdef int64_t i, k, start, total
    cdef uint64_t j
    cdef uint64_t word
    # Pass 1: bucket sizes.  Each draw gives four 16-bit slices, high slice
    # first, and a bucket is the top b bits of a slice (uniform, as 2**b
    # divides 2**16); a partial last draw uses its leading slices.
    i = 0
    while i < n:
        word = _rng_next(rng)
        for k in range(4):
            if i >= n:
                break
            cursor[((word >> (48 - 16 * k)) & 0xFFFF) >> shift] += 1
            i += 1
    # Exclusive prefix sums: cursor[j] = first slot of bucket j.
    total = 0
    for k in range(nb):
        start = cursor[k]
        cursor[k] = total
        total += start
    # Pass 2: replay the same draws and place each element.
    i = 0
    while i < n:
        word = _rng_next(&replay)
        for k in range(4):
            if i >= n:
                break
            j = ((word >> (48 - 16 * k)) & 0xFFFF) >> shift
            out[cursor[j]] = i
            cursor[j] += 1
            i += 1
    # Now cursor[j] is the end of bucket j (= start of j + 1).  Pass 3: the
    # generator continues from where pass 1 left it.
    start = 0
    for k in range(nb):
        _shuffle_inplace(out + start, cursor[k] - start, rng)
        start = cursor[k]
    free(cursor)
    return 0


cdef int _identity_shuffle(int64_t *out, int64_t n, Xoshiro256 *rng) noexcept nogil:
    if n <= _PERM_DIRECT_MAX:
        _identity_shuffle_direct(out, n, rng)
        return 0
    return _identity_shuffle_bucketed(out, n, rng)


# ---------------------------------------------------------------------------
# Python-visible wrappers: check once, then run a helper without the GIL.
# ---------------------------------------------------------------------------

_SEED_LIMIT = 1 << 64


cdef uint64_t _as_seed(object seed) except? 0:
    if isinstance(seed, (bool, np.bool_)):
        raise TypeError(f"seed must be an int, got {seed!r}")
    value = operator.index(seed)
    if not 0 <= value < _SEED_LIMIT:
        raise ValueError(f"seed must be in [0, 2**64), got {value}")
    return <uint64_t>value


cdef int64_t _as_count(object value, str name) except -1:
    if isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be an int, got {value!r}")
    count = operator.index(value)
    if count < 0:
        raise ValueError(f"{name} must be non-negative, got {count}")
    if count >= (1 << 63):
        raise ValueError(f"{name} must be below 2**63, got {count}")
    return <int64_t>count


cdef int64_t[::1] _out_array(object out, int64_t count):
    if out is None:
        return np.empty(count, dtype=np.int64)
    if not isinstance(out, np.ndarray) or out.dtype != np.int64 or out.ndim != 1 \
            or not out.flags.c_contiguous or not out.flags.writeable:
        raise TypeError("out must be a writeable, C-contiguous, 1-d int64 numpy array")
    if out.shape[0] != count:
        raise ValueError(f"out has {out.shape[0]} elements, expected count={count}")
    return out


@cython.boundscheck(False)
@cython.wraparound(False)
def random_raw(count, seed):
    """The first ``count`` raw 64-bit outputs of xoshiro256** seeded by ``seed``.

    Exposed so the generator can be checked against the reference algorithm.
    """
    cdef int64_t n = _as_count(count, "count")
    cdef Xoshiro256 rng
    _rng_seed(&rng, _as_seed(seed))
    result = np.empty(n, dtype=np.uint64)
    cdef uint64_t[::1] view = result
    cdef int64_t i
    with nogil:
        for i in range(n):
            view[i] = _rng_next(&rng)
    return result


@cython.boundscheck(False)
@cython.wraparound(False)
def uniform(count, seed):
    """``count`` doubles uniform on [0, 1): the top 53 bits of each output."""
    cdef int64_t n = _as_count(count, "count")
    cdef Xoshiro256 rng
    _rng_seed(&rng, _as_seed(seed))
    result = np.empty(n, dtype=np.float64)
    cdef double[::1] view = result
    cdef int64_t i
    with nogil:
        for i in range(n):
            view[i] = _rng_double(&rng)
    return result


def permutation(n, seed):
    """A uniform random permutation of ``range(n)`` as an int64 array.

    Fisher-Yates for small ``n``; above 2**17 elements the cache-friendly
    bucketed scheme described in the source (also exactly uniform).
    """
    return permutation_stream(n, n, seed)


@cython.boundscheck(False)
@cython.wraparound(False)
def permutation_stream(n, count, seed):
    """The first ``count`` indices of back-to-back permutations of ``range(n)``.

    Permutations are drawn one after another from a single stream seeded by
    ``seed``; the last one is cut short.  ``permutation_stream(n, n, s)`` is
    ``permutation(n, s)``.  This is RandomSampler's ``num_samples > n`` case.
    """
    cdef int64_t size = _as_count(n, "n")
    cdef int64_t total = _as_count(count, "count")
    cdef Xoshiro256 rng
    _rng_seed(&rng, _as_seed(seed))
    if size == 0 and total > 0:
        raise ValueError(f"cannot draw count={total} indices from an empty range (n=0)")
    result = np.empty(total, dtype=np.int64)
    if total == 0:
        return result
    cdef int64_t[::1] view = result
    cdef int64_t full = total // size, rest = total % size, k
    cdef int status = 0
    cdef int64_t *scratch = NULL
    with nogil:
        for k in range(full):
            status = _identity_shuffle(&view[k * size], size, &rng)
            if status != 0:
                break
        if status == 0 and rest > 0:
            scratch = <int64_t *>malloc(size * sizeof(int64_t))
            if scratch == NULL:
                status = -1
            else:
                status = _identity_shuffle(scratch, size, &rng)
                if status == 0:
                    for k in range(rest):
                        view[full * size + k] = scratch[k]
                free(scratch)
    if status != 0:
        raise MemoryError(f"permutation of n={size}: out of memory for its scratch space")
    return result


@cython.boundscheck(False)
@cython.wraparound(False)
def randint(n, count, seed, out=None):
    """``count`` independent uniform draws from ``range(n)`` (int64, unbiased).

    With ``out`` (a C-contiguous int64 array of length ``count``) the draws are
    written there and ``out`` is returned.
    """
    cdef int64_t bound = _as_count(n, "n")
    cdef int64_t total = _as_count(count, "count")
    cdef Xoshiro256 rng
    _rng_seed(&rng, _as_seed(seed))
    if bound == 0 and total > 0:
        raise ValueError(f"cannot draw count={total} integers from an empty range (n=0)")
    cdef int64_t[::1] view = _out_array(out, total)
    cdef int64_t i
    cdef uint32_t bound32
    with nogil:
        if <uint64_t>bound <= FL_UINT32_MAX:
            bound32 = <uint32_t>bound
            for i in range(total):
                view[i] = <int64_t>_rng_below32(&rng, bound32)
        else:
            for i in range(total):
                view[i] = <int64_t>_rng_below64(&rng, <uint64_t>bound)
    return view.base if out is None else out
