"""The fused table update equals the regular step: same params and optimizer state.

A toy model on plain arrays: queries ``x W + b`` scored against a 64-row table with 45
real classes (19 padding rows: on 2x4 one shard is part padding and one all padding) by
the tiled cosine softmax with a learned scale, blocks of 3 rows (dividing neither the 16
nor the 8 rows per shard). The optimizer is the project's AdamW (``training.make_optimizer``:
weight decay on matrices only, linear decay, global-norm clipping that binds in the first
step). Two steps of the regular step (full table gradient, ``state.apply_gradients``) and of
the fused one (table gradient stopped, ``FusedTableUpdate.apply_gradients``) from the same
state give the same parameters, moments, step counts and gradient norms.
"""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from embedding_core.distributed import parallel
from embedding_core.losses import vocab_softmax
from embedding_core.losses.table_update import (
    TABLE_STATS,
    FusedTableUpdate,
    softmax_table_stats,
)
from embedding_core.training import training

B, ROWS, D, CLASSES, BLOCK, CLIP = 16, 64, 8, 45, 3, 0.5


@pytest.fixture(scope="module")
def problem():
    rng = np.random.default_rng(0)
    params = {"proj": {"kernel": rng.standard_normal((D, D)).astype(np.float32) / 3,
                       "bias": rng.standard_normal((D,)).astype(np.float32) / 3},
              "table": rng.standard_normal((ROWS, D)).astype(np.float32),
              "log_scale": np.float32(np.log(5.0))}
    x = rng.standard_normal((B, D)).astype(np.float32)
    targets = np.concatenate([[0, CLASSES - 1], rng.integers(0, CLASSES, B - 2)]).astype(
        np.int32)
    return params, x, targets


def _run(problem, data, model, fused):
    params, x, targets = problem
    mesh = parallel.make_mesh(data, model)
    tx, _ = training.make_optimizer(learning_rate=0.05, total_steps=4, weight_decay=0.1,
                                    grad_clip_norm=CLIP)
    update = FusedTableUpdate(("table",), CLASSES, BLOCK, grad_clip_norm=CLIP)
    t = jnp.asarray(targets)

    def loss_fn(p, x):
        q = x @ p["proj"]["kernel"] + p["proj"]["bias"]
        scale = jnp.exp(p["log_scale"])
        stats = vocab_softmax.vocab_parallel_logsumexp(q, p["table"], t, mesh, scale,
                                                num_classes=CLASSES, block_size=BLOCK,
                                                table_gradient=not fused)
        metrics = {}
        if fused:
            metrics[TABLE_STATS] = softmax_table_stats(q, t, jnp.full((B,), 1.0 / B),
                                                       stats.logsumexp, scale)
        return jnp.mean(stats.logsumexp - stats.target_logit), metrics

    def step(state, x):
        (_, metrics), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params, x)
        if fused:
            return update.apply_gradients(state, grads, metrics[TABLE_STATS], mesh)
        return state.apply_gradients(grads=grads), optax.tree.norm(grads)

    def place(path, leaf):
        spec = P("model", None) if path[0].key == "table" else P()
        return jax.device_put(leaf, NamedSharding(mesh, spec))

    with jax.set_mesh(mesh):
        placed = jax.tree_util.tree_map_with_path(place, params)
        state = training.TrainState.create(apply_fn=None, params=placed, tx=tx)
        jitted = jax.jit(step, donate_argnums=0)
        norms = []
        for _ in range(2):
            state, norm = jitted(state, x)
            norms.append(float(norm))
    return jax.device_get((state.step, state.params, state.opt_state)), norms


@pytest.mark.parametrize("data,model", [(2, 4), (1, 8)])
def test_fused_step_equals_regular_step(problem, data, model):
    regular, regular_norms = _run(problem, data, model, fused=False)
    fused, fused_norms = _run(problem, data, model, fused=True)
    assert regular_norms[0] > CLIP  # the clip binds in the first step
    np.testing.assert_allclose(fused_norms, regular_norms, rtol=1e-5)
    assert jax.tree.structure(fused) == jax.tree.structure(regular)
    for (path, got), want in zip(jax.tree_util.tree_flatten_with_path(fused)[0],
                                 jax.tree.leaves(regular), strict=True):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-7,
                                   err_msg=jax.tree_util.keystr(path))
    # Both steps moved the table, padding rows included (weight decay alone).
    table = fused[1]["table"]
    assert np.abs(table - problem[0]["table"]).min() > 0
