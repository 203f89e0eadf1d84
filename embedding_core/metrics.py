"""Evaluation metrics for embeddings: classification with a tuned threshold and ranking.

Pure numpy (scikit-learn for ROC-AUC and label-ranking average precision). Every function
takes array-likes (numpy or jax arrays), rejects NaN scores with ``ValueError`` and returns
Python floats.

Ties never favour the model:

* ``ranks_of_targets`` (recall@k, MRR) gives a target the *worst* rank among the items that
  share its score: every other item with a score ``>=`` the target's counts ahead of it.
* MAP, NDCG@k and P@k sort by score (descending) and, among equal scores, put the relevant
  items (larger gains) *after* the non-relevant ones (smaller gains). This order is
  deterministic, so a constant scorer cannot earn credit from an accidental tie order.
* ``ranks_of_relevant`` (several relevant items per query) gives every relevant item its
  position in that same order: at equal score it goes behind every non-relevant item, but
  relevant items tied with each other take consecutive positions (they are not counted
  against each other, as trec_eval's MRR and recall do not count them). With one relevant
  item per query it equals ``ranks_of_targets``.

Users: DualCSE (RTE accuracy with a threshold tuned on validation), DocEnt (entity ranking,
MovieLens tag prediction: P@K, NDCG@K, MAP = LRAP, ROC-AUC), multi-resolution retrieval
(recall@k of the right paragraph over all paragraphs).
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import sklearn.metrics

DEFAULT_RECALL_KS: tuple[int, ...] = (1, 2, 3, 5, 10, 20, 50)


# --------------------------------------------------------------------------- validation


def _scores(x, ndim: int, name: str = "scores") -> np.ndarray:
    arr = np.asarray(x)
    if arr.ndim != ndim:
        raise ValueError(f"{name} must be {ndim}-D, got shape {arr.shape}")
    if arr.dtype == np.bool_ or not (
        np.issubdtype(arr.dtype, np.floating) or np.issubdtype(arr.dtype, np.integer)
    ):
        raise ValueError(f"{name} must be int or float, got dtype {arr.dtype}")
    if np.issubdtype(arr.dtype, np.floating) and np.isnan(arr).any():
        bad = np.argwhere(np.isnan(arr))[0].tolist()
        raise ValueError(f"{name} contains NaN (first at index {bad})")
    return arr


def _binary(x, shape: tuple[int, ...], name: str) -> np.ndarray:
    """Bool array of ``shape``; accepts bool or 0/1 numbers."""
    arr = np.asarray(x)
    if arr.shape != shape:
        raise ValueError(f"{name} must have shape {shape} (as the scores), got {arr.shape}")
    if arr.dtype != np.bool_:
        if not (np.issubdtype(arr.dtype, np.integer) or np.issubdtype(arr.dtype, np.floating)):
            raise ValueError(f"{name} must be bool or 0/1, got dtype {arr.dtype}")
        if not np.isin(arr, (0, 1)).all():
            raise ValueError(f"{name} must be bool or 0/1, found other values")
        arr = arr.astype(bool)
    return arr


def _queries_with_relevant(scores, relevant, caller: str) -> tuple[np.ndarray, np.ndarray]:
    # Queries with no relevant item have no defined AP: they are dropped, not scored.
    s = _scores(scores, 2)
    rel = _binary(relevant, s.shape, "relevant")
    keep = rel.any(axis=1)
    if not keep.any():
        raise ValueError(f"{caller}: no query has a relevant item")
    return s[keep], rel[keep]


def _positive_int(k, name: str = "k") -> int:
    if isinstance(k, bool) or int(k) != k or k < 1:
        raise ValueError(f"{name} must be a positive integer, got {k!r}")
    return int(k)


def _pessimistic_order(scores: np.ndarray, tie_key: np.ndarray) -> np.ndarray:
    """Indices sorting each row by score descending, ties by ``tie_key`` ascending.

    ``lexsort`` sorts ascending by its last key; sorting by (score asc, tie_key desc) and
    reversing gives (score desc, tie_key asc) without negating the scores (which would wrap
    unsigned integers).
    """
    inverted = ~tie_key if tie_key.dtype == np.bool_ else -tie_key.astype(np.float64)
    return np.lexsort((inverted, scores), axis=-1)[..., ::-1]


# ------------------------------------------------------------- threshold classification


def accuracy_at_threshold(scores, labels, threshold: float) -> float:
    """Accuracy of the rule ``predict positive iff score > threshold``.

    Args:
      scores: ``[n]`` float (or int) scores, e.g. cosine similarities.
      labels: ``[n]`` bool (or 0/1) gold labels, True = positive.
      threshold: float, may be ``-inf`` / ``inf``.

    Returns:
      Fraction of the ``n`` examples classified correctly, in [0, 1].

    Raises:
      ValueError: empty input, NaN scores, shape mismatch or non-binary labels.
    """
    s = _scores(scores, 1)
    y = _binary(labels, s.shape, "labels")
    if s.size == 0:
        raise ValueError("accuracy_at_threshold needs at least one example")
    return float(np.mean((s > threshold) == y))


def best_threshold_accuracy(scores, labels) -> tuple[float, float]:
    """Threshold that maximises the accuracy of ``score > threshold``, and that accuracy.

    The candidates are ``-inf``, the midpoint between each pair of consecutive distinct
    scores and ``+inf``: every distinct classification of the data is reached by exactly
    one of them. Among equally accurate candidates the smallest threshold is returned.
    O(n log n) (one sort plus cumulative counts). This is the usual protocol of tuning the
    decision threshold on a validation set and applying it to the test set (DualCSE RTE,
    see ``docs/dualcse.md``; SentEval-style binary evaluation of similarity scores).

    Midpoints are computed in the scores' floating dtype (float64 for integer scores) and
    kept strictly below the upper score, so ``scores > threshold`` evaluated in either the
    input dtype or float64 reproduces the reported accuracy.

    Args:
      scores: ``[n]`` float (or int) scores.
      labels: ``[n]`` bool (or 0/1) gold labels.

    Returns:
      ``(threshold, accuracy)``: Python floats; accuracy in [0, 1].

    Raises:
      ValueError: empty input, NaN scores, shape mismatch or non-binary labels.
    """
    s = _scores(scores, 1)
    y = _binary(labels, s.shape, "labels")
    if s.size == 0:
        raise ValueError("best_threshold_accuracy needs at least one example")
    if not np.issubdtype(s.dtype, np.floating):
        s = s.astype(np.float64)
    order = np.argsort(s, kind="stable")
    s_sorted, y_sorted = s[order], y[order]
    # Last index of each run of equal scores: a threshold between runs splits there.
    run_end = np.flatnonzero(np.append(s_sorted[1:] != s_sorted[:-1], True))
    unique = s_sorted[run_end]
    pos_le = np.cumsum(y_sorted)[run_end]  # positives with score <= unique[i]
    neg_le = (run_end + 1) - pos_le
    n_pos = int(y.sum())
    # Threshold -inf: everything predicted positive; after unique[i]: <= unique[i] negative.
    correct = np.concatenate(([n_pos], neg_le + (n_pos - pos_le)))
    best = int(np.argmax(correct))  # first maximum = smallest threshold
    if best == 0:
        threshold = -np.inf
    elif best == len(unique):
        threshold = np.inf
    else:
        lo, hi = unique[best - 1], unique[best]
        with np.errstate(over="ignore"):
            mid = lo + (hi - lo) / 2
        if not np.isfinite(mid):  # (hi - lo) overflowed for extreme magnitudes
            mid = lo / 2 + hi / 2
        # Rounding can land on hi for adjacent floats; lo still separates the two runs.
        threshold = lo if (mid >= hi or mid < lo) else mid
    return float(threshold), float(correct[best] / s.size)


# ----------------------------------------------------------- single-target retrieval


def ranks_of_targets(scores, targets) -> np.ndarray:
    """1-based rank of each query's target item, pessimistic on ties.

    ``rank_i = 1 + #{j != t_i : scores[i, j] >= scores[i, t_i]}``: every other item that
    scores at least as high as the target is counted ahead of it, so ties (and a constant
    scorer) never favour the model. This avoids the off-by-one and optimistic-tie faults
    listed in ``docs/pitfalls.md``.

    Args:
      scores: ``[n_queries, n_items]`` float (or int) similarity scores, higher = better.
        ``-inf`` is allowed (e.g. masked items).
      targets: ``[n_queries]`` int, column index of each query's correct item.

    Returns:
      ``[n_queries]`` int64 ranks in ``[1, n_items]``.

    Raises:
      ValueError: NaN scores, wrong shapes, non-integer or out-of-range targets.
    """
    s = _scores(scores, 2)
    t = np.asarray(targets)
    if t.shape != (s.shape[0],):
        raise ValueError(f"targets must have shape ({s.shape[0]},), got {t.shape}")
    if t.dtype == np.bool_ or not np.issubdtype(t.dtype, np.integer):
        raise ValueError(f"targets must be integers, got dtype {t.dtype}")
    if t.size and (t.min() < 0 or t.max() >= s.shape[1]):
        raise ValueError(f"targets must lie in [0, {s.shape[1]}), got [{t.min()}, {t.max()}]")
    target_scores = s[np.arange(s.shape[0]), t]
    # Counting ">=" includes the target itself, which supplies the "1 +".
    return np.sum(s >= target_scores[:, None], axis=1, dtype=np.int64)


def recall_at_k_from_ranks(ranks, ks: Iterable[int] = DEFAULT_RECALL_KS) -> dict[int, float]:
    """Recall@k from precomputed 1-based target ranks (for streamed, blockwise scoring).

    ``recall@k = #{i : rank_i <= k} / n_queries``: a target at rank exactly ``k`` counts,
    one at rank ``k + 1`` does not. A ``k`` larger than the number of items is allowed and
    gives 1.0. With one relevant item per query this is also the hit rate / top-k accuracy.

    Args:
      ranks: ``[n_queries]`` int ranks (>= 1), e.g. from :func:`ranks_of_targets`,
        concatenated over blocks of queries.
      ks: cut-offs, positive ints.

    Returns:
      ``{k: recall}`` in the order of ``ks``; floats in [0, 1].

    Raises:
      ValueError: empty or non-positive ranks, bad ``k``.
    """
    r = _ranks(ranks)
    return {_positive_int(k): float(np.mean(r <= k)) for k in ks}


def recall_at_k(scores, targets, ks: Iterable[int] = DEFAULT_RECALL_KS) -> dict[int, float]:
    """Recall@k of the single correct item per query (retrieval of the right paragraph).

    Args:
      scores: ``[n_queries, n_items]`` float scores.
      targets: ``[n_queries]`` int index of the correct item.
      ks: cut-offs; default ``(1, 2, 3, 5, 10, 20, 50)`` as in the ConvRR/FCRR papers.

    Returns:
      ``{k: recall}``; see :func:`ranks_of_targets` (pessimistic ties) and
      :func:`recall_at_k_from_ranks` (definition).
    """
    return recall_at_k_from_ranks(ranks_of_targets(scores, targets), ks)


def mrr(ranks) -> float:
    """Mean reciprocal rank, ``mean_i 1 / rank_i``.

    Args:
      ranks: ``[n_queries]`` int 1-based ranks (e.g. from :func:`ranks_of_targets`).

    Returns:
      Float in (0, 1].

    Raises:
      ValueError: empty or non-positive ranks.
    """
    return float(np.mean(1.0 / _ranks(ranks)))


def _ranks(ranks) -> np.ndarray:
    r = np.asarray(ranks)
    if r.ndim != 1 or r.size == 0:
        raise ValueError(f"ranks must be a non-empty 1-D array, got shape {r.shape}")
    if r.dtype == np.bool_ or not np.issubdtype(r.dtype, np.integer):
        raise ValueError(f"ranks must be integers, got dtype {r.dtype}")
    if r.min() < 1:
        raise ValueError(f"ranks are 1-based, got a rank of {r.min()}")
    return r


# ------------------------------------------------------------ multi-relevant ranking

_MAX_COMPARISONS = 1 << 22
"""Score comparisons held in memory at once by :func:`ranks_of_relevant` (about 4M, i.e.
a few tens of MB for float32 scores plus the boolean mask)."""


def ranks_of_relevant(scores, relevant) -> tuple[np.ndarray, np.ndarray]:
    """1-based rank of every relevant item, in the worst-case tie order for the model.

    The ``j``-th relevant item of a query (0-based, relevant items by descending score) has

        ``rank_j = j + 1 + #{non-relevant items i : score_i >= score_j}``

    i.e. its position when the row is sorted by descending score with relevant items behind
    the non-relevant ones they tie with. Relevant items tied with each other take the
    consecutive positions ``j + 1 + ...``, so any order among them gives the same ranks: they
    are not counted against each other. This is the order :func:`mean_average_precision`
    and :func:`ndcg_at_k` (binary gains) already use, so MAP, MRR, recall@k and NDCG@k
    computed from these ranks agree with each other. Without ties the ranks are the plain
    positions of the relevant items (what ``trec_eval`` computes for tie-free runs).

    Cost: ``O(n_pairs * n_items)`` comparisons, done in chunks of pairs so that at most
    ``_MAX_COMPARISONS`` are held in memory at once (no full sort of the rows).

    Args:
      scores: ``[n_queries, n_items]`` float (or int) scores, higher = better; ``-inf`` is
        allowed.
      relevant: ``[n_queries, n_items]`` bool (or 0/1) relevance.

    Returns:
      ``(query, rank)``: two ``[n_pairs]`` int64 arrays, one entry per relevant
      ``(query, item)`` pair, sorted by query and then by rank (strictly increasing within
      a query, so a query's ``j``-th entry is its ``j``-th relevant item). Queries without
      a relevant item have no entry. Ranks lie in ``[1, n_items]``.

    Raises:
      ValueError: NaN scores, wrong shapes or non-binary relevance.
    """
    s = _scores(scores, 2)
    rel = _binary(relevant, s.shape, "relevant")
    query, item = np.nonzero(rel)
    pair_scores = s[query, item]
    # Non-relevant items scoring at least as high as each relevant one, in chunks of pairs:
    # a [pairs, n_items] comparison at once would not fit for large entity sets.
    ahead = np.empty(query.size, dtype=np.int64)
    step = max(1, _MAX_COMPARISONS // max(1, s.shape[1]))
    for start in range(0, query.size, step):
        q = query[start : start + step]
        at_least = s[q] >= pair_scores[start : start + step, None]
        ahead[start : start + step] = np.count_nonzero(at_least & ~rel[q], axis=1)
    # j = number of the query's relevant items placed before this one. Sorting by (query,
    # score ascending) and counting from the end of each query's run avoids negating the
    # scores (which would wrap unsigned integers); tied relevant items get consecutive j in
    # some order, which does not matter since they share ``ahead``.
    by_score = np.lexsort((pair_scores, query))
    per_query = np.bincount(query, minlength=s.shape[0])
    run_end = np.cumsum(per_query)  # one past the last pair of each query
    j = np.empty(query.size, dtype=np.int64)
    j[by_score] = run_end[query[by_score]] - 1 - np.arange(query.size)
    rank = j + 1 + ahead
    order = np.lexsort((rank, query))
    return query[order].astype(np.int64), rank[order]



def _relevance_in_rank_order(scores: np.ndarray, relevant: np.ndarray) -> np.ndarray:
    order = _pessimistic_order(scores, relevant)
    return np.take_along_axis(relevant, order, axis=-1)


def _ap_rows(sorted_relevant: np.ndarray) -> np.ndarray:
    """AP per row from relevance in rank order; rows need at least one relevant item."""
    hits = np.cumsum(sorted_relevant, axis=-1)
    precision = hits / np.arange(1, sorted_relevant.shape[-1] + 1)
    return np.sum(precision * sorted_relevant, axis=-1) / hits[..., -1]


def average_precision(scores, relevant) -> float:
    """Average precision of one ranked list.

    ``AP = (1 / R) * sum_{r : item at rank r is relevant} precision@r`` with ``R`` the
    number of relevant items (the standard IR definition, e.g. Manning et al.,
    *Introduction to Information Retrieval*, sec. 8.4). Ties are ordered pessimistically
    (relevant after non-relevant at equal score). Without ties it equals
    ``sklearn.metrics.average_precision_score(relevant, scores)``.

    Args:
      scores: ``[n_items]`` float scores.
      relevant: ``[n_items]`` bool (or 0/1) relevance.

    Returns:
      Float in (0, 1].

    Raises:
      ValueError: NaN scores, shape mismatch, or no relevant item.
    """
    s = _scores(scores, 1)
    rel = _binary(relevant, s.shape, "relevant")
    if not rel.any():
        raise ValueError("average_precision needs at least one relevant item")
    return float(_ap_rows(_relevance_in_rank_order(s, rel)))


def mean_average_precision(scores, relevant) -> float:
    """MAP: mean of :func:`average_precision` over queries with at least one relevant item.

    Args:
      scores: ``[n_queries, n_items]`` float scores.
      relevant: ``[n_queries, n_items]`` bool (or 0/1) relevance.

    Returns:
      Float in (0, 1].

    Raises:
      ValueError: NaN scores, shape mismatch, or no query with a relevant item.
    """
    s, rel = _queries_with_relevant(scores, relevant, "mean_average_precision")
    return float(np.mean(_ap_rows(_relevance_in_rank_order(s, rel))))


def ndcg_at_k(scores, gains, k: int) -> float:
    """Mean NDCG@k over queries whose ideal DCG@k is positive.

    ``DCG@k = sum_{r=1}^{min(k, n)} gain_(r) / log2(r + 1)`` with ``gain_(r)`` the gain of
    the item at rank ``r``; ``NDCG@k = DCG@k / IDCG@k`` where ``IDCG@k`` is the DCG of the
    gains sorted descending (Jarvelin & Kekalainen 2002, the linear-gain form used by the
    DocEnt tag-prediction notebooks with gain = count or log(1 + count)). Ties are ordered
    pessimistically (smaller gain first at equal score). Queries with zero ideal DCG (no
    positive gain) are skipped.

    Args:
      scores: ``[n_queries, n_items]`` float scores.
      gains: ``[n_queries, n_items]`` float gains, >= 0 (bool = binary relevance).
      k: cut-off, positive int; a ``k`` above ``n_items`` uses all items.

    Returns:
      Float in [0, 1].

    Raises:
      ValueError: NaN scores or gains, negative gains, shape mismatch, bad ``k``, or no
        query with a positive gain.
    """
    s = _scores(scores, 2)
    g = np.asarray(gains)
    g = _scores(g.astype(np.float64) if g.dtype == np.bool_ else g, 2, "gains").astype(np.float64)
    if g.shape != s.shape:
        raise ValueError(f"gains must have shape {s.shape} (as the scores), got {g.shape}")
    if (g < 0).any():
        raise ValueError("gains must be >= 0")
    k = min(_positive_int(k), s.shape[1])
    discount = 1.0 / np.log2(np.arange(2, k + 2))
    ranked = np.take_along_axis(g, _pessimistic_order(s, g), axis=1)[:, :k]
    ideal = -np.sort(-g, axis=1)[:, :k]
    dcg, idcg = ranked @ discount, ideal @ discount
    keep = idcg > 0
    if not keep.any():
        raise ValueError("ndcg_at_k: no query has a positive gain")
    return float(np.mean(dcg[keep] / idcg[keep]))


def precision_at_k(scores, relevant, k: int, min_positives: int | None = None) -> float:
    """Mean precision@k over queries with at least ``min_positives`` relevant items.

    ``P@k = #{relevant items among the top k} / k``. The DocEnt tag-prediction protocol
    averages P@K only over movies with at least K positive tags (``min_positives = k``, the
    default), so that a perfect ranking scores 1. Ties are ordered pessimistically.

    Args:
      scores: ``[n_queries, n_items]`` float scores.
      relevant: ``[n_queries, n_items]`` bool (or 0/1) relevance.
      k: cut-off, ``1 <= k <= n_items``.
      min_positives: minimum number of relevant items for a query to count; default ``k``.

    Returns:
      Float in [0, 1].

    Raises:
      ValueError: NaN scores, shape mismatch, bad ``k``, or no query qualifies.
    """
    s = _scores(scores, 2)
    rel = _binary(relevant, s.shape, "relevant")
    k = _positive_int(k)
    if k > s.shape[1]:
        raise ValueError(f"k={k} exceeds the number of items ({s.shape[1]})")
    min_positives = k if min_positives is None else int(min_positives)
    keep = rel.sum(axis=1) >= min_positives
    if not keep.any():
        raise ValueError(f"precision_at_k: no query has >= {min_positives} relevant items")
    ranked = _relevance_in_rank_order(s[keep], rel[keep])[:, :k]
    return float(np.mean(ranked.sum(axis=1) / k))


def label_ranking_average_precision(scores, relevant) -> float:
    """Label-ranking average precision over queries with at least one relevant item.

    ``LRAP = mean_i (1/|Y_i|) sum_{j in Y_i} |{l in Y_i : s_il >= s_ij}| / |{l : s_il >= s_ij}|``
    (Tsoumakas et al.; ``sklearn.metrics.label_ranking_average_precision_score``, which this
    calls). Ties count against the model (``>=``). This is the "MAP" of the DocEnt
    tag-prediction notebooks. Queries without a relevant item are dropped first (sklearn
    would score them 1).

    Args:
      scores: ``[n_queries, n_labels]`` float scores.
      relevant: ``[n_queries, n_labels]`` bool (or 0/1) relevance.

    Returns:
      Float in (0, 1].

    Raises:
      ValueError: NaN scores, shape mismatch, or no query with a relevant item.
    """
    s, rel = _queries_with_relevant(scores, relevant, "label_ranking_average_precision")
    return float(sklearn.metrics.label_ranking_average_precision_score(rel, s))


def roc_auc(scores, labels) -> float:
    """ROC-AUC over all entries of ``scores`` / ``labels`` flattened together.

    The probability that a random positive scores above a random negative, ties counting
    one half (``sklearn.metrics.roc_auc_score``, which this calls). The DocEnt notebooks
    compute it over the flattened movie x tag matrix.

    Args:
      scores: float array of any shape.
      labels: bool (or 0/1) array of the same shape.

    Returns:
      Float in [0, 1].

    Raises:
      ValueError: NaN scores, shape mismatch, or only one class present.
    """
    s_any, y_any = np.asarray(scores), np.asarray(labels)
    if s_any.shape != y_any.shape:
        raise ValueError(f"labels must have shape {s_any.shape} (as the scores), got {y_any.shape}")
    s = _scores(s_any.reshape(-1), 1)
    y = _binary(y_any.reshape(-1), s.shape, "labels")
    if y.all() or not y.any():
        raise ValueError("roc_auc needs both positive and negative labels")
    return float(sklearn.metrics.roc_auc_score(y, s))
