# Weighted index streams: Walker's alias method for draws with replacement,
# exponential keys for draws without (WeightedRandomSampler, multinomial).
#
# Included by _core.pyx after _random.pxi, whose generator and argument
# checks these use.  As there: C-level helpers (``_alias_*``) without the GIL,
# then the checked Python-visible functions.

# ---------------------------------------------------------------------------
# Weighted draws: Walker's alias method with Vose's O(n) construction
# (Walker, ACM TOMS 1977; Vose, IEEE TSE 1991).  Each column i holds an
# acceptance threshold and an alias: draw a uniform column, keep it if a
# 53-bit uniform integer is below its threshold, else take its alias.
# ---------------------------------------------------------------------------


@cython.cdivision(True)
cdef inline uint64_t _threshold53(double p) noexcept nogil:
    # ceil(p * 2**53), so "u53 < threshold" is exactly "u53 / 2**53 < p".
    if p >= 1.0:
        return (<uint64_t>1) << 53
    if p <= 0.0:
        return 0
    return <uint64_t>ceil(p * FL_TWO_POW_53)


@cython.cdivision(True)
cdef void _alias_build(const double *w, int64_t n, double w_max, int64_t heaviest,
                       uint64_t *table, double *q, int64_t *work) noexcept nogil:
    # table[2i] = acceptance threshold of column i, table[2i + 1] = its alias:
    # one cache line per draw.  q: scratch scaled masses; work: scratch stack
    # of small columns (from the front) and large columns (from the back).
    cdef int64_t i, s, l, n_small = 0, n_large = 0
    cdef double total = 0.0
    # Dividing by the largest weight first keeps the sum finite whatever the
    # magnitudes (1e308 weights would overflow it).
    for i in range(n):
        q[i] = w[i] / w_max
        total += q[i]
    cdef double scale = <double>n / total
    for i in range(n):
        q[i] *= scale
        table[2 * i + 1] = <uint64_t>i
        if w[i] > 0.0:
            if q[i] < 1.0:
                work[n_small] = i
                n_small += 1
            else:
                n_large += 1
                work[n - n_large] = i
    # Zero-weight columns go on top of the small stack so they are paired
    # first, while a large column certainly exists to alias them.
    for i in range(n):
        if not w[i] > 0.0:
            work[n_small] = i
            n_small += 1
    while n_small > 0 and n_large > 0:
        n_small -= 1
        s = work[n_small]
        l = work[n - n_large]
        table[2 * s] = _threshold53(q[s])
        table[2 * s + 1] = <uint64_t>l
        # Vose's order of operations, (q_l + q_s) - 1, loses least precision.
        q[l] = (q[l] + q[s]) - 1.0
        if q[l] < 1.0:
            n_large -= 1
            work[n_small] = l
            n_small += 1
    # What remains has mass 1 up to rounding: keep those columns whole, except
    # that a zero weight must never be drawn, so it aliases the heaviest.
    while n_large > 0:
        l = work[n - n_large]
        n_large -= 1
        table[2 * l] = _threshold53(1.0)
    while n_small > 0:
        n_small -= 1
        s = work[n_small]
        if w[s] > 0.0:
            table[2 * s] = _threshold53(1.0)
        else:
            table[2 * s] = 0
            table[2 * s + 1] = <uint64_t>heaviest


cdef enum:
    _ALIAS_BLOCK = 64   # draws in flight: their table rows are prefetched together


@cython.boundscheck(False)
@cython.wraparound(False)
cdef void _alias_draw(const uint64_t *table, uint64_t n, int64_t *out, int64_t count,
                      Xoshiro256 *rng) noexcept nogil:
    # The table is random-access memory (16 MB for 10**6 weights), so draws
    # are made a block at a time: pick the block's columns, prefetch their
    # rows, then resolve them; the misses overlap instead of queueing.  The
    # stream is consumed in the order column, coin, column, coin, ... exactly
    # as a one-at-a-time loop would.
    cdef uint64_t cols[_ALIAS_BLOCK]
    cdef uint64_t coins[_ALIAS_BLOCK]
    cdef int64_t pos = 0, m, k
    cdef uint64_t c
    while pos < count:
        m = count - pos
        if m > _ALIAS_BLOCK:
            m = _ALIAS_BLOCK
        for k in range(m):
            c = _rng_below(rng, n)
            cols[k] = c
            coins[k] = _rng_next(rng) >> 11
            fl_prefetch(&table[2 * c])
        for k in range(m):
            c = cols[k]
            if coins[k] < table[2 * c]:
                out[pos + k] = <int64_t>c
            else:
                out[pos + k] = <int64_t>table[2 * c + 1]
        pos += m


@cython.boundscheck(False)
@cython.wraparound(False)
@cython.cdivision(True)
cdef void _exponential_keys(const double *w, const int64_t *idx, int64_t m, double w_max,
                            double *keys, Xoshiro256 *rng) noexcept nogil:
    # Efraimidis & Spirakis, "Weighted random sampling with a reservoir"
    # (IPL 2006), exponential form: key_i = E_i / w_i with E_i ~ Exp(1).
    # Sorting by key gives the order of successive draws without replacement.
    # u is in (0, 1] so log(u) is finite.
    cdef int64_t j
    cdef double u
    for j in range(m):
        u = <double>((_rng_next(rng) >> 11) + 1) * FL_TWO_POW_M53
        keys[j] = -log(u) / (w[idx[j]] / w_max)


cdef double[::1] _as_weights(object weights):
    array = np.ascontiguousarray(weights, dtype=np.float64)
    if array.ndim != 1:
        raise ValueError(f"weights should be a 1d sequence but given weights have shape {tuple(array.shape)}")
    return array


@cython.boundscheck(False)
@cython.wraparound(False)
cdef tuple _inspect_weights(const double[::1] w):
    # One pass: the first invalid entry, the number of positive weights and
    # the heaviest one.  Errors follow torch.multinomial's type and wording,
    # plus the offending index and value.
    cdef int64_t n = w.shape[0], i, bad = -1, positive = 0, heaviest = -1
    cdef double w_max = 0.0, x
    with nogil:
        for i in range(n):
            x = w[i]
            if not isfinite(x) or x < 0.0:
                bad = i
                break
            if x > 0.0:
                positive += 1
                if x > w_max:
                    w_max = x
                    heaviest = i
    if bad >= 0:
        # torch.multinomial's wording on its general path (the one
        # WeightedRandomSampler takes), which also files NaN under "< 0";
        # then where the culprit is.
        x = w[bad]
        kind = "= infinity or NaN" if x == x and not isfinite(x) else "< 0"
        raise RuntimeError(f"invalid multinomial distribution (encountering probability entry "
                           f"{kind}): weights[{bad}] = {x}")
    if positive == 0:
        detail = "weights is empty" if n == 0 else f"all {n} weights are zero"
        raise RuntimeError(f"invalid multinomial distribution (sum of probabilities <= 0): {detail}")
    return positive, heaviest, w_max


@cython.boundscheck(False)
@cython.wraparound(False)
def alias_table(weights):
    """Walker/Vose alias table of ``weights`` in O(n), for ``alias_draw``.

    Returns a ``(n, 2)`` uint64 array: per column, the acceptance threshold
    on a 53-bit uniform integer and the alias index.  Raises ``RuntimeError``
    (as torch.multinomial) for negative, NaN or infinite weights, or when
    none is positive; ``ValueError`` when ``weights`` is not 1-d.
    """
    cdef double[::1] w = _as_weights(weights)
    positive, heaviest, w_max = _inspect_weights(w)
    cdef int64_t n = w.shape[0]
    table = np.empty((n, 2), dtype=np.uint64)
    cdef uint64_t[:, ::1] tview = table
    cdef double *q = <double *>malloc(n * sizeof(double))
    cdef int64_t *work = <int64_t *>malloc(n * sizeof(int64_t))
    cdef int64_t heavy = heaviest
    cdef double top = w_max
    if q == NULL or work == NULL:
        free(q)
        free(work)
        raise MemoryError(f"alias table of {n} weights: out of memory")
    with nogil:
        _alias_build(&w[0], n, top, heavy, &tview[0, 0], q, work)
    free(q)
    free(work)
    return table


@cython.boundscheck(False)
@cython.wraparound(False)
def alias_draw(table, count, seed, out=None):
    """``count`` independent draws (int64) from an ``alias_table``, O(1) each."""
    cdef const uint64_t[:, ::1] tview = table
    if tview.shape[1] != 2 or tview.shape[0] == 0:
        raise ValueError(f"table must be a non-empty (n, 2) array from alias_table, "
                         f"got shape {tuple(np.shape(table))}")
    cdef int64_t total = _as_count(count, "count")
    cdef Xoshiro256 rng
    _rng_seed(&rng, _as_seed(seed))
    cdef int64_t[::1] view = _out_array(out, total)
    if total > 0:
        with nogil:
            _alias_draw(&tview[0, 0], <uint64_t>tview.shape[0], &view[0], total, &rng)
    return view.base if out is None else out


@cython.boundscheck(False)
@cython.wraparound(False)
def weighted_sample(weights, count, replacement, seed):
    """``count`` indices drawn with probability proportional to ``weights``.

    With replacement: alias method, O(n + count).  Without: exponential keys
    ``E_i / w_i`` and a top-``count`` selection, ordered as successive draws;
    zero weights are never drawn, and asking for more indices than there are
    positive weights raises ``RuntimeError``.  The without-replacement keys go
    through libm's ``log``; two platforms whose ``log`` differ in the last bit
    could order two keys equal to within that bit differently (with-
    replacement streams are integer-only and identical everywhere).
    """
    cdef double[::1] w = _as_weights(weights)
    cdef int64_t total = _as_count(count, "count")
    if replacement:
        return alias_draw(alias_table(w), total, seed)
    positive, heaviest, w_max = _inspect_weights(w)
    if total > w.shape[0]:
        raise RuntimeError("cannot sample n_sample > prob_dist.size(-1) samples without replacement")
    if total > positive:
        raise RuntimeError(f"cannot sample n_sample > number of non-zero weights samples without "
                           f"replacement: n_sample={total}, but only {positive} of "
                           f"{w.shape[0]} weights are positive")
    cdef Xoshiro256 rng
    _rng_seed(&rng, _as_seed(seed))
    candidates = np.flatnonzero(np.asarray(w) > 0.0).astype(np.int64, copy=False)
    keys = np.empty(positive, dtype=np.float64)
    cdef const int64_t[::1] cview = candidates
    cdef double[::1] kview = keys
    cdef int64_t m = positive
    cdef double top = w_max
    with nogil:
        _exponential_keys(&w[0], &cview[0], m, top, &kview[0], &rng)
    if total == 0:
        return np.empty(0, dtype=np.int64)
    if total < m:
        chosen = np.argpartition(keys, total - 1)[:total]
    else:
        chosen = np.arange(m)
    # Stable sort: equal keys (probability ~0) still give one defined order.
    chosen = chosen[np.argsort(keys[chosen], kind="stable")]
    return np.ascontiguousarray(candidates[chosen], dtype=np.int64)
