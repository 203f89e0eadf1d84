"""Batch-hard triplet loss of questions against the global batch's paragraphs (``docs/mrwe.md``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections

from embedding_core.losses.triplet import batch_hard_triplet_loss
from mrwe_jax.features.cache import FeatureSet
from mrwe_jax.model import SiameseRetriever, side_inputs


def question_paragraph_triplet_loss(
    q: jax.Array, p: jax.Array, q_label: jax.Array, p_label: jax.Array, *, margin: float,
    soft_margin: bool, distance: str,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """``mean_i max(0, max_{p+} d(q_i, p+) - min_{p-} d(q_i, p-) + margin)`` (``soft_margin``:
    softplus) of ``q [n_q, d]`` against ``p [n_p, d]``: ``(loss, stats)``."""
    n_q, n_p = q.shape[0], p.shape[0]
    embeddings = jnp.concatenate([q, p], axis=0)
    labels = jnp.concatenate([q_label, p_label]).astype(jnp.int32)
    is_question = jnp.arange(n_q + n_p) < n_q
    return batch_hard_triplet_loss(embeddings, labels, margin=margin, soft_margin=soft_margin,
                                   distance=distance, anchors=is_question,
                                   candidates=~is_question)


def batch_top1(q: jax.Array, p: jax.Array, q_label: jax.Array, p_label: jax.Array) -> jax.Array:
    """Share of questions whose own paragraph is the most similar (dot product) of the batch."""
    sims = jnp.einsum("qd,pd->qp", q, p, precision=jax.lax.Precision.HIGHEST)
    own = q_label[:, None] == p_label[None, :]
    own_score = jnp.max(jnp.where(own, sims, -jnp.inf), axis=1)
    other_best = jnp.max(jnp.where(own, -jnp.inf, sims), axis=1)
    return jnp.mean((own_score > other_best).astype(jnp.float32))


def encode_batch(model: SiameseRetriever, params: Any, batch: Mapping[str, jax.Array],
                 features: FeatureSet, *, deterministic: bool = True,
                 rng: jax.Array | None = None) -> tuple[jax.Array, jax.Array]:
    """``(questions [b_q, d''], paragraphs [b_p, d''])`` float32 unit vectors of a batch."""
    questions = side_inputs(batch["q_features"], batch.get("q_mask"), features)
    paragraphs = side_inputs(batch["p_features"], batch.get("p_mask"), features)
    rngs = {"dropout": rng} if rng is not None else {}
    return model.apply({"params": params}, questions, paragraphs,
                       deterministic=deterministic, rngs=rngs)


def make_loss_fn(model: SiameseRetriever, config: ml_collections.ConfigDict, features: FeatureSet):
    """``loss_fn(params, batch, rng) -> (loss, metrics)`` on the global batch."""
    deterministic = not float(config.dropout_rate)

    def loss_fn(params, batch, rng):
        q, p = encode_batch(model, params, batch, features, deterministic=deterministic, rng=rng)
        loss, stats = question_paragraph_triplet_loss(
            q, p, batch["q_label"], batch["p_label"], margin=float(config.margin),
            soft_margin=bool(config.soft_margin), distance=config.distance)
        stats = dict(stats)
        stats["batch_top1"] = batch_top1(q, p, batch["q_label"], batch["p_label"])
        return loss, stats

    return loss_fn
