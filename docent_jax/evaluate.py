"""DocEnt's evaluation protocols (``docs/docent.md``): zero-shot entity ranking and
MovieLens tag prediction.

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

**MovieLens tag prediction** (sec. 5; the authors' notebooks, github urikz/docent,
``docent/tag/closed/MoviesHoldoutEval.ipynb``, ``eval_model``):

* a score matrix movie x tag (the 1,128 Tag Genome tags) and the ground-truth count of each
  cell = number of users who applied the tag (``data_pipelines.movielens.tag_count_matrix``);
* label = ``count > threshold`` (1 for the plain evaluation, 2 with human cross-validation);
* over the movies with at least one positive label: Precision@K for K = 1..20 averaged over
  the movies with at least K positives; NDCG@K with gain = raw count and with gain =
  ``log(1 + count)`` (natural log, as the notebook's ``np.log(gain + 1)``), discount
  ``log2(rank + 1)``, gains of *every* tag (also those with a count at or below the threshold);
  MAP = label-ranking average precision (``sklearn.metrics.label_ranking_average_precision_
  score``);
* AUC = ROC-AUC over the flattened matrix of *all* movies.

Ties follow ``embedding_core.metrics``: pessimistic (a relevant tag tied with a non-relevant
one ranks after it). The notebook sorted with ``np.argsort(-scores)``, whose order among ties
is numpy's; for tie-free model scores the two agree, for integer-valued predictors such as
the human baseline ours is the lower bound. Where the notebook divides by ``0 + 1e-8`` (no
movie with K positives) we return NaN.

Tag fine-tuning (closed vocabulary: held-out movies; open vocabulary: held-out tags) takes
frozen embeddings or an encoder function as arguments, so it works with any model or
baseline.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Literal, overload

import jax
import jax.numpy as jnp
import numpy as np
import optax

from data_pipelines.movielens import HumanCVFold
from embedding_core import metrics
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
    n = rel.shape[0]
    # Pairs come sorted by query, then rank: a query's j-th pair is its j-th relevant entity.
    query, rank = metrics.ranks_of_relevant(scores, rel)
    count = np.bincount(query, minlength=n)  # >= 1: _relevance rejects empty queries
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
    k = min(ndcg_k, scores.shape[1])
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
                    per_query: Literal[False] = ...) -> Summary: ...
@overload
def evaluate_scores(score_block: Callable[[int, int], np.ndarray],
                    relevant: Sequence[Sequence[int]], *, block_size: int = ...,
                    ks: Sequence[int] = ..., ndcg_k: int = ...,
                    per_query: Literal[True]) -> tuple[Summary, PerQuery]: ...


def evaluate_scores(score_block: Callable[[int, int], np.ndarray],
                    relevant: Sequence[Sequence[int]], *, block_size: int = 1024,
                    ks: Sequence[int] = RECALL_KS, ndcg_k: int = NDCG_K,
                    per_query: bool = False) -> Summary | tuple[Summary, PerQuery]:
    """:func:`ranking_metrics` over query blocks, so the full score matrix is never whole.

    Args:
      score_block: ``(start, stop) -> [stop - start, n_entities]`` scores of those queries.
      relevant: per query, its relevant entity indices.
      block_size: queries per block.
      ks, ndcg_k: cut-offs, as in :func:`ranking_metrics`.
      per_query: also return ``{metric: [n_queries] float64}`` (e.g. for
        ``embedding_core.stats.paired_bootstrap`` between two systems).

    Returns:
      As :func:`ranking_metrics`, over all queries. The summary is the mean of the
      per-query values (kept for every query: a few floats each), so it does not depend
      on ``block_size``.
    """
    if not relevant:
        raise ValueError("no queries to evaluate")
    if isinstance(block_size, bool) or int(block_size) != block_size or block_size < 1:
        raise ValueError(f"block_size must be a positive integer, got {block_size!r}")
    parts: list[PerQuery] = []
    for start in range(0, len(relevant), block_size):
        stop = min(start + block_size, len(relevant))
        parts.append(_per_query_metrics(score_block(start, stop), relevant[start:stop], ks,
                                        ndcg_k))
    values = {name: np.concatenate([p[name] for p in parts]) for name in parts[0]}
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
    return evaluate_scores(lambda a, b: cosine_scores(query_vectors[a:b], entity_vectors),
                           relevant, **kwargs)


def evaluate_ranker(ranker, queries: Sequence[tuple[str, Sequence[int]]],
                    progress: bool = False, **kwargs) -> dict[str, float]:
    """Held-out ranking metrics of a trained DocEnt model of any variant
    (``inference.EntityRanker``): each query block is scored by ``ranker.score`` (Dual,
    Hybrid: ``a cos(f(q), g(e))``; Full: the entity logits of ``[CLS] [MASK] [SEP] q``).
    ``kwargs`` go to :func:`evaluate_scores`."""
    texts = [q for q, _ in queries]
    return evaluate_scores(
        lambda a, b: ranker.score(texts[a:b], show_progress_bar=progress and a == 0),
        [r for _, r in queries], **kwargs)


def format_table(rows: dict[str, dict[str, float]]) -> str:
    """A fixed-width table, metrics in percent, one row per model."""
    width = max(len(name) for name in rows) + 2
    header = "model".ljust(width) + "".join(f"{m:>11}" for m in METRIC_NAMES)
    lines = [header, "-" * len(header)]
    for name, values in rows.items():
        lines.append(name.ljust(width) + "".join(f"{100 * values[m]:>11.2f}"
                                                 for m in METRIC_NAMES))
    return "\n".join(lines)


# ----------------------------------------------------------------------------- tag prediction

DEFAULT_KS: tuple[int, ...] = tuple(range(1, 21))
"""K = 1..20, the notebook's ``MAX_K = 20``."""


def _matrix(x, name: str) -> np.ndarray:
    arr = np.asarray(x)
    if arr.ndim != 2:
        raise ValueError(f"{name} must be [n_movies, n_tags], got shape {arr.shape}")
    return arr


def tag_metrics(
    scores,
    counts,
    threshold: int = 1,
    ks: Sequence[int] = DEFAULT_KS,
) -> dict[str, float]:
    """DocEnt tag-prediction metrics of one score matrix (see the module docstring).

    Args:
      scores: ``[n_movies, n_tags]`` float scores, higher = more relevant.
      counts: ``[n_movies, n_tags]`` int number of users who applied each tag (>= 0).
      threshold: a cell is positive when ``count > threshold``.
      ks: the K of Precision@K and NDCG@K.

    Returns:
      ``map``, ``auc``, ``precision@K``, ``ndcg@K`` (gain = count), ``ndcg_log@K`` (gain =
      ``log(1 + count)``), ``num_movies@K`` (movies with >= K positives),
      ``movies_with_positive`` and ``positives``. Metrics that are undefined are NaN: all of
      them when no movie has a positive, ``precision@K`` when no movie has K positives,
      ``auc`` when every cell is positive.

    Raises:
      ValueError: shapes differ, negative counts or NaN scores.
    """
    s = _matrix(scores, "scores")
    c = _matrix(counts, "counts")
    if c.shape != s.shape:
        raise ValueError(f"counts shape {c.shape} != scores shape {s.shape}")
    if (c < 0).any():
        raise ValueError("counts must be >= 0")
    labels = c > threshold
    keep = labels.any(axis=1)
    positives_per_movie = labels.sum(axis=1)
    out: dict[str, float] = {"movies_with_positive": float(keep.sum()),
                             "positives": float(labels.sum())}
    nan = float("nan")
    has_any = bool(keep.any())
    s_kept, c_kept, y_kept = s[keep], c[keep].astype(np.float64), labels[keep]
    out["map"] = metrics.label_ranking_average_precision(s_kept, y_kept) if has_any else nan
    out["auc"] = metrics.roc_auc(s, labels) if has_any and not labels.all() else nan
    for k in ks:
        k = int(k)
        n_at_k = int((positives_per_movie >= k).sum())
        out[f"num_movies@{k}"] = float(n_at_k)
        # n_at_k > 0 implies k <= n_tags.
        out[f"precision@{k}"] = metrics.precision_at_k(s_kept, y_kept, k) if n_at_k else nan
        out[f"ndcg@{k}"] = metrics.ndcg_at_k(s_kept, c_kept, k) if has_any else nan
        out[f"ndcg_log@{k}"] = metrics.ndcg_at_k(s_kept, np.log1p(c_kept), k) if has_any else nan
    return out


# ----------------------------------------------------------------------------- human baseline


def human_baseline(
    folds: Sequence[HumanCVFold],
    *,
    threshold: int = 2,
    ks: Sequence[int] = DEFAULT_KS,
    model_scores: Mapping[str, np.ndarray] | None = None,
) -> dict[str, dict]:
    """The human cross-validation: each fold's counts are the labels, the other folds'
    counts are the "human" predictor's scores (``docs/docent.md``; folds from
    ``data_pipelines.movielens.human_cv_folds``, users permuted with ``np.random.seed(31415)``,
    3 folds).

    Models are scored against the same fold labels (the notebook's ``eval_model(...,
    labels=fold counts, groundtruth_threshold=2)``), so their figures compare with the
    human's.

    Args:
      folds: the folds (``held_in`` = labels, ``others`` = human scores).
      threshold: positive when the fold's count ``> threshold`` (2 in the paper).
      ks: K of P@K / NDCG@K.
      model_scores: optional ``{name: [n_movies, n_tags] scores}`` evaluated on every fold.

    Returns:
      ``{"human": {"folds": [metrics per fold], "mean": metrics}, name: {...}}`` where
      ``mean`` is the mean over the folds on which the metric is defined (NaN if none).

    Raises:
      ValueError: no folds, or a model's scores whose shape differs from the counts'.
    """
    if not folds:
        raise ValueError("human_baseline needs at least one fold")
    predictors: dict[str, Callable[[HumanCVFold], np.ndarray]] = {"human": lambda f: f.others}
    for name, score in (model_scores or {}).items():
        score = np.asarray(score)
        if score.shape != folds[0].held_in.shape:
            raise ValueError(f"scores of {name!r} have shape {score.shape}, the counts "
                             f"{folds[0].held_in.shape}")
        predictors[name] = lambda f, score=score: score
    results: dict[str, dict] = {}
    for name, predict in predictors.items():
        per_fold = [tag_metrics(predict(f), f.held_in, threshold, ks) for f in folds]
        results[name] = {"folds": per_fold, "mean": _nanmean_dicts(per_fold)}
    return results


def _nanmean_dicts(rows: Sequence[Mapping[str, float]]) -> dict[str, float]:
    out = {}
    for key in rows[0]:
        values = np.array([r[key] for r in rows], dtype=np.float64)
        out[key] = float(np.mean(values[~np.isnan(values)])) if (~np.isnan(values)).any() \
            else float("nan")
    return out


# ----------------------------------------------------------------------------- closed vocabulary


@dataclasses.dataclass(frozen=True)
class TagHead:
    """A linear tag classifier on frozen entity embeddings: ``logits = x W + b``.

    Attributes:
      kernel: ``[dim, n_tags]`` float32. bias: ``[n_tags]`` float32.
      normalize: the inputs are L2-normalised before the linear layer.
    """

    kernel: np.ndarray
    bias: np.ndarray
    normalize: bool

    def scores(self, embeddings) -> np.ndarray:
        """``[n, dim]`` embeddings -> ``[n, n_tags]`` float32 logits."""
        x = _prepare(embeddings, self.normalize)
        return x @ self.kernel + self.bias


def _prepare(embeddings, normalize: bool) -> np.ndarray:
    x = np.asarray(embeddings, dtype=np.float32)
    if x.ndim != 2:
        raise ValueError(f"embeddings must be [n, dim], got shape {x.shape}")
    return l2_normalize(x) if normalize else x


def fit_tag_head(
    embeddings,
    labels,
    *,
    steps: int = 500,
    learning_rate: float = 1e-2,
    weight_decay: float = 1e-4,
    normalize: bool = True,
) -> TagHead:
    """Trains a logistic-regression tag head (one sigmoid per tag) with optax AdamW.

    Full-batch binary cross-entropy (``optax.sigmoid_binary_cross_entropy``) on frozen
    embeddings; weights start at zero (the problem is convex, so the result does not depend
    on a seed). The paper fine-tunes the whole model; this is the linear-probe form of its
    closed-vocabulary fine-tuning.

    Args:
      embeddings: ``[n, dim]`` float entity embeddings of the training movies.
      labels: ``[n, n_tags]`` bool (or 0/1) training labels.
      steps, learning_rate, weight_decay: optimisation; ``normalize``: L2-normalise inputs.

    Returns:
      The fitted :class:`TagHead`.
    """
    x = _prepare(embeddings, normalize)
    y = np.asarray(labels, dtype=np.float32)
    if y.ndim != 2 or y.shape[0] != x.shape[0]:
        raise ValueError(f"labels must be [{x.shape[0]}, n_tags], got shape {y.shape}")
    params = {"kernel": jnp.zeros((x.shape[1], y.shape[1]), jnp.float32),
              "bias": jnp.zeros((y.shape[1],), jnp.float32)}
    tx = optax.adamw(learning_rate, weight_decay=weight_decay)

    def loss(p, xb, yb):
        logits = jnp.dot(xb, p["kernel"], precision=jax.lax.Precision.HIGHEST) + p["bias"]
        return jnp.mean(optax.sigmoid_binary_cross_entropy(logits, yb))

    params = _fit(loss, params, tx, steps, jnp.asarray(x), jnp.asarray(y))
    return TagHead(np.asarray(params["kernel"]), np.asarray(params["bias"]), normalize)


def _fit(loss, params, tx, steps: int, *data):
    """``steps`` full-batch optimizer steps inside one jitted ``lax.fori_loop``."""

    @jax.jit
    def run(params, *data):
        def body(_, carry):
            p, state = carry
            grads = jax.grad(loss)(p, *data)
            updates, state = tx.update(grads, state, p)
            return optax.apply_updates(p, updates), state

        return jax.lax.fori_loop(0, steps, body, (params, tx.init(params)))[0]

    return run(params, *data)


def closed_vocab_eval(
    embeddings,
    counts,
    train_rows: Sequence[int],
    test_rows: Sequence[int],
    *,
    threshold: int = 1,
    train_threshold: int = 0,
    ks: Sequence[int] = DEFAULT_KS,
    **fit_options,
) -> dict:
    """Closed-vocabulary tag prediction: fit a tag head on training movies, score held-out
    movies (the paper held out 1,000 movies).

    Args:
      embeddings: ``[n_movies, dim]`` frozen entity embeddings (any model, any baseline).
      counts: ``[n_movies, n_tags]`` int user counts.
      train_rows, test_rows: disjoint row indices.
      threshold: evaluation labels ``count > threshold``.
      train_threshold: training labels ``count > train_threshold`` (default 0: every tag
        applied by some user is a training positive, the denser signal).
      fit_options: passed to :func:`fit_tag_head`.

    Returns:
      ``{"metrics": tag_metrics on the test rows, "scores": [n_test, n_tags] float32,
      "head": TagHead}``.

    Raises:
      ValueError: overlapping or out-of-range rows, mismatched shapes.
    """
    x = np.asarray(embeddings)
    c = _matrix(counts, "counts")
    train, test = _rows(train_rows, len(c)), _rows(test_rows, len(c))
    if x.shape[0] != c.shape[0]:
        raise ValueError(f"embeddings have {x.shape[0]} rows, counts {c.shape[0]}")
    if np.intersect1d(train, test).size:
        raise ValueError("train_rows and test_rows overlap: held-out movies would leak")
    head = fit_tag_head(x[train], c[train] > train_threshold, **fit_options)
    scores = head.scores(x[test])
    return {"metrics": tag_metrics(scores, c[test], threshold, ks), "scores": scores,
            "head": head}


def _rows(rows: Sequence[int], n: int) -> np.ndarray:
    r = np.asarray(rows, dtype=np.int64).reshape(-1)
    if r.size == 0:
        raise ValueError("empty row selection")
    if r.min() < 0 or r.max() >= n:
        raise ValueError(f"row indices must lie in [0, {n}), got [{r.min()}, {r.max()}]")
    if np.unique(r).size != r.size:
        raise ValueError("row indices repeat")
    return r


# ----------------------------------------------------------------------------- open vocabulary


def _cosine(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return _prepare(a, True) @ _prepare(b, True).T


def open_vocab_eval(
    entity_embeddings,
    tag_texts: Sequence[str],
    encode_texts: Callable[[list[str]], np.ndarray],
    counts,
    heldout_tags: Sequence[int],
    *,
    threshold: int = 1,
    ks: Sequence[int] = DEFAULT_KS,
    fit_steps: int = 0,
    learning_rate: float = 1e-2,
) -> dict:
    """Open-vocabulary tag prediction: held-out tags are scored through the text side.

    Each held-out tag's text is encoded by ``encode_texts`` (the model's sentence encoder,
    e.g. DocEnt-Dual's ``f``) and a movie's score is ``cos(x_movie, f(tag))`` (the paper's
    Boolean-QA-like task: the test tags' labels are never seen). With ``fit_steps > 0`` the
    remaining (training) tags first fit a linear map ``A`` (initialised to the identity) and
    a scalar scale and bias, ``logit = a * cos(A x_movie, f(tag)) + b`` with binary
    cross-entropy on ``count > 0``, all movies; held-out tags are then scored with
    ``cos(A x, f(tag))``: a frozen-encoder form of the paper's fine-tuning on the other
    tags. Entity and text vectors must share a width.

    Args:
      entity_embeddings: ``[n_movies, dim]``.
      tag_texts: ``n_tags`` tag strings, in the columns' order.
      encode_texts: ``list[str] -> [n, dim]`` array.
      counts: ``[n_movies, n_tags]`` int user counts.
      heldout_tags: column indices of the evaluation tags (the paper: 500).

    Returns:
      ``{"metrics": tag_metrics over the held-out columns, "scores": [n_movies, n_heldout]}``.

    Raises:
      ValueError: mismatched shapes, bad indices, or an encoder output of the wrong shape.
    """
    x = _prepare(entity_embeddings, False)
    c = _matrix(counts, "counts")
    if len(tag_texts) != c.shape[1] or x.shape[0] != c.shape[0]:
        raise ValueError(f"{x.shape[0]} movies x {len(tag_texts)} tag texts do not match "
                         f"counts {c.shape}")
    held = _rows(heldout_tags, c.shape[1])

    def encode(columns: np.ndarray) -> np.ndarray:
        vectors = np.asarray(encode_texts([tag_texts[j] for j in columns]), dtype=np.float32)
        if vectors.shape != (len(columns), x.shape[1]):
            raise ValueError(f"encode_texts returned shape {vectors.shape}, expected "
                             f"({len(columns)}, {x.shape[1]})")
        return vectors

    if fit_steps > 0:
        train = np.setdiff1d(np.arange(c.shape[1]), held)
        x = _fit_projection(x, encode(train), c[:, train] > 0, fit_steps, learning_rate)
    scores = _cosine(x, encode(held))
    return {"metrics": tag_metrics(scores, c[:, held], threshold, ks), "scores": scores}


def _fit_projection(x: np.ndarray, tags: np.ndarray, labels: np.ndarray, steps: int,
                    learning_rate: float) -> np.ndarray:
    """Fits ``A``, ``a``, ``b`` of ``a * cos(A x, t) + b``; returns the projected ``x A^T``."""
    params = {"A": jnp.eye(x.shape[1], dtype=jnp.float32),
              "scale": jnp.asarray(10.0, jnp.float32), "bias": jnp.asarray(0.0, jnp.float32)}
    tx = optax.adam(learning_rate)
    t = _prepare(tags, True)

    def loss(p, xb, tb, yb):
        projected = jnp.dot(xb, p["A"].T, precision=jax.lax.Precision.HIGHEST)
        projected = projected / jnp.maximum(jnp.linalg.norm(projected, axis=1, keepdims=True),
                                            1e-12)
        logits = p["scale"] * jnp.dot(projected, tb.T, precision=jax.lax.Precision.HIGHEST)
        return jnp.mean(optax.sigmoid_binary_cross_entropy(logits + p["bias"], yb))

    params = _fit(loss, params, tx, steps, jnp.asarray(x), jnp.asarray(t),
                  jnp.asarray(labels, jnp.float32))
    return x @ np.asarray(params["A"]).T
