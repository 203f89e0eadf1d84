"""DocEnt's zero-shot entity ranking (sec. 3.3; ``docs/docent.md``): MAP, MRR, recall@k, NDCG@k
from one rank per relevant entity (``metrics.ranks_of_relevant``)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from embedding_core import l2_normalize, metrics, multihost

RECALL_KS = (1, 5, 10)
NDCG_K = 10
METRIC_NAMES = ("MAP", "MRR", *(f"recall@{k}" for k in RECALL_KS), f"NDCG@{NDCG_K}")

Summary = dict[str, float]
"""Metric name -> mean over queries, plus ``"num_queries"``."""
PerQuery = dict[str, np.ndarray]
"""Metric name -> ``[n_queries]`` float64 values, in query order."""


def _relevance(relevant: Sequence[Sequence[int]], num_entities: int) -> np.ndarray:
    """``[n_queries, num_entities]`` bool relevance from per-query index lists."""
    rel = np.zeros((len(relevant), num_entities), dtype=bool)
    for i, items in enumerate(relevant):
        items = list(items)
        if not items:
            raise ValueError(f"query {i} has no relevant entity")
        for e in items:
            if not 0 <= int(e) < num_entities:
                raise ValueError(f"query {i}: relevant entity {e} not in [0, {num_entities})")
        rel[i, items] = True
    return rel


def _cutoff(k, name: str) -> int:
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
        raise ValueError(f"{name} must be positive integers, got {k!r}")
    return int(k)


def _per_query_metrics(scores, relevant: Sequence[Sequence[int]], ks: Sequence[int],
                       ndcg_k: int) -> PerQuery:
    """Every metric per query, all from one rank computation (``metrics.ranks_of_relevant``)."""
    ks = [_cutoff(k, "ks") for k in ks]
    ndcg_k = _cutoff(ndcg_k, "ndcg_k")
    scores = np.asarray(scores)
    if scores.ndim != 2 or scores.shape[0] != len(relevant):
        raise ValueError(f"scores must be [{len(relevant)}, n_entities], got {scores.shape}")
    rel = _relevance(relevant, scores.shape[1])
    query, rank = metrics.ranks_of_relevant(scores, rel)
    return _metrics_from_ranks(query, rank, rel.shape[0], scores.shape[1], ks, ndcg_k)


def _metrics_from_ranks(query: np.ndarray, rank: np.ndarray, n: int, num_items: int,
                        ks: Sequence[int], ndcg_k: int) -> PerQuery:
    """Every metric per query from ``(query, rank)`` pairs sorted by query then rank."""
    # Pairs come sorted by query, then rank: a query's j-th pair is its j-th relevant entity.
    count = np.bincount(query, minlength=n)  # >= 1: callers reject empty queries
    first = np.cumsum(count) - count
    j = np.arange(query.size) - first[query]

    def per_query_mean(values: np.ndarray) -> np.ndarray:
        return np.bincount(query, weights=values, minlength=n) / count

    out: PerQuery = {
        # AP = mean over relevant entities of precision at their rank, (j + 1) / rank_j.
        "MAP": per_query_mean((j + 1) / rank),
        "MRR": 1.0 / rank[first],
    }
    for k in ks:
        out[f"recall@{k}"] = per_query_mean((rank <= k).astype(np.float64))
    # Binary-gain NDCG@k; the ideal list puts the query's min(count, k) relevant entities on
    # top. A cut-off beyond the list length uses the whole list (as metrics.ndcg_at_k).
    k = min(ndcg_k, num_items)
    discount = 1.0 / np.log2(np.arange(2, k + 2))
    ideal = np.cumsum(discount)[np.minimum(count, k) - 1]
    gained = np.where(rank <= k, 1.0 / np.log2(rank + 1.0), 0.0)
    out[f"NDCG@{ndcg_k}"] = np.bincount(query, weights=gained, minlength=n) / ideal
    return out


def _summary(per_query: PerQuery, num_queries: int) -> Summary:
    out = {name: float(np.mean(values)) for name, values in per_query.items()}
    out["num_queries"] = float(num_queries)
    return out


def ranking_metrics(scores: np.ndarray, relevant: Sequence[Sequence[int]],
                    ks: Sequence[int] = RECALL_KS, ndcg_k: int = NDCG_K,
                    per_query: bool = False) -> Summary | tuple[Summary, PerQuery]:
    """MAP, MRR, recall@k, NDCG@k, ``num_queries`` of ``[n_queries, n_entities]`` scores
    (``per_query``: also per query); ValueError: a bad relevant list, shapes, NaN, a cut-off < 1."""
    values = _per_query_metrics(scores, relevant, ks, ndcg_k)
    summary = _summary(values, len(relevant))
    return (summary, values) if per_query else summary


def evaluate_scores(score_block: Callable[[int, int], np.ndarray],
                    relevant: Sequence[Sequence[int]], *, block_size: int = 1024,
                    ks: Sequence[int] = RECALL_KS, ndcg_k: int = NDCG_K,
                    per_query: bool = False,
                    split: bool = False) -> Summary | tuple[Summary, PerQuery]:
    """:func:`ranking_metrics` over query blocks (``split``: a slice each, a collective)."""
    if not relevant:
        raise ValueError("no queries to evaluate")
    if isinstance(block_size, bool) or int(block_size) != block_size or block_size < 1:
        raise ValueError(f"block_size must be a positive integer, got {block_size!r}")

    def rows(first: int, last: int) -> PerQuery:
        parts: list[PerQuery] = []
        for start in range(first, last, block_size):
            stop = min(start + block_size, last)
            parts.append(_per_query_metrics(score_block(start, stop), relevant[start:stop],
                                            ks, ndcg_k))
        return {name: np.concatenate([p[name] for p in parts]) for name in parts[0]}

    values = multihost.split_map(rows, len(relevant), what="ranking") if split else \
        rows(0, len(relevant))
    summary = _summary(values, len(relevant))
    return (summary, values) if per_query else summary


def evaluate_ranks(rank_block: Callable[[int, int], tuple[np.ndarray, np.ndarray]],
                   relevant: Sequence[Sequence[int]], num_items: int, *,
                   block_size: int = 1024, ks: Sequence[int] = RECALL_KS,
                   ndcg_k: int = NDCG_K, per_query: bool = False,
                   split: bool = False) -> Summary | tuple[Summary, PerQuery]:
    """:func:`evaluate_scores` from ranks alone (``rank_block(start, stop) -> (query, rank)``, no
    score matrix); ValueError as :func:`ranking_metrics`, or no queries, a bad block size."""
    if not relevant:
        raise ValueError("no queries to evaluate")
    if isinstance(block_size, bool) or int(block_size) != block_size or block_size < 1:
        raise ValueError(f"block_size must be a positive integer, got {block_size!r}")
    ks = [_cutoff(k, "ks") for k in ks]
    ndcg_k = _cutoff(ndcg_k, "ndcg_k")
    for i, items in enumerate(relevant):
        if not list(items):
            raise ValueError(f"query {i} has no relevant entity")
        for e in items:
            if not 0 <= int(e) < num_items:
                raise ValueError(f"query {i}: relevant entity {e} not in [0, {num_items})")

    def rows(first: int, last: int) -> PerQuery:
        parts: list[PerQuery] = []
        for start in range(first, last, block_size):
            stop = min(start + block_size, last)
            query, rank = rank_block(start, stop)
            parts.append(_metrics_from_ranks(np.asarray(query), np.asarray(rank),
                                             stop - start, num_items, ks, ndcg_k))
        return {name: np.concatenate([p[name] for p in parts]) for name in parts[0]}

    values = multihost.split_map(rows, len(relevant), what="ranking") if split else \
        rows(0, len(relevant))
    summary = _summary(values, len(relevant))
    return (summary, values) if per_query else summary


def eval_subset(queries: Sequence, limit: int) -> list:
    """Items ``floor(i * n / limit)`` of ``queries`` (all when ``limit`` is 0 or larger)."""
    n = len(queries)
    return list(queries) if limit <= 0 or limit >= n else [queries[i * n // limit]
                                                           for i in range(limit)]


def cosine_scores(queries: np.ndarray, entities: np.ndarray) -> np.ndarray:
    """``[n_q, n_e]`` float32 cosine similarities (zero vectors score 0)."""
    return (l2_normalize(queries) @ l2_normalize(entities).T).astype(np.float32)


def evaluate_embeddings(query_vectors: np.ndarray, entity_vectors: np.ndarray,
                        relevant: Sequence[Sequence[int]],
                        **kwargs) -> Summary | tuple[Summary, PerQuery]:
    """Ranking by cosine of ``[n_q, d]`` queries and ``[n_e, d]`` entities."""
    if len(query_vectors) != len(relevant):
        raise ValueError(f"{len(query_vectors)} query vectors for {len(relevant)} queries")
    kwargs.setdefault("split", True)  # numpy on this process: each may take a slice
    return evaluate_scores(lambda a, b: cosine_scores(query_vectors[a:b], entity_vectors),
                           relevant, **kwargs)


def evaluate_ranker(ranker, queries: Sequence[tuple[str, Sequence[int]]],
                    progress: bool = False, **kwargs) -> dict[str, float]:
    """Ranking metrics of an ``EntityRanker``, ranked where the table lies."""
    texts = [q for q, _ in queries]
    relevant = [r for _, r in queries]
    kwargs.setdefault("split", multihost.is_local(ranker.params))
    return evaluate_ranks(
        lambda a, b: ranker.relevant_ranks(texts[a:b], relevant[a:b],
                                           show_progress_bar=progress and a == 0),
        relevant, ranker.num_entities, **kwargs)


def format_table(rows: dict[str, dict[str, float]]) -> str:
    """A fixed-width table, metrics in percent, one row per model."""
    width = max(len(name) for name in rows) + 2
    header = "model".ljust(width) + "".join(f"{m:>11}" for m in METRIC_NAMES)
    lines = [header, "-" * len(header)]
    for name, values in rows.items():
        lines.append(name.ljust(width) + "".join(f"{100 * values[m]:>11.2f}" for m in METRIC_NAMES))
    return "\n".join(lines)
