"""sentence-transformers' losses as declared objects, on the global batch (every device's
rows: its ``gather_across_devices=True``). Each maps ``embeddings`` (one ``[n, dim]`` array a
column: anchor, positive, negatives...) and ``labels`` (``[n]`` float32 or None) to a
float32 scalar; names, arguments and defaults are sentence-transformers 6.3's
(``docs/sentence.md``, "Losses")."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp

from embedding_core import l2_normalize

DIRECTIONS = ("query_to_doc", "query_to_query", "doc_to_query", "doc_to_doc")
_HI = jax.lax.Precision.HIGHEST


def cos_sim(a: jax.Array, b: jax.Array) -> jax.Array:
    """``[n, d]`` x ``[m, d]`` -> ``[n, m]`` float32 cosine."""
    return dot_score(l2_normalize(a.astype(jnp.float32)), l2_normalize(b.astype(jnp.float32)))


def dot_score(a: jax.Array, b: jax.Array) -> jax.Array:
    """``[n, d]`` x ``[m, d]`` -> ``[n, m]`` float32 dot products."""
    return jnp.einsum("nd,md->nm", a.astype(jnp.float32), b.astype(jnp.float32), precision=_HI)


def pairwise_cos_sim(a: jax.Array, b: jax.Array) -> jax.Array:
    """``[n, d]`` x ``[n, d]`` -> ``[n]`` float32 cosine of row i with row i."""
    return jnp.sum(l2_normalize(a.astype(jnp.float32)) * l2_normalize(b.astype(jnp.float32)), -1)


def pairwise_dot_score(a: jax.Array, b: jax.Array) -> jax.Array:
    """``[n, d]`` x ``[n, d]`` -> ``[n]`` float32 dot product of row i with row i."""
    return jnp.sum(a.astype(jnp.float32) * b.astype(jnp.float32), -1)


SIMILARITIES: dict[str, Callable[[jax.Array, jax.Array], jax.Array]] = {
    "cos_sim": cos_sim, "dot_score": dot_score}
PAIRWISE: dict[str, Callable[[jax.Array, jax.Array], jax.Array]] = {
    "pairwise_cos_sim": pairwise_cos_sim, "pairwise_dot_score": pairwise_dot_score}


def _choice(name: str, value: str, allowed: Sequence[str]) -> None:
    if value not in allowed:
        raise ValueError(f"{name}={value!r}: one of {', '.join(allowed)}")


@dataclasses.dataclass(frozen=True)
class MultipleNegativesRankingLoss:
    """InfoNCE with in-batch negatives: column 0 the queries, 1 their positives, 2... hard
    negatives; ``loss = -mean_i(s_ii - log Z_i)``, ``s = scale * similarity``, ``Z`` over the
    ``directions`` (one softmax, or one a direction averaged: ``partition_mode``)."""

    scale: float = 20.0
    similarity_fct: str = "cos_sim"
    directions: tuple[str, ...] = ("query_to_doc",)
    partition_mode: str = "joint"
    min_columns = 2

    def __post_init__(self) -> None:
        if not self.scale > 0:
            raise ValueError(f"scale={self.scale}: must be positive")
        _choice("similarity_fct", self.similarity_fct, list(SIMILARITIES))
        _choice("partition_mode", self.partition_mode, ["joint", "per_direction"])
        if not self.directions or "query_to_doc" not in self.directions:
            raise ValueError(f"directions={self.directions}: must include 'query_to_doc'")
        for d in self.directions:
            _choice("directions", d, DIRECTIONS)
        if self.partition_mode == "per_direction" and (
                {"query_to_query", "doc_to_doc"} & set(self.directions)):
            raise ValueError("partition_mode='per_direction' takes only the directions "
                             "'query_to_doc' and 'doc_to_query'")

    def __call__(self, embeddings: Sequence[jax.Array], labels: jax.Array | None = None,
                 rng: jax.Array | None = None) -> jax.Array:
        if len(embeddings) < 2:
            raise ValueError(f"{type(self).__name__} needs at least 2 columns (anchor, "
                             f"positive), got {len(embeddings)}")
        sim = SIMILARITIES[self.similarity_fct]
        queries, docs = embeddings[0], list(embeddings[1:])
        n = queries.shape[0]
        rows = jnp.arange(n)
        docs_all = jnp.concatenate(docs, axis=0)  # [n * (columns - 1), d]
        scores = {"query_to_doc": sim(queries, docs_all)}
        if "query_to_query" in self.directions:
            scores["query_to_query"] = jnp.where(jnp.eye(n, dtype=bool), -jnp.inf,
                                                 sim(queries, queries))
        if "doc_to_query" in self.directions:
            scores["doc_to_query"] = sim(queries, docs[0]).T
        if "doc_to_doc" in self.directions:
            same_query = jnp.tile(jnp.eye(n, dtype=bool), (1, len(docs)))
            scores["doc_to_doc"] = jnp.where(same_query, -jnp.inf, sim(docs_all, docs[0]).T)
        scores = {k: v * self.scale for k, v in scores.items()}
        positive = scores["query_to_doc"][rows, rows]
        if self.partition_mode == "joint":
            log_z = jax.nn.logsumexp(jnp.concatenate(list(scores.values()), axis=1), axis=1)
        else:
            log_z = sum(jax.nn.logsumexp(v, axis=1) for v in scores.values()) / len(scores)
        return -jnp.mean(positive - log_z)

    def config_dict(self) -> dict[str, Any]:
        """The arguments as sentence-transformers' ``get_config_dict`` names them."""
        return {"scale": self.scale, "similarity_fct": self.similarity_fct,
                "gather_across_devices": True, "directions": list(self.directions),
                "partition_mode": self.partition_mode}


@dataclasses.dataclass(frozen=True)
class MultipleNegativesSymmetricRankingLoss(MultipleNegativesRankingLoss):
    """MNRL with ``doc_to_query`` beside ``query_to_doc``, one softmax each, averaged."""

    directions: tuple[str, ...] = ("query_to_doc", "doc_to_query")
    partition_mode: str = "per_direction"


@dataclasses.dataclass(frozen=True)
class CachedMultipleNegativesRankingLoss(MultipleNegativesRankingLoss):
    """MNRL by GradCache: the same value and gradient, embedded ``mini_batch_size`` rows of
    each device at a time (the trainer's ``contrastive_chunk_size``)."""

    mini_batch_size: int = 32

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.mini_batch_size < 1:
            raise ValueError(f"mini_batch_size={self.mini_batch_size}: must be at least 1")

    def config_dict(self) -> dict[str, Any]:
        return {**super().config_dict(), "mini_batch_size": self.mini_batch_size}


@dataclasses.dataclass(frozen=True)
class CoSENTLoss:
    """Scored pairs: ``log(1 + sum exp(s_kl - s_ij))`` over pairs with ``label_ij >
    label_kl``, ``s = scale * similarity_fct(column 0, column 1)``."""

    scale: float = 20.0
    similarity_fct: str = "pairwise_cos_sim"
    min_columns = 2

    def __post_init__(self) -> None:
        _choice("similarity_fct", self.similarity_fct, list(PAIRWISE))

    def __call__(self, embeddings: Sequence[jax.Array], labels: jax.Array | None = None,
                 rng: jax.Array | None = None) -> jax.Array:
        if labels is None or len(embeddings) != 2:
            raise ValueError("CoSENTLoss takes two text columns and a score column")
        scores = PAIRWISE[self.similarity_fct](embeddings[0], embeddings[1]) * self.scale
        labels = labels.astype(jnp.float32)
        higher = labels[:, None] > labels[None, :]  # (i, j): pair i scored above pair j
        diffs = jnp.where(higher, scores[None, :] - scores[:, None], -jnp.inf)
        return jax.nn.logsumexp(jnp.concatenate([jnp.zeros(1), diffs.reshape(-1)]))

    def config_dict(self) -> dict[str, Any]:
        return {"scale": self.scale, "similarity_fct": self.similarity_fct}


def shrink(x: jax.Array, dim: int) -> jax.Array:
    """The first ``dim`` coordinates of ``[..., d]``, L2-normalised (Matryoshka)."""
    return l2_normalize(x[..., :dim].astype(jnp.float32))


@dataclasses.dataclass(frozen=True)
class MatryoshkaLoss:
    """``sum_d w_d * loss(shrink(embeddings, d))`` over ``matryoshka_dims`` (largest first);
    ``n_dims_per_step > 0``: that many dims drawn a step from ``rng``."""

    loss: Any
    matryoshka_dims: tuple[int, ...]
    matryoshka_weights: tuple[float, ...] | None = None
    n_dims_per_step: int = -1

    def __post_init__(self) -> None:
        dims = tuple(int(d) for d in self.matryoshka_dims)
        if not dims or min(dims) <= 0:
            raise ValueError(f"matryoshka_dims={list(dims)}: give positive dimensions")
        weights = self.matryoshka_weights
        weights = (1.0,) * len(dims) if weights is None else tuple(float(w) for w in weights)
        if len(weights) != len(dims):
            raise ValueError(f"matryoshka_weights has {len(weights)} entries for "
                             f"{len(dims)} matryoshka_dims")
        pairs = sorted(zip(dims, weights, strict=True), key=lambda p: p[0], reverse=True)
        object.__setattr__(self, "matryoshka_dims", tuple(p[0] for p in pairs))
        object.__setattr__(self, "matryoshka_weights", tuple(p[1] for p in pairs))

    @property
    def min_columns(self) -> int:
        return self.loss.min_columns

    def check_dim(self, dim: int) -> None:
        """Raises ValueError: a Matryoshka dimension above the model's ``dim``."""
        if max(self.matryoshka_dims) > dim:
            raise ValueError(f"matryoshka_dims={list(self.matryoshka_dims)}: the model's "
                             f"embeddings have {dim} dimensions")

    def __call__(self, embeddings: Sequence[jax.Array], labels: jax.Array | None = None,
                 rng: jax.Array | None = None) -> jax.Array:
        weights = jnp.asarray(self.matryoshka_weights, jnp.float32)
        k = len(self.matryoshka_dims)
        if 0 < self.n_dims_per_step < k:
            if rng is None:
                raise ValueError("n_dims_per_step needs the step's rng")
            chosen = jax.random.permutation(rng, k)[:self.n_dims_per_step]
            weights = weights * jnp.zeros(k).at[chosen].set(1.0)
        values = jnp.stack([self.loss([shrink(e, d) for e in embeddings], labels)
                            for d in self.matryoshka_dims])
        return jnp.sum(weights * values)

    def config_dict(self) -> dict[str, Any]:
        return {"loss": type(self.loss).__name__,
                "matryoshka_dims": list(self.matryoshka_dims),
                "matryoshka_weights": list(self.matryoshka_weights),
                "n_dims_per_step": self.n_dims_per_step}


LOSSES = {cls.__name__: cls for cls in (
    MultipleNegativesRankingLoss, MultipleNegativesSymmetricRankingLoss,
    CachedMultipleNegativesRankingLoss, CoSENTLoss)}


def inner(loss: Any) -> Any:
    """The loss a MatryoshkaLoss wraps, else ``loss``."""
    return loss.loss if isinstance(loss, MatryoshkaLoss) else loss


def mini_batch_size(loss: Any) -> int:
    """The GradCache rows of a cached loss (wrapped or not), else 0."""
    return getattr(inner(loss), "mini_batch_size", 0)
