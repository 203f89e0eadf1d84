"""DualEncoder: grouped padding, pooling and the cross/bi/simcse layouts."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from data_pipelines import inli, pipeline
from data_pipelines.tokenization import load_tokenizer
from dualcse_jax import tables as dualcse_data
from dualcse_jax.configs import default
from dualcse_jax.data import model_inputs
from dualcse_jax.model import Pooler, build_model, init_fn
from dualcse_jax.tables import length_groups
from embedding_core.models.pretrained import load_pretrained


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
    params = init_fn(model)(jax.random.key(0))
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


def test_cls_mlp_head_is_trained_and_used(tmp_path, tiny_bert_dir):
    """SimCSE's cls_mlp head: its weights move in training, and encode goes through them."""
    from dualcse_jax.inference import load
    from dualcse_jax.trainer import train
    from embedding_core.models.pretrained import load_pretrained as lp

    config = default.get_config()
    config.update(model=str(tiny_bert_dir), architecture="simcse", pooling="cls_mlp",
                  train_data="inli", max_length=32, batch_size=8, max_train_examples=32,
                  num_train_steps=2, learning_rate=1e-3, dropout=False, log_every=1)
    initial = init_fn(build_model(config, lp(config.model).config))(jax.random.key(0))
    assert set(initial["encoder"]["pooler"]["mlp"]) == {"kernel", "bias"}
    train(config, tmp_path / "w")
    model = load(tmp_path / "w")
    head = jax.tree.map(np.asarray, model.params["encoder"]["pooler"]["mlp"])
    # Trained: the head moved from its (seed-42) initialisation.
    init_rng, _ = jax.random.split(jax.random.key(config.seed))
    start = jax.tree.map(np.asarray, nn.unbox(init_fn(model.model)(init_rng))["encoder"]
                         ["pooler"]["mlp"])
    assert np.abs(head["kernel"] - start["kernel"]).max() > 1e-4
    assert np.abs(head["bias"]).max() > 1e-5  # zero-initialised

    texts = ["A man is playing a guitar.", "The lawn was littered with toys."]
    got = model.encode(texts, kind="explicit")
    # Used: encode = tanh(W h_cls + b) of the trained head, by hand from the [CLS] state.
    from data_pipelines.tokenization import tokenize
    from embedding_core.models.encoders import TransformerEncoder

    tok = tokenize(model.tokenizer, texts, config.max_length)
    width = int(tok.lengths.max())
    ids, types = tok.input_ids[:, :width], tok.token_type_ids[:, :width]
    mask = (np.arange(width)[None] < tok.lengths[:, None]).astype(np.int32)
    hidden = TransformerEncoder(model.model.config).apply(
        {"params": model.params["encoder"]["transformer"]}, ids, mask, types,
        deterministic=True).last_hidden_state
    cls = np.asarray(hidden, np.float32)[:, 0]
    np.testing.assert_allclose(got, np.tanh(cls @ head["kernel"] + head["bias"]), atol=1e-5)
    assert not np.allclose(got, cls, atol=1e-3)  # not the bare [CLS] state
    # And perturbing the head changes what encode returns.
    params = jax.tree.map(lambda x: x, model.params)  # new containers, same leaves
    params["encoder"]["pooler"]["mlp"]["bias"] = head["bias"] + 0.5
    model.params = params
    np.testing.assert_allclose(model.encode(texts, kind="explicit"),
                               np.tanh(cls @ head["kernel"] + head["bias"] + 0.5), atol=1e-5)
    assert np.abs(model.encode(texts, kind="explicit") - got).max() > 0.05


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
