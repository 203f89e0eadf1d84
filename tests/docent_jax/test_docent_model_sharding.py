"""DocEnt's loss and gradients (Dual, Full, Hybrid) are the same on one device and on
data x model meshes.

The entity table is split over "model" (its logical axis "entities"), and so are the
encoder's attention heads and MLP; the full-vocabulary softmax (Dual, Hybrid's dual term)
and Full's union softmax run vocabulary-parallel inside the jitted step. Every gradient is
compared: the entity table and bias, the scale, the projection, the MLM head and every leaf
of the encoder. Dropout is off (its masks depend on the sharding); the MLM masks are drawn
from the step key over the global array, so they are the same on every mesh.
"""

import jax
import numpy as np
import pytest

from docent_jax import data as docent_data
from docent_jax import trainer
from docent_jax.configs import default
from embedding_core.distributed import parallel
from embedding_core.training import training

SENTENCES = [(e % 6, f"sentence {k} about thing {e % 6}")
             for k, e in enumerate([0, 1, 2, 3, 4, 5, 0, 0])]


@pytest.fixture(scope="module")
def setting(tiny_bert_dir):
    config = default.get_config()
    config.update(dict(model=str(tiny_bert_dir), dropout=False, max_length=16, batch_size=8,
                       table_multiple=8, projection_dim=16))
    data = docent_data.EntityData([f"e{i}" for i in range(6)], [f"thing {i}" for i in range(6)],
                                  SENTENCES, [("thing 1?", (1,))], "eight sentences")
    table = docent_data.entity_sentence_table(SENTENCES, 6, tiny_bert_dir, 16)
    batch = {"input_ids": table.input_ids, "token_type_ids": table.token_type_ids,
             "attention_mask": (np.arange(16) < table.lengths[..., None]).astype(np.int32),
             "entity_ids": table.text_ids[:, 0]}
    return config, data, batch


def _loss_and_grads(setting, variant, softmax, devices, data, model_axis):
    config, entity_data, _ = setting
    config = config.copy_and_resolve_references()
    config.variant, config.softmax = variant, softmax
    config.word_mask_rate, config.entity_mask_rate = 0.3, 0.5
    if variant == "full":
        config.projection_dim = 0
    mesh = parallel.make_mesh(data, model_axis, devices=devices)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(docent_data, "load_data", lambda config: entity_data)
        task = trainer.build_task(config, mesh)
    assert task.num_examples == 8 and task.global_batch_size == 8
    batch = dict(next(task.make_batches(0)))  # the variant's layout; the whole table
    batch.pop("step")
    tx, _ = task.make_optimizer(config, 10)
    state, shardings = training.create_sharded_state(
        task.init_params, tx, mesh, jax.random.key(0), pretrained=task.pretrained)
    grad_fn = jax.jit(jax.value_and_grad(task.loss_fn, has_aux=True),
                      in_shardings=(shardings.params, parallel.batch_sharding(mesh),
                                    parallel.replicated(mesh)))
    with jax.set_mesh(mesh):
        (value, metrics), grads = grad_fn(state.params, parallel.host_to_global(batch, mesh),
                                          jax.random.key(1))
    return float(value), jax.device_get(metrics), jax.tree.map(np.asarray, grads)


ENTITY_SIDE = {
    "dual": {"['entity_embeddings']", "['log_scale']", "['projection']['kernel']"},
    "full": {"['entity_embeddings']", "['entity_bias']", "['word_bias']",
             "['mlm_transform']['dense']['kernel']"},
    "hybrid": {"['entity_embeddings']", "['log_scale']", "['projection']['kernel']",
               "['word_bias']", "['mlm_transform']['dense']['kernel']"},
}
# Hybrid's full_vocab dual term is Dual's function (entity_softmax_loss), covered by Dual.
# Full and Hybrid add the MLM head to Dual's sharded table and encoder (35-50 s each on 2
# cores): the slow tier; Dual's two softmaxes stay in the default tier.
CASES = [("dual", "full_vocab"), ("dual", "in_batch"),
         pytest.param("full", "in_batch", marks=pytest.mark.slow),
         pytest.param("hybrid", "in_batch", marks=pytest.mark.slow)]


@pytest.mark.parametrize("variant,softmax", CASES)
def test_all_gradients_equal_on_a_sharded_table_and_encoder(setting, variant, softmax):
    loss1, metrics1, grads1 = _loss_and_grads(setting, variant, softmax, jax.devices()[:1], 1, 1)
    # model=2: the BERT word table (30,522 rows, logical "vocab") splits only 2, 3 or 6 ways.
    meshes = [(4, 2)] if variant == "dual" else [(8, 1), (4, 2)]
    for data, model_axis in meshes:
        loss8, metrics8, grads8 = _loss_and_grads(setting, variant, softmax, jax.devices(),
                                                  data, model_axis)
        _check_equal(variant, loss1, grads1, loss8, grads8, f"{data}x{model_axis}")
    if variant != "dual":  # the MLM terms took part: something was masked on both meshes
        assert float(metrics1["masked_words"]) == float(metrics8["masked_words"]) > 0
        assert float(metrics1["mlm_loss"]) == pytest.approx(float(metrics8["mlm_loss"]),
                                                            rel=1e-5)
    if variant == "full":
        assert float(metrics1["masked_entities"]) == float(metrics8["masked_entities"]) > 0


def _check_equal(variant, loss1, grads1, loss8, grads8, mesh_name):
    np.testing.assert_allclose(loss8, loss1, rtol=1e-5, err_msg=mesh_name)
    flat1 = dict(jax.tree_util.tree_flatten_with_path(grads1)[0])
    flat8 = dict(jax.tree_util.tree_flatten_with_path(grads8)[0])
    assert flat1.keys() == flat8.keys()
    names = {jax.tree_util.keystr(path): path for path in flat1}
    # The comparison covers the encoder (every transformer leaf), not only the entity side.
    encoder = [n for n in names if n.startswith("['transformer']")]
    assert len(encoder) > 20 and any("attention" in n for n in encoder)
    assert ENTITY_SIDE[variant] <= set(names)
    scale = max(float(np.abs(g).max()) for g in flat1.values())
    for name, path in names.items():
        g1, g8 = flat1[path], flat8[path]
        if name.endswith("['key']['bias']"):
            # A key bias shifts every score of a query equally: its true gradient is zero,
            # both meshes give rounding noise (~1e-10), which is checked for staying small.
            assert max(float(np.abs(g1).max()), float(np.abs(g8).max())) < 1e-7 * scale, name
            continue
        np.testing.assert_allclose(g8, g1, rtol=1e-4, atol=1e-5 * float(np.abs(g1).max()),
                                   err_msg=f"{mesh_name} {name}")
    # The encoder is trained: its gradients are not zero (else the comparison is empty).
    assert max(float(np.abs(flat1[names[n]]).max()) for n in encoder) > 0.0
    # Padding rows 6 and 7 are never targets, inputs nor candidates.
    table = flat8[names["['entity_embeddings']"]]
    assert float(np.abs(table[6:]).max()) == 0.0
    assert float(np.abs(table[:6]).max()) > 0.0
