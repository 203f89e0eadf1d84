"""Batch-hard triplet loss (Hermans, Beyer, Leibe 2017) and NaN-free pairwise distances."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from embedding_core.losses.losses import l2_normalize

TRIPLET_DISTANCES = ("euclidean", "squared", "cosine")


def pairwise_distances(embeddings: jax.Array, distance: str = "euclidean") -> jax.Array:
    """``[n, n]`` float32 distances of ``[n, dim]`` rows, 0 on the diagonal: ``squared``
    (from the Gram matrix), ``euclidean`` (gradient 0 where rows coincide) or ``1 - cos``.
    Raises ValueError: unknown ``distance``."""
    if distance not in TRIPLET_DISTANCES:
        raise ValueError(f"distance must be one of {TRIPLET_DISTANCES}, got {distance!r}")
    x = embeddings.astype(jnp.float32)
    n = x.shape[0]
    eye = jnp.eye(n, dtype=bool)
    if distance == "cosine":
        u = l2_normalize(x)
        cos = jnp.einsum("nd,md->nm", u, u, precision=jax.lax.Precision.HIGHEST)
        return jnp.where(eye, 0.0, 1.0 - cos)
    gram = jnp.einsum("nd,md->nm", x, x, precision=jax.lax.Precision.HIGHEST)
    sq_norm = jnp.diagonal(gram)
    sq = jnp.maximum(sq_norm[:, None] + sq_norm[None, :] - 2.0 * gram, 0.0)
    sq = jnp.where(eye, 0.0, sq)  # exact zeros on the diagonal, whatever the rounding
    if distance == "squared":
        return sq
    positive = sq > 0.0
    return jnp.where(positive, jnp.sqrt(jnp.where(positive, sq, 1.0)), 0.0)


def batch_hard_triplet_loss(embeddings: jax.Array, labels: jax.Array, *, margin: float,
                            soft_margin: bool = False, distance: str = "euclidean",
                            valid: jax.Array | None = None, anchors: jax.Array | None = None,
                            candidates: jax.Array | None = None
                           ) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Hermans et al. 2017, eq. (5): mean over anchors with a positive and a negative of
    ``max(max_p D(a, p) - min_n D(a, n) + margin, 0)`` (or softplus); ``[n, dim]``,
    ``[n]`` int32 labels, optional ``[n]`` bool masks. Returns float32 ``(loss, stats)``.
    Raises: ValueError: shapes disagree, unknown ``distance`` or negative ``margin``."""
    if embeddings.ndim != 2 or labels.shape != embeddings.shape[:1]:
        raise ValueError(f"embeddings must be [n, dim] and labels [n]; got {embeddings.shape} "
                         f"and {labels.shape}")
    if margin < 0:
        raise ValueError(f"margin must be >= 0, got {margin}")
    n = embeddings.shape[0]
    for name, mask in (("valid", valid), ("anchors", anchors), ("candidates", candidates)):
        if mask is not None and mask.shape != (n,):
            raise ValueError(f"{name} must be [{n}] bool, got shape {mask.shape}")
    valid = jnp.ones((n,), bool) if valid is None else valid.astype(bool)
    is_anchor = valid if anchors is None else valid & anchors.astype(bool)
    is_candidate = valid if candidates is None else valid & candidates.astype(bool)

    dist = pairwise_distances(embeddings, distance)  # [n, n] float32
    same = labels[:, None] == labels[None, :]
    not_self = ~jnp.eye(n, dtype=bool)
    pair_ok = is_anchor[:, None] & is_candidate[None, :]
    positive = pair_ok & same & not_self
    negative = pair_ok & ~same
    use = is_anchor & jnp.any(positive, axis=1) & jnp.any(negative, axis=1)

    # Finite fills (distances >= 0): -1 never wins the max, 1e30 never wins the min.
    d_ap = jnp.max(jnp.where(positive, dist, -1.0), axis=1)
    d_an = jnp.min(jnp.where(negative, dist, 1e30), axis=1)
    d_ap = jnp.where(use, d_ap, 0.0)
    d_an = jnp.where(use, d_an, 0.0)
    gap = d_ap - d_an
    per_anchor = jax.nn.softplus(gap) if soft_margin else jnp.maximum(gap + margin, 0.0)
    per_anchor = jnp.where(use, per_anchor, 0.0)

    count = jnp.sum(use.astype(jnp.float32))
    denom = jnp.maximum(count, 1.0)
    stats = {
        "active_fraction": jnp.sum((use & (gap + margin > 0)).astype(jnp.float32)) / denom,
        "mean_d_ap": jnp.sum(d_ap) / denom,
        "mean_d_an": jnp.sum(d_an) / denom,
        "num_valid_anchors": count,
    }
    return jnp.sum(per_anchor) / denom, stats
