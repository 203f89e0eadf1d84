"""mrwe_jax.load: a trained run is self-contained (its IDF table is a run file), and
encoding a long text needs memory linear in its word count (batches of long texts get
fewer rows) while normal texts give the same vectors as before."""

import json
import shutil
import tracemalloc

import flax.linen as nn
import jax
import numpy as np
import pytest

import mrwe_jax
from data_pipelines.retrieval_corpus import load_corpus
from mrwe_jax import data, inference, trainer
from mrwe_jax.configs import default
from mrwe_jax.features import sources as ws
from mrwe_jax.features.cache import FeatureSet
from mrwe_jax.model import build_model, init_fn

VOCAB = ("river city music king war film school church energy water law team army ship "
         "bird tree gold light stone north").split()


def squad_file(path, seed=0, num_articles=8, paragraphs=3):
    """A small SQuAD v1.1 file; ``seed`` changes every paragraph."""
    rng = np.random.default_rng(seed)
    arts, qn = [], 0
    for a in range(num_articles):
        paras = []
        for p in range(paragraphs):
            words = list(rng.choice(VOCAB, size=10))
            qas = []
            for _ in range(1 + (a + p) % 3):
                qas.append({"id": f"q{qn}", "question": " ".join(rng.choice(words, 4)),
                            "answers": []})
                qn += 1
            paras.append({"context": " ".join(words), "qas": qas})
        arts.append({"title": f"A{a}", "paragraphs": paras})
    path.write_text(json.dumps({"version": "1.1", "data": arts}))
    return path


def long_text(num_words, seed=0):
    return " ".join(np.random.default_rng(seed).choice(VOCAB, num_words))


# --------------------------------------------------------------------------- IDF run file


def test_idf_table_json_round_trip_is_exact():
    table = ws.idf(["the river city", "the gold king", "a b c the"])
    back = ws.IdfTable.from_json(json.loads(json.dumps(table.to_json())))
    assert dict(back) == dict(table) and back.num_documents == table.num_documents
    np.testing.assert_array_equal(back.weights(["river", "the", "unseen"]),
                                  table.weights(["river", "the", "unseen"]))
    for bad in ([], {"idf": {}}, {"format": ws.IDF_FORMAT, "num_documents": "3", "idf": {}},
                {"format": ws.IDF_FORMAT, "num_documents": 3, "idf": {"a": "x"}}):
        with pytest.raises(ValueError, match="idf.json is not an IDF table"):
            ws.IdfTable.from_json(bad, "idf.json")


def test_load_needs_no_corpus(tmp_path, monkeypatch, caplog):
    """Train 2 steps on a copy of a SQuAD file; alter it, delete it: load() encodes the same."""
    monkeypatch.setenv("EMBEDDING_JAX_CACHE", str(tmp_path / "cache"))
    corpus_file = squad_file(tmp_path / "squad.json")
    config = default.get_config()
    config.update(tower="convrr", num_blocks=1, window_size=3, kernels=8, scale=0.5,
                  paragraphs_per_batch=8, questions_per_paragraph=2, learning_rate=1e-2,
                  squad_path=str(corpus_file), test_fraction=0.25, sources="tfidf",
                  tfidf_dim=16, num_train_steps=2, checkpoint_every=2, log_every=1)
    workdir = tmp_path / "run"
    trainer.train(config, workdir)

    saved = ws.IdfTable.from_json(json.loads((workdir / inference.IDF_FILE).read_text()))
    corpus = load_corpus(corpus_file, test_fraction=0.25)
    expected = ws.idf(corpus.paragraph_texts)
    assert dict(saved) == dict(expected) and saved.num_documents == expected.num_documents

    texts = ["Which river runs by the city?", "gold king " * 20 + "unseenword", "army"]
    before = mrwe_jax.load(workdir).encode(texts)
    assert before.shape == (3, 16) and np.isfinite(before).all()

    squad_file(corpus_file, seed=1, num_articles=3)  # the corpus changed: other IDF values
    assert dict(ws.idf(load_corpus(corpus_file, test_fraction=0.5).paragraph_texts)) \
        != dict(expected)
    np.testing.assert_array_equal(mrwe_jax.load(workdir).encode(texts), before)
    corpus_file.unlink()  # ... and moved away
    np.testing.assert_array_equal(mrwe_jax.load(workdir).encode(texts), before)

    # A workdir trained before idf.json: the corpus is needed, and its absence is named.
    old = tmp_path / "old_run"
    shutil.copytree(workdir, old)
    (old / inference.IDF_FILE).unlink()
    with pytest.raises(FileNotFoundError,
                       match=f"has no idf.json and its training corpus {corpus_file} is gone"):
        mrwe_jax.load(old)
    squad_file(corpus_file)  # the original corpus is back: the table is rebuilt from it
    with caplog.at_level("WARNING"):
        np.testing.assert_array_equal(mrwe_jax.load(old).encode(texts), before)
    assert "has no idf.json" in caplog.text


# --------------------------------------------------------------------------- long texts


def untrained_retriever(tower="convrr", dim=256):
    """A Retriever on the hashed TF-IDF source with random params (no files needed)."""
    config = default.get_config()
    config.update(tower=tower, sources="tfidf", tfidf_dim=dim, num_blocks=2, kernels=32)
    recipe = {"sources": ["tfidf"], "source_dims": {"tfidf": dim}, "source_weights": [1.0],
              "source_aggregate": "concatenate", "word_aggregate": "average"}
    table = ws.idf(["the river city", "gold king", "the army of the north", long_text(50)])
    features = FeatureSet.from_recipe(recipe, table)
    model = build_model(config)
    params = nn.meta.unbox(init_fn(model, features, config)(jax.random.key(0)))
    return inference.Retriever(model, params, config, features)


def test_batch_rows_bound_the_padded_slots():
    assert data.batch_rows(512, 64) == 64  # 64 x 512 = the budget: as before
    assert data.batch_rows(1024, 64) == 32
    assert data.batch_rows(32768, 64) == 1
    assert data.batch_rows(4096, 64, None) == 64
    assert data.batch_rows(16, 3, 32) == 2  # a power of two below the batch size
    for width in (16, 64, 1024, 1 << 15, 1 << 17):
        for batch in (1, 3, 64, 128):
            rows = data.batch_rows(width, batch)
            assert 1 <= rows <= batch
            assert rows * width <= max(data.MAX_BATCH_WORDS, width)


def test_best_window_equals_the_dense_score_table():
    def dense(num_pieces, starts, content):
        pos = np.arange(num_pieces)[:, None]
        s = np.asarray(starts)[None, :]
        inside = (pos >= s) & (pos < s + content)
        score = np.where(inside, np.minimum(pos - s, s + content - 1 - pos), -1)
        return np.argmax(score, axis=1)

    rng = np.random.default_rng(0)
    for _ in range(100):
        content, n = int(rng.integers(1, 600)), int(rng.integers(1, 4000))
        starts = ws.window_starts(n, content)
        np.testing.assert_array_equal(ws.best_window(n, starts, content),
                                      dense(n, starts, content))
        other = rng.integers(0, n, size=int(rng.integers(1, 9))).tolist()  # any order
        np.testing.assert_array_equal(ws.best_window(n, other, content),
                                      dense(n, other, content))


@pytest.mark.parametrize("tower", ["convrr", "fcrr"])
def test_vectors_are_unchanged_by_the_row_budget(tower):
    """Normal texts: bit-identical to unbudgeted batches (the code before the budget);
    long texts in batches of fewer rows: within float32 rounding, in input order."""
    retriever = untrained_retriever(tower)
    normal = ["Who founded the city?", "The army of the north.", long_text(300, 1), "gold"]
    texts = [long_text(1200, 2), *normal, long_text(2000, 3), long_text(40, 4)]
    got = {}
    for budget in (None, data.MAX_BATCH_WORDS, 1024):
        retriever.max_batch_words = budget
        got[budget] = (retriever.encode(normal), retriever.encode(texts, batch_size=4),
                       retriever.encode(texts, side="paragraph"))
    np.testing.assert_array_equal(got[data.MAX_BATCH_WORDS][0], got[None][0])
    for budget in (data.MAX_BATCH_WORDS, 1024):
        for a, b in zip(got[None], got[budget], strict=True):
            # Other batch widths reduce in another order: a few ulp of unit-scale values
            # (1.07e-6 seen on an AVX-512 machine).
            np.testing.assert_allclose(a, b, rtol=0, atol=5e-6)
    assert np.abs(got[None][1][0] - got[None][1][1]).max() > 1e-3  # rows are not all one


def _peak_bytes(retriever, text):
    retriever.encode([text])  # compile first (XLA's memory is not Python's)
    tracemalloc.start()
    try:
        retriever.encode([text])
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_encode_memory_is_linear_in_words():
    """Host memory (numpy, traced) of encoding one text: ``batch_size`` padded rows per
    batch made it ``64 x`` the text's own word matrix (the mixture's ``[rows, width, L, d]``
    and the tower's ``[rows, width, d'']``); now a long text is one row."""
    dim = 256
    retriever = untrained_retriever(dim=dim)
    words_bytes = 2048 * dim * 4  # one 2,000-word text's padded word matrix
    retriever.max_batch_words = None  # every batch 64 rows: what the fault looked like
    unbudgeted = _peak_bytes(retriever, long_text(2000))
    assert unbudgeted > 32 * words_bytes
    retriever.max_batch_words = data.MAX_BATCH_WORDS
    short, long = _peak_bytes(retriever, long_text(500)), _peak_bytes(retriever, long_text(2000))
    assert long < 2 * short and long < unbudgeted / 3  # within the budget: no growth
    assert long < 8 * (data.MAX_BATCH_WORDS * dim * 4)
    retriever.max_batch_words = 256  # past the budget: linear, a few copies of the text
    short, long = _peak_bytes(retriever, long_text(500)), _peak_bytes(retriever, long_text(2000))
    assert long < 8 * words_bytes
    assert long < 6 * short
