"""DocEnt-Full and DocEnt-Hybrid: masking, checkpoint loading, tied heads, training on SQuAD."""

from __future__ import annotations

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from data_pipelines import squad
from data_pipelines.tokenization import load_tokenizer, tokenize
from docent_jax import data as docent_data
from docent_jax import loss as docent_loss
from docent_jax import masking as masking_lib
from docent_jax import model as model_lib
from embedding_core.distributed import parallel
from embedding_core.models.encoders import EncoderConfig, TransformerEncoder
from embedding_core.models.pretrained import load_pretrained
from embedding_core.training import training

SEQ_LEN = 30  # sentence tokens incl. [CLS]/[SEP]; Full inputs are 2 longer


def _tiny_config(vocab=120) -> EncoderConfig:
    return EncoderConfig(model_type="bert", vocab_size=vocab, hidden_size=16, num_layers=1,
                         num_heads=2, intermediate_size=32, max_position_embeddings=64,
                         type_vocab_size=2, layer_norm_eps=1e-12, hidden_act="gelu",
                         pad_token_id=0, hidden_dropout_rate=0.0, attention_dropout_rate=0.0)


@pytest.fixture(scope="module")
def tokenizer(minilm_dir):
    return load_tokenizer(minilm_dir)


@pytest.fixture(scope="module")
def corpus():
    """Real sentences: the first two paragraphs of six SQuAD dev articles (one entity each)."""
    articles, _ = squad.read_squad()
    short = [dataclasses.replace(a, paragraphs=a.paragraphs[:2]) for a in articles[:6]]
    return squad.wikipedia_entity_corpus(short)


@pytest.fixture(scope="module")
def sentence_batch(corpus, tokenizer):
    """16 sentences, 2-3 per entity (so same-entity pairs share the batch)."""
    picked, per_entity = [], {}
    for entity, text in corpus.sentences:
        if per_entity.get(entity, 0) < 3 and len(picked) < 16:
            per_entity[entity] = per_entity.get(entity, 0) + 1
            picked.append((entity, text))
    assert len(picked) == 16 and len(per_entity) == 6
    tokens = tokenize(tokenizer, [t for _, t in picked], SEQ_LEN)
    entity_ids = np.array([e for e, _ in picked], np.int32)
    return tokens, entity_ids


@pytest.fixture(scope="module")
def full_tiny():
    """A tiny DocEnt-Full (5 entities) and its freshly initialised params."""
    model = model_lib.DocEntFull(_tiny_config(), num_entities=5)
    return model, nn.unbox(jax.jit(model_lib.init_fn(model))(jax.random.key(0)))


@pytest.fixture(scope="module")
def hybrid_tiny():
    """A tiny DocEnt-Hybrid (4 entities) and its freshly initialised params."""
    model = model_lib.DocEntHybrid(_tiny_config(), num_entities=4, num_rows=4, scale_init=5.0,
                                   learn_scale=False)
    return model, nn.unbox(jax.jit(model_lib.init_fn(model))(jax.random.key(0)))


@pytest.fixture(scope="module")
def mesh1():
    return parallel.make_mesh(1, 1, devices=jax.devices()[:1])


@pytest.fixture(scope="module")
def masking(tokenizer):
    return masking_lib.MaskingConfig.from_tokenizer(tokenizer, word_mask_rate=0.15,
                                                    entity_mask_rate=0.5, max_predictions=8)


# ----------------------------------------------------------------------------- inputs, masking


def test_full_input_layout(tokenizer):
    tokens = tokenize(tokenizer, ["a short one", "the second sentence here"], 10)
    out = docent_data.full_inputs_from_tokens(tokens.input_ids, tokens.lengths,
                                              np.array([3, 0]),
                                              word_vocab_size=30522, sep_id=102)
    cls, sep = 101, 102
    words = tokenizer.encode("a short one", add_special_tokens=False).ids
    assert len(words) == 3
    assert out["input_ids"][0].tolist() == [cls, 30522 + 3, sep, *words, sep] + [0] * 5
    assert out["token_type_ids"][0].tolist() == [0, 0, 0, 1, 1, 1, 1] + [0] * 5
    assert out["attention_mask"][0].tolist() == [1] * 7 + [0] * 5
    assert out["input_ids"][1, 1] == 30522 and out["attention_mask"][1].sum() == 8


def test_masking_rates_and_never_special(sentence_batch, tokenizer):
    tokens, entity_ids = sentence_batch
    reps = 64  # 1024 rows of real token ids
    full = docent_data.full_inputs_from_tokens(
        np.tile(tokens.input_ids, (reps, 1)), np.tile(tokens.lengths, reps),
        np.tile(entity_ids, reps), word_vocab_size=30522, sep_id=102)
    ids, mask = jnp.asarray(full["input_ids"]), jnp.asarray(full["attention_mask"])
    cfg = masking_lib.MaskingConfig.from_tokenizer(tokenizer, word_mask_rate=0.15,
                                                   entity_mask_rate=0.3, max_predictions=32)

    @jax.jit
    def draw(word_key, entity_key):
        maskable = masking_lib.maskable_word_pieces(ids, mask, cfg)
        return maskable, masking_lib.mask_word_pieces(word_key, ids, maskable, cfg), \
            masking_lib.mask_entity_tokens(entity_key, ids, cfg)

    maskable, out, (e_ids, e_labels, e_w) = jax.device_get(draw(jax.random.key(7),
                                                                jax.random.key(8)))
    pos, w = out.positions, out.weights > 0
    ids_np, new = np.asarray(ids), out.input_ids
    rows = np.repeat(np.arange(len(ids_np))[:, None], pos.shape[1], axis=1)
    chosen = np.zeros(ids_np.shape, bool)
    chosen[rows[w], pos[w]] = True
    assert chosen.sum() == w.sum()  # distinct positions
    special = np.isin(ids_np, (101, 102, 0, 103)) | (ids_np >= 30522) | (full["attention_mask"]
                                                                          == 0)
    assert not (chosen & special).any()  # [CLS], [SEP], padding, entity token: never
    assert (new[~chosen] == ids_np[~chosen]).all()  # only chosen positions change
    np.testing.assert_array_equal(out.labels[w], ids_np[rows[w], pos[w]])
    rate = chosen.sum() / maskable.sum()
    assert abs(rate - 0.15) < 0.01, rate
    replaced = new[chosen]
    assert abs(np.mean(replaced == 103) - 0.8) < 0.03
    assert abs(np.mean(replaced == ids_np[chosen]) - 0.1) < 0.03  # kept; random: the rest
    # Entity masking: rate respected, only position 1, always [MASK].
    e_w = e_w > 0
    assert abs(e_w.mean() - 0.3) < 0.04
    assert (e_ids[e_w, 1] == 103).all() and (e_ids[~e_w, 1] == ids_np[~e_w, 1]).all()
    assert (e_labels == ids_np[:, 1]).all()
    np.testing.assert_array_equal(np.delete(e_ids, 1, axis=1), np.delete(ids_np, 1, axis=1))
    # Same key, same masks (resumable); another key, other masks.
    again = jax.device_get(draw(jax.random.key(7), jax.random.key(8)))[1]
    other = jax.device_get(draw(jax.random.key(9), jax.random.key(8)))[1]
    np.testing.assert_array_equal(again.input_ids, new)
    assert (other.input_ids != new).any()
    # The batch sharded over 8 devices gets the same masks (global random draws).
    mesh = parallel.make_mesh(8, 1)
    sharded = parallel.host_to_global({"ids": full["input_ids"], "mask": full["attention_mask"]},
                                      mesh)
    on_mesh = jax.jit(lambda k, i, m: masking_lib.mask_word_pieces(
        k, i, masking_lib.maskable_word_pieces(i, m, cfg), cfg).input_ids)(
        jax.random.key(7), sharded["ids"], sharded["mask"])
    np.testing.assert_array_equal(np.asarray(on_mesh), new)


# ----------------------------------------------------------------------------- encoder hook, heads


def test_extra_token_embeddings_hook_extends_the_vocabulary(full_tiny):
    cfg = _tiny_config()
    enc = TransformerEncoder(cfg)
    ids = jnp.array([[101, 5, 7, 102]], jnp.int32)
    mask = jnp.ones_like(ids)
    params = full_tiny[1]["transformer"]
    extra = jax.random.normal(jax.random.key(1), (4, cfg.hidden_size))
    # Extra id vocab + 2 must behave as a word piece whose row is extra[2].
    swapped = jax.tree.map(lambda x: x, params)
    swapped["embeddings"]["word_embeddings"]["embedding"] = (
        params["embeddings"]["word_embeddings"]["embedding"].at[5].set(extra[2]))

    @jax.jit
    def run(params, swapped, extra):
        def apply(p, i, **kw):
            return enc.apply({"params": p}, i, mask, **kw).last_hidden_state

        return (apply(params, ids), apply(params, ids, extra_token_embeddings=extra),
                apply(params, ids.at[0, 1].set(cfg.vocab_size + 2), extra_token_embeddings=extra),
                apply(swapped, ids))

    plain, with_table, via_extra, via_word = run(params, swapped, extra)
    np.testing.assert_array_equal(plain, with_table)  # no extra id: bit-identical
    np.testing.assert_allclose(via_extra, via_word, rtol=1e-6, atol=1e-6)
    assert np.abs(np.asarray(via_extra) - np.asarray(plain)).max() > 1e-3
    with pytest.raises(ValueError, match="extra_token_embeddings"):
        jax.eval_shape(lambda: enc.apply({"params": params}, ids, mask,
                                         extra_token_embeddings=extra[:, :3]))


def _layer_norm(x, scale, bias, eps=1e-12):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * scale + bias


def test_full_head_is_tied_to_both_tables(full_tiny):
    from scipy.special import erf

    cfg = _tiny_config()
    model, params = full_tiny
    params = dict(params)
    params["word_bias"] = jax.random.normal(jax.random.key(1), (cfg.vocab_size,))
    params["entity_bias"] = jax.random.normal(jax.random.key(2), (5,))
    h = np.asarray(jax.random.normal(jax.random.key(3), (3, cfg.hidden_size)), np.float64)
    ids = jnp.zeros((1, 4), jnp.int32)

    def logits_fn(m, hidden):
        m.encode(ids, jnp.ones_like(ids), ids)  # binds the encoder's variables
        return m.mlm_logits(hidden)

    got = np.asarray(jax.jit(lambda p, x: model.apply({"params": p}, x, method=logits_fn))(
        params, h.astype(np.float32)))
    p = jax.tree.map(lambda x: np.asarray(x, np.float64), params)
    t = h @ p["mlm_transform"]["dense"]["kernel"] + p["mlm_transform"]["dense"]["bias"]
    t = 0.5 * t * (1 + erf(t / np.sqrt(2)))  # exact GELU
    t = _layer_norm(t, p["mlm_transform"]["LayerNorm"]["scale"],
                    p["mlm_transform"]["LayerNorm"]["bias"])
    table = np.concatenate([p["transformer"]["embeddings"]["word_embeddings"]["embedding"],
                            p["entity_embeddings"]])
    want = t @ table.T + np.concatenate([p["word_bias"], p["entity_bias"]])
    assert got.shape == (3, cfg.vocab_size + 5)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_full_loss_weighting(full_tiny, masking, mesh1):
    cfg = _tiny_config()
    model, params = full_tiny
    rng = np.random.default_rng(0)
    words = rng.integers(104, cfg.vocab_size, (8, 12)).astype(np.int32)
    words[:, 0], words[:, -1] = 101, 102
    batch = docent_data.full_inputs_from_tokens(words, np.full(8, 12), np.arange(8) % 5,
                                                word_vocab_size=cfg.vocab_size, sep_id=102)
    small = dataclasses.replace(masking, word_vocab_size=cfg.vocab_size, word_mask_rate=0.3)

    @jax.jit
    def run(params):
        key = jax.random.key(3)
        out = [docent_loss.full_loss(model, params, batch, key, small, mesh1, **kw) for kw in (
            {}, {"entity_loss_weight": 2.0}, {"single_cross_entropy": True})]
        return [o[0] for o in out], out[0][1]

    (loss1, loss2, loss_single), m = jax.device_get(run(params))
    assert m["masked_words"] > 0 and m["masked_entities"] > 0
    assert loss1 == pytest.approx(m["mlm_loss"] + m["entity_loss"], rel=1e-6)
    assert loss2 == pytest.approx(m["mlm_loss"] + 2 * m["entity_loss"], rel=1e-6)
    pooled = (m["mlm_loss"] * m["masked_words"] + m["entity_loss"] * m["masked_entities"]) / (
        m["masked_words"] + m["masked_entities"])
    assert loss_single == pytest.approx(pooled, rel=1e-5)
    assert abs(loss_single - loss1) > 1e-3  # the two weightings do differ


def test_hybrid_head_sees_the_entity_and_its_gradient_reaches_the_table(hybrid_tiny, masking,
                                                                         mesh1):
    cfg = _tiny_config()
    model, params = hybrid_tiny
    rng = np.random.default_rng(0)
    ids = rng.integers(104, cfg.vocab_size, (4, 12)).astype(np.int32)
    ids[:, 0], ids[:, -1] = 101, 102
    batch = {"input_ids": ids, "attention_mask": np.ones_like(ids),
             "token_type_ids": np.zeros_like(ids), "entity_ids": np.array([0, 0, 2, 2], np.int32)}
    small = dataclasses.replace(masking, word_vocab_size=cfg.vocab_size, word_mask_rate=0.3)

    def mlm_only(p):
        return docent_loss.hybrid_loss(model, p, batch, jax.random.key(1), small,
                                       mesh1)[1]["mlm_loss"]

    grad = np.asarray(jax.jit(jax.grad(mlm_only))(params)["entity_embeddings"])
    norms = np.linalg.norm(grad, axis=1)
    assert norms[0] > 0 and norms[2] > 0  # the batch's entities learn from the MLM term
    assert norms[1] == 0 and norms[3] == 0  # the others get nothing


def test_hybrid_dual_term_masks_same_entity_sentences(hybrid_tiny, masking, mesh1):
    cfg = _tiny_config()
    model, params = hybrid_tiny
    rng = np.random.default_rng(1)
    ids = rng.integers(104, cfg.vocab_size, (5, 9)).astype(np.int32)
    ids[:, 0], ids[:, -1] = 101, 102
    entity_ids = np.array([0, 1, 0, 2, 1], np.int32)
    batch = {"input_ids": ids, "attention_mask": np.ones_like(ids),
             "token_type_ids": np.zeros_like(ids), "entity_ids": entity_ids}
    no_mask = dataclasses.replace(masking, word_vocab_size=cfg.vocab_size, word_mask_rate=0.0)

    @jax.jit
    def run(params):
        loss, metrics = docent_loss.hybrid_loss(model, params, batch, jax.random.key(0), no_mask,
                                                mesh1)  # the fixture's fixed scale a = 5
        s, _, table, _ = model.apply({"params": params}, ids, batch["attention_mask"],
                                     batch["token_type_ids"], entity_ids,
                                     jnp.zeros((5, 1), jnp.int32))
        return loss, metrics, s, table[entity_ids]

    loss, metrics, s, g = jax.device_get(run(params))
    s, g = np.asarray(s, np.float64), np.asarray(g, np.float64)
    cos = (s / np.linalg.norm(s, axis=1, keepdims=True)) @ (
        g / np.linalg.norm(g, axis=1, keepdims=True)).T
    want = []
    for i in range(5):
        keep = (entity_ids != entity_ids[i]) | (np.arange(5) == i)  # copies are not negatives
        z = 5.0 * cos[i, keep]
        want.append(np.log(np.exp(z).sum()) - 5.0 * cos[i, i])
    assert float(metrics["dual_loss"]) == pytest.approx(np.mean(want), rel=1e-5)
    assert float(metrics["masked_words"]) == 0 and float(metrics["mlm_loss"]) == 0
    assert float(loss) == pytest.approx(float(metrics["dual_loss"]), rel=1e-6)


@pytest.mark.parametrize("mesh_shape", [(1, 1), (4, 2)])
def test_full_union_softmax_equals_a_dense_numpy_reference(mesh_shape):
    """Word pieces (dense) + entity rows (vocabulary-parallel, 2 padding rows) == one numpy
    softmax over [E_word; E_ent[:6]] with both biases."""
    vocab, rows, n_ent, hidden, n = 40, 8, 6, 8, 12
    rng = np.random.default_rng(0)
    t = rng.normal(size=(n, hidden)).astype(np.float32)
    words, ents = (rng.normal(size=(k, hidden)).astype(np.float32) for k in (vocab, rows))
    word_bias, ent_bias = (rng.normal(size=k).astype(np.float32) for k in (vocab, rows))
    labels = np.array([3, 39, 0, vocab + 0, vocab + 5, 17, vocab + 2, 8, vocab + 5, 1, 2,
                       vocab + 4], np.int32)
    t[5] = 3.0 * words[17]  # one confident, correct word prediction
    devices = jax.devices()[:mesh_shape[0] * mesh_shape[1]]
    mesh = parallel.make_mesh(*mesh_shape, devices=devices)
    ce, correct = jax.jit(lambda *a: docent_loss.union_cross_entropy(*a, mesh, n_ent))(
        t, labels, words, word_bias, ents, ent_bias)
    union = np.concatenate([words, ents[:n_ent]]).astype(np.float64)
    logits = t.astype(np.float64) @ union.T + np.concatenate([word_bias, ent_bias[:n_ent]])
    lse = np.log(np.exp(logits - logits.max(1, keepdims=True)).sum(1)) + logits.max(1)
    want = lse - logits[np.arange(n), labels]
    np.testing.assert_allclose(np.asarray(ce), want, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(np.asarray(correct),
                                  (logits.argmax(1) == labels).astype(np.float32))
    assert np.asarray(correct)[5] == 1.0


def test_hybrid_mlm_head_input_is_the_token_state_and_the_entity_vector(hybrid_tiny):
    """logits = LN(gelu([h_t ; g(e)] W + b)) E_word^T + b_w, recomputed in numpy, and moving
    g(e) changes the predictions of e's sentences only, by exactly that formula."""
    from scipy.special import erf

    model, params = hybrid_tiny
    cfg = _tiny_config()
    rng = np.random.default_rng(2)
    ids = rng.integers(104, cfg.vocab_size, (3, 7)).astype(np.int32)
    mask, types = np.ones_like(ids), np.zeros_like(ids)
    entity_ids = np.array([1, 3, 1], np.int32)
    positions = np.array([[1, 4], [2, 5], [3, 3]], np.int32)
    params = dict(params, word_bias=jax.random.normal(jax.random.key(5), (cfg.vocab_size,)))

    @jax.jit
    def run(p):
        _, logits, _, _ = model.apply({"params": p}, ids, mask, types, entity_ids, positions)
        hidden = model.apply({"params": p}, ids, mask, types,
                             method=model_lib.DocEntDual.encode_tokens)[1]
        return logits, hidden

    def reference(p, hidden):
        p = jax.tree.map(lambda x: np.asarray(x, np.float64), p)
        h = np.take_along_axis(np.asarray(hidden, np.float64), positions[..., None], axis=1)
        g = p["entity_embeddings"][entity_ids][:, None, :].repeat(2, axis=1)
        x = np.concatenate([h, g], axis=-1)
        x = x @ p["mlm_transform"]["dense"]["kernel"] + p["mlm_transform"]["dense"]["bias"]
        x = 0.5 * x * (1 + erf(x / np.sqrt(2)))
        x = _layer_norm(x, p["mlm_transform"]["LayerNorm"]["scale"],
                        p["mlm_transform"]["LayerNorm"]["bias"])
        words = p["transformer"]["embeddings"]["word_embeddings"]["embedding"]
        return x @ words.T + p["word_bias"]

    logits, hidden = jax.device_get(run(params))
    np.testing.assert_allclose(logits, reference(params, hidden), rtol=1e-4, atol=1e-4)
    moved = dict(params, entity_embeddings=params["entity_embeddings"].at[1].add(0.5))
    logits2, hidden2 = jax.device_get(run(moved))
    np.testing.assert_array_equal(hidden2, hidden)  # the encoder never sees g
    np.testing.assert_array_equal(logits2[1], logits[1])  # entity 3's sentence: unchanged
    assert np.abs(logits2[[0, 2]] - logits[[0, 2]]).min() > 0  # entity 1's: all changed
    np.testing.assert_allclose(logits2, reference(moved, hidden), rtol=1e-4, atol=1e-4)


# ----------------------------------------------------------------------------- checkpoint


def test_full_model_loads_minilm_unchanged(minilm_dir, tokenizer):
    pre = load_pretrained(minilm_dir, dropout=False)
    model = model_lib.DocEntFull(pre.config, num_entities=6)
    mesh = parallel.make_mesh(8, 1)
    state, _ = training.create_sharded_state(
        model_lib.init_fn(model, seq_len=1, predictions=1), optax.identity(), mesh,
        jax.random.key(0), pretrained={model_lib.PRETRAINED_PATH: pre.params})
    params = state.params
    np.testing.assert_array_equal(
        np.asarray(params["transformer"]["embeddings"]["word_embeddings"]["embedding"]),
        pre.params["embeddings"]["word_embeddings"]["embedding"])
    tokens = tokenize(tokenizer, ["The game was played at Levi's Stadium in Santa Clara."], 16)
    ids = jnp.asarray(tokens.input_ids)
    mask = jnp.asarray((np.arange(16)[None] < tokens.lengths[:, None]).astype(np.int32))
    types = jnp.zeros_like(ids)

    @jax.jit
    def both(ours, theirs):
        full = model.apply({"params": ours}, ids, mask, types, method=model_lib.DocEntFull.encode)
        plain = TransformerEncoder(pre.config).apply({"params": theirs}, ids, mask, types)
        return full.last_hidden_state, plain.last_hidden_state

    ours, minilm = both(params, jax.device_put(pre.params, parallel.replicated(mesh)))
    np.testing.assert_array_equal(np.asarray(ours), np.asarray(minilm))
    # Entity rows: truncated normal, std 0.02 before truncation at 2 sigma (std ~0.0176).
    entities = np.asarray(model_lib.entity_table(params))
    assert entities.shape == (6, 384)
    assert np.abs(entities).max() <= 0.04 + 1e-7
    assert 0.0155 < entities.std() < 0.0195
    # The head is fresh (MiniLM has no cls.* weights): LayerNorm at its initial values.
    np.testing.assert_array_equal(np.asarray(params["mlm_transform"]["LayerNorm"]["scale"]),
                                  np.ones(384, np.float32))

# ----------------------------------------------------------------------------- training


def _train(make_loss, model, batch, steps=20, lr=3e-3):
    """``steps`` Adam steps on one fixed batch through the shared sharded train step;
    ``make_loss(mesh) -> loss_fn``."""
    mesh = parallel.make_mesh(4, 2)  # vocabulary and entity tables sharded over "model"
    loss_fn = make_loss(mesh)
    state, shardings = training.create_sharded_state(model_lib.init_fn(model), optax.adam(lr),
                                                     mesh, jax.random.key(0))
    step = training.make_train_step(loss_fn, shardings, mesh)
    global_batch = parallel.host_to_global(batch, mesh)
    history = []
    for _ in range(steps):
        state, metrics = step(state, global_batch, jax.random.key(1))
        history.append(metrics)
    return [{k: float(v) for k, v in m.items()} for m in jax.device_get(history)]


def _falls(history, key, margin):
    values = [h[key] for h in history]
    first, last = np.mean(values[:3]), np.mean(values[-3:])
    assert np.isfinite(values).all(), (key, values)
    assert last < first - margin, (key, values)


# A random 2-layer BERT over MiniLM's real 30,522 word pieces (the real-checkpoint path is
# tested above; random weights keep the compiled step small).
TRAIN_CONFIG = _tiny_config(vocab=30522).replace(hidden_size=32, num_heads=4, num_layers=2,
                                                 intermediate_size=64)


def test_full_trains_on_squad_sentences(sentence_batch, masking):
    tokens, entity_ids = sentence_batch
    batch = docent_data.full_inputs_from_tokens(tokens.input_ids, tokens.lengths, entity_ids,
                                                word_vocab_size=30522, sep_id=102)
    model = model_lib.DocEntFull(TRAIN_CONFIG, num_entities=6)
    history = _train(lambda mesh: lambda p, b, r: docent_loss.full_loss(
        model, p, b, r, masking, mesh, entity_loss_weight=2.0), model, batch)
    # At initialisation the softmax is over the union (30,528 ids), not the 6 entities.
    assert abs(history[0]["entity_loss"] - np.log(30522 + 6)) < 1.0
    for h in history:  # lambda = 2 weights the entity term
        assert h["loss"] == pytest.approx(h["mlm_loss"] + 2 * h["entity_loss"], rel=1e-5)
    assert min(h["masked_entities"] for h in history) > 0
    _falls(history, "mlm_loss", 0.5)
    _falls(history, "entity_loss", 1.0)


def test_hybrid_trains_on_squad_sentences(sentence_batch, masking):
    tokens, entity_ids = sentence_batch
    mask = (np.arange(SEQ_LEN)[None] < tokens.lengths[:, None]).astype(np.int32)
    batch = {"input_ids": tokens.input_ids, "attention_mask": mask,
             "token_type_ids": tokens.token_type_ids, "entity_ids": entity_ids}
    model = model_lib.DocEntHybrid(TRAIN_CONFIG, num_entities=6, num_rows=6, scale_init=10.0)
    history = _train(lambda mesh: lambda p, b, r: docent_loss.hybrid_loss(
        model, p, b, r, masking, mesh), model, batch)
    _falls(history, "dual_loss", 0.3)
    _falls(history, "mlm_loss", 0.5)
