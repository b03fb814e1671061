"""The index-stream kernels of fastload._core (_kernels/_random.pxi).

Streams are pinned two ways: against small pure-Python reference
implementations of the documented algorithms (xoshiro256** seeded by
SplitMix64, Lemire's bounded integers, Fisher-Yates, the bucketed shuffle),
and by known answers, so any change to a stream fails here.
"""

import math

import numpy as np
import pytest

from fastload import _core

MASK64 = (1 << 64) - 1


# --- pure-Python references, written from the papers' descriptions ---------

class RefRng:
    """xoshiro256** 1.0 with its state from four SplitMix64 outputs."""

    def __init__(self, seed: int) -> None:
        x = seed
        state = []
        for _ in range(4):
            x = (x + 0x9E3779B97F4A7C15) & MASK64
            z = x
            z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
            z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
            state.append(z ^ (z >> 31))
        self.s = state

    @staticmethod
    def _rotl(x: int, k: int) -> int:
        return ((x << k) | (x >> (64 - k))) & MASK64

    def next(self) -> int:
        s = self.s
        result = (self._rotl((s[1] * 5) & MASK64, 7) * 9) & MASK64
        t = (s[1] << 17) & MASK64
        s[2] ^= s[0]
        s[3] ^= s[1]
        s[1] ^= s[2]
        s[0] ^= s[3]
        s[2] ^= t
        s[3] = self._rotl(s[3], 45)
        return result

    def below(self, bound: int) -> int:
        if bound <= 0xFFFFFFFF:
            while True:
                m = (self.next() >> 32) * bound
                if (m & 0xFFFFFFFF) >= ((1 << 32) - bound) % bound:
                    return m >> 32
        while True:
            m = self.next() * bound
            if (m & MASK64) >= ((1 << 64) - bound) % bound:
                return m >> 64


def ref_permutation(n: int, seed: int) -> list:
    rng = RefRng(seed)
    if n <= 1 << 17:
        out = [0] * n
        for i in range(n):
            j = rng.below(i + 1)
            out[i] = out[j]
            out[j] = i
        return out
    b = 0
    while b < 16 and (n >> (b + 17)) > 0:
        b += 1
    buckets = [[] for _ in range(1 << b)]
    i = 0
    while i < n:  # pass 1 and 2 consume the same draws; pass 3 continues after
        word = rng.next()
        for k in range(4):
            if i < n:
                buckets[((word >> (48 - 16 * k)) & 0xFFFF) >> (16 - b)].append(i)
                i += 1
    out = []
    for bucket in buckets:
        for i in range(len(bucket) - 1, 0, -1):
            j = rng.below(i + 1)
            bucket[i], bucket[j] = bucket[j], bucket[i]
        out.extend(bucket)
    return out


def chi2_bound(df: int, z: float = 4.5) -> float:
    """Upper chi-square quantile (Wilson-Hilferty); z = 4.5 is p ~ 3e-6."""
    return df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3


# --- the generator ----------------------------------------------------------

@pytest.mark.parametrize("seed", [0, 1, 12345, 2**63 - 1, 2**64 - 1])
def test_raw_stream_matches_reference(seed):
    ref = RefRng(seed)
    assert _core.random_raw(64, seed).tolist() == [ref.next() for _ in range(64)]


def test_raw_stream_known_answer():
    # Pinned: a change of algorithm, seeding or platform arithmetic fails here.
    assert _core.random_raw(3, 0).tolist() == [
        11091344671253066420, 13793997310169335082, 1900383378846508768]


def test_uniform_known_answer():
    assert _core.uniform(2, 5).tolist() == [0.2884112281702357, 0.6020823331320106]


def test_uniform_is_top_53_bits():
    raw = _core.random_raw(1000, 9)
    u = _core.uniform(1000, 9)
    assert np.array_equal(u, (raw >> np.uint64(11)).astype(np.float64) / 2.0**53)
    assert u.min() >= 0.0 and u.max() < 1.0


@pytest.mark.parametrize("bad", [-1, 2**64, 1.5, "3", None, True])
def test_seed_validation(bad):
    with pytest.raises((ValueError, TypeError)):
        _core.permutation(5, bad)


# --- permutations -------------------------------------------------------------

@pytest.mark.parametrize("n", [0, 1, 2, 3, 17, 1000, 1 << 17, (1 << 17) + 1, 10**6 + 3])
def test_permutation_is_a_permutation(n):
    p = _core.permutation(n, 5)
    assert p.dtype == np.int64 and p.shape == (n,) and p.flags.c_contiguous
    assert np.array_equal(np.sort(p), np.arange(n))


@pytest.mark.parametrize("n", [10, 1000, (1 << 17) + 5])
def test_permutation_matches_reference(n):
    assert _core.permutation(n, 2024).tolist() == ref_permutation(n, 2024)


def test_permutation_known_answer():
    # Both paths pinned: direct Fisher-Yates and the bucketed scheme.
    assert _core.permutation(10, 1).tolist() == [6, 3, 1, 7, 2, 9, 5, 8, 4, 0]
    assert _core.permutation(3 * 10**6, 7)[:5].tolist() == [1180361, 948701, 866280, 1486006, 1184868]


def test_permutation_seeds():
    assert np.array_equal(_core.permutation(1000, 3), _core.permutation(1000, 3))
    assert not np.array_equal(_core.permutation(1000, 3), _core.permutation(1000, 4))
    big = 10**6
    assert not np.array_equal(_core.permutation(big, 3), _core.permutation(big, 4))


def test_permutation_positions_uniform():
    # For n = 5, every element should land in every position 1/5 of the time.
    n, trials = 5, 20000
    counts = np.zeros((n, n))
    for seed in range(trials):
        p = _core.permutation(n, seed)
        counts[p, np.arange(n)] += 1
    expected = trials / n
    stat = ((counts - expected) ** 2 / expected).sum()
    assert stat < chi2_bound((n - 1) ** 2)


def test_permutation_all_orders_of_three_equally_likely():
    trials = 30000
    seen = {}
    for seed in range(trials):
        key = tuple(_core.permutation(3, seed).tolist())
        seen[key] = seen.get(key, 0) + 1
    assert len(seen) == 6
    expected = trials / 6
    assert sum((c - expected) ** 2 / expected for c in seen.values()) < chi2_bound(5)


def test_bucketed_permutation_uniform_positions():
    # The bucketed path (n > 2**17): element 0's position, across seeds,
    # should be uniform over 16 equal slices of the array.
    n, trials, slices = (1 << 17) + 999, 800, 16
    hist = np.zeros(slices)
    firsts = np.zeros(slices)
    for seed in range(trials):
        p = _core.permutation(n, seed)
        hist[np.flatnonzero(p == 0)[0] * slices // n] += 1
        firsts[p[0] * slices // n] += 1
    expected = trials / slices
    assert ((hist - expected) ** 2 / expected).sum() < chi2_bound(slices - 1)
    assert ((firsts - expected) ** 2 / expected).sum() < chi2_bound(slices - 1)


def test_permutation_stream():
    assert np.array_equal(_core.permutation_stream(7, 7, 3), _core.permutation(7, 3))
    s = _core.permutation_stream(7, 23, 3)
    assert s.shape == (23,)
    for k in range(3):
        assert np.array_equal(np.sort(s[7 * k:7 * k + 7]), np.arange(7))
    assert np.array_equal(s[:7], _core.permutation(7, 3))
    assert len(set(s[21:].tolist())) == 2
    assert _core.permutation_stream(0, 0, 1).shape == (0,)
    with pytest.raises(ValueError):
        _core.permutation_stream(0, 3, 1)


def test_permutation_validation():
    with pytest.raises(ValueError):
        _core.permutation(-1, 0)
    with pytest.raises(TypeError):
        _core.permutation(2.5, 0)


# --- bounded integers ----------------------------------------------------------

@pytest.mark.parametrize("n", [1, 2, 7, 1000, 2**32 - 1, 2**32, 2**32 + 1, 2**62 + 12345])
def test_randint_matches_reference(n):
    ref = RefRng(77)
    got = _core.randint(n, 200, 77)
    assert got.dtype == np.int64
    assert got.tolist() == [ref.below(n) for _ in range(200)]
    assert got.min() >= 0 and got.max() < n


def test_randint_known_answer():
    assert _core.randint(10, 10, 1).tolist() == [7, 5, 5, 3, 6, 1, 0, 3, 8, 5]


def test_randint_uniform_chi_square():
    n, count = 37, 370000
    counts = np.bincount(_core.randint(n, count, 4), minlength=n)
    expected = count / n
    assert ((counts - expected) ** 2 / expected).sum() < chi2_bound(n - 1)


def test_randint_unbiased_for_awkward_bound():
    # 3 * 2**30 leaves a large rejection zone for a biased (modulo) method:
    # values below 2**30 would come out twice as often.
    n = 3 * 2**30
    draws = _core.randint(n, 300000, 8)
    low = np.count_nonzero(draws < 2**30) / draws.size
    assert abs(low - 1 / 3) < 0.005


def test_randint_out_and_validation():
    out = np.empty(50, dtype=np.int64)
    assert _core.randint(9, 50, 3, out=out) is out
    assert np.array_equal(out, _core.randint(9, 50, 3))
    assert _core.randint(0, 0, 1).shape == (0,)
    with pytest.raises(ValueError):
        _core.randint(0, 5, 1)
    with pytest.raises(ValueError):
        _core.randint(5, -1, 1)
    with pytest.raises(TypeError):
        _core.randint(5, 4, 1, out=np.empty(4, dtype=np.int32))
    with pytest.raises(ValueError):
        _core.randint(5, 4, 1, out=np.empty(5, dtype=np.int64))


# --- weighted draws --------------------------------------------------------------

def test_alias_frequencies_chi_square():
    weights = np.array([1.0, 2.0, 0.5, 4.0, 0.0, 3.0, 0.25, 1e-3])
    count = 500000
    draws = _core.weighted_sample(weights, count, True, 11)
    counts = np.bincount(draws, minlength=weights.size)
    assert counts[4] == 0
    positive = weights > 0
    expected = count * weights[positive] / weights.sum()
    stat = ((counts[positive] - expected) ** 2 / expected).sum()
    assert stat < chi2_bound(int(positive.sum()) - 1)


@pytest.mark.parametrize("seed", range(4))
def test_alias_table_encodes_the_distribution_exactly(seed):
    # The probability the table gives each index, computed from the table
    # itself: column mass kept plus the mass aliased to it, over n columns.
    rng = np.random.default_rng(seed)
    weights = rng.random(500) ** 4
    weights[rng.random(500) < 0.2] = 0.0
    table = _core.alias_table(weights)
    keep = table[:, 0].astype(np.float64) / 2.0**53
    implied = keep.copy()
    np.add.at(implied, table[:, 1].astype(np.int64), 1.0 - keep)
    implied /= weights.size
    assert np.allclose(implied, weights / weights.sum(), rtol=0, atol=1e-12)
    assert np.all(implied[weights == 0] == 0)


def test_alias_table_and_draw_agree_with_weighted_sample():
    weights = np.random.default_rng(0).random(1000)
    table = _core.alias_table(weights)
    assert table.shape == (1000, 2) and table.dtype == np.uint64
    assert np.array_equal(_core.alias_draw(table, 5000, 3), _core.weighted_sample(weights, 5000, True, 3))
    out = np.empty(10, dtype=np.int64)
    assert _core.alias_draw(table, 10, 3, out=out) is out


def test_alias_extreme_weights():
    # Huge and tiny magnitudes (the naive sum overflows): still proportional.
    weights = np.array([1e308, 1e308, 0.0, 5e307])
    counts = np.bincount(_core.weighted_sample(weights, 100000, True, 2), minlength=4)
    assert counts[2] == 0
    assert abs(counts[0] / counts[3] - 2.0) < 0.15
    single = _core.weighted_sample([0.0, 0.0, 3.0], 1000, True, 1)
    assert np.all(single == 2)


def test_zero_weights_never_drawn_many_zeros():
    weights = np.zeros(10000)
    weights[::97] = np.random.default_rng(1).random(weights[::97].size) + 0.01
    draws = _core.weighted_sample(weights, 200000, True, 5)
    assert np.all(weights[draws] > 0)


def test_weighted_known_answer():
    assert _core.weighted_sample([1.0, 0.0, 2.0, 3.0], 8, True, 3).tolist() == [2, 0, 3, 3, 3, 2, 2, 2]
    assert _core.weighted_sample([1.0, 0.0, 2.0, 3.0], 3, False, 3).tolist() == [2, 0, 3]


def test_without_replacement_distinct_and_nonzero():
    rng = np.random.default_rng(3)
    weights = rng.random(5000)
    weights[rng.random(5000) < 0.3] = 0.0
    positive = int((weights > 0).sum())
    for seed in range(5):
        draws = _core.weighted_sample(weights, positive, False, seed)
        assert len(np.unique(draws)) == positive
        assert np.all(weights[draws] > 0)
    part = _core.weighted_sample(weights, 100, False, 9)
    assert len(set(part.tolist())) == 100 and np.all(weights[part] > 0)


def test_without_replacement_first_draw_proportional():
    weights = np.array([1.0, 2.0, 3.0, 4.0])
    trials = 20000
    firsts = np.bincount([_core.weighted_sample(weights, 2, False, s)[0] for s in range(trials)],
                         minlength=4)
    expected = trials * weights / weights.sum()
    assert ((firsts - expected) ** 2 / expected).sum() < chi2_bound(3)


def test_without_replacement_second_draw_conditional():
    # P(second = 1 | first = 0) = w1 / (w1 + w2) = 1/3 for weights 1, 1, 2.
    weights = [1.0, 1.0, 2.0]
    pairs = [tuple(_core.weighted_sample(weights, 2, False, s).tolist()) for s in range(20000)]
    after0 = [b for a, b in pairs if a == 0]
    assert abs(after0.count(1) / len(after0) - 1 / 3) < 0.03


@pytest.mark.parametrize("weights, match", [
    ([1.0, -1.0, 2.0], r"entry < 0\): weights\[1\] = -1.0"),
    ([1.0, float("nan")], r"entry < 0\): weights\[1\] = nan"),
    ([float("inf"), 1.0], r"entry = infinity or NaN\): weights\[0\] = inf"),
    ([0.0, 0.0], r"sum of probabilities <= 0"),
    ([], r"sum of probabilities <= 0"),
])
@pytest.mark.parametrize("replacement", [True, False])
def test_weight_validation(weights, match, replacement):
    with pytest.raises(RuntimeError, match=match):
        _core.weighted_sample(weights, 1, replacement, 0)


def test_weight_validation_matches_torch(torch):
    # torch words these differently on its one-sample path; compare the
    # general path (several samples), which WeightedRandomSampler uses.
    for weights in ([1.0, -1.0], [1.0, float("nan")], [float("inf"), 1.0], [0.0, 0.0]):
        with pytest.raises(RuntimeError) as theirs:
            torch.multinomial(torch.tensor(weights, dtype=torch.float64), 2, True)
        with pytest.raises(RuntimeError) as ours:
            _core.weighted_sample(weights, 1, True, 0)
        assert str(ours.value).startswith(str(theirs.value))


def test_without_replacement_too_many():
    with pytest.raises(RuntimeError, match=r"cannot sample n_sample > prob_dist.size\(-1\) samples "
                                           r"without replacement"):
        _core.weighted_sample([1.0, 2.0], 3, False, 0)
    with pytest.raises(RuntimeError, match="only 2 of 3 weights are positive"):
        _core.weighted_sample([1.0, 0.0, 2.0], 3, False, 0)


def test_weights_must_be_1d():
    with pytest.raises(ValueError, match=r"weights have shape \(1, 2\)"):
        _core.alias_table([[1.0, 2.0]])
