"""DocEnt's optimizer: each parameter group at its own rate, and the head-only warm-up."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from docent_jax.configs import default
from docent_jax.optimizer import make_optimizer

PARAMS = {"transformer": {"w": jnp.zeros((3,))}, "entity_embeddings": jnp.zeros((4, 3)),
          "log_scale": jnp.zeros(()), "mlm_transform": {"dense": jnp.zeros((3,))},
          "word_bias": jnp.zeros((5,)), "entity_bias": jnp.zeros((4,))}


def _config(variant, **kw):
    c = default.get_config()
    c.update(dict(dict(variant=variant, learning_rate=1e-4, entity_learning_rate=1e-2,
                       mlm_head_learning_rate=1e-3, warmup_steps=0, lr_decay="constant",
                       weight_decay=0.0, num_train_steps=10), **kw))
    return c


def _steps(config, n):
    """The first ``n`` updates for a constant gradient of ones (Adam's step = lr there)."""
    tx, _ = make_optimizer(config, 10)
    state = tx.init(PARAMS)
    grads = jax.tree.map(jnp.ones_like, PARAMS)
    out = []
    for _ in range(n):
        updates, state = tx.update(grads, state, PARAMS)
        out.append({k: float(np.abs(np.asarray(jax.tree.leaves(v)[0])).max())
                    for k, v in updates.items()})
    return out


@pytest.mark.parametrize("variant", ["dual", "full", "hybrid"])
def test_each_group_moves_at_its_rate(variant):
    first = _steps(_config(variant), 1)[0]
    head = 1e-3 if variant != "dual" else 1e-4  # Dual has no MLM head: the encoder's rate
    want = {"transformer": 1e-4, "entity_embeddings": 1e-2, "log_scale": 1e-2,
            "entity_bias": 1e-2, "mlm_transform": head, "word_bias": head}
    for name, rate in want.items():
        assert first[name] == pytest.approx(rate, rel=1e-3), name


def test_head_only_warmup_freezes_the_rest_for_its_steps():
    steps = _steps(_config("full", mlm_head_init="warmup", mlm_warmup_steps=2), 3)
    for step in steps[:2]:
        assert step["transformer"] == 0 and step["entity_embeddings"] == 0
        assert step["mlm_transform"] > 0 and step["word_bias"] > 0
    assert steps[2]["transformer"] == pytest.approx(1e-4, rel=1e-2)
    assert steps[2]["entity_embeddings"] == pytest.approx(1e-2, rel=1e-2)
    # "random" never freezes anything.
    assert _steps(_config("full", mlm_head_init="random", mlm_warmup_steps=2), 1)[0][
        "transformer"] > 0
    assert isinstance(make_optimizer(_config("dual"), 10)[0], optax.GradientTransformation)


def test_a_warmup_longer_than_the_run_is_cut_to_half_of_it():
    from docent_jax.optimizer import head_warmup_steps

    assert head_warmup_steps(_config("full", mlm_head_init="warmup", mlm_warmup_steps=50),
                             300) == 50
    assert head_warmup_steps(_config("hybrid", mlm_head_init="warmup", mlm_warmup_steps=50),
                             2) == 1
    assert head_warmup_steps(_config("dual", mlm_head_init="warmup", mlm_warmup_steps=50),
                             300) == 0
    # A 2-step run: step 0 warms the head, step 1 trains the encoder and entity table.
    config = _config("full", mlm_head_init="warmup", mlm_warmup_steps=50, num_train_steps=2)
    tx, _ = make_optimizer(config, 2)
    state = tx.init(PARAMS)
    grads = jax.tree.map(jnp.ones_like, PARAMS)
    moved = []
    for _ in range(2):
        updates, state = tx.update(grads, state, PARAMS)
        moved.append(float(np.abs(np.asarray(updates["entity_embeddings"])).max()))
    assert moved[0] == 0 and moved[1] > 0
