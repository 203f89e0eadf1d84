"""DocEnt's zero-shot entity ranking protocol and metrics (``docs/docent.md``).

**Zero-shot entity ranking** (Zemlyanskiy et al. 2021, sec. 3.3): a pre-trained, not
fine-tuned model ranks a fixed set of entities for a natural-language query by
``cos(g(e), f(q))``. Metrics, all from one rank per relevant entity
(``embedding_core.metrics.ranks_of_relevant``: at equal score a relevant entity ranks behind
every non-relevant one, relevant entities tied with each other are not counted against each
other; trec_eval's values for tie-free scores):

* MAP: mean average precision over the query's relevant entities;
* MRR: mean of 1 / (rank of the best-ranked relevant entity);
* recall@k: share of a query's relevant entities ranked in the top k, averaged over queries
  (with one relevant entity per query: the hit rate / top-k accuracy);
* NDCG@k with binary gains (Jarvelin & Kekalainen 2002).

With a single relevant entity per query (the SQuAD task) MAP equals MRR. Queries are scored
in blocks, so the ``[n_queries, n_entities]`` matrix is never whole. ``per_query=True`` also
returns each metric per query, for paired significance tests between two systems
(``embedding_core.stats.paired_bootstrap``).

MovieLens tag prediction lives in ``docent_jax.tag_eval``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Literal, overload

import numpy as np

from embedding_core import metrics, multihost
from embedding_core.inference import l2_normalize

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
    """Every metric per query from ``metrics.ranks_of_relevant``-style ``(query, rank)``
    pairs (sorted by query, then rank; every query of ``range(n)`` has one)."""
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


@overload
def ranking_metrics(scores: np.ndarray, relevant: Sequence[Sequence[int]],
                    ks: Sequence[int] = ..., ndcg_k: int = ...,
                    per_query: Literal[False] = ...) -> Summary: ...
@overload
def ranking_metrics(scores: np.ndarray, relevant: Sequence[Sequence[int]],
                    ks: Sequence[int] = ..., ndcg_k: int = ..., *,
                    per_query: Literal[True]) -> tuple[Summary, PerQuery]: ...


def ranking_metrics(scores: np.ndarray, relevant: Sequence[Sequence[int]],
                    ks: Sequence[int] = RECALL_KS, ndcg_k: int = NDCG_K,
                    per_query: bool = False) -> Summary | tuple[Summary, PerQuery]:
    """Ranking metrics of one score matrix (see the module docstring for the definitions).

    Ties follow ``embedding_core.metrics.ranks_of_relevant`` for *every* metric: at equal
    score a relevant entity ranks behind every non-relevant one, while relevant entities tied
    with each other take consecutive ranks (not counted against each other). E.g. scores
    ``[1, 1, 0]`` with entities 0 and 1 relevant give MRR 1, recall@1 0.5, recall@2 1 and
    MAP 1 (trec_eval's values for any order of the tie); ``[1, 1, 0]`` with only entity 1
    relevant gives MRR 0.5.

    Args:
      scores: ``[n_queries, n_entities]`` float, higher = more relevant.
      relevant: per query, the indices of its relevant entities (at least one).
      ks: recall cut-offs, positive ints (above ``n_entities`` they give 1.0).
      ndcg_k: NDCG cut-off, a positive int (above ``n_entities``: the whole list).
      per_query: also return every metric per query.

    Returns:
      ``{"MAP", "MRR", "recall@k"..., "NDCG@k", "num_queries"}``: the means over queries,
      floats in [0, 1] (and the count). With ``per_query=True``, ``(that dict, {metric:
      [n_queries] float64})`` whose arrays average to the summary's values.

    Raises:
      ValueError: a query without relevant entity, an index out of range, a shape mismatch,
        NaN scores, a non-positive cut-off.
    """
    values = _per_query_metrics(scores, relevant, ks, ndcg_k)
    summary = _summary(values, len(relevant))
    return (summary, values) if per_query else summary


@overload
def evaluate_scores(score_block: Callable[[int, int], np.ndarray],
                    relevant: Sequence[Sequence[int]], *, block_size: int = ...,
                    ks: Sequence[int] = ..., ndcg_k: int = ...,
                    per_query: Literal[False] = ..., split: bool = ...) -> Summary: ...
@overload
def evaluate_scores(score_block: Callable[[int, int], np.ndarray],
                    relevant: Sequence[Sequence[int]], *, block_size: int = ...,
                    ks: Sequence[int] = ..., ndcg_k: int = ...,
                    per_query: Literal[True], split: bool = ...) -> tuple[Summary, PerQuery]: ...


def evaluate_scores(score_block: Callable[[int, int], np.ndarray],
                    relevant: Sequence[Sequence[int]], *, block_size: int = 1024,
                    ks: Sequence[int] = RECALL_KS, ndcg_k: int = NDCG_K,
                    per_query: bool = False,
                    split: bool = False) -> Summary | tuple[Summary, PerQuery]:
    """:func:`ranking_metrics` over query blocks, so the full score matrix is never whole.

    Args:
      score_block: ``(start, stop) -> [stop - start, n_entities]`` scores of those queries.
      relevant: per query, its relevant entity indices.
      block_size: queries per block.
      ks, ndcg_k: cut-offs, as in :func:`ranking_metrics`.
      per_query: also return ``{metric: [n_queries] float64}`` (e.g. for
        ``embedding_core.stats.paired_bootstrap`` between two systems).
      split: with several processes, each scores its slice of the queries and the
        per-query values are gathered (``embedding_core.multihost.split_map``); a
        collective, and ``score_block`` must compute on this process alone (process-local
        params). Every process returns the same result.

    Returns:
      As :func:`ranking_metrics`, over all queries. The summary is the mean of the
      per-query values (kept for every query: a few floats each), so it does not depend
      on ``block_size``.
    """
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
    """:func:`evaluate_scores` from the ranks of the relevant entities alone.

    For rankers that compute the ranks where the scores lie (``inference.EntityRanker.
    relevant_ranks``: per-shard counts on the devices holding the table), so no
    ``[queries, entities]`` score matrix reaches the host. Same metrics, same ties.

    Args:
      rank_block: ``(start, stop) -> (query, rank)`` of those queries, as
        ``embedding_core.metrics.ranks_of_relevant`` returns them (query indices relative
        to ``start``).
      relevant: per query, its relevant entity indices (checked here).
      num_items: entities ranked (ranks lie in ``[1, num_items]``).
      block_size, ks, ndcg_k, per_query, split: as in :func:`evaluate_scores`.

    Raises:
      ValueError: no queries, a query without relevant entity or one out of range, a bad
        cut-off or block size.
    """
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


def cosine_scores(queries: np.ndarray, entities: np.ndarray) -> np.ndarray:
    """``[n_q, n_e]`` float32 cosine similarities (zero vectors score 0)."""
    return (l2_normalize(queries) @ l2_normalize(entities).T).astype(np.float32)


def evaluate_embeddings(query_vectors: np.ndarray, entity_vectors: np.ndarray,
                        relevant: Sequence[Sequence[int]],
                        **kwargs) -> Summary | tuple[Summary, PerQuery]:
    """Ranking by cosine between ``[n_q, d]`` query and ``[n_e, d]`` entity vectors.

    ``kwargs`` go to :func:`evaluate_scores` (``block_size``, ``ks``, ``ndcg_k``,
    ``per_query``); its return value is returned.
    """
    if len(query_vectors) != len(relevant):
        raise ValueError(f"{len(query_vectors)} query vectors for {len(relevant)} queries")
    kwargs.setdefault("split", True)  # numpy on this process: each may take a slice
    return evaluate_scores(lambda a, b: cosine_scores(query_vectors[a:b], entity_vectors),
                           relevant, **kwargs)


def evaluate_ranker(ranker, queries: Sequence[tuple[str, Sequence[int]]],
                    progress: bool = False, **kwargs) -> dict[str, float]:
    """Held-out ranking metrics of a trained DocEnt model of any variant
    (``inference.EntityRanker``), scored by ``a cos(f(q), g(e))`` (Dual, Hybrid) or the
    entity logits of ``[CLS] [MASK] [SEP] q`` (Full). The ranks of each query block's
    relevant entities are computed on the devices holding the table
    (``ranker.relevant_ranks``, shard by shard when it is split over ``"model"``): the
    metrics of :func:`evaluate_scores` on ``ranker.score``, without the score matrix on
    the host. ``kwargs`` go to :func:`evaluate_ranks`. With several processes and a loaded
    ranker (process-local params) each process ranks its slice of the queries."""
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
        lines.append(name.ljust(width) + "".join(f"{100 * values[m]:>11.2f}"
                                                 for m in METRIC_NAMES))
    return "\n".join(lines)
