"""DocEnt's tag-prediction metrics and frozen-embedding baselines (``docs/docent.md``)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax

from docent_jax.corpora.movielens import HumanCVFold
from embedding_core import l2_normalize, metrics

DEFAULT_KS: tuple[int, ...] = tuple(range(1, 21))  # the notebook's MAX_K = 20


def _matrix(x, name: str) -> np.ndarray:
    arr = np.asarray(x)
    if arr.ndim != 2:
        raise ValueError(f"{name} must be [n_movies, n_tags], got shape {arr.shape}")
    return arr


def tag_metrics(scores, counts, threshold: int = 1,
                ks: Sequence[int] = DEFAULT_KS) -> dict[str, float]:
    """``map``, ``auc``, ``precision@K``, ``ndcg@K``, ``ndcg_log@K``, ``num_movies@K``, ... of
    ``[n_movies, n_tags]`` scores vs counts (NaN: undefined); ValueError: shapes, sign, NaN."""
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



def human_baseline(folds: Sequence[HumanCVFold], *, threshold: int = 2,
                   ks: Sequence[int] = DEFAULT_KS,
                   model_scores: Mapping[str, np.ndarray] | None = None) -> dict[str, dict]:
    """The human cross-validation beside ``model_scores``: ``{"human": {"folds", "mean"}, name:
    ...}``; ValueError: no folds, a shape unlike the counts'."""
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
    columns = {key: np.array([r[key] for r in rows], dtype=np.float64) for key in rows[0]}
    return {key: float(np.mean(v[~np.isnan(v)])) if (~np.isnan(v)).any() else float("nan")
            for key, v in columns.items()}



@dataclasses.dataclass(frozen=True)
class TagHead:
    """``logits = x W + b`` on frozen entity embeddings (``x`` L2-normalised if ``normalize``)."""

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


def fit_tag_head(embeddings, labels, *, steps: int = 500, learning_rate: float = 1e-2,
                 weight_decay: float = 1e-4, normalize: bool = True) -> TagHead:
    """Per-tag logistic regression (full-batch BCE, AdamW from zero); ValueError: shapes."""
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


def closed_vocab_eval(embeddings, counts, train_rows: Sequence[int], test_rows: Sequence[int], *,
                      threshold: int = 1, train_threshold: int = 0, ks: Sequence[int] = DEFAULT_KS,
                      **fit_options) -> dict:
    """Closed vocabulary probe: :func:`fit_tag_head` on ``train_rows`` (``count >
    train_threshold``), scored on ``test_rows`` (``count > threshold``): ``{"metrics", "scores",
    "head"}``; ValueError: overlapping or out-of-range rows, shapes."""
    x = np.asarray(embeddings)
    c = _matrix(counts, "counts")
    train, test = _rows(train_rows, len(c)), _rows(test_rows, len(c))
    if x.shape[0] != c.shape[0]:
        raise ValueError(f"embeddings have {x.shape[0]} rows, counts {c.shape[0]}")
    check_disjoint(train, test, "train_rows and test_rows", "movies")
    head = fit_tag_head(x[train], c[train] > train_threshold, **fit_options)
    scores = head.scores(x[test])
    return {"metrics": tag_metrics(scores, c[test], threshold, ks), "scores": scores, "head": head}


def check_disjoint(a, b, names: str, what: str) -> None:
    """Raises ValueError when index arrays ``a`` and ``b`` share an item."""
    if np.intersect1d(a, b).size:
        raise ValueError(f"{names} overlap: held-out {what} would leak")


def _rows(rows: Sequence[int], n: int) -> np.ndarray:
    r = np.asarray(rows, dtype=np.int64).reshape(-1)
    if r.size == 0:
        raise ValueError("empty row selection")
    if r.min() < 0 or r.max() >= n:
        raise ValueError(f"row indices must lie in [0, {n}), got [{r.min()}, {r.max()}]")
    if np.unique(r).size != r.size:
        raise ValueError("row indices repeat")
    return r



def open_vocab_eval(entity_embeddings, tag_texts: Sequence[str],
                    encode_texts: Callable[[list[str]], np.ndarray], counts,
                    heldout_tags: Sequence[int], *, threshold: int = 1,
                    ks: Sequence[int] = DEFAULT_KS, fit_steps: int = 0,
                    learning_rate: float = 1e-2) -> dict:
    """Open vocabulary: score ``cos(x_movie, f(tag))`` (``fit_steps > 0``: ``cos(A x, f(tag))``
    after fitting ``a * cos(A x, f(tag)) + b`` on the other tags): ``{"metrics", "scores"}``;
    ValueError: shapes, indices, an encoder output of the wrong shape."""
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
    scores = _prepare(x, True) @ _prepare(encode(held), True).T
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
