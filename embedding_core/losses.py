"""Losses shared by the model packages, written on the global batch.

Every loss here takes float32 inputs (callers cast encoder outputs up) and returns a
float32 scalar or per-example vector. Under ``jax.jit`` with sharded inputs XLA inserts
the collectives, so the negatives are those of the *global* batch and the gradient is the
gradient of the global mean (no per-device loss, no missing gradient averaging).
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp


def l2_normalize(x: jax.Array, axis: int = -1, eps: float = 1e-12) -> jax.Array:
    """``x / ||x||`` along ``axis``, with a finite gradient everywhere.

    A vector with ``||x|| <= eps`` (e.g. the all-zero vector of an empty text) maps to 0 with
    gradient 0: differentiating ``sqrt`` at 0 would give NaN gradients, so ``rsqrt`` only
    ever sees a positive argument (double-where form).

    Args:
      x: float array. axis: the vector axis. eps: norms at or below it count as zero.

    Returns:
      Array of ``x``'s shape and dtype.
    """
    sq = jnp.sum(x * x, axis=axis, keepdims=True)
    big = sq > eps * eps
    inv = jnp.where(big, jax.lax.rsqrt(jnp.where(big, sq, 1.0)), 0.0)
    return x * inv.astype(x.dtype)


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
    key_valid: jax.Array | None = None,
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
      key_valid: optional ``[m]`` bool; a False key is left out of every denominator (a
        padding slot, or an absent hard negative). A positive must be valid.

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
    if key_valid is not None:
        logits = jnp.where(key_valid[None, :] | is_positive, logits, -jnp.inf)
    log_norm = jax.nn.logsumexp(logits, axis=-1)
    positive_logit = jnp.take_along_axis(logits, positive_index[:, None], axis=-1)[:, 0]
    return log_norm - positive_logit


# --------------------------------------------------------------------------- batch-hard triplet

TRIPLET_DISTANCES = ("euclidean", "squared", "cosine")


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


# ---------------------------------------------------------------- vocabulary-parallel softmax


class VocabParallelStats(NamedTuple):
    """Per-query statistics of a softmax over a row-sharded table (all ``[b]`` float32).

    Attributes:
      logsumexp: ``log sum_j exp(z_ij)`` over the real rows.
      target_logit: ``z_{i, t_i}`` (0 where the target is outside ``[0, num_classes)``).
      max_logit: ``max_j z_ij`` (gradient stopped; for accuracies).
    """

    logsumexp: jax.Array
    target_logit: jax.Array
    max_logit: jax.Array


def _varying_axes(x: jax.Array) -> tuple[str, ...]:
    """The ``shard_map`` mesh axes along which ``x``'s value varies (its type's record)."""
    aval = jax.typeof(x)
    mat = getattr(aval, "mat", None)  # jax >= 0.10; older releases call it ``vma``
    return tuple(mat.varying if mat is not None else getattr(aval, "vma", ()))


def _vary(x: jax.Array, axes: tuple[str, ...]) -> jax.Array:
    """``x`` typed as varying over ``axes`` inside ``shard_map`` (a no-op on the value)."""
    have = _varying_axes(x)
    missing = tuple(a for a in axes if a not in have)
    return jax.lax.pcast(x, missing, to="varying") if missing else x


def _block_logits(q: jax.Array, w_block: jax.Array, bias_block: jax.Array, s: jax.Array,
                  cosine: bool) -> jax.Array:
    """``s * q . norm(w_j) + bias_j`` for one block of rows: ``[b, block]`` float32."""
    w_block = w_block.astype(jnp.float32)
    if cosine:
        w_block = l2_normalize(w_block)
    logits = jnp.einsum("bd,vd->bv", q, w_block, precision=jax.lax.Precision.HIGHEST)
    return s * logits + bias_block.astype(jnp.float32)[None, :]


def _block_rows(k: jax.Array, block: int, rows: int,
                limit: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Block ``k``'s first row, its rows ``[block]`` and which of them it counts.

    The last block of a shard whose rows ``block`` does not divide is shifted back to end
    at the last row (no padded copy of the table); rows it shares with the block before
    are not counted again, nor are rows at or beyond ``limit`` (padding classes).
    """
    start = jnp.minimum(k * block, rows - block)
    row = start + jnp.arange(block)
    return start, row, (row >= k * block) & (row < limit)


def _finite_or_zero(x: jax.Array) -> jax.Array:
    return jnp.where(jnp.isfinite(x), x, 0.0)


def _all_varying_axes(*xs: jax.Array) -> tuple[str, ...]:
    return tuple(sorted({a for x in xs for a in _varying_axes(x)}))


def _sum_to_type_of(g: jax.Array, primal: jax.Array) -> jax.Array:
    """``psum`` of a cotangent over the ``shard_map`` axes it varies on and its primal does
    not (e.g. a table block's gradient, summed over the data shards' queries)."""
    have = _varying_axes(primal)
    extra = tuple(a for a in _varying_axes(g) if a not in have)
    return jax.lax.psum(g, extra) if extra else g


def _tiled_forward(q, w, bias, s, limit, local_t, block, cosine):
    rows, b = w.shape[0], q.shape[0]

    def body(k, carry):
        top, total, target = carry
        start, row, counted = _block_rows(k, block, rows, limit)
        logits = _block_logits(q, jax.lax.dynamic_slice_in_dim(w, start, block),
                               jax.lax.dynamic_slice_in_dim(bias, start, block), s, cosine)
        logits = jnp.where(counted[None, :], logits, -jnp.inf)
        new_top = jnp.maximum(top, jnp.max(logits, axis=1))
        # A -inf running max (no counted row yet) shifts by 0: exp(-inf - 0) = 0, not NaN.
        shift = _finite_or_zero(new_top)
        total = (total * jnp.exp(top - shift)
                 + jnp.sum(jnp.exp(logits - shift[:, None]), axis=1))
        hit = (row[None, :] == local_t[:, None]) & counted[None, :]
        target = target + jnp.sum(jnp.where(hit, logits, 0.0), axis=1)
        return new_top, total, target

    zeros = _vary(jnp.zeros((b,), jnp.float32),
                  _all_varying_axes(q, w, bias, s, limit, local_t))
    top, total, target = jax.lax.fori_loop(
        0, -(-rows // block), body, (zeros - jnp.inf, zeros, zeros))
    # log(0) = -inf: a shard without a counted row adds nothing in the cross-shard join.
    return jnp.log(total) + _finite_or_zero(top), target, top


@functools.partial(jax.custom_vjp, nondiff_argnums=(6, 7, 8))
def _tiled_shard_logsumexp(q: jax.Array, w: jax.Array, bias: jax.Array, s: jax.Array,
                           limit: jax.Array, local_t: jax.Array, block: int,
                           cosine: bool, table_grad: bool
                           ) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Shard-local log-sum-exp, target logit and max of ``z = s * q . norm(w) + bias``.

    Scans ``w``'s rows in blocks of ``block`` with an online max (Milakov & Gimelshein
    2018, "Online normalizer calculation for softmax"), so at most ``[b, block]`` logits
    exist at a time. The backward recomputes each block's logits and pulls
    ``g_lse * softmax + g_target * onehot`` back through that block alone (the same
    recompute-per-tile trade as MaxText's vocabulary tiling), accumulating the table's
    gradient into one ``[rows, d]`` buffer. Under ``shard_map`` each block's table gradient
    is summed over the axes the queries vary on and the table does not (``data``) as it is
    made, so the step needs no second table-sized buffer for one large all-reduce.

    Args:
      q: ``[b, d]`` float32 queries, already normalised for the cosine form.
      w: ``[rows, d]`` float rows of this shard (normalised per block when ``cosine``).
      bias: ``[rows]`` float per-row logit bias.
      s: float32 scalar logit scale.
      limit: int32 scalar; rows at or beyond it are padding (not in the softmax).
      local_t: ``[b]`` int32 local row of each query's target, -1 when not in this shard.
      block: rows per block, ``1 <= block <= rows``.
      cosine: normalise each row of ``w``.
      table_grad: ``False``: the backward leaves ``w`` out (zero cotangent, no ``[rows,
        d]`` buffer); for a table updated block by block (``embedding_core.table_update``).

    Returns:
      ``(lse, target, top)``, each ``[b]`` float32: the log-sum-exp over the counted rows
      (-inf when none), the target's logit (0 when not here) and the max logit (no
      gradient flows through it).
    """
    return _tiled_forward(q, w, bias, s, limit, local_t, block, cosine)


def _tiled_fwd(q, w, bias, s, limit, local_t, block, cosine, table_grad):
    out = _tiled_forward(q, w, bias, s, limit, local_t, block, cosine)
    return out, (q, w, bias, s, limit, local_t, out[0])


def _tiled_bwd(block, cosine, table_grad, residuals, cotangents):
    q, w, bias, s, limit, local_t, lse = residuals
    g_lse, g_target, _ = cotangents  # the max is used under stop_gradient only
    rows = w.shape[0]
    lse = _finite_or_zero(lse)
    # Under shard_map: q and s typed as varying over every axis, so their per-block
    # cotangents stay local and are summed once after the loop; w and bias are left as
    # they are, so each block's pullback sums its table gradient over the data axis at once
    # (the transpose of the implicit cast) and no second table-sized buffer is needed for
    # one large all-reduce at the end.
    axes = _all_varying_axes(q, w, bias, s, limit, local_t)
    q_all, s_all = _vary(q, axes), _vary(s, axes)

    def body(k, carry):
        dq, dw, dbias, ds = carry
        start, row, counted = _block_rows(k, block, rows, limit)
        w_block = jax.lax.dynamic_slice_in_dim(w, start, block)
        bias_block = jax.lax.dynamic_slice_in_dim(bias, start, block)
        if table_grad:
            logits, pullback = jax.vjp(lambda *a: _block_logits(*a, cosine), q_all, w_block,
                                       bias_block, s_all)
        else:  # the table as a constant: no table pullback, nor its sum over data
            logits, pullback = jax.vjp(
                lambda q_, b_, s_: _block_logits(q_, w_block, b_, s_, cosine), q_all,
                bias_block, s_all)
        # Uncounted entries get exactly 0 (a where, not a product with a masked exp).
        prob = jnp.where(counted[None, :], jnp.exp(logits - lse[:, None]), 0.0)
        hit = (row[None, :] == local_t[:, None]) & counted[None, :]
        g_logits = g_lse[:, None] * prob + jnp.where(hit, g_target[:, None], 0.0)
        if table_grad:
            g_q, g_w, g_bias, g_s = pullback(g_logits)
            dw = jax.lax.dynamic_update_slice_in_dim(
                dw, jax.lax.dynamic_slice_in_dim(dw, start, block) + g_w, start, axis=0)
        else:
            g_q, g_bias, g_s = pullback(g_logits)
        dbias = jax.lax.dynamic_update_slice_in_dim(
            dbias, jax.lax.dynamic_slice_in_dim(dbias, start, block) + g_bias, start, axis=0)
        return dq + g_q, dw, dbias, ds + g_s

    # Without the table's gradient the carry holds an empty placeholder, not [rows, d].
    init = (_vary(jnp.zeros(q.shape, jnp.float32), axes),
            _vary(jnp.zeros(w.shape if table_grad else (0,), jnp.float32), _varying_axes(w)),
            _vary(jnp.zeros(bias.shape, jnp.float32), _varying_axes(bias)),
            _vary(jnp.zeros(s.shape, jnp.float32), axes))
    dq, dw, dbias, ds = jax.lax.fori_loop(0, -(-rows // block), body, init)
    return (_sum_to_type_of(dq, q).astype(q.dtype),
            dw.astype(w.dtype) if table_grad else None,
            dbias.astype(bias.dtype), _sum_to_type_of(ds, s).astype(s.dtype), None, None)


_tiled_shard_logsumexp.defvjp(_tiled_fwd, _tiled_bwd)


def vocab_parallel_logsumexp(
    queries: jax.Array,
    table: jax.Array,
    targets: jax.Array,
    mesh: jax.sharding.Mesh,
    scale: float | jax.Array = 1.0,
    *,
    bias: jax.Array | None = None,
    cosine: bool = True,
    num_classes: int | None = None,
    data_axis: str = "data",
    model_axis: str = "model",
    block_size: int = 0,
    table_gradient: bool = True,
) -> VocabParallelStats:
    """Log-partition, target logit and max logit of a softmax over a row-sharded table.

    Logits ``z_ij = scale * cos(q_i, w_j) + bias_j`` (or ``scale * q_i . w_j + bias_j`` with
    ``cosine=False``) over *every* row of the table (RELIC's / DocEnt-Dual's full softmax over
    all entities, Ling et al. 2020; DocEnt-Full's entity rows of the union vocabulary), never
    built on one device (Megatron-LM's vocabulary-parallel cross-entropy, Shoeybi et al.
    2019, sec. 3; see MaxText's vocabulary tiling). The cross-entropy is ``logsumexp -
    target_logit``; a softmax over the union of this table and another vocabulary is
    ``logaddexp`` of the two log-partitions (``docent_jax.loss.full_loss``).

    Under ``jax.shard_map`` each device holds ``b / data`` queries and ``V / model`` rows and
    computes its local logits ``[b / data, V / model]`` in float32; across ``model_axis``:

    * the row max goes through ``lax.pmax`` of a *stopped* gradient (pmax has no
      differentiation rule; the max only stabilises the exponentials, so the loss does not
      depend on it and its gradient is exactly zero);
    * the sum of exponentials goes through ``lax.psum``;
    * the target logit is a masked local lookup (rows outside this shard give 0) + ``psum``.

    Cosine normalisation of the table happens shard-locally, row by row.

    **Tiling** (``block_size > 0``; MaxText's vocabulary tiling, ``docs/docent.md``): the
    local logits are never built whole either. Each device scans its rows in blocks of
    ``block_size`` with an online max / log-sum-exp (:func:`_tiled_shard_logsumexp`, a
    ``jax.custom_vjp`` whose backward recomputes each block's logits), so a device holds at
    most ``[b / data, block_size]`` logits at a time, plus gradient buffers the size of its
    table shard. Only the shard-local log-sum-exp is hand-differentiated; the cross-shard
    join ``m = pmax(stop_gradient(lse_local))``, ``lse = m + log(psum(exp(lse_local - m)))``
    is ordinary differentiable code. Equal to the untiled form up to float rounding.

    Args:
      queries: ``[b, d]`` float; cast to float32. ``b`` must be divisible by the mesh's
        ``data_axis`` size.
      table: ``[V, d]`` float class (entity) vectors; cast to float32. ``V`` must be divisible
        by the mesh's ``model_axis`` size (pad the table and pass ``num_classes``).
      targets: ``[b]`` int32 row of each query's correct class; a target outside
        ``[0, num_classes)`` gets target logit 0 (callers mask such queries out).
      mesh: the mesh with axes ``data_axis`` and ``model_axis``.
      scale: logit scale (inverse temperature), a Python float or a float32 scalar array
        (e.g. a learned parameter; it gets its gradient).
      bias: optional ``[V]`` float per-row logit bias (sharded like the rows).
      cosine: L2-normalise queries and rows first (DocEnt-Dual's cosine score).
      num_classes: rows at or beyond this index are padding and excluded from the softmax;
        default ``V``.
      data_axis, model_axis: mesh axis names of the batch and of the table rows.
      block_size: rows per block of the tiled scan inside each shard; 0 = untiled (the
        whole ``[b / data, V / model]`` block at once). A block size at or above the rows
        per shard means one block; one that does not divide them is handled (the last
        block is shifted back and its overlap masked).
      table_gradient: ``False``: no gradient flows to ``table`` (a zero cotangent, and the
        tiled backward builds no table-sized buffer); the queries, scale and bias still
        get theirs. For a table whose optimizer step is folded into a blockwise pass
        (``embedding_core.table_update``).

    Returns:
      :class:`VocabParallelStats`, each ``[b]`` float32, sharded over ``data_axis``.

    Raises:
      ValueError: shapes disagree, ``b`` / ``V`` are not divisible by the axis sizes, or
        ``block_size < 0``.
    """
    if queries.ndim != 2 or table.ndim != 2 or queries.shape[1] != table.shape[1]:
        raise ValueError(f"queries must be [b, d] and table [V, d]; got {queries.shape} and "
                         f"{table.shape}")
    b, vocab = queries.shape[0], table.shape[0]
    if targets.shape != (b,):
        raise ValueError(f"targets must be [{b}], got {targets.shape}")
    if bias is not None and bias.shape != (vocab,):
        raise ValueError(f"bias must be [{vocab}], got {bias.shape}")
    n_data, n_model = mesh.shape[data_axis], mesh.shape[model_axis]
    if b % n_data:
        raise ValueError(f"batch {b} is not divisible by mesh axis {data_axis!r} = {n_data}")
    if vocab % n_model:
        raise ValueError(f"table rows {vocab} are not divisible by mesh axis {model_axis!r} = "
                         f"{n_model}; pad the table to a multiple and pass num_classes")
    num_classes = vocab if num_classes is None else int(num_classes)
    if not 0 < num_classes <= vocab:
        raise ValueError(f"num_classes={num_classes} must lie in [1, {vocab}]")
    if int(block_size) < 0:
        raise ValueError(f"block_size must be >= 0 (0 = untiled), got {block_size}")
    rows_per_shard = vocab // n_model
    P = jax.sharding.PartitionSpec

    def tiled(q, w, bias, t, s):
        q = q.astype(jnp.float32)
        if cosine:
            q = l2_normalize(q)
        offset = jax.lax.axis_index(model_axis) * rows_per_shard
        limit = jnp.clip(num_classes - offset, 0, rows_per_shard).astype(jnp.int32)
        local_t = t - offset
        local_t = jnp.where((local_t >= 0) & (local_t < limit), local_t, -1)
        lse, target, top = _tiled_shard_logsumexp(
            q, w, bias, s, limit, local_t, min(int(block_size), rows_per_shard), cosine,
            bool(table_gradient))
        shift = jax.lax.pmax(jax.lax.stop_gradient(lse), model_axis)
        shift = jnp.where(jnp.isfinite(shift), shift, 0.0)
        lse = shift + jnp.log(jax.lax.psum(jnp.exp(lse - shift), model_axis))
        return VocabParallelStats(lse, jax.lax.psum(target, model_axis),
                                  jax.lax.pmax(jax.lax.stop_gradient(top), model_axis))

    def local(q, w, bias, t, s):
        q = q.astype(jnp.float32)
        w = w.astype(jnp.float32)
        if cosine:
            q, w = l2_normalize(q), l2_normalize(w)
        logits = s * jnp.einsum("bd,vd->bv", q, w, precision=jax.lax.Precision.HIGHEST)
        logits = logits + bias.astype(jnp.float32)[None, :]
        offset = jax.lax.axis_index(model_axis) * rows_per_shard
        column = offset + jnp.arange(rows_per_shard)
        if num_classes < vocab:
            logits = jnp.where(column[None, :] < num_classes, logits, -jnp.inf)
        # Stop the gradient before pmax (no transpose rule); any finite shift gives the
        # same loss, so the stopped max loses nothing.
        shift = jax.lax.pmax(jax.lax.stop_gradient(jnp.max(logits, axis=1)), model_axis)
        sum_exp = jax.lax.psum(jnp.sum(jnp.exp(logits - shift[:, None]), axis=1), model_axis)
        local_t = t - offset
        here = (local_t >= 0) & (local_t < rows_per_shard) & (t < num_classes)
        picked = jnp.take_along_axis(
            logits, jnp.clip(local_t, 0, rows_per_shard - 1)[:, None], axis=1)[:, 0]
        target_logit = jax.lax.psum(jnp.where(here, picked, 0.0), model_axis)
        return VocabParallelStats(jnp.log(sum_exp) + shift, target_logit, shift)

    sharded = jax.shard_map(
        tiled if block_size else local, mesh=mesh,
        in_specs=(P(data_axis, None), P(model_axis, None), P(model_axis), P(data_axis), P()),
        out_specs=VocabParallelStats(P(data_axis), P(data_axis), P(data_axis)))
    bias = jnp.zeros((vocab,), jnp.float32) if bias is None else bias
    if not table_gradient:
        table = jax.lax.stop_gradient(table)
    return sharded(queries, table, bias, targets.astype(jnp.int32),
                   jnp.asarray(scale, jnp.float32))


def vocab_parallel_softmax_cross_entropy(
    queries: jax.Array,
    table: jax.Array,
    targets: jax.Array,
    mesh: jax.sharding.Mesh,
    scale: float | jax.Array,
    *,
    cosine: bool = True,
    num_classes: int | None = None,
    data_axis: str = "data",
    model_axis: str = "model",
    block_size: int = 0,
) -> jax.Array:
    """Full-softmax cross-entropy over a class table sharded by rows over ``model_axis``.

    ``loss_i = logsumexp_j(z_ij) - z_{i, t_i}`` with ``z_ij = scale * cos(q_i, w_j)`` (or
    ``scale * q_i . w_j`` when ``cosine=False``), equal to
    ``optax.softmax_cross_entropy_with_integer_labels(z, t)`` on the dense ``[b, V]``
    logits, which are never built on one device (:func:`vocab_parallel_logsumexp` says how).

    Args:
      queries: ``[b, d]`` float, ``b`` divisible by the mesh's ``data_axis`` size.
      table: ``[V, d]`` float, ``V`` divisible by the mesh's ``model_axis`` size.
      targets: ``[b]`` int32 in ``[0, num_classes)`` (not checked on device).
      mesh, scale, cosine, num_classes, data_axis, model_axis, block_size: see
        :func:`vocab_parallel_logsumexp`.

    Returns:
      ``[b]`` float32 per-query losses, sharded over ``data_axis``.

    Raises:
      ValueError: shapes disagree, or ``b`` / ``V`` are not divisible by the axis sizes.
    """
    stats = vocab_parallel_logsumexp(queries, table, targets, mesh, scale, cosine=cosine,
                                     num_classes=num_classes, data_axis=data_axis,
                                     model_axis=model_axis, block_size=block_size)
    return stats.logsumexp - stats.target_logit
