"""DocEnt-Dual's loss and gradients are the same on one device and on a data x model mesh.

The entity table is split over "model" (its logical axis "entities"); the full softmax runs
vocabulary-parallel inside the jitted step. Dropout is off (PITFALLS: masks depend on the
sharding).
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from docent_jax import data as docent_data
from docent_jax.configs import default
from docent_jax.model import PRETRAINED_PATH, build_model, init_fn
from docent_jax.trainer import make_loss_fn, make_optimizer
from embedding_core import parallel, training
from embedding_core.pretrained import load_pretrained


@pytest.fixture(scope="module")
def setting(tiny_bert_dir):
    config = default.get_config()
    config.update(dict(model=str(tiny_bert_dir), dropout=False, max_length=16, loss="full",
                       table_multiple=8, projection_dim=16))
    pre = load_pretrained(config.model)
    sentences = [(e % 6, f"sentence {k} about thing {e % 6}") for k, e in
                 enumerate([0, 1, 2, 3, 4, 5, 0, 0])]
    table = docent_data.entity_sentence_table(sentences, 6, pre.model_dir, 16)
    batch = {"input_ids": table.input_ids, "token_type_ids": table.token_type_ids,
             "attention_mask": (np.arange(16) < table.lengths[..., None]).astype(np.int32),
             "text_ids": table.text_ids}
    return config, pre, batch


def _loss_and_grads(setting, loss, devices, data, model_axis):
    config, pre, batch = setting
    config = config.copy_and_resolve_references()
    config.loss = loss
    model = build_model(config, pre.config, num_entities=6)
    mesh = parallel.make_mesh(data, model_axis, devices=devices)
    tx, _ = make_optimizer(config, 10)
    state, shardings = training.create_sharded_state(
        init_fn(model), tx, mesh, jax.random.key(0), pretrained={PRETRAINED_PATH: pre.params})
    grad_fn = jax.jit(jax.value_and_grad(make_loss_fn(model, config, mesh), has_aux=True),
                      in_shardings=(shardings.params, parallel.batch_sharding(mesh),
                                    parallel.replicated(mesh)))
    with jax.set_mesh(mesh):
        (value, _), grads = grad_fn(state.params, parallel.host_to_global(batch, mesh),
                                    jax.random.key(1))
    return float(value), jax.tree.map(np.asarray, grads)


@pytest.mark.parametrize("loss", ["full", "in_batch"])
def test_entity_side_gradients_equal_on_a_sharded_table(setting, loss):
    loss1, grads1 = _loss_and_grads(setting, loss, jax.devices()[:1], 1, 1)
    # model=2: the BERT word table (30,522 rows, logical "vocab") splits only 2, 3 or 6 ways.
    loss8, grads8 = _loss_and_grads(setting, loss, jax.devices(), 4, 2)
    np.testing.assert_allclose(loss8, loss1, rtol=1e-5)
    for name in ("entity_embeddings", "log_scale"):
        g1, g8 = grads1[name], grads8[name]
        np.testing.assert_allclose(g8, g1, rtol=1e-5, atol=1e-5 * float(np.abs(g1).max()),
                                   err_msg=name)
    # Padding rows 6 and 7 are never targets nor (full softmax) candidates.
    assert float(np.abs(grads8["entity_embeddings"][6:]).max()) == 0.0
    assert float(jnp.abs(grads8["entity_embeddings"][:6]).max()) > 0.0
