"""Entity-ranking metrics (against sklearn and by hand) and the baselines' building blocks."""

import numpy as np
import pytest
import sklearn.metrics
from sklearn.feature_extraction.text import TfidfVectorizer

from docent_jax import baselines, evaluate

SCORES = np.array([[0.9, 0.1, 0.5, 0.3],
                   [0.2, 0.8, 0.4, 0.6],
                   [0.1, 0.2, 0.3, 0.4]])
RELEVANT = [[2], [0, 3], [3]]


def test_metrics_by_hand_and_against_sklearn():
    out = evaluate.ranking_metrics(SCORES, RELEVANT, ks=(1, 2, 3), ndcg_k=10)
    # q0: entity 2 at rank 2 -> AP 1/2, RR 1/2. q1: entity 3 at rank 2, entity 0 at rank 4
    # -> AP (1/2 + 2/4) / 2 = 1/2, RR 1/2. q2: entity 3 at rank 1 -> AP 1, RR 1.
    np.testing.assert_allclose(out["MAP"], 2 / 3)
    np.testing.assert_allclose(out["MRR"], 2 / 3)
    # recall@k: share of each query's relevant entities in its top k, averaged.
    np.testing.assert_allclose(out["recall@1"], (0 + 0 + 1) / 3)
    np.testing.assert_allclose(out["recall@2"], (1 + 0.5 + 1) / 3)
    np.testing.assert_allclose(out["recall@3"], (1 + 0.5 + 1) / 3)
    rel = np.zeros_like(SCORES, dtype=bool)
    for i, r in enumerate(RELEVANT):
        rel[i, r] = True
    ap = [sklearn.metrics.average_precision_score(rel[i], SCORES[i]) for i in range(3)]
    np.testing.assert_allclose(out["MAP"], np.mean(ap))
    np.testing.assert_allclose(out["NDCG@10"], sklearn.metrics.ndcg_score(rel, SCORES, k=10))
    assert out["num_queries"] == 3


def test_blockwise_evaluation_equals_whole_matrix():
    rng = np.random.default_rng(0)
    scores = rng.standard_normal((23, 9))
    relevant = [rng.choice(9, size=rng.integers(1, 4), replace=False).tolist()
                for _ in range(23)]
    whole = evaluate.ranking_metrics(scores, relevant)
    blocks = evaluate.evaluate_scores(lambda a, b: scores[a:b], relevant, block_size=5)
    for key, value in whole.items():
        np.testing.assert_allclose(blocks[key], value, rtol=1e-12, err_msg=key)


def test_ties_count_against_the_model():
    out = evaluate.ranking_metrics(np.zeros((1, 4)), [[1]], ks=(1, 4))
    np.testing.assert_allclose(out["MRR"], 1 / 4)
    assert out["recall@1"] == 0.0 and out["recall@4"] == 1.0


def test_bad_queries_are_rejected():
    with pytest.raises(ValueError, match="query 1 has no relevant entity"):
        evaluate.ranking_metrics(SCORES[:2], [[0], []])
    with pytest.raises(ValueError, match="query 0: relevant entity 7"):
        evaluate.ranking_metrics(SCORES[:1], [[7]])


def test_bag_of_sentences_is_the_mean_and_zero_without_sentences():
    vectors = np.array([[1.0, 0.0], [3.0, 0.0], [0.0, 2.0]])
    out = baselines.bag_of_sentences(vectors, np.array([0, 0, 2]), 3)
    np.testing.assert_array_equal(out, [[2.0, 0.0], [0.0, 0.0], [0.0, 2.0]])
    assert out.dtype == np.float32
    with pytest.raises(ValueError, match=r"\[0, 2\)"):
        baselines.bag_of_sentences(vectors, np.array([0, 0, 2]), 2)


def test_tfidf_scores_entity_documents_by_cosine():
    sentences = [(1, "blue car engine"), (0, "red apple"), (0, "a sweet fruit"),
                 (2, "apple orchards grow fruit trees")]
    queries = ["apple fruit", "engine"]
    block = baselines.tfidf_score_block(sentences, 3, queries)(0, 2)
    docs = ["red apple a sweet fruit", "blue car engine", "apple orchards grow fruit trees"]
    vec = TfidfVectorizer().fit(docs)
    ref = sklearn.metrics.pairwise.cosine_similarity(vec.transform(queries), vec.transform(docs))
    np.testing.assert_allclose(block, ref, rtol=1e-6)
    assert block[1, 1] > 0 and block[1, 0] == 0 and block[1, 2] == 0


def test_glove_average_uses_in_vocabulary_words_only():
    glove = baselines.GloveAverageEncoder()
    the, cat = glove.index["the"], glove.index["cat"]
    out = glove.encode(["The cat, the", "zzqqxv"])
    np.testing.assert_allclose(out[0], (2 * glove.matrix[the] + glove.matrix[cat]) / 3,
                               rtol=1e-6, atol=1e-7)
    np.testing.assert_array_equal(out[1], 0.0)


def test_mean_pooling_encoder_matches_torch_and_ignores_padding(tiny_bert_dir):
    import torch
    from transformers import BertModel

    texts = ["a short one", "a much longer sentence that pads the short one a lot"]
    encoder = baselines.MeanPoolingEncoder(str(tiny_bert_dir), max_length=32, batch_size=4)
    ours = encoder.encode(texts)
    alone = encoder.encode(texts[:1])
    np.testing.assert_allclose(alone[0], ours[0], rtol=1e-5, atol=1e-6)
    model = BertModel.from_pretrained(tiny_bert_dir).eval()
    for i, text in enumerate(texts):
        ids = encoder.tokenizer.encode(text).ids
        with torch.no_grad():
            hidden = model(torch.tensor([ids])).last_hidden_state[0].numpy()
        np.testing.assert_allclose(ours[i], hidden.mean(axis=0), rtol=1e-4, atol=1e-5)
