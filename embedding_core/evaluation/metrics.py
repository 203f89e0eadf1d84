"""Embedding metrics: tuned-threshold accuracy, recall@k, MRR, MAP, NDCG@k, P@k, LRAP,
ROC-AUC. Numpy in, Python floats out; NaN scores raise ``ValueError``. Ties never favour
the model (``docs/pitfalls.md``, "Off-by-one recall@k")."""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import sklearn.metrics

DEFAULT_RECALL_KS: tuple[int, ...] = (1, 2, 3, 5, 10, 20, 50)


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
    # Score descending, ties by tie_key ascending; never -scores (unsigned ints would wrap).
    inverted = ~tie_key if tie_key.dtype == np.bool_ else -tie_key.astype(np.float64)
    return np.lexsort((inverted, scores), axis=-1)[..., ::-1]


def accuracy_at_threshold(scores, labels, threshold: float) -> float:
    """Accuracy of ``score > threshold``, ``[n]`` scores and bool (or 0/1) labels.
    Raises: ValueError: empty input, NaN scores, shape mismatch or non-binary labels."""
    s = _scores(scores, 1)
    y = _binary(labels, s.shape, "labels")
    if s.size == 0:
        raise ValueError("accuracy_at_threshold needs at least one example")
    return float(np.mean((s > threshold) == y))


def best_threshold_accuracy(scores, labels) -> tuple[float, float]:
    """``(threshold, accuracy)`` maximising :func:`accuracy_at_threshold` over ``-inf``,
    the midpoints of consecutive distinct scores and ``+inf``; the smallest best wins.
    Raises: ValueError: empty input, NaN scores, shape mismatch or non-binary labels."""
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


def ranks_of_targets(scores, targets) -> np.ndarray:
    """``rank_i = 1 + #{j != t_i : scores[i, j] >= scores[i, t_i]}``, ``[n_queries]`` int64,
    from ``[n_queries, n_items]`` scores and ``[n_queries]`` int targets.
    Raises: ValueError: NaN scores, wrong shapes, non-integer or out-of-range targets."""
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
    """``{k: #{i : rank_i <= k} / n_queries}`` from ``[n_queries]`` int 1-based ranks.
    Raises: ValueError: empty or non-positive ranks, bad ``k``."""
    r = _ranks(ranks)
    return {_positive_int(k): float(np.mean(r <= k)) for k in ks}


def recall_at_k(scores, targets, ks: Iterable[int] = DEFAULT_RECALL_KS) -> dict[int, float]:
    """:func:`recall_at_k_from_ranks` of :func:`ranks_of_targets` (ks of ConvRR/FCRR)."""
    return recall_at_k_from_ranks(ranks_of_targets(scores, targets), ks)


def mrr(ranks) -> float:
    """``mean_i 1 / rank_i`` of ``[n_queries]`` int 1-based ranks. Raises ValueError."""
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

_MAX_COMPARISONS = 1 << 22  # held at once by ranks_of_relevant (a few tens of MB)


def ranks_of_relevant(scores, relevant) -> tuple[np.ndarray, np.ndarray]:
    """``rank_j = j + 1 + #{non-relevant i : score_i >= score_j}`` of a query's ``j``-th
    relevant item (0-based, by descending score): ``(query, rank)``, ``[n_pairs]`` int64
    each, sorted by query then rank, from ``[n_queries, n_items]`` scores and relevance.
    Raises: ValueError: NaN scores, wrong shapes or non-binary relevance."""
    s = _scores(scores, 2)
    rel = _binary(relevant, s.shape, "relevant")
    query, item = np.nonzero(rel)
    pair_scores = s[query, item]
    # Non-relevant items scoring >= each relevant one, in chunks of pairs.
    ahead = np.empty(query.size, dtype=np.int64)
    step = max(1, _MAX_COMPARISONS // max(1, s.shape[1]))
    for start in range(0, query.size, step):
        q = query[start : start + step]
        at_least = s[q] >= pair_scores[start : start + step, None]
        ahead[start : start + step] = np.count_nonzero(at_least & ~rel[q], axis=1)
    # j = the query's relevant items placed before this one, counted from the end of each
    # query's ascending run (no negated scores); tied items share ``ahead``.
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
    hits = np.cumsum(sorted_relevant, axis=-1)
    precision = hits / np.arange(1, sorted_relevant.shape[-1] + 1)
    return np.sum(precision * sorted_relevant, axis=-1) / hits[..., -1]


def average_precision(scores, relevant) -> float:
    """``AP = (1 / R) sum_{r: rank r relevant} precision@r`` of ``[n_items]`` scores and
    relevance (Manning et al., IIR sec. 8.4).
    Raises: ValueError: NaN scores, shape mismatch, or no relevant item."""
    s = _scores(scores, 1)
    rel = _binary(relevant, s.shape, "relevant")
    if not rel.any():
        raise ValueError("average_precision needs at least one relevant item")
    return float(_ap_rows(_relevance_in_rank_order(s, rel)))


def mean_average_precision(scores, relevant) -> float:
    """Mean :func:`average_precision` over the rows with a relevant item.
    Raises: ValueError: NaN scores, shape mismatch, or no query with a relevant item."""
    s, rel = _queries_with_relevant(scores, relevant, "mean_average_precision")
    return float(np.mean(_ap_rows(_relevance_in_rank_order(s, rel))))


def ndcg_at_k(scores, gains, k: int) -> float:
    """Mean ``DCG@k / IDCG@k``, ``DCG@k = sum_{r<=k} gain_(r) / log2(r + 1)`` (Jarvelin &
    Kekalainen 2002) over queries with a positive IDCG; ``[n_queries, n_items]`` gains >= 0.
    Raises: ValueError: NaN, negative gains, shape mismatch, bad ``k``, no positive gain."""
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
    """Mean ``#{relevant in the top k} / k`` over the queries with at least
    ``min_positives`` (default ``k``; ``docs/docent.md``) relevant items.
    Raises: ValueError: NaN scores, shape mismatch, bad ``k``, or no query qualifies."""
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
    """sklearn's LRAP (DocEnt's tag "MAP") over the queries with a relevant item.
    Raises: ValueError: NaN scores, shape mismatch, or no query with a relevant item."""
    s, rel = _queries_with_relevant(scores, relevant, "label_ranking_average_precision")
    return float(sklearn.metrics.label_ranking_average_precision_score(rel, s))


def roc_auc(scores, labels) -> float:
    """``sklearn.metrics.roc_auc_score`` over all entries of ``scores`` and ``labels``.
    Raises: ValueError: NaN scores, shape mismatch, or only one class present."""
    s_any, y_any = np.asarray(scores), np.asarray(labels)
    if s_any.shape != y_any.shape:
        raise ValueError(f"labels must have shape {s_any.shape} (as the scores), got {y_any.shape}")
    s = _scores(s_any.reshape(-1), 1)
    y = _binary(y_any.reshape(-1), s.shape, "labels")
    if y.all() or not y.any():
        raise ValueError("roc_auc needs both positive and negative labels")
    return float(sklearn.metrics.roc_auc_score(y, s))


def _binary_rows(scores, labels, caller: str) -> tuple[np.ndarray, np.ndarray]:
    s = _scores(scores, np.ndim(scores))  # ints stay ints: 2**60 and 2**60 + 1 differ
    y = _binary(labels, s.shape, "labels")
    if s.ndim < 1 or s.shape[-1] == 0:
        raise ValueError(f"{caller} needs [..., n_items] scores with n_items >= 1")
    positives = y.sum(axis=-1)
    if (positives == 0).any() or (positives == y.shape[-1]).any():
        raise ValueError(f"{caller} needs both positive and negative labels in every row")
    return s, y


def _sorted_weights(scores, labels, sample_weight, caller: str, descending: bool):
    """Positive and negative weights in score order, each item's tie group (start, end)."""
    s, y = _binary_rows(scores, labels, caller)
    if sample_weight is None:
        w = np.ones(s.shape)
    else:
        w = np.asarray(sample_weight, dtype=np.float64)
        if w.ndim < 1 or w.shape[-1] != s.shape[-1]:
            raise ValueError(f"{caller}: sample_weight must end in {s.shape[-1]} items, got "
                             f"shape {w.shape}")
        if not np.isfinite(w).all() or (w < 0).any():
            raise ValueError(f"{caller}: sample_weight must be finite and >= 0")
    shape = np.broadcast_shapes(s.shape, w.shape)
    order = np.argsort(s, axis=-1, kind="stable")
    if descending:  # not argsort(-s): unsigned scores would wrap
        order = order[..., ::-1]
    ss = np.take_along_axis(s, order, axis=-1)
    n, position = s.shape[-1], np.arange(s.shape[-1])
    first = np.ones(ss.shape, bool)
    first[..., 1:] = ss[..., 1:] != ss[..., :-1]
    last = np.ones(ss.shape, bool)
    last[..., :-1] = first[..., 1:]
    start = np.maximum.accumulate(np.where(first, position, 0), axis=-1)
    end = np.minimum.accumulate(np.where(last, position, n)[..., ::-1], axis=-1)[..., ::-1]
    if s.ndim == 1:  # one order for every weight row: plain indexing, no broadcast copies
        ws = _take(np.broadcast_to(w, shape), order)
    else:
        order, start, end, y = (np.broadcast_to(x, shape) for x in (order, start, end, y))
        ws = np.take_along_axis(np.broadcast_to(w, shape), order, axis=-1)
    wp = ws * _take(y, order)
    wn = ws - wp
    if (wp.sum(axis=-1) <= 0).any() or (wn.sum(axis=-1) <= 0).any():
        raise ValueError(f"{caller} needs positive and negative weight in every row")
    return wp, wn, start, end


def _take(x: np.ndarray, index: np.ndarray) -> np.ndarray:
    # C order: a row sums in the same order alone as in a batch (chunk-independent).
    if index.ndim == 1:
        return np.ascontiguousarray(x[..., index])
    return np.take_along_axis(x, index, axis=-1)


def roc_auc_rows(scores, labels, sample_weight=None) -> np.ndarray:
    """Row-wise ``roc_auc_score`` of ``[..., n]`` scores, ``sum_i w_i+ (N_below(i) +
    N_tied(i) / 2) / (P N)``; ``sample_weight`` ``[..., n]`` broadcasts (the bootstrap's
    resample counts). Returns float64 of the leading shape.
    Raises: ValueError: NaN scores, shape mismatch, negative weights, a one-class row."""
    wp, wn, start, end = _sorted_weights(scores, labels, sample_weight, "roc_auc_rows", False)
    # Each class's weights as fractions of its total: no overflow or underflow in P * N.
    wp, wn = wp / wp.sum(axis=-1, keepdims=True), wn / wn.sum(axis=-1, keepdims=True)
    below = np.cumsum(wn, axis=-1)
    up_to = _take(below, end)
    before = _take(below, start) - _take(wn, start)
    return np.sum(wp * (before + up_to) / 2, axis=-1)


def average_precision_rows(scores, labels, sample_weight=None) -> np.ndarray:
    """Row-wise ``average_precision_score``, ``sum_t (R_t - R_{t-1}) P_t`` over descending
    distinct thresholds; ``sample_weight`` as in :func:`roc_auc_rows`.
    Raises: ValueError: NaN scores, shape mismatch, negative weights, a one-class row."""
    wp, wn, _, end = _sorted_weights(scores, labels, sample_weight, "average_precision_rows",
                                     True)
    # Each item takes the precision at the end of its tie group (the threshold it enters at).
    tp = _take(np.cumsum(wp, axis=-1), end)
    seen = tp + _take(np.cumsum(wn, axis=-1), end)
    precision = np.divide(tp, seen, out=np.zeros_like(tp), where=seen > 0)
    return np.sum(wp * precision, axis=-1) / wp.sum(axis=-1)
