"""Train state, optimizer, sharded state creation and the jitted train step."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from etils import epath
from flax.training import train_state
from jax.sharding import Mesh

from embedding_core.distributed import parallel
from embedding_core.losses.table_update import TABLE_STATS, FusedTableUpdate
from embedding_core.storage import storage
from embedding_core.training import checkpoints

LossFn = Callable[[Any, Mapping[str, jax.Array], jax.Array], tuple[jax.Array, dict]]


class TrainState(train_state.TrainState):
    """``first_nonfinite_step``: int32, -1 while all is finite, else the first non-finite
    step (never saved; ``None``: off; ``docs/architecture.md``, "Stopping a run")."""

    first_nonfinite_step: Any = None


def check_workdir(workdir: str | os.PathLike) -> epath.Path:
    """``workdir`` as a path. Raises NotADirectoryError; ValueError: not a path or URI."""
    path = storage.as_path(workdir)
    if path.exists() and not path.is_dir():
        raise NotADirectoryError(f"--workdir {path} exists and is not a folder")
    return path


def learning_rate_schedule(
    peak: float, total_steps: int, warmup_steps: int, decay: str = "linear"
) -> optax.Schedule:
    """Linear warm-up to ``peak``, then ``linear`` (HF's), ``cosine`` or ``constant``.
    Raises ValueError: an unknown ``decay``."""
    warmup_steps = min(warmup_steps, max(total_steps - 1, 0))
    decay_steps = max(total_steps - warmup_steps, 1)
    if decay == "linear":
        after = optax.linear_schedule(peak, 0.0, decay_steps)
    elif decay == "cosine":
        after = optax.cosine_decay_schedule(peak, decay_steps)
    elif decay == "constant":
        after = optax.constant_schedule(peak)
    else:
        raise ValueError(f"unknown lr decay {decay!r}; use linear, cosine or constant")
    if warmup_steps == 0:
        return after
    return optax.join_schedules([optax.linear_schedule(0.0, peak, warmup_steps), after],
                                [warmup_steps])


def weight_decay_mask(params: Any) -> Any:
    """True for matrices, False for biases and LayerNorm parameters (HF's ``no_decay``)."""
    return jax.tree.map(lambda p: np.ndim(p) > 1, params)


def make_optimizer(*, learning_rate: float, total_steps: int, warmup_steps: int = 0,
                   weight_decay: float = 0.0, decay: str = "linear", b1: float = 0.9,
                   b2: float = 0.999, eps: float = 1e-8, grad_clip_norm: float | None = None
                   ) -> tuple[optax.GradientTransformation, optax.Schedule]:
    """AdamW (Loshchilov & Hutter 2019) with warm-up/decay; returns ``(optimizer, schedule)``."""
    schedule = learning_rate_schedule(learning_rate, total_steps, warmup_steps, decay)
    chain = []
    if grad_clip_norm:
        chain.append(optax.clip_by_global_norm(grad_clip_norm))
    chain.append(optax.adamw(schedule, b1=b1, b2=b2, eps=eps, weight_decay=weight_decay,
                             mask=weight_decay_mask))
    return optax.chain(*chain), schedule


def create_sharded_state(init_params: Callable[[jax.Array], Any], tx: optax.GradientTransformation,
                         mesh: Mesh, rng: jax.Array, *,
                         rules: parallel.LogicalRules = parallel.LOGICAL_AXIS_RULES,
                         pretrained: Mapping[str, Any] | None = None) -> tuple[TrainState, Any]:
    """``(state, state_shardings)`` built in place; ``pretrained``: ``{param path: numpy
    tree}`` replacing those subtrees. Raises ValueError: a pretrained tree that differs."""
    init_state = _state_initializer(init_params, tx)
    shardings = state_shardings(init_params, tx, mesh, rules)
    with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
        state = jax.jit(lambda k: nn.unbox(init_state(k)), out_shardings=shardings)(rng)
    if pretrained:
        params = state.params
        for path, tree in pretrained.items():
            params = _replace_subtree(params, shardings.params, tuple(path), tree)
        state = state.replace(params=params)
    return state, shardings


def _state_initializer(init_params, tx):
    def init_state(key):
        params = init_params(key)
        return TrainState(step=jnp.zeros((), jnp.int32), apply_fn=None, params=params,
                          tx=tx, opt_state=tx.init(params),
                          first_nonfinite_step=jnp.full((), -1, jnp.int32))

    return init_state


def state_shardings(init_params: Callable[[jax.Array], Any], tx: optax.GradientTransformation,
                    mesh: Mesh, rules: parallel.LogicalRules = parallel.LOGICAL_AXIS_RULES
                    ) -> Any:
    """Shardings of the train state (params and optimizer moments follow logical names)."""
    abstract = jax.eval_shape(_state_initializer(init_params, tx), jax.random.key(0))
    return parallel.logical_shardings(abstract, mesh, rules)



def restore_params(directory: str | os.PathLike, init_params: Callable[[jax.Array], Any],
                   mesh: Mesh, *, step: int | None = None,
                   rules: parallel.LogicalRules = parallel.LOGICAL_AXIS_RULES,
                   sizes: Mapping[str, int] | None = None) -> tuple[int, Any]:
    """:func:`checkpoints.restore_params` onto ``mesh`` (``init_params`` is only traced)."""
    boxed = jax.eval_shape(init_params, jax.random.key(0))
    shardings = parallel.logical_shardings(boxed, mesh, rules, sizes)
    abstract = nn.unbox(boxed)
    return checkpoints.restore_params(directory, checkpoints.abstract_like(abstract, shardings),
                                      step)


def _replace_subtree(params: Any, shardings: Any, path: tuple[str, ...], tree: Any) -> Any:
    name = "/".join(path)
    if not path:
        return _place_like(tree, params, shardings, name)
    if not isinstance(params, Mapping) or path[0] not in params:
        have = sorted(params) if isinstance(params, Mapping) else type(params).__name__
        raise ValueError(f"pretrained weights for {name!r}, but the model has {have} there")
    out = dict(params)
    out[path[0]] = _replace_subtree(params[path[0]], shardings[path[0]], path[1:], tree)
    return out


def _place_like(tree: Any, like: Any, shardings: Any, name: str) -> Any:
    want = jax.tree.structure(like)
    got = jax.tree.structure(tree)
    if want != got:
        raise ValueError(f"pretrained tree for {name!r} has structure {got}, model has {want}")

    def put(value, target, sharding):
        value = np.asarray(value, dtype=target.dtype)
        if value.shape != target.shape:
            raise ValueError(f"pretrained {name}: shape {value.shape} != model {target.shape}")
        return jax.make_array_from_callback(value.shape, sharding, lambda idx: value[idx])

    return jax.tree.map(put, tree, like, shardings)


def make_train_step(loss_fn: LossFn, state_shardings: Any, mesh: Mesh, *,
                    schedule: optax.Schedule | None = None,
                    rules: parallel.LogicalRules = parallel.LOGICAL_AXIS_RULES,
                    value_and_grad: Callable | None = None,
                    table_update: FusedTableUpdate | None = None
                    ) -> Callable[[TrainState, Mapping[str, jax.Array], jax.Array],
                                  tuple[TrainState, dict]]:
    """``step(state, batch, rng) -> (state, metrics)``, jitted, state donated; dropout key
    ``fold_in(rng, state.step)``; ``table_update`` consumes ``metrics[TABLE_STATS]``.
    Raises: ValueError: a table not split by rows; (trace) stats without a table update."""
    grad_fn = value_and_grad or jax.value_and_grad(loss_fn, has_aux=True)
    if table_update is not None:
        table_update.check_sharding(state_shardings.params)

    def step(state: TrainState, batch, rng):
        key = jax.random.fold_in(rng, state.step)
        (loss, metrics), grads = grad_fn(state.params, batch, key)
        metrics = dict(metrics)
        stats = metrics.pop(TABLE_STATS, None)
        if (stats is None) != (table_update is None):
            raise ValueError("the loss returned softmax table statistics (its table's "
                             "gradient stopped) but the step has no fused table update"
                             if table_update is None else "the fused table update needs the "
                             f"loss's {TABLE_STATS!r} metrics entry")
        metrics["loss"] = loss
        if table_update is None:
            metrics["grad_norm"] = optax.tree.norm(grads)
            new_state = state.apply_gradients(grads=grads)
        else:
            new_state, metrics["grad_norm"] = table_update.apply_gradients(state, grads, stats,
                                                                            mesh)
        if schedule is not None:
            metrics["learning_rate"] = schedule(state.step)
        flag = state.first_nonfinite_step
        if flag is not None:
            # The new params too: an overflowing update makes them inf under a finite loss.
            finite = jnp.isfinite(loss) & jnp.isfinite(metrics["grad_norm"])
            for leaf in jax.tree.leaves(new_state.params):
                finite &= jnp.all(jnp.isfinite(leaf))
            new_state = new_state.replace(first_nonfinite_step=jnp.where(
                (flag < 0) & ~finite, (state.step + 1).astype(flag.dtype), flag))
        return new_state, metrics

    jitted = jax.jit(
        step,
        in_shardings=(state_shardings, parallel.batch_sharding(mesh), parallel.replicated(mesh)),
        out_shardings=(state_shardings, parallel.replicated(mesh)),
        donate_argnums=0,
    )

    def run(state, batch, rng):
        with jax.set_mesh(mesh), nn.logical_axis_rules(rules):
            return jitted(state, batch, rng)

    run.jitted = jitted  # for ahead-of-time lowering in benchmarks
    return run
