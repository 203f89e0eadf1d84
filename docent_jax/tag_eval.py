"""DocEnt's MovieLens tag-prediction metrics and the frozen-embedding baselines
(``docs/docent.md``, ``docs/docent_tags.md``).

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

import jax
import jax.numpy as jnp
import numpy as np
import optax

from data_pipelines.movielens import HumanCVFold
from embedding_core import metrics
from embedding_core.inference import l2_normalize

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
