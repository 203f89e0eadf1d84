"""DualEncoder: grouped padding, pooling and the cross/bi/simcse layouts."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from data_pipelines import dualcse_data, inli, pipeline
from data_pipelines.tokenization import load_tokenizer
from dualcse_jax.configs import default
from dualcse_jax.model import (
    DualEncoder,
    Pooler,
    build_model,
    init_fn,
    length_groups,
    model_inputs,
)
from embedding_core.pretrained import load_pretrained


@pytest.fixture(scope="module")
def tiny(tiny_bert_dir):
    pre = load_pretrained(str(tiny_bert_dir))
    tok = load_tokenizer(pre.model_dir)
    rows = inli.read_inli(inli.inli_split_path("val"))[:6]
    return pre, tok, rows


def _untrained(tiny, architecture):
    """(config, model, table, params, rows) of a dropout-free model on the 6 INLI rows."""
    pre, tok, rows = tiny
    config = default.get_config()
    config.architecture, config.dropout = architecture, False
    model = build_model(config, pre.config)
    table = dualcse_data.inli_table(rows, tok, 64, encoder=architecture)
    params = init_fn(model, len(table.field_names))(jax.random.key(0))
    return config, model, table, params, rows


@pytest.mark.parametrize("architecture", ["cross", "bi"])
def test_grouped_padding_gives_the_same_vectors(tiny, architecture):
    config, model, table, params, rows = _untrained(tiny, architecture)
    kw = dict(global_batch_size=6, seed=0, num_steps=1, pad_multiple=8)
    plain = next(pipeline.make_batches(table, **kw))
    grouped = next(pipeline.make_batches(table, length_groups=length_groups(architecture), **kw))
    assert grouped["input_ids_1"].shape[-1] < plain["input_ids"].shape[-1]  # really shorter
    r1, u1 = model.apply({"params": params}, *model_inputs(plain))
    r2, u2 = model.apply({"params": params}, *model_inputs(grouped))
    assert r1.shape == (6, 4, model.config.hidden_size)
    np.testing.assert_allclose(r2, r1, atol=2e-5)
    np.testing.assert_allclose(u2, u1, atol=2e-5)
    assert np.abs(np.asarray(r1) - np.asarray(u1)).max() > 1e-4


def test_mean_pooling_ignores_padding():
    hidden = jnp.asarray(np.random.default_rng(0).normal(size=(2, 5, 3)), jnp.float32)
    mask = jnp.asarray([[1, 1, 0, 0, 0], [1, 1, 1, 1, 1]], jnp.int32)
    out = Pooler("mean").apply({}, hidden, mask)
    np.testing.assert_allclose(out[0], hidden[0, :2].mean(0), rtol=1e-6)
    np.testing.assert_allclose(out[1], hidden[1].mean(0), rtol=1e-6)
    changed = hidden.at[0, 2:].set(100.0)
    np.testing.assert_allclose(Pooler("mean").apply({}, changed, mask)[0], out[0], rtol=1e-6)


def test_cls_mlp_head_is_trained_and_used(tiny):
    pre, _, _ = tiny
    model = DualEncoder(pre.config, "simcse", "cls_mlp")
    params = init_fn(model, 3)(jax.random.key(0))
    assert "mlp" in params["encoder"]["pooler"]
    ids = jnp.asarray([[[101, 2023, 102], [101, 2003, 102], [101, 1037, 102]]], jnp.int32)
    e, _ = model.apply({"params": params}, ids, jnp.ones_like(ids), jnp.zeros_like(ids))
    assert np.all(np.abs(np.asarray(e)) <= 1.0)  # tanh head applied


@pytest.mark.parametrize("architecture", ["cross", "bi"])
def test_train_loss_gets_one_id_per_sentence(tiny, architecture):
    # Regression: the cross batch carries one text id per indicator field; fed to the loss
    # as is, the own contradiction took the implied hypothesis' id and was masked out of
    # term 2 as a "duplicate of the positive", so u never learnt to avoid contradictions.
    from data_pipelines.table import text_identity_ids
    from dualcse_jax.loss import dualcse_loss
    from dualcse_jax.trainer import make_loss_fn

    config, model, table, params, rows = _untrained(tiny, architecture)
    batch = next(pipeline.make_batches(table, global_batch_size=6, seed=3, num_steps=1,
                                       length_groups=length_groups(architecture)))
    n = len(rows)
    columns = [[ex.premise for ex in rows], [ex.explicit_entailment for ex in rows],
               [ex.implied_entailment for ex in rows], [ex.contradiction for ex in rows]]
    ids = text_identity_ids([t for c in columns for t in c]).reshape(4, n).T  # [n, 4]
    premise_col = np.asarray(table.text_ids)[:, 0]
    order = [int(np.flatnonzero(premise_col == t)[0]) for t in batch["text_ids"][:, 0]]
    assert sorted(order) == list(range(n))
    expected_ids = jnp.asarray(ids[order])
    assert bool(jnp.all(expected_ids[:, 3] != expected_ids[:, 2]))

    r, u = model.apply({"params": params}, *model_inputs(batch))
    want, _ = dualcse_loss(r, u, expected_ids)
    got, _ = make_loss_fn(model, config)(params, batch, jax.random.key(1))
    np.testing.assert_allclose(float(got), float(want), rtol=1e-6)
    if architecture == "cross":
        with pytest.raises(ValueError, match="one id per sentence"):
            dualcse_loss(r, u, jnp.asarray(batch["text_ids"]))
