"""Merged top-k and exact ranks of a row-sharded table's rows, scored where they lie
(``docs/architecture.md``, "Several processes"); padding rows never rank."""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

# (queries [n, d], rows [r, d], row_args sliced like the rows, replicated consts)
# -> [n, r] float32 scores, higher = better.
ScoreFn = Callable[[jax.Array, jax.Array, tuple, tuple], jax.Array]

P = PartitionSpec


def table_mesh(table: Any, data_axis: str = "data", model_axis: str = "model") -> Mesh:
    """The table's mesh, else a 1 x 1 mesh of its device. Raises ValueError: other axes."""
    sharding = getattr(table, "sharding", None)
    if isinstance(sharding, NamedSharding):
        mesh = sharding.mesh
        if not isinstance(mesh, Mesh) or {data_axis, model_axis} - set(mesh.axis_names):
            raise ValueError(f"table on mesh axes {mesh.axis_names}; ranking needs "
                             f"{(data_axis, model_axis)}")
        return mesh
    devices = sorted(sharding.device_set, key=lambda d: d.id) if sharding is not None \
        else jax.devices()[:1]
    return Mesh(np.asarray(devices[:1]).reshape(1, 1), (data_axis, model_axis))


def _check(queries, table, num_rows: int, mesh: Mesh, model_axis: str) -> tuple[int, int]:
    if queries.ndim != 2 or table.ndim != 2 or queries.shape[1] != table.shape[1]:
        raise ValueError(f"queries must be [n, d] and table [rows, d]; got {queries.shape} "
                         f"and {table.shape}")
    rows, shards = table.shape[0], mesh.shape[model_axis]
    if rows % shards:
        raise ValueError(f"table rows {rows} are not divisible by mesh axis {model_axis!r} = "
                         f"{shards}; pad the table to a multiple")
    if not 0 < num_rows <= rows:
        raise ValueError(f"num_rows={num_rows} must lie in [1, {rows}]")
    return rows // shards, shards


def _pad_queries(queries, mesh: Mesh, data_axis: str, extra: Sequence = ()) -> tuple:
    # Host inputs stay numpy (replicated on a multi-process mesh); padded rows list -1.
    xp = jnp if isinstance(queries, jax.Array) else np
    queries = xp.asarray(queries, xp.float32)
    extra = [xp.asarray(x, xp.int32) for x in extra]
    pad = -queries.shape[0] % mesh.shape[data_axis]
    if not pad:
        return (queries, *extra)
    return (xp.pad(queries, ((0, pad), (0, 0))),
            *(xp.pad(x, ((0, pad), (0, 0)), constant_values=-1) for x in extra))


def _host_consts(consts: tuple) -> tuple:
    # As numpy: they may live on other devices than the table.
    return tuple(np.asarray(jax.device_get(c)) for c in consts)


def _block_size(row_block: int, per_shard: int, least: int = 1) -> int:
    if isinstance(row_block, bool) or int(row_block) != row_block or row_block < 0:
        raise ValueError(f"row_block must be an int >= 0 (0 = a whole shard), got {row_block!r}")
    return per_shard if not row_block else min(per_shard, max(int(row_block), least))


def _block_scores(score_fn, q, w, row_args, consts, num_rows, per_shard, block, i, model_axis):
    """``[n, block]`` scores of block ``i`` (clamped into the shard; rows of an earlier
    block and padding ``-inf``) and its rows' global indices."""
    begin = jnp.minimum(i * block, per_shard - block)
    rows = jax.lax.dynamic_slice_in_dim(w, begin, block, 0)
    args = tuple(jax.lax.dynamic_slice_in_dim(a, begin, block, 0) for a in row_args)
    s = score_fn(q, rows, args, consts).astype(jnp.float32)
    local = begin + jnp.arange(block)
    column = jax.lax.axis_index(model_axis) * per_shard + local
    keep = (local >= i * block) & (column < num_rows)
    return jnp.where(keep[None, :], s, -jnp.inf), column


def top_k(score_fn: ScoreFn, queries: jax.Array, table: jax.Array, k: int, *,
          num_rows: int | None = None, row_args: tuple = (), consts: tuple = (),
          mesh: Mesh | None = None, data_axis: str = "data",
          model_axis: str = "model", row_block: int = 0) -> tuple[jax.Array, jax.Array]:
    """``(scores [n, k] float32, rows [n, k] int32)``: ``lax.top_k`` of the whole score
    matrix (ties: lower row first) from each shard's running top k over ``row_block`` rows.
    Raises: ValueError: shapes, ``k`` or ``num_rows`` out of range, rows not divisible."""
    mesh = mesh or table_mesh(table, data_axis, model_axis)
    num_rows = int(table.shape[0] if num_rows is None else num_rows)
    per_shard, _ = _check(queries, table, num_rows, mesh, model_axis)
    if isinstance(k, bool) or int(k) != k or not 1 <= k <= num_rows:
        raise ValueError(f"k must be an int in [1, {num_rows}], got {k!r}")
    n = queries.shape[0]
    (q,) = _pad_queries(queries, mesh, data_axis)
    block = _block_size(row_block, per_shard, min(int(k), per_shard))
    fn = _top_k_fn(score_fn, int(k), num_rows, per_shard, block, mesh, data_axis, model_axis,
                   len(row_args), len(consts))
    scores, rows = fn(q, table, tuple(row_args), _host_consts(consts))
    return scores[:n], rows[:n]


@functools.lru_cache(maxsize=32)
def _top_k_fn(score_fn, k, num_rows, per_shard, block, mesh, data_axis, model_axis, n_args,
              n_consts):
    local_k = min(k, per_shard)

    def local(q, w, row_args, consts):
        def best(i, carry=None):
            s, column = _block_scores(score_fn, q, w, row_args, consts, num_rows, per_shard,
                                      block, i, model_axis)
            values, where = jax.lax.top_k(s, min(local_k, block))
            index = column[where]
            if carry is not None:  # earlier (lower) rows first: ties keep the lower row
                values = jnp.concatenate([carry[0], values], axis=1)
                index = jnp.concatenate([carry[1], index], axis=1)
                values, where = jax.lax.top_k(values, local_k)
                index = jnp.take_along_axis(index, where, axis=1)
            return values, index

        values, index = jax.lax.fori_loop(1, -(-per_shard // block), best, best(0))
        # Shards in mesh order: at equal scores the lower row comes first after the merge.
        values = jax.lax.all_gather(values, model_axis, axis=1, tiled=True)
        index = jax.lax.all_gather(index, model_axis, axis=1, tiled=True)
        best, where = jax.lax.top_k(values, k)
        return best, jnp.take_along_axis(index, where, axis=1).astype(jnp.int32)

    sharded = jax.shard_map(
        local, mesh=mesh,
        in_specs=(P(data_axis, None), P(model_axis, None), (P(model_axis),) * n_args,
                  (P(),) * n_consts),
        out_specs=(P(data_axis, None), P(data_axis, None)), check_vma=False)
    return jax.jit(sharded)


def relevant_counts(score_fn: ScoreFn, queries: jax.Array, table: jax.Array,
                    relevant: np.ndarray, *, num_rows: int | None = None,
                    row_args: tuple = (), consts: tuple = (), mesh: Mesh | None = None,
                    data_axis: str = "data", model_axis: str = "model", row_block: int = 0
                    ) -> tuple[np.ndarray, np.ndarray]:
    """``(scores [n, R] float32, at_least [n, R] int64)``: each of ``relevant`` ``[n, R]``
    rows' (-1: none) score and the real rows scoring ``>=`` it; arguments as :func:`top_k`.
    Raises: ValueError: shapes, a relevant row out of range or repeated in a query."""
    mesh = mesh or table_mesh(table, data_axis, model_axis)
    num_rows = int(table.shape[0] if num_rows is None else num_rows)
    per_shard, _ = _check(queries, table, num_rows, mesh, model_axis)
    relevant = np.asarray(relevant)
    if relevant.ndim != 2 or relevant.shape[0] != queries.shape[0] or relevant.shape[1] < 1:
        raise ValueError(f"relevant must be [{queries.shape[0]}, R >= 1], got {relevant.shape}")
    if ((relevant < -1) | (relevant >= num_rows)).any():
        raise ValueError(f"relevant rows must lie in [0, {num_rows}) (or -1 = none)")
    ordered = np.sort(relevant, axis=1)
    if ((ordered[:, 1:] == ordered[:, :-1]) & (ordered[:, 1:] >= 0)).any():
        raise ValueError("a query lists the same relevant row twice")
    n = queries.shape[0]
    q, rel = _pad_queries(queries, mesh, data_axis, (relevant,))
    fn = _counts_fn(score_fn, num_rows, per_shard, _block_size(row_block, per_shard), mesh,
                    data_axis, model_axis, len(row_args), len(consts))
    scores, at_least = fn(q, table, rel, tuple(row_args), _host_consts(consts))
    return (np.asarray(scores, np.float32)[:n], np.asarray(at_least, np.int64)[:n])


@functools.lru_cache(maxsize=32)
def _counts_fn(score_fn, num_rows, per_shard, block, mesh, data_axis, model_axis, n_args,
               n_consts):
    steps = -(-per_shard // block)

    def local(q, w, rel, row_args, consts):
        def scores(i):
            return _block_scores(score_fn, q, w, row_args, consts, num_rows, per_shard, block,
                                 i, model_axis)

        def pick(i, target):
            s, column = scores(i)
            here = rel - column[0]
            # Only the block's rows not scored by an earlier block.
            fresh = i * block - jnp.minimum(i * block, per_shard - block)
            mine = (rel >= 0) & (here >= fresh) & (here < block)
            picked = jnp.take_along_axis(s, jnp.clip(here, 0, block - 1), axis=1)
            return target + jnp.where(mine, picked, 0.0)

        target = jax.lax.fori_loop(0, steps, pick, jnp.zeros(rel.shape, jnp.float32))
        target = jax.lax.psum(target, model_axis)  # [n, R]

        def count(i, counts):
            s, _ = scores(i)
            # One relevant column at a time: [n, block] compared, never [n, R, block].
            return counts + jax.lax.map(
                lambda t: jnp.sum(s >= t[:, None], axis=1, dtype=jnp.int32), target.T).T

        counts = jax.lax.fori_loop(0, steps, count, jnp.zeros(rel.shape, jnp.int32))
        return target, jax.lax.psum(counts, model_axis)

    sharded = jax.shard_map(
        local, mesh=mesh,
        in_specs=(P(data_axis, None), P(model_axis, None), P(data_axis, None),
                  (P(model_axis),) * n_args, (P(),) * n_consts),
        out_specs=(P(data_axis, None), P(data_axis, None)), check_vma=False)
    return jax.jit(sharded)


def ranks_from_counts(relevant: np.ndarray, scores: np.ndarray, at_least: np.ndarray
                      ) -> tuple[np.ndarray, np.ndarray]:
    """``metrics.ranks_of_relevant``'s ``(query, rank)`` from :func:`relevant_counts`:
    ``rank_j = j + 1 + (at_least - #{relevant rows scoring >= it})``."""
    relevant = np.asarray(relevant)
    valid = relevant >= 0
    query, col = np.nonzero(valid)
    s = np.where(valid, scores, -np.inf)
    pair = s[query, col]
    # Relevant rows of the same query scoring at least as high (itself included).
    higher = np.sum(s[query] >= pair[:, None], axis=1)
    ahead = at_least[query, col] - higher
    # j: position among the query's relevant rows by descending score (ties in any order).
    by_score = np.lexsort((-pair, query))
    per_query = np.bincount(query, minlength=relevant.shape[0])
    first = np.cumsum(per_query) - per_query
    j = np.empty(query.size, dtype=np.int64)
    j[by_score] = np.arange(query.size) - first[query[by_score]]
    rank = j + 1 + ahead
    order = np.lexsort((rank, query))
    return query[order].astype(np.int64), rank[order].astype(np.int64)
