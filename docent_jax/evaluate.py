"""Zero-shot entity ranking: rank all entities for each query by cosine, score the ranking.

DocEnt's zero-shot task (Zemlyanskiy et al. 2021, sec. 3.3): a pre-trained, not fine-tuned
model ranks a fixed set of entities for a natural-language query by ``cos(g(e), f(q))``.
Metrics (``embedding_core.metrics``; ties counted against the model everywhere):

* MAP: mean average precision over the query's relevant entities;
* MRR: mean of 1 / (rank of the best-ranked relevant entity);
* recall@k: share of a query's relevant entities ranked in the top k, averaged over queries
  (with one relevant entity per query: the hit rate / top-k accuracy);
* NDCG@k with binary gains (Jarvelin & Kekalainen 2002).

With a single relevant entity per query (the SQuAD task) MAP equals MRR.
Queries are scored in blocks, so the ``[n_queries, n_entities]`` matrix is never whole.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from embedding_core import metrics

RECALL_KS = (1, 5, 10)
NDCG_K = 10
METRIC_NAMES = ("MAP", "MRR", *(f"recall@{k}" for k in RECALL_KS), f"NDCG@{NDCG_K}")


def _relevance(relevant: Sequence[Sequence[int]], num_entities: int) -> np.ndarray:
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


def ranking_metrics(scores: np.ndarray, relevant: Sequence[Sequence[int]],
                    ks: Sequence[int] = RECALL_KS, ndcg_k: int = NDCG_K) -> dict[str, float]:
    """Ranking metrics of one score matrix.

    Args:
      scores: ``[n_queries, n_entities]`` float, higher = more relevant.
      relevant: per query, the indices of its relevant entities (at least one).
      ks: recall cut-offs. ndcg_k: NDCG cut-off.

    Returns:
      ``{"MAP", "MRR", "recall@k"..., "NDCG@k", "num_queries"}``, floats in [0, 1] (and the
      count).

    Raises:
      ValueError: a query without relevant entity, an index out of range, a shape mismatch,
        NaN scores.
    """
    scores = np.asarray(scores)
    if scores.ndim != 2 or scores.shape[0] != len(relevant):
        raise ValueError(f"scores must be [{len(relevant)}, n_entities], got {scores.shape}")
    rel = _relevance(relevant, scores.shape[1])
    pair_query, pair_item = np.nonzero(rel)
    # Each relevant entity's rank, with ties (other relevant entities included) ahead of it.
    ranks = metrics.ranks_of_targets(scores[pair_query], pair_item)
    n = len(relevant)
    best = np.full(n, np.iinfo(np.int64).max)
    np.minimum.at(best, pair_query, ranks)
    per_query = np.bincount(pair_query, minlength=n)
    out = {"MAP": metrics.mean_average_precision(scores, rel), "MRR": metrics.mrr(best)}
    for k in ks:
        hits = np.bincount(pair_query, weights=(ranks <= k).astype(np.float64), minlength=n)
        out[f"recall@{k}"] = float(np.mean(hits / per_query))
    out[f"NDCG@{ndcg_k}"] = metrics.ndcg_at_k(scores, rel, ndcg_k)
    out["num_queries"] = float(n)
    return out


def evaluate_scores(score_block: Callable[[int, int], np.ndarray],
                    relevant: Sequence[Sequence[int]], *, block_size: int = 1024,
                    ks: Sequence[int] = RECALL_KS, ndcg_k: int = NDCG_K) -> dict[str, float]:
    """:func:`ranking_metrics` over query blocks (every metric is a mean over queries).

    Args:
      score_block: ``(start, stop) -> [stop - start, n_entities]`` scores of those queries.
      relevant: per query, its relevant entity indices.
      block_size: queries per block.

    Returns:
      As :func:`ranking_metrics`, over all queries.
    """
    if not relevant:
        raise ValueError("no queries to evaluate")
    total: dict[str, float] = {}
    for start in range(0, len(relevant), block_size):
        stop = min(start + block_size, len(relevant))
        part = ranking_metrics(score_block(start, stop), relevant[start:stop], ks, ndcg_k)
        weight = (stop - start) / len(relevant)
        for key, value in part.items():
            if key != "num_queries":
                total[key] = total.get(key, 0.0) + weight * value
    total["num_queries"] = float(len(relevant))
    return total


def evaluate_embeddings(query_vectors: np.ndarray, entity_vectors: np.ndarray,
                        relevant: Sequence[Sequence[int]], **kwargs) -> dict[str, float]:
    """Ranking by cosine between ``[n_q, d]`` query and ``[n_e, d]`` entity vectors."""
    from docent_jax.inference import cosine_scores

    if len(query_vectors) != len(relevant):
        raise ValueError(f"{len(query_vectors)} query vectors for {len(relevant)} queries")
    return evaluate_scores(lambda a, b: cosine_scores(query_vectors[a:b], entity_vectors),
                           relevant, **kwargs)


def evaluate_ranker(ranker, queries: Sequence[tuple[str, Sequence[int]]],
                    progress: bool = False) -> dict[str, float]:
    """Held-out ranking metrics of a trained DocEnt-Dual (``inference.EntityRanker``)."""
    texts = [q for q, _ in queries]
    q = ranker.encode_queries(texts, progress="encode queries" if progress else False)
    return evaluate_embeddings(q, ranker.entity_embeddings(), [r for _, r in queries])


def format_table(rows: dict[str, dict[str, float]]) -> str:
    """A fixed-width table, metrics in percent, one row per model."""
    width = max(len(name) for name in rows) + 2
    header = "model".ljust(width) + "".join(f"{m:>11}" for m in METRIC_NAMES)
    lines = [header, "-" * len(header)]
    for name, values in rows.items():
        lines.append(name.ljust(width) + "".join(f"{100 * values[m]:>11.2f}"
                                                 for m in METRIC_NAMES))
    return "\n".join(lines)
