"""Batches beyond device memory: GradCache (Gao et al. 2021, ``dL/dp = dL/dp|_E +
J_E(p)^T dL/dE``), per-example dropout and gradient accumulation (``docs/architecture.md``,
"Batches beyond device memory"). Chunk k of ``[D*L]`` rows is ``[D, n, C][:, k, :]``."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax.sharding import Mesh, NamedSharding, PartitionSpec

# (params, batch rows, global row indices [n] int32, step key) -> pytree of [n, ...].
EmbedFn = Callable[[Any, Mapping[str, jax.Array], jax.Array, jax.Array], Any]
# (params, embeddings of the whole global batch, global batch, step key) -> (loss, metrics).
EmbeddingLossFn = Callable[[Any, Any, Mapping[str, jax.Array], jax.Array], tuple[jax.Array, dict]]
# (params, batch, step key) -> ((loss, metrics), grads): jax.value_and_grad(has_aux=True)'s form.
ValueAndGradFn = Callable[[Any, Mapping[str, jax.Array], jax.Array],
                          tuple[tuple[jax.Array, dict], Any]]


@dataclasses.dataclass(frozen=True)
class ContrastiveLoss:
    """A loss split at its embeddings (a ``Task.loss_fn``); ``embed``'s row i depends on
    row i, its global index and the key only."""

    embed: EmbedFn
    loss: EmbeddingLossFn

    def __call__(self, params: Any, batch: Mapping[str, jax.Array], rng: jax.Array
                 ) -> tuple[jax.Array, dict]:
        rows = row_indices(batch_rows(batch))
        return self.loss(params, self.embed(params, batch, rows, rng), batch, rng)


@dataclasses.dataclass(frozen=True)
class GradAccumulation:
    """Micro-batch ``weight`` (``metrics -> float32``; ``None``: equal) and the ``summed``
    metrics (the others are averaged) of ``config.grad_accum_steps``."""

    weight: Callable[[Mapping[str, jax.Array]], jax.Array] | None = None
    summed: tuple[str, ...] = ()


def batch_rows(batch: Mapping[str, Any]) -> int:
    """The leading dimension every array leaf shares. Raises ValueError."""
    sizes = {int(x.shape[0]) for x in jax.tree.leaves(batch) if jnp.ndim(x) >= 1}
    if len(sizes) != 1:
        raise ValueError(f"a contrastive batch needs one leading (row) dimension shared by "
                         f"every entry; got sizes {sorted(sizes)}")
    return sizes.pop()


def row_indices(n: int) -> jax.Array:
    """``[n]`` int32 global row indices."""
    return jnp.arange(n, dtype=jnp.int32)


def _context_data() -> bool:
    return "data" in (jax.sharding.get_abstract_mesh().axis_names or ())


def _data_size(mesh: Mesh | None) -> int:
    # The given mesh, else the one jax.set_mesh made current (the train step's), else one.
    if mesh is not None:
        return int(mesh.shape["data"])
    return int(jax.sharding.get_abstract_mesh().shape["data"]) if _context_data() else 1


def check_split(field: str, parts_or_size: int, rows: int, mesh: Mesh, *,
                chunk: bool, what: str = "batch_size") -> None:
    """Raises ValueError (the field, the per-device batch, the mesh) where ``parts_or_size``
    (rows per chunk when ``chunk``, else parts) does not split each device's rows evenly."""
    data = _data_size(mesh)
    per_device = rows // data
    shape = f"mesh data={data}, model={mesh.shape['model']}"
    if rows % data:
        return  # parallel.check_global_batch reports this one
    if parts_or_size < 1 or per_device % parts_or_size:
        divisors = [d for d in range(1, per_device + 1) if per_device % d == 0]
        kind = "rows per device in each chunk" if chunk else "micro-batches"
        raise ValueError(
            f"config.{field}={parts_or_size} ({kind}) does not divide the per-device batch "
            f"{per_device} ({what}={rows} over {shape}); use one of {divisors[:12]}")


def split_rows(tree: Any, parts: int, mesh: Mesh | None) -> Any:
    """Each leaf ``[N, ...]`` -> ``[parts, N/parts, ...]``, part k ``[D, parts, c][:, k]``.
    Raises ValueError: ``N`` not divisible by ``D * parts``."""
    data = _data_size(mesh)

    def split(x):
        n = x.shape[0]
        if n % (data * parts):
            raise ValueError(f"{n} rows cannot be cut into {parts} parts per device over "
                             f"{data} data devices")
        c = n // (data * parts)
        y = x.reshape(data, parts, c, *x.shape[1:]).swapaxes(0, 1)
        return _constrain(y.reshape(parts, data * c, *x.shape[1:]), mesh, 1)

    return jax.tree.map(split, tree)


def merge_rows(tree: Any, mesh: Mesh | None) -> Any:
    """Inverse of :func:`split_rows`: ``[parts, D*c, ...]`` -> ``[D*parts*c, ...]``."""
    data = _data_size(mesh)

    def merge(y):
        parts, dc = y.shape[:2]
        c = dc // data
        x = y.reshape(parts, data, c, *y.shape[2:]).swapaxes(0, 1)
        return _constrain(x.reshape(data * parts * c, *y.shape[2:]), mesh, 0)

    return jax.tree.map(merge, tree)


def _constrain(x: jax.Array, mesh: Mesh | None, axis: int) -> jax.Array:
    # Rows over "data": propagation through the reshapes may pick a replicated layout.
    spec = PartitionSpec(*([None] * axis), "data")
    if mesh is not None:
        return jax.lax.with_sharding_constraint(x, NamedSharding(mesh, spec))
    return jax.lax.with_sharding_constraint(x, spec) if _context_data() else x


def gather_keys(tree: Any, rows: int, chunk_size: int, mesh: Mesh | None = None) -> Any:
    """``tree`` (the keys of :func:`map_rows`' query chunks) replicated once, not in every
    iteration (``docs/performance.md``, "TPU compiler"); a no-op where no loop runs."""
    if chunk_size <= 0 or (mesh is None and not _context_data()):
        return tree
    if rows // (_data_size(mesh) * chunk_size) <= 1:
        return tree
    spec = PartitionSpec()
    where = NamedSharding(mesh, spec) if mesh is not None else spec
    return jax.tree.map(lambda x: jax.lax.with_sharding_constraint(x, where), tree)


def map_rows(fn: Callable[[Any], Any], rows: Any, chunk_size: int, mesh: Mesh | None = None) -> Any:
    """``fn(rows)`` over chunks of ``chunk_size`` rows per data device (0: at once), each
    recomputed in the backward. Raises ValueError: ``chunk_size`` does not divide."""
    if chunk_size <= 0:
        return fn(rows)
    n, data = batch_rows(rows), _data_size(mesh)
    if n % (data * chunk_size):
        raise ValueError(f"chunk size {chunk_size} does not divide the per-device rows "
                         f"{n / data:g} ({n} rows over {data} data devices)")
    parts = n // (data * chunk_size)
    if parts == 1:
        return fn(rows)
    return merge_rows(jax.lax.map(jax.checkpoint(fn), split_rows(rows, parts, mesh)), mesh)


def per_example(apply: Callable[[Any, jax.Array | None], Any], dropout: bool
                ) -> Callable[[Any, jax.Array, jax.Array], Any]:
    """``(inputs, rows, key) -> apply(inputs, key)`` with each example's dropout key
    ``fold_in(key, row)`` (``jax.vmap``); ``key=None`` is deterministic."""

    def embed(inputs: Any, rows: jax.Array, key: jax.Array) -> Any:
        if not dropout:
            return apply(inputs, None)

        def one(x, row):
            out = apply(jax.tree.map(lambda a: a[None], x), jax.random.fold_in(key, row))
            return jax.tree.map(lambda a: a[0], out)

        rules = tuple((name, None if name == "batch" else axis)
                      for name, axis in nn.get_logical_axis_rules())
        mesh = jax.sharding.get_abstract_mesh()
        spmd = "data" if "data" in (mesh.axis_names or ()) else None
        with nn.logical_axis_rules(rules):
            return jax.vmap(one, spmd_axis_name=spmd)(inputs, rows)

    return embed


def chunked_value_and_grad(loss: ContrastiveLoss, chunk_size: int, mesh: Mesh | None,
                           param_shardings: Any = None) -> ValueAndGradFn:
    """``jax.value_and_grad(loss, has_aux=True)`` up to summation order, with the
    activations of ``chunk_size`` rows per device at a time. Raises ValueError (trace)."""
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")

    def value_and_grad(params, batch, rng):
        n = batch_rows(batch)
        data = _data_size(mesh)
        if n % (data * chunk_size):
            raise ValueError(f"contrastive_chunk_size={chunk_size} does not divide the "
                             f"per-device batch {n / data:g} ({n} rows over {data} devices)")
        parts = n // (data * chunk_size)
        chunks = split_rows((batch, row_indices(n)), parts, mesh)

        def embed_chunk(xs):
            rows_batch, rows = xs
            return jax.lax.stop_gradient(loss.embed(params, rows_batch, rows, rng))

        embeddings = merge_rows(jax.lax.map(embed_chunk, chunks), mesh)
        (value, metrics), (direct, d_embeddings) = jax.value_and_grad(
            loss.loss, argnums=(0, 1), has_aux=True)(params, embeddings, batch, rng)
        cotangents = split_rows(d_embeddings, parts, mesh)

        def backward_chunk(acc, xs):
            (rows_batch, rows), cotangent = xs
            _, vjp = jax.vjp(lambda p: loss.embed(p, rows_batch, rows, rng), params)
            return _keep(jax.tree.map(jnp.add, acc, vjp(cotangent)[0]), param_shardings), None

        grads, _ = jax.lax.scan(backward_chunk, _keep(direct, param_shardings),
                                (chunks, cotangents))
        return (value, metrics), grads

    return value_and_grad


def accumulated_value_and_grad(
    loss_fn: Callable[[Any, Mapping[str, jax.Array], jax.Array], tuple[jax.Array, dict]],
    steps: int, mesh: Mesh | None, accumulation: GradAccumulation | None = None,
    param_shardings: Any = None,
) -> ValueAndGradFn:
    """``sum_k w_k grad_k / sum_k w_k`` (and loss) over ``steps`` micro-batches, key
    ``fold_in(rng, k)``, ``w_k = accumulation.weight(metrics_k)``. Raises ValueError (trace)."""
    weight = accumulation.weight if accumulation is not None else None

    def value_and_grad(params, batch, rng):
        micro = split_rows(batch, steps, mesh)

        def body(carry, xs):
            k, micro_batch = xs
            (value, metrics), grads = jax.value_and_grad(loss_fn, has_aux=True)(
                params, micro_batch, jax.random.fold_in(rng, k))
            w = jnp.float32(1.0) if weight is None else jax.lax.stop_gradient(
                jnp.asarray(weight(metrics), jnp.float32))
            acc, total, weights = carry
            acc = _keep(jax.tree.map(lambda a, g: a + w * g, acc, grads), param_shardings)
            return (acc, total + w * value, weights + w), metrics

        zeros = _keep(jax.tree.map(jnp.zeros_like, params), param_shardings)
        init = (zeros, jnp.float32(0.0), jnp.float32(0.0))
        (acc, total, weights), metrics = jax.lax.scan(
            body, init, (jnp.arange(steps, dtype=jnp.int32), micro))
        inv = jnp.where(weights > 0, 1.0 / jnp.where(weights > 0, weights, 1.0), 0.0)
        grads = jax.tree.map(lambda a: (a * inv).astype(a.dtype), acc)
        summed = accumulation.summed if accumulation is not None else ()
        metrics = {k: jnp.sum(m, axis=0) if k in summed else jnp.mean(m, axis=0)
                   for k, m in metrics.items()}
        return (total * inv, metrics), grads

    return value_and_grad


def _keep(tree: Any, shardings: Any) -> Any:
    # Scan-carry accumulators pinned to the params' shardings (propagation may replicate).
    if shardings is None:
        return tree
    return jax.tree.map(jax.lax.with_sharding_constraint, tree, shardings)


@dataclasses.dataclass(frozen=True)
class StepSplit:
    """A step's split of each device's rows: GradCache ``chunk_size``, ``accum_steps``
    micro-batches, ``loss_chunk`` query rows scored at a time (0 = off)."""

    chunk_size: int = 0
    accum_steps: int = 1
    loss_chunk: int = 0

    @classmethod
    def from_config(cls, config: Any) -> StepSplit:
        """Raises ValueError: both chunking and accumulation set."""
        split = cls(int(config.contrastive_chunk_size), int(config.grad_accum_steps),
                    int(config.get("loss_chunk_size", 0)))
        if split.chunk_size > 0 and split.accum_steps > 1:
            raise ValueError(f"config.contrastive_chunk_size={split.chunk_size} and "
                             f"config.grad_accum_steps={split.accum_steps}: set one of them "
                             "(chunking already bounds the memory)")
        return split

    def check(self, rows: int, mesh: Mesh) -> None:
        """Raises ValueError (:func:`check_split`)."""
        if self.chunk_size > 0:
            check_split("contrastive_chunk_size", self.chunk_size, rows, mesh, chunk=True)
        if self.accum_steps > 1:
            check_split("grad_accum_steps", self.accum_steps, rows, mesh, chunk=False)
        if self.loss_chunk > 0:
            check_split("loss_chunk_size", self.loss_chunk, rows, mesh, chunk=True)

    def check_task(self, name: str, loss_fn: Any, accumulation: GradAccumulation | None
                   ) -> None:
        """Raises ValueError: chunking a loss that is no :class:`ContrastiveLoss`, or
        accumulating a task without ``accumulation``."""
        if self.chunk_size > 0 and not isinstance(loss_fn, ContrastiveLoss):
            raise ValueError(
                f"config.contrastive_chunk_size={self.chunk_size}: {name}'s loss is not split "
                "at its embeddings (a contrastive.ContrastiveLoss: DualCSE, SimCSE, "
                "DocEnt-Dual), so it cannot be chunked; set it to 0"
                + (" (grad_accum_steps bounds its memory)" if accumulation else ""))
        if self.accum_steps > 1 and accumulation is None:
            hint = ("its in-batch loss would lose negatives: use contrastive_chunk_size instead"
                    if isinstance(loss_fn, ContrastiveLoss) else "set it to 1")
            raise ValueError(f"config.grad_accum_steps={self.accum_steps}: {name} does not "
                             f"accumulate gradients; {hint}")

    def value_and_grad(self, loss_fn: Any, accumulation: GradAccumulation | None,
                       mesh: Mesh, param_shardings: Any = None) -> ValueAndGradFn | None:
        """Chunked, accumulated or ``None`` (the plain gradient)."""
        if self.chunk_size > 0:
            return chunked_value_and_grad(loss_fn, self.chunk_size, mesh, param_shardings)
        if self.accum_steps > 1:
            return accumulated_value_and_grad(loss_fn, self.accum_steps, mesh, accumulation,
                                              param_shardings)
        return None
