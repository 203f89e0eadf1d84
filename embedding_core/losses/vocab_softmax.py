"""Megatron-LM's vocabulary-parallel softmax in ``shard_map``, optionally tiled with an
online log-sum-exp (Milakov & Gimelshein 2018; ``docs/docent.md``, "Tiling")."""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp

from embedding_core.losses.losses import l2_normalize


class VocabParallelStats(NamedTuple):
    """``[b]`` float32 each: ``log sum_j exp(z_ij)``, ``z_{i, t_i}`` (0 outside the
    classes) and ``max_j z_ij`` (gradient stopped)."""

    logsumexp: jax.Array
    target_logit: jax.Array
    max_logit: jax.Array


def _varying_axes(x: jax.Array) -> tuple[str, ...]:
    aval = jax.typeof(x)
    mat = getattr(aval, "mat", None)  # jax >= 0.10; older releases call it ``vma``
    return tuple(mat.varying if mat is not None else getattr(aval, "vma", ()))


def _vary(x: jax.Array, axes: tuple[str, ...]) -> jax.Array:
    have = _varying_axes(x)
    missing = tuple(a for a in axes if a not in have)
    return jax.lax.pcast(x, missing, to="varying") if missing else x


def _block_logits(q: jax.Array, w_block: jax.Array, bias_block: jax.Array, s: jax.Array,
                  cosine: bool) -> jax.Array:
    """``[b, block]`` float32 ``s * q . norm(w_j) + bias_j``."""
    w_block = w_block.astype(jnp.float32)
    if cosine:
        w_block = l2_normalize(w_block)
    logits = jnp.einsum("bd,vd->bv", q, w_block, precision=jax.lax.Precision.HIGHEST)
    return s * logits + bias_block.astype(jnp.float32)[None, :]


def _block_rows(k: jax.Array, block: int, rows: int,
                limit: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Block ``k``'s first row, rows and which it counts (a last block shifted back to end
    at the last row counts no row twice; none at or beyond ``limit``)."""
    start = jnp.minimum(k * block, rows - block)
    row = start + jnp.arange(block)
    return start, row, (row >= k * block) & (row < limit)


def _finite_or_zero(x: jax.Array) -> jax.Array:
    return jnp.where(jnp.isfinite(x), x, 0.0)


def _all_varying_axes(*xs: jax.Array) -> tuple[str, ...]:
    return tuple(sorted({a for x in xs for a in _varying_axes(x)}))


def _sum_to_type_of(g: jax.Array, primal: jax.Array) -> jax.Array:
    """``psum`` over the axes ``g`` varies on and its primal does not."""
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
        total = total * jnp.exp(top - shift) + jnp.sum(jnp.exp(logits - shift[:, None]), axis=1)
        hit = (row[None, :] == local_t[:, None]) & counted[None, :]
        target = target + jnp.sum(jnp.where(hit, logits, 0.0), axis=1)
        return new_top, total, target

    zeros = _vary(jnp.zeros((b,), jnp.float32), _all_varying_axes(q, w, bias, s, limit, local_t))
    top, total, target = jax.lax.fori_loop(
        0, -(-rows // block), body, (zeros - jnp.inf, zeros, zeros))
    # log(0) = -inf: a shard without a counted row adds nothing in the cross-shard join.
    return jnp.log(total) + _finite_or_zero(top), target, top


@functools.partial(jax.custom_vjp, nondiff_argnums=(6, 7, 8))
def _tiled_shard_logsumexp(q: jax.Array, w: jax.Array, bias: jax.Array, s: jax.Array,
                           limit: jax.Array, local_t: jax.Array, block: int,
                           cosine: bool, table_grad: bool
                           ) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Shard-local ``(lse, target, top)`` ``[b]`` of ``z = s * q . norm(w) + bias`` over
    blocks of ``w`` rows below ``limit``; ``local_t`` -1 off this shard. The backward
    recomputes each block and pulls ``g_lse * softmax + g_target * onehot`` back."""
    return _tiled_forward(q, w, bias, s, limit, local_t, block, cosine)


def _tiled_fwd(q, w, bias, s, limit, local_t, block, cosine, table_grad):
    out = _tiled_forward(q, w, bias, s, limit, local_t, block, cosine)
    return out, (q, w, bias, s, limit, local_t, out[0])


def _tiled_bwd(block, cosine, table_grad, residuals, cotangents):
    q, w, bias, s, limit, local_t, lse = residuals
    g_lse, g_target, _ = cotangents  # the max is used under stop_gradient only
    rows = w.shape[0]
    lse = _finite_or_zero(lse)
    # Table gradients are summed over data per block: no second table-sized buffer.
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


def vocab_parallel_logsumexp(queries: jax.Array, table: jax.Array, targets: jax.Array,
                             mesh: jax.sharding.Mesh, scale: float | jax.Array = 1.0, *,
                             bias: jax.Array | None = None, cosine: bool = True,
                             num_classes: int | None = None, data_axis: str = "data",
                             model_axis: str = "model", block_size: int = 0,
                             table_gradient: bool = True) -> VocabParallelStats:
    """:class:`VocabParallelStats` of ``z_ij = scale * cos(q_i, w_j) + bias_j`` (dot without
    ``cosine``), ``[b, d]`` queries sharded over ``data_axis``, ``[V, d]`` table over
    ``model_axis``; rows from ``num_classes`` on are padding; ``block_size`` rows per tile
    (0: untiled); ``table_gradient=False``: zero cotangent for ``table``.
    Raises: ValueError: shapes disagree, ``b`` / ``V`` are not divisible by the axis sizes,
    or ``block_size < 0``."""
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
        # pmax has no transpose rule: stop the gradient first (any finite shift will do).
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
    return sharded(queries, table, bias, targets.astype(jnp.int32), jnp.asarray(scale, jnp.float32))


def vocab_parallel_softmax_cross_entropy(queries: jax.Array, table: jax.Array, targets: jax.Array,
                                         mesh: jax.sharding.Mesh, scale: float | jax.Array, *,
                                         cosine: bool = True, num_classes: int | None = None,
                                         data_axis: str = "data", model_axis: str = "model",
                                         block_size: int = 0) -> jax.Array:
    """``[b]`` float32 ``logsumexp_j(z_ij) - z_{i, t_i}`` of :func:`vocab_parallel_logsumexp`
    (same args; ``optax.softmax_cross_entropy_with_integer_labels`` without dense logits)."""
    stats = vocab_parallel_logsumexp(queries, table, targets, mesh, scale, cosine=cosine,
                                     num_classes=num_classes, data_axis=data_axis,
                                     model_axis=model_axis, block_size=block_size)
    return stats.logsumexp - stats.target_logit
