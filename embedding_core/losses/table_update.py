"""The optimizer step of a row-sharded softmax table, block by block, without its
``[V / model, d]`` gradient (``docs/docent.md``, "Fused table update"):
``dL/dw_j = sum_i c_i (p_ij - [t_i = j]) dz_ij/dw_j``, ``p_ij = exp(z_ij - lse_i)``."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from embedding_core.losses.losses import l2_normalize
from embedding_core.losses.vocab_softmax import _block_logits, _block_rows

TABLE_STATS = "table_softmax_stats"  # metrics key; the train step removes it

_TABLE, _PARAM, _OTHER = "table", "param", "other"


class SoftmaxTableStats(NamedTuple):
    """Per query, gradients stopped: ``[b, d]`` float32 queries, ``[b]`` int32 targets,
    ``[b]`` float32 ``c_i = dL/dce_i`` and log-partitions, the float32 scalar scale ``s``."""

    queries: jax.Array
    targets: jax.Array
    weights: jax.Array
    logsumexp: jax.Array
    scale: jax.Array


def softmax_table_stats(queries: jax.Array, targets: jax.Array, weights: jax.Array,
                        logsumexp: jax.Array, scale: jax.Array | float) -> SoftmaxTableStats:
    """:class:`SoftmaxTableStats` from a loss's values, cast and with gradients stopped."""
    cast = (jnp.float32, jnp.int32, jnp.float32, jnp.float32, jnp.float32)
    values = (queries, targets, weights, logsumexp, scale)
    return SoftmaxTableStats(*(jax.lax.stop_gradient(jnp.asarray(x, dtype))
                               for x, dtype in zip(values, cast, strict=True)))


def block_table_gradient(q: jax.Array, w_block: jax.Array, logsumexp: jax.Array,
                         local_targets: jax.Array, weights: jax.Array, scale: jax.Array,
                         rows: jax.Array, counted: jax.Array, cosine: bool) -> jax.Array:
    """``[block, d]`` float32 gradient of ``sum_i c_i ce_i`` for rows ``[block]`` of
    ``w_block`` (``counted`` False: padding)."""
    zero_bias = jnp.zeros(w_block.shape[:1], jnp.float32)
    logits, pullback = jax.vjp(lambda w: _block_logits(q, w, zero_bias, scale, cosine), w_block)
    prob = jnp.where(counted[None, :], jnp.exp(logits - logsumexp[:, None]), 0.0)
    hit = (rows[None, :] == local_targets[:, None]) & counted[None, :]
    g_logits = weights[:, None] * prob - jnp.where(hit, weights[:, None], 0.0)
    return pullback(g_logits)[0].astype(jnp.float32)


def _empty_like(shape: Sequence[int], dtype) -> jax.Array:
    if not shape:
        return jnp.zeros((), dtype)
    return jnp.zeros((0, *shape[1:]), dtype)


def _key_name(key: Any) -> Any:
    for attr in ("key", "name", "idx"):
        if hasattr(key, attr):
            return getattr(key, attr)
    return str(key)


def _clip(t: jax.Array, norm: jax.Array, max_norm: float | None) -> jax.Array:
    # optax.clip_by_global_norm's own formula, with the norm of the whole gradient.
    if max_norm is None:
        return t
    return jax.lax.select(norm < max_norm, t, (t / norm.astype(t.dtype)) * max_norm)


@dataclasses.dataclass(frozen=True)
class FusedTableUpdate:
    """The step of the table at ``path`` for a ``tx`` that acts elementwise after a
    global-norm clip (``grad_clip_norm``: ``tx``'s; AdamW, SGD; not LAMB)."""

    path: tuple[str, ...]
    num_classes: int
    block_size: int
    cosine: bool = True
    grad_clip_norm: float | None = None
    data_axis: str = "data"
    model_axis: str = "model"

    def __post_init__(self):
        if int(self.block_size) < 1:
            raise ValueError(f"the fused table update needs block_size >= 1, got "
                             f"{self.block_size}")
        if int(self.num_classes) < 1:
            raise ValueError(f"num_classes must be >= 1, got {self.num_classes}")
        if self.grad_clip_norm is not None and not float(self.grad_clip_norm) > 0:
            raise ValueError(f"grad_clip_norm must be > 0 or None, got {self.grad_clip_norm}")

    def check_sharding(self, param_shardings: Any) -> None:
        """Raises ValueError unless the table is split by rows over ``model_axis`` alone."""
        sharding = self._table_leaf(param_shardings)[1]
        spec = tuple(sharding.spec) if isinstance(sharding, NamedSharding) else None
        if spec is None or (spec + (None, None))[:2] != (self.model_axis, None) or any(spec[2:]):
            raise ValueError(
                f"the fused table update needs the table {'/'.join(self.path)} split by rows "
                f"over {self.model_axis!r} alone, got {sharding}; map its row axis to "
                f"{self.model_axis!r} and its width to None in the logical axis rules")

    def _table_leaf(self, tree: Any) -> tuple[int, Any]:
        leaves = jax.tree_util.tree_flatten_with_path(tree)[0]
        for index, (path, leaf) in enumerate(leaves):
            if tuple(_key_name(k) for k in path) == tuple(self.path):
                return index, leaf
        raise ValueError(f"no parameter {'/'.join(self.path)} to update in place; the "
                         f"parameters are {[jax.tree_util.keystr(p) for p, _ in leaves][:8]}")

    def _state_roles(self, tx: optax.GradientTransformation, opt_state: Any, params: Any,
                     table_index: int) -> list[str]:
        param_def = jax.tree.structure(params)
        marker = jax.tree.unflatten(param_def, [i == table_index
                                                for i in range(param_def.num_leaves)])
        try:
            roles = optax.tree_utils.tree_map_params(
                tx, lambda _, is_table: _TABLE if is_table else _PARAM, opt_state, marker,
                transform_non_params=lambda v: jax.tree.map(lambda _: _OTHER, v))
        except (TypeError, ValueError) as err:
            raise ValueError(f"the fused table update cannot read this optimizer's state "
                             f"layout ({err}); turn it off") from err
        leaves, state_def = jax.tree.flatten(opt_state)
        role_leaves, role_def = jax.tree.flatten(roles)
        if role_def != state_def:
            raise ValueError("the fused table update cannot read this optimizer's state "
                             "layout; turn it off")
        table = jax.tree.leaves(params)[table_index]
        for leaf, role in zip(leaves, role_leaves, strict=True):
            if role == _TABLE and tuple(leaf.shape) != tuple(table.shape):
                raise ValueError(f"the optimizer keeps a {tuple(leaf.shape)} state for the "
                                 f"{tuple(table.shape)} table (not elementwise, e.g. "
                                 "factored moments); the fused table update needs "
                                 "elementwise moments: turn it off")
        return role_leaves

    def apply_gradients(self, state: Any, grads: Any, stats: SoftmaxTableStats,
                        mesh: Mesh) -> tuple[Any, jax.Array]:
        """``(state.apply_gradients(grads), grad_norm before clipping)``, the table's
        gradient made block by block. Raises ValueError (trace): indivisible rows or
        batch, an optimizer state that is not elementwise."""
        tx, params = state.tx, state.params
        table_index, table = self._table_leaf(params)
        param_leaves, param_def = jax.tree.flatten(params)
        grad_leaves = param_def.flatten_up_to(grads)
        roles = self._state_roles(tx, state.opt_state, params, table_index)
        state_leaves, state_def = jax.tree.flatten(state.opt_state)
        rows, _ = table.shape
        n_data, n_model = mesh.shape[self.data_axis], mesh.shape[self.model_axis]
        if rows % n_model:
            raise ValueError(f"table rows {rows} are not divisible by mesh axis "
                             f"{self.model_axis!r} = {n_model}")
        if stats.queries.shape[0] % n_data:
            raise ValueError(f"batch {stats.queries.shape[0]} is not divisible by mesh axis "
                             f"{self.data_axis!r} = {n_data}")
        clip = None if self.grad_clip_norm is None else float(self.grad_clip_norm)

        rest_sq = sum((jnp.sum(jnp.square(g.astype(jnp.float32)))
                       for i, g in enumerate(grad_leaves) if i != table_index),
                      jnp.zeros((), jnp.float32))
        if clip is not None:
            norm = jnp.sqrt(self._blockwise(tx, param_leaves, param_def, table_index,
                                            state_leaves, state_def, roles, stats, mesh,
                                            rest_sq, None, update=False))
        else:
            norm = jnp.zeros((), jnp.float32)  # unused: nothing is clipped

        # Every parameter but the table: one tx.update on the view without it.
        empty_table = _empty_like(table.shape, table.dtype)
        rest_params = [empty_table if i == table_index else p for i, p in enumerate(param_leaves)]
        rest_grads = [empty_table if i == table_index else _clip(g, norm, clip)
                      for i, g in enumerate(grad_leaves)]
        rest_state = [_empty_like(leaf.shape, leaf.dtype) if role == _TABLE else leaf
                      for leaf, role in zip(state_leaves, roles, strict=True)]
        updates, new_rest_state = tx.update(jax.tree.unflatten(param_def, rest_grads),
                                            jax.tree.unflatten(state_def, rest_state),
                                            jax.tree.unflatten(param_def, rest_params))
        new_params = jax.tree.leaves(optax.apply_updates(
            jax.tree.unflatten(param_def, rest_params), updates))

        new_table, new_moments, total_sq = self._blockwise(
            tx, param_leaves, param_def, table_index, state_leaves, state_def, roles, stats,
            mesh, rest_sq, norm, update=True)
        grad_norm = jnp.sqrt(total_sq) if clip is None else norm
        new_params[table_index] = new_table
        moments = iter(new_moments)
        new_state_leaves = [next(moments) if role == _TABLE else leaf
                            for leaf, role in zip(jax.tree.leaves(new_rest_state), roles,
                                                  strict=True)]
        return state.replace(step=state.step + 1,
                             params=jax.tree.unflatten(param_def, new_params),
                             opt_state=jax.tree.unflatten(state_def, new_state_leaves)
                             ), grad_norm

    def _blockwise(self, tx, param_leaves, param_def, table_index, state_leaves, state_def,
                   roles, stats: SoftmaxTableStats, mesh: Mesh, rest_sq, norm, *,
                   update: bool):
        """One ``shard_map`` pass over the blocks: the squared gradient norm (from
        ``rest_sq``: after the backward, in place), with ``update`` the table and moments."""
        table = param_leaves[table_index]
        rows_per_shard = table.shape[0] // mesh.shape[self.model_axis]
        block = min(int(self.block_size), rows_per_shard)
        num_blocks = -(-rows_per_shard // block)
        param_shapes = [(tuple(p.shape), p.dtype) for p in param_leaves]
        state_shapes = [(tuple(s.shape), s.dtype) for s in state_leaves]
        moments = [s for s, role in zip(state_leaves, roles, strict=True) if role == _TABLE]
        others = [s for s, role in zip(state_leaves, roles, strict=True) if role == _OTHER]
        clip = None if self.grad_clip_norm is None else float(self.grad_clip_norm)
        model, data = self.model_axis, self.data_axis

        def shard(w, moments, others, q, t, c, lse, s, rest_sq, norm):
            offset = jax.lax.axis_index(model) * rows_per_shard
            limit = jnp.clip(self.num_classes - offset, 0, rows_per_shard).astype(jnp.int32)
            q = l2_normalize(q) if self.cosine else q
            local_t = t - offset
            local_t = jnp.where((local_t >= 0) & (local_t < limit), local_t, -1)

            def gradient(k, w):
                start, row, fresh = _block_rows(k, block, rows_per_shard, jnp.int32(rows_per_shard))
                w_block = jax.lax.dynamic_slice_in_dim(w, start, block)
                g = block_table_gradient(q, w_block, lse, local_t, c, s, row, row < limit,
                                         self.cosine)
                # Rows the shifted last block shares with the block before are done.
                return start, fresh, w_block, g, jnp.sum(jnp.where(fresh[:, None],
                                                                   jnp.square(g), 0.0))

            def norm_body(k, sq):
                return sq + gradient(k, w)[-1]

            def write(w, moments, done):
                start, blocks = done
                return (jax.lax.dynamic_update_slice_in_dim(w, blocks[0], start, axis=0),
                        [jax.lax.dynamic_update_slice_in_dim(m, b, start, axis=0)
                         for m, b in zip(moments, blocks[1:], strict=True)])

            def body(k, carry):
                # Block k's rows are written at step k + 1 from the carry: written where
                # computed, XLA would keep a copy of every buffer.
                w, moments = write(*carry[:2], carry[3])
                sq = carry[2]
                start, fresh, w_block, g, g_sq = gradient(k, w)
                old = [jax.lax.dynamic_slice_in_dim(m, start, block) for m in moments]
                sq = sq + g_sq
                g = _clip(g, norm, clip)
                view_params = [w_block if i == table_index else _empty_like(*shape)
                               for i, shape in enumerate(param_shapes)]
                view_grads = [g.astype(w.dtype) if i == table_index else _empty_like(*shape)
                              for i, shape in enumerate(param_shapes)]
                blocks, rest = iter(old), iter(others)
                view_state = [next(blocks) if role == _TABLE
                              else next(rest) if role == _OTHER else _empty_like(*shape)
                              for shape, role in zip(state_shapes, roles, strict=True)]
                updates, new_view = tx.update(jax.tree.unflatten(param_def, view_grads),
                                              jax.tree.unflatten(state_def, view_state),
                                              jax.tree.unflatten(param_def, view_params))
                new_block = optax.apply_updates(w_block, jax.tree.leaves(updates)[table_index])
                new_moments = [leaf for leaf, role in zip(jax.tree.leaves(new_view), roles,
                                                          strict=True) if role == _TABLE]
                # Rows the shifted last block shares with the block before keep their values.
                keep = fresh[:, None]
                done = [jnp.where(keep, new.astype(o.dtype), o) for new, o in
                        zip([new_block, *new_moments], [w_block, *old], strict=True)]
                return w, moments, sq, (start, done)

            sq = jnp.where(jax.lax.axis_index(model) == 0, rest_sq, 0.0)
            if not update:
                return jax.lax.psum(jax.lax.fori_loop(0, num_blocks, norm_body, sq), model)
            # Nothing written yet: the first step writes block 0's own values back.
            first = (jnp.int32(0), [jax.lax.dynamic_slice_in_dim(x, 0, block)
                                    for x in (w, *moments)])
            w, moments, sq, last = jax.lax.fori_loop(0, num_blocks, body, (w, moments, sq, first))
            w, moments = write(w, moments, last)
            return w, moments, jax.lax.psum(sq, model)

        rows_spec = P(model, None)
        in_specs = (rows_spec, [rows_spec] * len(moments), [P()] * len(others),
                    P(data, None), P(data), P(data), P(data), P(), P(), P())
        out_specs = (rows_spec, [rows_spec] * len(moments), P()) if update else P()
        norm = jnp.zeros((), jnp.float32) if norm is None else norm
        return jax.shard_map(shard, mesh=mesh, in_specs=in_specs, out_specs=out_specs)(
            table, moments, others, stats.queries, stats.targets, stats.weights,
            stats.logsumexp, stats.scale, rest_sq, norm)
