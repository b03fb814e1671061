# Packing length-sorted samples into batches by a token budget
# (``fastload.sampler.BucketBatchSampler`` with ``max_tokens``): a
# sequential greedy walk, one pass, no Python per sample.

@cython.boundscheck(False)
@cython.wraparound(False)
def token_batch_starts(const int64_t[::1] sorted_lengths, Py_ssize_t chunk,
                       Py_ssize_t batch_size, int64_t max_tokens):
    """Where each batch starts, packing ``sorted_lengths`` greedily by tokens.

    ``sorted_lengths`` is ascending within each chunk of ``chunk`` entries (the
    last may be shorter); a batch never crosses a chunk, holds at most
    ``batch_size`` entries, and ``count * (its last, longest, entry) <=
    max_tokens``.  ValueError if a chunk is not ascending or one entry alone
    exceeds ``max_tokens`` (naming its position).
    """
    if chunk <= 0 or batch_size <= 0 or max_tokens <= 0:
        raise ValueError("chunk, batch_size and max_tokens must be positive")
    cdef Py_ssize_t n = sorted_lengths.shape[0]
    starts = np.empty(n, dtype=np.int64)
    cdef int64_t[::1] out = starts
    cdef Py_ssize_t i = 0, j, end, count, found = 0, bad = -1
    with nogil:
        while i < n:
            end = (i // chunk + 1) * chunk
            if end > n:
                end = n
            if sorted_lengths[i] > max_tokens or sorted_lengths[i] < 0 \
                    or (i % chunk != 0 and sorted_lengths[i] < sorted_lengths[i - 1]):
                bad = i
                break
            out[found] = i
            found += 1
            j = i + 1
            count = 1
            while j < end and count < batch_size:
                if sorted_lengths[j] < sorted_lengths[j - 1]:
                    bad = j
                    break
                if (count + 1) * sorted_lengths[j] > max_tokens:
                    break
                j += 1
                count += 1
            if bad >= 0:
                break
            i = j
    if bad >= 0:
        raise ValueError(f"sorted_lengths[{bad}] = {sorted_lengths[bad]} is negative, above "
                         f"max_tokens={max_tokens} or out of order within its chunk")
    return starts[:found].copy()
