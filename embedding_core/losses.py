"""Losses shared by the model packages, written on the global batch.

Every loss here takes float32 inputs (callers cast encoder outputs up) and returns a
float32 scalar or per-example vector. Under ``jax.jit`` with sharded inputs XLA inserts
the collectives, so the negatives are those of the *global* batch and the gradient is the
gradient of the global mean (no per-device loss, no missing gradient averaging).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def l2_normalize(x: jax.Array, axis: int = -1, eps: float = 1e-12) -> jax.Array:
    """Unit-length rows, ``x / max(||x||, eps)`` (as ``torch.nn.functional.normalize``)."""
    norm = jnp.sqrt(jnp.sum(x * x, axis=axis, keepdims=True))
    return x / jnp.maximum(norm, eps)


def cosine_similarity_matrix(a: jax.Array, b: jax.Array) -> jax.Array:
    """Pairwise cosine similarities.

    Args:
      a: ``[n, dim]`` float.
      b: ``[m, dim]`` float.

    Returns:
      ``[n, m]`` float32, ``cos(a_i, b_j)``.
    """
    a = l2_normalize(a.astype(jnp.float32))
    b = l2_normalize(b.astype(jnp.float32))
    return jnp.einsum("nd,md->nm", a, b, precision=jax.lax.Precision.HIGHEST)


def info_nce(
    queries: jax.Array,
    keys: jax.Array,
    positive_index: jax.Array,
    *,
    temperature: float,
    key_ids: jax.Array | None = None,
) -> jax.Array:
    """InfoNCE with cosine similarity, in-batch negatives and identity masking.

    ``loss_i = -log( v(q_i, k_{p_i}) / sum_j v(q_i, k_j) )`` with
    ``v(a, b) = exp(cos(a, b) / temperature)`` (van den Oord et al. 2018; the SimCSE /
    DualCSE form). Every key is a negative except keys that carry the same identity as the
    positive (``key_ids[j] == key_ids[p_i]``, ``j != p_i``): those are duplicates of the
    positive (the same text or the same entity) and are removed from the denominator, since
    pushing a query away from a copy of its positive is a false negative.

    Args:
      queries: ``[n, dim]`` float; cast to float32.
      keys: ``[m, dim]`` float; cast to float32.
      positive_index: ``[n]`` int32, index into ``keys`` of each query's positive.
      temperature: softmax temperature tau (> 0), e.g. 0.05.
      key_ids: optional ``[m]`` int32 identities of the keys; ``None`` masks nothing.

    Returns:
      ``[n]`` float32 per-query losses.
    """
    logits = cosine_similarity_matrix(queries, keys) / temperature  # [n, m]
    n, m = logits.shape
    columns = jnp.arange(m)[None, :]
    is_positive = columns == positive_index[:, None]
    if key_ids is not None:
        positive_ids = key_ids[positive_index]  # [n]
        duplicate = (key_ids[None, :] == positive_ids[:, None]) & ~is_positive
        logits = jnp.where(duplicate, -jnp.inf, logits)
    log_norm = jax.nn.logsumexp(logits, axis=-1)
    positive_logit = jnp.take_along_axis(logits, positive_index[:, None], axis=-1)[:, 0]
    return log_norm - positive_logit


# --------------------------------------------------------------------------- batch-hard triplet

TRIPLET_DISTANCES = ("euclidean", "squared", "cosine")


def safe_l2_normalize(x: jax.Array, axis: int = -1, eps: float = 1e-12) -> jax.Array:
    """``x / ||x||`` along ``axis``, with a finite gradient everywhere.

    A vector with ``||x|| <= eps`` (e.g. the all-zero vector of an empty text) maps to 0 with
    gradient 0. ``l2_normalize`` differentiates ``sqrt`` at 0 for a zero vector and returns
    NaN gradients; here ``rsqrt`` only ever sees a positive argument (double-where form).

    Args:
      x: float array. axis: the vector axis. eps: norms at or below it count as zero.

    Returns:
      Array of ``x``'s shape and dtype.
    """
    sq = jnp.sum(x * x, axis=axis, keepdims=True)
    big = sq > eps * eps
    inv = jnp.where(big, jax.lax.rsqrt(jnp.where(big, sq, 1.0)), 0.0)
    return x * inv.astype(x.dtype)


def pairwise_distances(embeddings: jax.Array, distance: str = "euclidean") -> jax.Array:
    """All pairwise distances between the rows of one matrix, NaN-free under ``jax.grad``.

    - ``"squared"``: ``||a - b||^2`` from the Gram matrix, clipped at 0 against rounding.
    - ``"euclidean"``: its square root in the double-where form: where the squared distance
      is 0 (exactly coinciding rows, the diagonal) the distance is 0 with gradient 0; the
      square root never sees 0, so its infinite derivative never enters the chain rule.
    - ``"cosine"``: ``1 - cos(a, b)`` on unit rows (an all-zero row has cosine 0 to all).

    Args:
      embeddings: ``[n, dim]`` float; cast to float32.
      distance: one of :data:`TRIPLET_DISTANCES`.

    Returns:
      ``[n, n]`` float32, zero on the diagonal.

    Raises:
      ValueError: unknown ``distance``.
    """
    if distance not in TRIPLET_DISTANCES:
        raise ValueError(f"distance must be one of {TRIPLET_DISTANCES}, got {distance!r}")
    x = embeddings.astype(jnp.float32)
    n = x.shape[0]
    eye = jnp.eye(n, dtype=bool)
    if distance == "cosine":
        u = safe_l2_normalize(x)
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


def batch_hard_triplet_loss(
    embeddings: jax.Array,
    labels: jax.Array,
    *,
    margin: float,
    soft_margin: bool = False,
    distance: str = "euclidean",
    valid: jax.Array | None = None,
    anchors: jax.Array | None = None,
    candidates: jax.Array | None = None,
) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Batch-hard triplet loss (Hermans, Beyer, Leibe 2017, "In Defense of the Triplet
    Loss", eq. (5)).

    For each anchor a, over the batch::

        d_ap = max_{p: label_p == label_a, p != a} D(a, p)     (hardest positive)
        d_an = min_{n: label_n != label_a}        D(a, n)     (hardest negative)
        loss_a = max(d_ap - d_an + margin, 0)                 (hard margin)
        loss_a = softplus(d_ap - d_an)                        (soft margin; margin unused)

    The loss is the mean of ``loss_a`` over *valid anchors*: anchors that are valid and have
    at least one valid positive and one valid negative; others contribute 0 and are left out
    of the mean (0 when there is no valid anchor at all). The hardest-positive/negative
    selections are computed with finite fill values and masked again before the hinge
    (double where), so rows without a positive or negative give no NaN or inf, in the value or
    in the gradient. softplus is ``jax.nn.softplus`` (no overflow of ``log(1 + exp(x))``).

    With Cakaloglu & Xu's Siamese retrieval set-up (question anchors, paragraph positives and
    negatives; arXiv 1902.00663) put questions and paragraphs in one batch, label each with
    its paragraph id, and pass ``anchors = is_question`` and ``candidates = is_paragraph``.

    Args:
      embeddings: ``[n, dim]`` float; cast to float32.
      labels: ``[n]`` int32 class / identity of each row.
      margin: the hinge margin m (>= 0), in units of ``distance``.
      soft_margin: use ``softplus(d_ap - d_an)`` instead of the hinge.
      distance: ``"euclidean"`` (the paper's choice), ``"squared"`` or ``"cosine"``
        (``1 - cos``); see :func:`pairwise_distances`.
      valid: optional ``[n]`` bool, False for padding rows (neither anchor nor candidate).
      anchors: optional ``[n]`` bool, rows that act as anchors (default: every valid row).
      candidates: optional ``[n]`` bool, rows that may be positives or negatives (default:
        every valid row).

    Returns:
      ``(loss, stats)``: ``loss`` a float32 scalar; ``stats`` float32 scalars
      ``active_fraction`` (share of valid anchors with ``d_ap - d_an + margin > 0``, i.e. a
      non-zero hinge; with soft margin the same test with the margin), ``mean_d_ap``,
      ``mean_d_an`` (over valid anchors; both near 0 and loss near ``margin`` is the collapse
      signature) and ``num_valid_anchors``.

    Raises:
      ValueError: shapes disagree, unknown ``distance`` or negative ``margin``.
    """
    if embeddings.ndim != 2 or labels.shape != embeddings.shape[:1]:
        raise ValueError(
            f"embeddings must be [n, dim] and labels [n]; got {embeddings.shape} and "
            f"{labels.shape}"
        )
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
    has_positive = jnp.any(positive, axis=1)
    has_negative = jnp.any(negative, axis=1)
    use = is_anchor & has_positive & has_negative

    # Finite fills: distances are >= 0 (cosine: >= 0 up to rounding), so -1 never beats a
    # real positive in the max, and a fill of 1e30 never beats a real negative in the min.
    d_ap = jnp.max(jnp.where(positive, dist, -1.0), axis=1)
    d_an = jnp.min(jnp.where(negative, dist, 1e30), axis=1)
    d_ap = jnp.where(use, d_ap, 0.0)
    d_an = jnp.where(use, d_an, 0.0)
    gap = d_ap - d_an
    per_anchor = jax.nn.softplus(gap) if soft_margin else jnp.maximum(gap + margin, 0.0)
    per_anchor = jnp.where(use, per_anchor, 0.0)

    count = jnp.sum(use.astype(jnp.float32))
    denom = jnp.maximum(count, 1.0)
    loss = jnp.sum(per_anchor) / denom
    stats = {
        "active_fraction": jnp.sum((use & (gap + margin > 0)).astype(jnp.float32)) / denom,
        "mean_d_ap": jnp.sum(d_ap) / denom,
        "mean_d_an": jnp.sum(d_an) / denom,
        "num_valid_anchors": count,
    }
    return loss, stats
