"""DocEnt-Dual with ``config.fused_table_update``: the same training step, without the
table's full gradient.

The train step (``training.make_train_step``) of a tiny DocEnt-Dual (1-layer encoder, 45
entities in 64 rows, blocks of 3 rows, full softmax) with DocEnt's own optimizer (AdamW,
weight decay, the entity learning rate as a factor, global-norm clipping that binds) gives
the same parameters, optimizer state and metrics after two steps with the fused table
update as without it, on 2x4 (``tests/embedding_core/test_table_update.py`` checks the
update itself on plain arrays, on 2x4 and 1x8). A compile-only probe checks the memory it
saves; the config check refuses the field where there is no tiled full softmax to fuse.

The encoder's learning rate is tiny (the table's is the usual 1e-3): Adam turns gradients
that are zero up to rounding (the attention key bias: softmax ignores a shift) into
full-size steps of either sign, so with a real rate the two runs' encoders, and through
them the second step's table gradient, would part by more than rounding. The key bias is
left out of the comparison for that reason.
"""

import sys
from pathlib import Path

import jax
import numpy as np
import pytest

from docent_jax.configs import default, validate_config
from docent_jax.loss import make_loss_fn
from docent_jax.model import build_model, init_fn
from docent_jax.optimizer import make_optimizer
from docent_jax.trainer import fused_table_update
from embedding_core import configs
from embedding_core.distributed import parallel
from embedding_core.models.encoders import EncoderConfig
from embedding_core.training import training

REPO = Path(__file__).resolve().parents[2]
B, L, ENTITIES, ROWS, BLOCK, CLIP = 16, 8, 45, 64, 3, 0.05
NOISE_ONLY = "['attention']['self']['key']['bias']"  # exact gradient 0: rounding noise


def _config(fused: bool):
    c = default.get_config()
    c.update(variant="dual", softmax="full_vocab", vocab_block_size=BLOCK, table_multiple=ROWS,
             fused_table_update=fused, dropout=False, projection_dim=8, batch_size=B,
             learning_rate=1e-7, entity_learning_rate=1e-3, weight_decay=0.1,
             grad_clip_norm=CLIP, warmup_steps=0, lr_decay="linear")
    validate_config(c)
    return c


@pytest.fixture(scope="module")
def batch():
    rng = np.random.default_rng(0)
    ids = rng.integers(1, 100, (B, 1, L)).astype(np.int32)
    entity_ids = np.concatenate([[0, ENTITIES - 1], rng.integers(0, ENTITIES, B - 2)])
    return {"input_ids": ids, "attention_mask": np.ones_like(ids),
            "token_type_ids": np.zeros_like(ids), "entity_ids": entity_ids.astype(np.int32)}


def _train(batch, data, model_size, fused):
    config = _config(fused)
    encoder = EncoderConfig("bert", 100, 8, 1, 2, 16, 16, 2, 1e-12, "gelu", 0, 0.0, 0.0)
    model = build_model(config, encoder, ENTITIES)
    mesh = parallel.make_mesh(data, model_size)
    init = init_fn(model)
    rules = parallel.fit_rules(configs.axis_rules(config), mesh,
                               jax.eval_shape(init, jax.random.key(0)), {"heads": 2})
    tx, schedule = make_optimizer(config, 4)
    state, shardings = training.create_sharded_state(init, tx, mesh, jax.random.key(1),
                                                     rules=rules)
    step = training.make_train_step(make_loss_fn(model, config, mesh), shardings, mesh,
                                    schedule=schedule, rules=rules,
                                    table_update=fused_table_update(config, ENTITIES))
    metrics = []
    for _ in range(2):
        state, m = step(state, parallel.host_to_global(batch, mesh), jax.random.key(2))
        metrics.append(jax.device_get(m))
    return jax.device_get((state.step, state.params, state.opt_state)), metrics


@pytest.mark.mesh  # sets its own mesh shape
def test_fused_step_equals_regular_step(batch):
    regular, regular_metrics = _train(batch, 2, 4, fused=False)
    fused, fused_metrics = _train(batch, 2, 4, fused=True)
    assert regular_metrics[0]["grad_norm"] > CLIP  # the clip binds
    for want, got in zip(regular_metrics, fused_metrics, strict=True):
        assert sorted(got) == sorted(want)  # the statistics are not logged
        for name in want:
            np.testing.assert_allclose(got[name], want[name], rtol=1e-5, err_msg=name)
    assert jax.tree.structure(fused) == jax.tree.structure(regular)
    compared = 0
    for (path, got), want in zip(jax.tree_util.tree_flatten_with_path(fused)[0],
                                 jax.tree.leaves(regular), strict=True):
        name = jax.tree_util.keystr(path)
        if NOISE_ONLY in name or not np.size(want):
            continue
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6 * np.abs(want).max(),
                                   err_msg=name)
        compared += 1
    assert compared > 3 * 20  # params, both Adam moments, the step counts


@pytest.mark.mesh  # sets its own mesh shape
def test_fused_step_holds_no_table_gradient():
    """Compile-only: with the fused update the step's temporaries stay well under the
    table shard's gradient (which the tiled step alone holds whole:
    ``test_tiled_softmax.py``) and within a few blocks; the arguments are the state."""
    sys.path.insert(0, str(REPO / "benchmarks"))
    from memory_cases import docent_full_softmax_case

    entities, dim, batch, data, model, block = 32768, 64, 256, 2, 4, 256
    fused = docent_full_softmax_case(entities, dim, batch, data, model, block, fused=True)
    gradient = entities // model * dim * 4
    blocks = 8 * (batch // data * block + block * dim) * 4
    assert fused["temp_bytes"] < min(gradient / 2, blocks)
    state = 3 * gradient  # table + two Adam moments, per device
    assert state <= fused["arg_bytes"] <= state + 4096 + batch * (dim + 1) * 4


@pytest.mark.parametrize("change", [dict(softmax="in_batch"), dict(vocab_block_size=0),
                                    dict(variant="hybrid"),
                                    dict(variant="full", projection_dim=0)])
def test_fused_update_needs_the_tiled_full_softmax(change):
    config = _config(True)
    config.update(change)
    with pytest.raises(ValueError, match="fused_table_update=True .* needs variant='dual'"):
        validate_config(config)
    config.fused_table_update = False
    validate_config(config)
