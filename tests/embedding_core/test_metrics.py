"""Metrics against brute-force loops, hand-worked cases and scikit-learn."""

import math

import numpy as np
import pytest
import sklearn.metrics

from embedding_core.evaluation import metrics

# ----------------------------------------------------------------------- recall@k, MRR


def _brute_force_recall(scores, targets, ks):
    """Double loop over queries and items; ties counted against the target."""
    ranks = []
    for i in range(scores.shape[0]):
        t = targets[i]
        ahead = 0
        for j in range(scores.shape[1]):
            if j != t and scores[i, j] >= scores[i, t]:
                ahead += 1
        ranks.append(ahead + 1)
    return ranks, {k: sum(r <= k for r in ranks) / len(ranks) for k in ks}


def test_recall_at_k_matches_brute_force_with_many_ties():
    rng = np.random.default_rng(0)
    scores = rng.integers(0, 4, size=(60, 25)).astype(np.float32)  # 4 values: many ties
    targets = rng.integers(0, 25, size=60)
    ks = (1, 2, 3, 5, 10, 20, 25, 50)
    ref_ranks, ref_recall = _brute_force_recall(scores, targets, ks)
    np.testing.assert_array_equal(metrics.ranks_of_targets(scores, targets), ref_ranks)
    got = metrics.recall_at_k(scores, targets, ks)
    assert list(got) == list(ks)
    for k in ks:
        assert got[k] == pytest.approx(ref_recall[k], abs=0)
    assert got[25] == got[50] == 1.0
    assert metrics.mrr(metrics.ranks_of_targets(scores, targets)) == pytest.approx(
        np.mean([1 / r for r in ref_ranks])
    )


def test_recall_counts_rank_k_but_not_k_plus_1():
    scores = np.array([[0.9, 0.8, 0.7, 0.6]])
    assert metrics.ranks_of_targets(scores, [2]).tolist() == [3]
    got = metrics.recall_at_k(scores, [2], ks=(2, 3, 4))
    assert got == {2: 0.0, 3: 1.0, 4: 1.0}


def test_ties_never_favour_the_model():
    constant = np.zeros((3, 5))
    assert metrics.ranks_of_targets(constant, [0, 2, 4]).tolist() == [5, 5, 5]
    assert metrics.recall_at_k(constant, [0, 2, 4], ks=(1, 4, 5)) == {1: 0.0, 4: 0.0, 5: 1.0}
    # A masked (-inf) target ties with other masked items and goes last among them.
    s = np.array([[1.0, -np.inf, -np.inf]])
    assert metrics.ranks_of_targets(s, [1]).tolist() == [3]


def test_recall_from_ranks_streams_over_blocks():
    rng = np.random.default_rng(1)
    scores = rng.normal(size=(30, 12))
    targets = rng.integers(0, 12, size=30)
    ranks = np.concatenate(
        [metrics.ranks_of_targets(scores[i : i + 7], targets[i : i + 7]) for i in range(0, 30, 7)]
    )
    assert metrics.recall_at_k_from_ranks(ranks, (1, 3)) == metrics.recall_at_k(
        scores, targets, (1, 3)
    )


def test_mrr_hand_worked():
    assert metrics.mrr([1, 2, 4]) == pytest.approx((1 + 0.5 + 0.25) / 3)


@pytest.mark.parametrize(
    "scores, targets",
    [
        (np.array([[0.1, np.nan]]), [0]),  # NaN score
        (np.zeros((2, 3)), [0, 3]),  # target out of range
        (np.zeros((2, 3)), [0.0, 1.0]),  # float targets
        (np.zeros((2, 3)), [0]),  # wrong length
    ],
)
def test_ranks_reject_bad_input(scores, targets):
    with pytest.raises(ValueError):
        metrics.ranks_of_targets(scores, targets)


def test_recall_rejects_bad_k_and_ranks():
    with pytest.raises(ValueError):
        metrics.recall_at_k_from_ranks([1, 2], ks=(0,))
    with pytest.raises(ValueError):
        metrics.recall_at_k_from_ranks([0, 2], ks=(1,))


# --------------------------------------------------------------------- best threshold


def test_best_threshold_hand_worked():
    # Sorted: 0.1(neg) 0.35(pos) 0.4(neg) 0.8(pos). Accuracy of each candidate:
    # -inf 2/4, 0.225 3/4, 0.375 2/4, 0.6 3/4, +inf 2/4 -> the smaller of the two 3/4.
    scores = [0.4, 0.1, 0.8, 0.35]
    labels = [False, False, True, True]
    thr, acc = metrics.best_threshold_accuracy(scores, labels)
    assert thr == pytest.approx(0.225)
    assert acc == 0.75
    assert metrics.accuracy_at_threshold(scores, labels, 0.6) == 0.75
    assert metrics.accuracy_at_threshold(scores, labels, 0.375) == 0.5


def test_best_threshold_extremes():
    # All positive: -inf (everything predicted positive) is the smallest best threshold.
    assert metrics.best_threshold_accuracy([0.3, 0.1], [1, 1]) == (-math.inf, 1.0)
    # All negative: only +inf classifies everything right.
    assert metrics.best_threshold_accuracy([0.3, 0.1], [0, 0]) == (math.inf, 1.0)


def _brute_force_threshold(scores, labels):
    values = sorted(set(scores.tolist()))
    candidates = (
        [-math.inf]
        + [(a + b) / 2 for a, b in zip(values[:-1], values[1:], strict=True)]
        + [math.inf]
    )
    best_thr, best_acc = None, -1.0
    for thr in candidates:  # increasing, so ">" keeps the smallest on ties
        acc = sum(
            (s > thr) == y for s, y in zip(scores.tolist(), labels.tolist(), strict=True)
        ) / len(scores)
        if acc > best_acc:
            best_thr, best_acc = thr, acc
    return best_thr, best_acc


@pytest.mark.parametrize("seed", range(5))
def test_best_threshold_matches_brute_force(seed):
    rng = np.random.default_rng(seed)
    n = 41
    scores = rng.integers(0, 12, size=n) / 4.0  # exact midpoints, many ties
    labels = rng.random(n) < 0.3 + 0.1 * seed
    thr, acc = metrics.best_threshold_accuracy(scores, labels)
    ref_thr, ref_acc = _brute_force_threshold(scores, labels)
    assert (thr, acc) == (ref_thr, ref_acc)
    assert metrics.accuracy_at_threshold(scores, labels, thr) == acc


def test_best_threshold_on_adjacent_float32_scores():
    # lo has an odd last mantissa bit, so lo + (hi - lo) / 2 rounds (to even) up to hi.
    lo = np.nextafter(np.float32(1.0), np.float32(2.0))
    hi = np.nextafter(lo, np.float32(2.0))
    scores = np.array([lo, hi, lo, hi], dtype=np.float32)
    labels = np.array([False, True, False, True])
    thr, acc = metrics.best_threshold_accuracy(scores, labels)
    assert acc == 1.0
    # The threshold must separate the two values in float32 and in float64 comparisons.
    np.testing.assert_array_equal(scores > np.float32(thr), labels)
    np.testing.assert_array_equal(scores.astype(np.float64) > thr, labels)


def test_threshold_rejects_bad_input():
    with pytest.raises(ValueError):
        metrics.best_threshold_accuracy([0.1, np.nan], [0, 1])
    with pytest.raises(ValueError):
        metrics.best_threshold_accuracy([0.1, 0.2], [0, 2])
    with pytest.raises(ValueError):
        metrics.best_threshold_accuracy([], [])


# ------------------------------------------------------------------------------ P@k


def test_precision_at_k_hand_worked():
    scores = np.array([[0.9, 0.8, 0.7, 0.6, 0.5], [0.1, 0.2, 0.3, 0.4, 0.5]])
    relevant = np.array([[1, 0, 1, 0, 1], [1, 0, 0, 0, 0]], dtype=bool)
    # k=1: both queries have >= 1 positive: (1 + 0) / 2.
    assert metrics.precision_at_k(scores, relevant, 1) == 0.5
    # k=2, 3: only the first query has >= k positives.
    assert metrics.precision_at_k(scores, relevant, 2) == 0.5
    assert metrics.precision_at_k(scores, relevant, 3) == pytest.approx(2 / 3)
    # min_positives=1 brings the second query back in at k=2: (1/2 + 0) / 2.
    assert metrics.precision_at_k(scores, relevant, 2, min_positives=1) == 0.25
    with pytest.raises(ValueError, match="no query"):
        metrics.precision_at_k(scores, relevant, 4)
    with pytest.raises(ValueError, match="exceeds"):
        metrics.precision_at_k(scores, relevant, 6, min_positives=0)


def test_precision_ties_are_pessimistic():
    scores = np.ones((1, 4))
    relevant = np.array([[True, False, False, True]])
    assert metrics.precision_at_k(scores, relevant, 2) == 0.0


# ------------------------------------------------------------------------------ NDCG


@pytest.mark.parametrize("gain_fn", [lambda c: c, np.log1p], ids=["raw", "log1p"])
def test_ndcg_hand_worked(gain_fn):
    # Rank order by score: item 0, item 2, item 1, item 3 -> counts 0, 1, 3, 2.
    scores = np.array([[0.9, 0.5, 0.7, 0.1], [0.4, 0.3, 0.2, 0.1]])
    counts = np.array([[0.0, 3.0, 1.0, 2.0], [0.0, 0.0, 0.0, 0.0]])  # row 2 skipped
    g = gain_fn
    dcg = g(0.0) / 1 + g(1.0) / math.log2(3) + g(3.0) / 2
    idcg = g(3.0) / 1 + g(2.0) / math.log2(3) + g(1.0) / 2
    assert metrics.ndcg_at_k(scores, gain_fn(counts), 3) == pytest.approx(dcg / idcg)
    # k beyond the number of items uses all of them.
    dcg4 = dcg + g(2.0) / math.log2(5)
    idcg4 = idcg + g(0.0) / math.log2(5)
    assert metrics.ndcg_at_k(scores, gain_fn(counts), 10) == pytest.approx(dcg4 / idcg4)


def test_ndcg_matches_sklearn_without_ties():
    rng = np.random.default_rng(2)
    scores = rng.normal(size=(12, 20))
    gains = rng.integers(0, 5, size=(12, 20)).astype(float)
    gains[:, 0] += 1  # every row has a positive gain (sklearn scores empty rows 0)
    for k in (1, 5, 20):
        assert metrics.ndcg_at_k(scores, gains, k) == pytest.approx(
            sklearn.metrics.ndcg_score(gains, scores, k=k)
        )


def test_ndcg_ties_and_bad_input():
    assert metrics.ndcg_at_k(np.ones((1, 2)), np.array([[1.0, 0.0]]), 1) == 0.0
    with pytest.raises(ValueError, match="no query"):
        metrics.ndcg_at_k(np.ones((1, 2)), np.zeros((1, 2)), 1)
    with pytest.raises(ValueError):
        metrics.ndcg_at_k(np.ones((1, 2)), np.array([[1.0, -1.0]]), 1)


# ------------------------------------------------------------------------------- MAP


def test_map_matches_sklearn_average_precision_per_row():
    rng = np.random.default_rng(3)
    scores = rng.normal(size=(25, 15))  # continuous: no ties
    relevant = rng.random((25, 15)) < 0.2
    relevant[:3] = False  # queries without a relevant item are skipped
    rows = [i for i in range(25) if relevant[i].any()]
    per_row = [sklearn.metrics.average_precision_score(relevant[i], scores[i]) for i in rows]
    for i, ref in zip(rows, per_row, strict=True):
        assert metrics.average_precision(scores[i], relevant[i]) == pytest.approx(ref)
    assert metrics.mean_average_precision(scores, relevant) == pytest.approx(np.mean(per_row))


def test_average_precision_ties_hand_worked():
    # Pessimistic order: [non-relevant (1), relevant (1), relevant (0)] -> (1/2 + 2/3) / 2.
    assert metrics.average_precision([1.0, 1.0, 0.0], [1, 0, 1]) == pytest.approx(7 / 12)
    with pytest.raises(ValueError):
        metrics.average_precision([1.0, 0.0], [0, 0])


# ------------------------------------------------------------------------- LRAP, AUC


def _brute_force_lrap(scores, relevant):
    per_row = []
    for s, y in zip(scores.tolist(), relevant.tolist(), strict=True):
        pos = [j for j, r in enumerate(y) if r]
        if not pos:
            continue
        total = 0.0
        for j in pos:
            above = [k for k in range(len(s)) if s[k] >= s[j]]
            total += sum(y[k] for k in above) / len(above)
        per_row.append(total / len(pos))
    return sum(per_row) / len(per_row)


def test_lrap_hand_worked_and_brute_force():
    # The example of sklearn's documentation.
    scores = np.array([[0.75, 0.5, 1.0], [1.0, 0.2, 0.1]])
    relevant = np.array([[1, 0, 0], [0, 0, 1]])
    assert metrics.label_ranking_average_precision(scores, relevant) == pytest.approx(5 / 12)

    rng = np.random.default_rng(4)
    scores = rng.integers(0, 5, size=(30, 10)).astype(float)  # ties
    relevant = rng.random((30, 10)) < 0.25
    relevant[:4] = False  # sklearn alone would score these rows 1
    ref = _brute_force_lrap(scores, relevant)
    assert metrics.label_ranking_average_precision(scores, relevant) == pytest.approx(ref)
    keep = relevant.any(axis=1)
    assert ref == pytest.approx(
        sklearn.metrics.label_ranking_average_precision_score(relevant[keep], scores[keep])
    )


def test_roc_auc_flattened_vs_pairs_and_sklearn():
    scores = np.array([[0.9, 0.2, 0.5], [0.5, 0.1, 0.7]])
    labels = np.array([[1, 0, 1], [0, 0, 1]])
    pos = scores[labels == 1]
    neg = scores[labels == 0]
    pairs = [(p > n) + 0.5 * (p == n) for p in pos for n in neg]
    assert metrics.roc_auc(scores, labels) == pytest.approx(np.mean(pairs))
    assert metrics.roc_auc(scores, labels) == pytest.approx(
        sklearn.metrics.roc_auc_score(labels.ravel(), scores.ravel())
    )
    with pytest.raises(ValueError, match="both"):
        metrics.roc_auc(scores, np.ones_like(labels))
    with pytest.raises(ValueError):
        metrics.roc_auc(scores, labels.T)


@pytest.mark.parametrize("levels", [None, 5, 2])  # continuous scores, heavy ties, two values
def test_auc_and_ap_rows_equal_sklearn(levels):
    from sklearn.metrics import average_precision_score, roc_auc_score

    rng = np.random.default_rng(7)
    labels = rng.random((6, 41)) < 0.3
    labels[:, 0], labels[:, 1] = True, False
    scores = rng.normal(size=labels.shape) + labels * 0.8
    if levels:
        scores = np.round(scores * levels / 4) / levels  # many exact ties, across classes
    auc = metrics.roc_auc_rows(scores, labels)
    ap = metrics.average_precision_rows(scores, labels)
    assert auc.shape == ap.shape == (6,)
    for i in range(6):
        assert auc[i] == pytest.approx(roc_auc_score(labels[i], scores[i]), abs=1e-12)
        assert ap[i] == pytest.approx(average_precision_score(labels[i], scores[i]), abs=1e-12)


def test_auc_ap_rows_by_hand_and_errors():
    # Scores 3, 2, 2, 1 with labels 1, 0, 1, 0: the tie at 2 is half a win, AUC = 3/4 ->
    # pairs (3>2, 3>1, 2=2 -> 1/2, 2>1) = 3.5 / 4; AP: thresholds 3 (P=1, R=1/2), 2 (P=2/3,
    # R=1) -> 1/2 * 1 + 1/2 * 2/3.
    s, y = np.array([3.0, 2.0, 2.0, 1.0]), np.array([1, 0, 1, 0])
    assert metrics.roc_auc_rows(s, y) == pytest.approx(3.5 / 4)
    assert metrics.average_precision_rows(s, y) == pytest.approx(0.5 + 1 / 3)
    with pytest.raises(ValueError, match="both positive and negative"):
        metrics.roc_auc_rows(s, np.ones(4))
    with pytest.raises(ValueError, match="NaN"):
        metrics.average_precision_rows(np.array([np.nan, 1.0]), np.array([1, 0]))


def test_weighted_auc_ap_equal_sklearn_and_the_resample_they_count():
    from sklearn.metrics import average_precision_score, roc_auc_score

    rng = np.random.default_rng(11)
    labels = rng.random(57) < 0.4
    scores = np.round(rng.normal(size=57) + labels * 0.7, 1)  # ties within and across classes
    counts = rng.integers(0, 4, size=(5, 57))  # five bootstrap-like resamples, as counts
    counts[:, :2] = 1
    labels[:2] = True, False
    auc = metrics.roc_auc_rows(scores, labels, sample_weight=counts)
    ap = metrics.average_precision_rows(scores, labels, sample_weight=counts)
    assert auc.shape == ap.shape == (5,)
    for i, c in enumerate(counts):
        resample = np.repeat(np.arange(57), c)  # the multiset the counts stand for
        assert auc[i] == pytest.approx(roc_auc_score(labels[resample], scores[resample]),
                                       abs=1e-12)
        assert ap[i] == pytest.approx(
            average_precision_score(labels[resample], scores[resample]), abs=1e-12)
    w = rng.random(57)  # real-valued weights: sklearn's sample_weight
    assert metrics.roc_auc_rows(scores, labels, w) == pytest.approx(
        roc_auc_score(labels, scores, sample_weight=w), abs=1e-12)
    assert metrics.average_precision_rows(scores, labels, w) == pytest.approx(
        average_precision_score(labels, scores, sample_weight=w), abs=1e-12)
    rows = np.stack([scores, -scores]), np.stack([labels, labels])  # [2, n] against [3, 2, n]
    many = rng.random((3, 2, 57))
    got = metrics.roc_auc_rows(*rows, sample_weight=many)
    assert got.shape == (3, 2) and got[2, 1] == pytest.approx(
        roc_auc_score(labels, -scores, sample_weight=many[2, 1]), abs=1e-12)
    with pytest.raises(ValueError, match="sample_weight"):
        metrics.roc_auc_rows(scores, labels, -w)
    with pytest.raises(ValueError, match="positive and negative weight"):
        metrics.roc_auc_rows(scores, labels, labels.astype(float))


def test_auc_ap_extreme_weights_and_large_integer_scores():
    # Found by trying to break them: P * N over- / underflowed at extreme weight scales, and
    # integer scores above 2**53 collapsed into ties when cast to float64.
    s, y = np.array([0.1, 0.4, 0.35, 0.8]), np.array([0, 0, 1, 1])
    for scale in (1e-200, 1e-162, 1e160):
        assert metrics.roc_auc_rows(s, y, np.full(4, scale)) == pytest.approx(0.75)
        assert metrics.average_precision_rows(s, y, np.full(4, scale)) == pytest.approx(
            metrics.average_precision_rows(s, y))
    big = np.array([2**60, 2**60 + 1], dtype=np.int64)
    assert metrics.roc_auc_rows(big, [0, 1]) == 1.0
    assert metrics.average_precision_rows(big.astype(np.uint64), [0, 1]) == 1.0
