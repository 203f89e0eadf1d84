"""The batch-hard triplet loss of questions against paragraphs (``docs/mrwe.md``).

The Siamese set-up: questions (anchors) and paragraphs (candidates) go through one tower;
for each question the hardest positive is its paragraph (the only one with its label in the
batch) and the hardest negative the nearest other paragraph of the batch (batch-hard,
``embedding_core.losses.batch_hard_triplet_loss``). Negatives are the P - 1 other paragraphs
of the *global* batch (the loss is written on the global batch; XLA inserts the
collectives).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_collections

from data_pipelines.word_features import FeatureSet
from embedding_core.losses import batch_hard_triplet_loss
from mrwe_jax.model import SiameseRetriever, encode_batch


def question_paragraph_triplet_loss(
    q: jax.Array, p: jax.Array, q_label: jax.Array, p_label: jax.Array, *, margin: float,
    soft_margin: bool, distance: str,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """``mean_i max(0, max_{p+} d(q_i, p+) - min_{p-} d(q_i, p-) + margin)``.

    The hardest positive and negative of question ``q_i`` are searched among the
    paragraphs only (questions are anchors, never candidates); ``soft_margin`` replaces the
    hinge by ``softplus``.

    Args:
      q: ``[n_q, d]`` question vectors; p: ``[n_p, d]`` paragraph vectors.
      q_label, p_label: paragraph index of each question / paragraph.
      distance: ``"euclidean"``, ``"squared"`` or ``"cosine"``.

    Returns:
      ``(loss, stats)``: the triplet statistics (``active_fraction``, ``mean_d_ap``,
      ``mean_d_an``, ...; both distances near 0 with the loss near the margin is collapse).
    """
    n_q, n_p = q.shape[0], p.shape[0]
    embeddings = jnp.concatenate([q, p], axis=0)
    labels = jnp.concatenate([q_label, p_label]).astype(jnp.int32)
    is_question = jnp.arange(n_q + n_p) < n_q
    return batch_hard_triplet_loss(embeddings, labels, margin=margin, soft_margin=soft_margin,
                                   distance=distance, anchors=is_question,
                                   candidates=~is_question)


def batch_top1(q: jax.Array, p: jax.Array, q_label: jax.Array, p_label: jax.Array
               ) -> jax.Array:
    """Share of questions whose own paragraph is the most similar (dot product) of the batch."""
    sims = jnp.einsum("qd,pd->qp", q, p, precision=jax.lax.Precision.HIGHEST)
    own = q_label[:, None] == p_label[None, :]
    own_score = jnp.max(jnp.where(own, sims, -jnp.inf), axis=1)
    other_best = jnp.max(jnp.where(own, -jnp.inf, sims), axis=1)
    return jnp.mean((own_score > other_best).astype(jnp.float32))


def make_loss_fn(model: SiameseRetriever, config: ml_collections.ConfigDict,
                 features: FeatureSet):
    """``loss_fn(params, batch, rng) -> (loss, metrics)`` on the global batch.

    Rows: the ``P*K`` questions (anchors only) and the ``P`` paragraphs (candidates only),
    labelled by paragraph index. Metrics: the triplet statistics and :func:`batch_top1`.
    """
    deterministic = not float(config.dropout_rate)

    def loss_fn(params, batch, rng):
        q, p = encode_batch(model, params, batch, features, config,
                            deterministic=deterministic, rng=rng)
        loss, stats = question_paragraph_triplet_loss(
            q, p, batch["q_label"], batch["p_label"], margin=float(config.margin),
            soft_margin=bool(config.soft_margin), distance=config.distance)
        stats = dict(stats)
        stats["batch_top1"] = batch_top1(q, p, batch["q_label"], batch["p_label"])
        return loss, stats

    return loss_fn
