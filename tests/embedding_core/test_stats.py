"""Paired bootstrap: hand-checkable cases, scipy.stats.bootstrap, reproducibility, chunking."""

import dataclasses

import numpy as np
import pytest

from embedding_core.evaluation import stats
from embedding_core.evaluation.stats import BootstrapInterval, format_interval, paired_bootstrap


def test_identical_systems_give_zero_interval():
    a = np.random.default_rng(0).random(57)
    iv = paired_bootstrap(a, a.copy(), num_samples=500)
    assert (iv.mean_difference, iv.low, iv.high) == (0.0, 0.0, 0.0)
    assert iv.num_samples == 500 and iv.confidence == 0.95
    assert format_interval(iv) == "+0.00 [+0.00, +0.00]"


@pytest.mark.parametrize("shift", [0.25, 0.1, -3.7])
def test_constant_difference_gives_exactly_that_difference(shift):
    # a - b is exactly `shift` for every query (b = 0); a naive mean of n copies of 0.1
    # is not always exactly 0.1, the interval must still be [c, c].
    a = np.full(37, shift)
    iv = paired_bootstrap(a, np.zeros(37), num_samples=300)
    assert (iv.mean_difference, iv.low, iv.high) == (shift, shift, shift)


def test_two_queries_by_hand():
    # Differences (0, 1): a resample's mean is 0, 1/2 or 1 with probability 1/4, 1/2, 1/4.
    # The 95% interval reaches both extremes; the central 40% (quantiles 0.3 and 0.7)
    # lies inside the 1/2 mass.
    a, b = [0.5, 2.0], [0.5, 1.0]
    wide = paired_bootstrap(a, b, num_samples=4000)
    assert (wide.mean_difference, wide.low, wide.high) == (0.5, 0.0, 1.0)
    narrow = paired_bootstrap(a, b, num_samples=4000, confidence=0.4)
    assert (narrow.low, narrow.high) == (0.5, 0.5)


def test_matches_scipy_paired_percentile_bootstrap():
    scipy_stats = pytest.importorskip("scipy.stats")
    rng = np.random.default_rng(1)
    n = 150
    x = rng.random(n)  # query difficulty, shared by both systems
    a = x + 0.02 + 0.05 * rng.standard_normal(n)
    b = x + 0.05 * rng.standard_normal(n)
    ours = paired_bootstrap(a, b, num_samples=20_000, seed=3)
    ref = scipy_stats.bootstrap(
        (a, b), lambda u, v, axis: np.mean(u - v, axis=axis), paired=True, vectorized=True,
        method="percentile", n_resamples=20_000, confidence_level=0.95,
        rng=np.random.default_rng(4),
    ).confidence_interval
    # Monte Carlo error of a 2.5% quantile with 20k resamples is ~0.02 standard errors per
    # run; allow 0.15 standard errors of the mean difference.
    se = np.std(a - b, ddof=1) / np.sqrt(n)
    assert ours.low == pytest.approx(ref.low, abs=0.15 * se)
    assert ours.high == pytest.approx(ref.high, abs=0.15 * se)
    assert ours.mean_difference == pytest.approx(np.mean(a - b), abs=1e-15)
    # Pairing: the unpaired interval (each system resampled on its own) is several times
    # wider here, since the shared difficulty x dominates each system's variance.
    unpaired = scipy_stats.bootstrap(
        (a, b), lambda u, v, axis: np.mean(u, axis=axis) - np.mean(v, axis=axis),
        paired=False, vectorized=True, method="percentile", n_resamples=5_000,
        rng=np.random.default_rng(5),
    ).confidence_interval
    assert unpaired.high - unpaired.low > 3 * (ours.high - ours.low)


def test_seed_reproducible_and_seed_dependent():
    rng = np.random.default_rng(2)
    a, b = rng.random(80), rng.random(80)
    first = paired_bootstrap(a, b, num_samples=1000, seed=7)
    assert paired_bootstrap(a, b, num_samples=1000, seed=7) == first
    other = paired_bootstrap(a, b, num_samples=1000, seed=8)
    assert (other.low, other.high) != (first.low, first.high)
    assert other.mean_difference == first.mean_difference


def test_chunking_does_not_change_the_interval():
    rng = np.random.default_rng(3)
    a, b = rng.random(37), rng.random(37)  # odd length: odd chunk sizes x n
    ref = paired_bootstrap(a, b, num_samples=999, seed=11)
    for chunk_size in (1, 7, 333, 998, 5000):
        assert paired_bootstrap(a, b, num_samples=999, seed=11, chunk_size=chunk_size) == ref


def test_default_chunks_stay_under_the_memory_bound(monkeypatch):
    rng = np.random.default_rng(4)
    a, b = rng.random(50), rng.random(50)
    ref = paired_bootstrap(a, b, num_samples=1000, seed=5)
    sizes = []
    real_rng = np.random.default_rng

    class Spy:
        def __init__(self, seed):
            self.inner = real_rng(seed)

        def random(self, size):
            sizes.append(int(np.prod(size)))
            return self.inner.random(size)

    monkeypatch.setattr(stats, "_MAX_ENTRIES", 120)
    monkeypatch.setattr(stats.np.random, "default_rng", Spy)
    got = paired_bootstrap(a, b, num_samples=1000, seed=5)
    assert got == ref
    assert max(sizes) <= 120 and sum(sizes) == 1000 * 50


def test_format_interval():
    iv = BootstrapInterval(0.0123, -0.0045, 0.0287, num_samples=10, confidence=0.95)
    assert format_interval(iv) == "+1.23 [-0.45, +2.87]"
    assert format_interval(iv, scale=1, digits=3) == "+0.012 [-0.004, +0.029]"
    with pytest.raises(dataclasses.FrozenInstanceError):
        iv.low = 0.0


def test_bad_inputs_are_rejected():
    ok = np.array([0.1, 0.2, 0.3])
    with pytest.raises(ValueError, match="a and b must have the same length"):
        paired_bootstrap(ok, ok[:2])
    with pytest.raises(ValueError, match="a is empty"):
        paired_bootstrap([], [])
    with pytest.raises(ValueError, match="b must be finite"):
        paired_bootstrap(ok, [0.1, np.nan, 0.3])
    with pytest.raises(ValueError, match="a must be finite"):
        paired_bootstrap([np.inf, 0.0, 0.0], ok)
    with pytest.raises(ValueError, match="a must be 1-D"):
        paired_bootstrap(ok[None], ok[None])
    with pytest.raises(ValueError, match="b must be real numbers"):
        paired_bootstrap(ok, ["x", "y", "z"])
    for confidence in (0.0, 1.0, 1.5, -0.1):
        with pytest.raises(ValueError, match="confidence"):
            paired_bootstrap(ok, ok, confidence=confidence)
    with pytest.raises(ValueError, match="num_samples"):
        paired_bootstrap(ok, ok, num_samples=0)
    with pytest.raises(ValueError, match="chunk_size"):
        paired_bootstrap(ok, ok, chunk_size=0)
    for a, b in (([1e308, -1e308], [-1e308, 1e308]), ([1.5e308, -1.5e308], [0.0, 0.0])):
        with pytest.raises(ValueError, match="overflows float64"):  # not a NaN interval
            paired_bootstrap(a, b, num_samples=10)


def test_bootstrap_of_auc_difference():
    from sklearn.metrics import roc_auc_score

    from embedding_core.evaluation import metrics

    rng = np.random.default_rng(3)
    y = rng.random(300) < 0.4
    a = rng.normal(size=300) + y * 1.0
    b = rng.normal(size=300) + y * 0.2
    iv = stats.paired_bootstrap_statistic(metrics.roc_auc_rows, a, b, y, num_samples=400)
    assert iv.mean_difference == pytest.approx(roc_auc_score(y, a) - roc_auc_score(y, b))
    assert iv.low < iv.mean_difference < iv.high and iv.low > 0  # a clearly better
    # Chunking does not change the draws; one system against itself is exactly 0.
    again = stats.paired_bootstrap_statistic(metrics.roc_auc_rows, a, b, y,
                                             num_samples=400, chunk_size=7)
    assert (again.low, again.high) == (iv.low, iv.high)
    same = stats.paired_bootstrap_statistic(metrics.average_precision_rows, a, a, y,
                                            num_samples=50)
    assert (same.mean_difference, same.low, same.high) == (0.0, 0.0, 0.0)
    with pytest.raises(ValueError, match="both classes"):
        stats.paired_bootstrap_statistic(metrics.roc_auc_rows, a, b, np.ones(300))


def test_bootstrap_statistic_over_seeds_is_the_mean_of_seed_statistics():
    from sklearn.metrics import average_precision_score

    from embedding_core.evaluation import metrics

    rng = np.random.default_rng(4)
    y = rng.random(120) < 0.5
    a = rng.normal(size=(120, 3)) + y[:, None] * 0.9  # three seeds
    b = rng.normal(size=120) + y * 0.3
    iv = stats.paired_bootstrap_statistic(metrics.average_precision_rows, a, b, y,
                                          num_samples=200)
    want = np.mean([average_precision_score(y, a[:, i]) for i in range(3)]) - \
        average_precision_score(y, b)
    assert iv.mean_difference == pytest.approx(want, abs=1e-12)
    assert iv.low < want < iv.high


def test_bootstrap_statistic_is_chunk_independent_to_the_bit_and_checks_labels():
    from embedding_core.evaluation import metrics

    rng = np.random.default_rng(3)
    y = rng.random(40) < 0.5
    a = np.round(rng.normal(size=40) + y, 1)
    b = np.round(rng.normal(size=(40, 3)) + 0.5 * y[:, None], 1)
    runs = [stats.paired_bootstrap_statistic(metrics.average_precision_rows, a, b, y,
                                             num_samples=500, seed=3, chunk_size=c)
            for c in (1, 7, None)]
    assert len({(r.low, r.high) for r in runs}) == 1
    for bad, shown in ((np.where(y, 2, 0), r"\[2\]"), (np.where(y, 1.0, np.nan), r"\[nan\]"),
                       (np.where(y, 1, -1), r"\[-1\]"), (y.astype(str), "<U5")):
        with pytest.raises(ValueError, match=f"bool or 0/1, got {shown}"):
            stats.paired_bootstrap_statistic(metrics.roc_auc_rows, a, b, bad, num_samples=5)
    with pytest.raises(ValueError, match=r"labels of shape \(40, 1\)"):
        stats.paired_bootstrap_statistic(metrics.roc_auc_rows, a, b, y[:, None], num_samples=5)
    with pytest.raises(ValueError, match="empty"):
        stats.paired_bootstrap_statistic(metrics.roc_auc_rows, a, np.zeros((40, 0)), y)
