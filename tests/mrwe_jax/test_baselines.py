"""TF-IDF and BM25 baselines against hand-worked values."""

import math

import numpy as np

from mrwe_jax.baselines import bm25_scores, tfidf_scores

PARAGRAPHS = ["cat sat mat", "Dog sat.", "cat, cat dog bird"]


def test_bm25_equals_hand_computed_lucene_okapi():
    scores = bm25_scores(["cat bird", "zebra", "cat cat"], PARAGRAPHS, k1=1.5, b=0.75)
    assert scores.shape == (3, 3) and scores.dtype == np.float32
    n, avgdl, k1, b = 3, 3.0, 1.5, 0.75

    def idf(df):
        return math.log(1 + (n - df + 0.5) / (df + 0.5))

    def tfc(tf, length):
        return tf / (tf + k1 * (1 - b + b * length / avgdl))

    d0 = idf(2) * tfc(1, 3)  # cat once in a 3-word paragraph = ln(1.6) * 0.4
    assert d0 == math.log(1.6) * 0.4
    d2 = idf(2) * tfc(2, 4) + idf(1) * tfc(1, 4)
    np.testing.assert_allclose(scores[0], [d0, 0.0, d2], rtol=1e-6)
    np.testing.assert_array_equal(scores[1], 0.0)  # no indexed word
    np.testing.assert_allclose(scores[2], 2 * np.array([d0, 0.0, idf(2) * tfc(2, 4)]),
                               rtol=1e-6)  # a repeated query word counts twice


def test_tfidf_cosine_equals_manual_smooth_idf():
    questions = ["Which cat sat?", "bird bird"]
    scores = tfidf_scores(questions, PARAGRAPHS)
    vocab = ["bird", "cat", "dog", "mat", "sat"]
    docs = [p.lower().replace(",", "").replace(".", "").split() for p in PARAGRAPHS]
    df = np.array([sum(w in d for d in docs) for w in vocab])
    idf = np.log((1 + 3) / (1 + df)) + 1  # sklearn smooth_idf=True

    def vec(words):
        v = np.array([words.count(w) for w in vocab], float) * idf
        return v / np.linalg.norm(v)

    want = np.array([[vec(["cat", "sat"]) @ vec(d) for d in docs],
                     [vec(["bird", "bird"]) @ vec(d) for d in docs]])
    np.testing.assert_allclose(scores, want, rtol=1e-6)
    assert np.argmax(scores[1]) == 2
