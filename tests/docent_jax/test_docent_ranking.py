"""Entity-ranking metrics (against sklearn and by hand) and the baselines' building blocks."""

import itertools
import math

import numpy as np
import pytest
import sklearn.metrics
from sklearn.feature_extraction.text import TfidfVectorizer

from docent_jax import baselines, evaluate
from embedding_core.evaluation import metrics
from embedding_core.evaluation.stats import paired_bootstrap

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


# ------------------------------------------------------------------- ties (trec_eval rule)


def _metrics_of_order(order, rel, ks, ndcg_k):
    """Metrics of one explicit ranking (item indices, best first), straight from positions."""
    positions = [p + 1 for p, item in enumerate(order) if rel[item]]
    n_rel, n = len(positions), len(order)
    out = {"MAP": sum((i + 1) / p for i, p in enumerate(positions)) / n_rel,
           "MRR": 1 / positions[0]}
    for k in ks:
        out[f"recall@{k}"] = sum(p <= k for p in positions) / n_rel
    cut = min(ndcg_k, n)
    dcg = sum(1 / math.log2(p + 1) for p in positions if p <= cut)
    idcg = sum(1 / math.log2(r + 1) for r in range(1, min(n_rel, cut) + 1))
    out[f"NDCG@{ndcg_k}"] = dcg / idcg
    return out


def _brute_force(scores_row, rel_row, ks, ndcg_k):
    """Enumerates every permutation allowed by the rule (scores non-increasing; at equal
    score no relevant item before a non-relevant one; relevant items among themselves in
    any order), checks they all give the same metrics and returns them."""
    allowed = []
    for order in itertools.permutations(range(len(scores_row))):
        ok = all(scores_row[x] > scores_row[y]
                 or (scores_row[x] == scores_row[y] and not (rel_row[x] and not rel_row[y]))
                 for x, y in itertools.pairwise(order))
        if ok:
            allowed.append(_metrics_of_order(order, rel_row, ks, ndcg_k))
    assert allowed
    for other in allowed[1:]:
        for key, value in allowed[0].items():
            assert other[key] == pytest.approx(value, abs=1e-12), key
    return allowed[0]


def test_tied_relevant_entities_are_not_counted_against_each_other():
    # trec_eval: MRR 1, recall@1 1/2 for either order of the two tied relevant entities.
    out = evaluate.ranking_metrics([[1.0, 1.0, 0.0]], [[0, 1]], ks=(1, 2), ndcg_k=2)
    assert out["MRR"] == 1.0
    assert out["recall@1"] == 0.5 and out["recall@2"] == 1.0
    assert out["MAP"] == 1.0 and out["NDCG@2"] == 1.0


def test_relevant_tied_with_non_relevant_counts_against_the_model():
    out = evaluate.ranking_metrics([[1.0, 1.0, 0.0]], [[1]], ks=(1, 2), ndcg_k=2)
    assert out["MRR"] == 0.5 and out["MAP"] == 0.5
    assert out["recall@1"] == 0.0 and out["recall@2"] == 1.0
    np.testing.assert_allclose(out["NDCG@2"], 1 / math.log2(3))
    # Two relevant entities tied with one non-relevant: it goes first, they take ranks 2, 3.
    out = evaluate.ranking_metrics([[1.0, 1.0, 1.0, 0.0]], [[0, 1]], ks=(1, 2, 3), ndcg_k=3)
    assert out["MRR"] == 0.5
    assert (out["recall@1"], out["recall@2"], out["recall@3"]) == (0.0, 0.5, 1.0)
    np.testing.assert_allclose(out["MAP"], (1 / 2 + 2 / 3) / 2)
    np.testing.assert_allclose(out["NDCG@3"], (1 / math.log2(3) + 1 / 2) / (1 + 1 / math.log2(3)))


def test_mixed_ties_by_hand():
    # Non-relevant 0 (0.9) and 3 (0.5); relevant 1, 2 (0.5, tied with 3) and 4 (0.1).
    # Worst case for the model: 0, 3, {1, 2}, 4 -> relevant ranks 3, 4, 5.
    scores = [[0.9, 0.5, 0.5, 0.5, 0.1]]
    query, rank = metrics.ranks_of_relevant(scores, [[0, 1, 1, 0, 1]])
    assert query.tolist() == [0, 0, 0] and rank.tolist() == [3, 4, 5]
    out = evaluate.ranking_metrics(scores, [[4, 2, 1]], ks=(1, 3, 4, 5), ndcg_k=4)
    np.testing.assert_allclose(out["MRR"], 1 / 3)
    np.testing.assert_allclose(out["MAP"], (1 / 3 + 2 / 4 + 3 / 5) / 3)
    np.testing.assert_allclose([out[f"recall@{k}"] for k in (1, 3, 4, 5)], [0, 1 / 3, 2 / 3, 1])
    np.testing.assert_allclose(out["NDCG@4"], (1 / 2 + 1 / math.log2(5))
                               / (1 + 1 / math.log2(3) + 1 / 2))


def test_constant_scorer_ranks_relevant_last():
    out = evaluate.ranking_metrics(np.zeros((1, 5)), [[1, 3]], ks=(1, 3, 4, 5), ndcg_k=5)
    # Ranks 4 and 5 behind the three non-relevant entities.
    np.testing.assert_allclose(out["MRR"], 1 / 4)
    np.testing.assert_allclose(out["MAP"], (1 / 4 + 2 / 5) / 2)
    assert [out[f"recall@{k}"] for k in (1, 3, 4, 5)] == [0.0, 0.0, 0.5, 1.0]


@pytest.mark.parametrize("seed", range(4))
def test_ties_match_brute_force_over_all_allowed_orders(seed):
    rng = np.random.default_rng(seed)
    ks, ndcg_k = (1, 2, 3, 6), 3
    for _ in range(15):
        n = int(rng.integers(2, 7))
        scores = rng.integers(0, 3, size=(1, n)).astype(np.float32)  # 3 values: many ties
        relevant = [sorted(rng.choice(n, size=int(rng.integers(1, n + 1)), replace=False))]
        rel_row = np.zeros(n, dtype=bool)
        rel_row[relevant[0]] = True
        ref = _brute_force(scores[0], rel_row, ks, ndcg_k)
        got = evaluate.ranking_metrics(scores, relevant, ks, ndcg_k)
        for key, value in ref.items():
            assert got[key] == pytest.approx(value, abs=1e-12), (key, scores, relevant)


def test_ranks_follow_the_pessimistic_sort_and_do_not_depend_on_chunking(monkeypatch):
    rng = np.random.default_rng(5)
    scores = rng.integers(0, 4, size=(40, 17)).astype(np.uint8)  # unsigned: no negation
    rel = rng.random((40, 17)) < 0.3
    rel[:, 0] |= ~rel.any(axis=1)
    query, rank = metrics.ranks_of_relevant(scores, rel)
    # Position of each relevant item when sorting by score desc, relevant after ties.
    order = metrics._pessimistic_order(scores, rel)
    ref_q, ref_pos = np.nonzero(np.take_along_axis(rel, order, axis=1))
    np.testing.assert_array_equal(query, ref_q)
    np.testing.assert_array_equal(rank, ref_pos + 1)
    monkeypatch.setattr(metrics, "_MAX_COMPARISONS", 20)  # one pair per chunk
    q2, r2 = metrics.ranks_of_relevant(scores, rel)
    np.testing.assert_array_equal(q2, query)
    np.testing.assert_array_equal(r2, rank)


def test_one_relevant_per_query_equals_ranks_of_targets():
    rng = np.random.default_rng(2)
    scores = rng.integers(0, 3, size=(30, 8)).astype(np.float64)
    scores[0, :3] = -np.inf
    targets = rng.integers(0, 8, size=30)
    targets[0] = 1
    _, rank = metrics.ranks_of_relevant(scores, np.eye(8, dtype=bool)[targets])
    np.testing.assert_array_equal(rank, metrics.ranks_of_targets(scores, targets))


def test_map_and_ndcg_agree_with_embedding_core_metrics_under_ties():
    rng = np.random.default_rng(3)
    scores = rng.integers(0, 4, size=(50, 12)).astype(np.float32)
    relevant = [rng.choice(12, size=int(rng.integers(1, 6)), replace=False).tolist()
                for _ in range(50)]
    rel = np.zeros((50, 12), dtype=bool)
    for i, r in enumerate(relevant):
        rel[i, r] = True
    out = evaluate.ranking_metrics(scores, relevant, ndcg_k=5)
    np.testing.assert_allclose(out["MAP"], metrics.mean_average_precision(scores, rel),
                               rtol=1e-12)
    np.testing.assert_allclose(out["NDCG@5"], metrics.ndcg_at_k(scores, rel, 5), rtol=1e-12)


@pytest.mark.parametrize("ndcg_k", [1, 3, 10, 40])
def test_map_and_ndcg_against_sklearn_without_ties(ndcg_k):
    rng = np.random.default_rng(ndcg_k)
    scores = rng.standard_normal((60, 25))  # continuous: no ties
    relevant = [rng.choice(25, size=int(rng.integers(1, 8)), replace=False).tolist()
                for _ in range(60)]
    rel = np.zeros(scores.shape, dtype=bool)
    for i, r in enumerate(relevant):
        rel[i, r] = True
    summary, per_query = evaluate.ranking_metrics(scores, relevant, ndcg_k=ndcg_k,
                                                  per_query=True)
    ap = [sklearn.metrics.average_precision_score(rel[i], scores[i]) for i in range(60)]
    np.testing.assert_allclose(per_query["MAP"], ap, rtol=1e-12)
    ndcg = [sklearn.metrics.ndcg_score(rel[i : i + 1], scores[i : i + 1], k=ndcg_k)
            for i in range(60)]
    np.testing.assert_allclose(per_query[f"NDCG@{ndcg_k}"], ndcg, rtol=1e-12)
    np.testing.assert_allclose(summary[f"NDCG@{ndcg_k}"],
                               sklearn.metrics.ndcg_score(rel, scores, k=ndcg_k), rtol=1e-12)


# -------------------------------------------------------------------------------- per query


def test_per_query_values_by_hand_and_means_equal_summary():
    summary, per_query = evaluate.ranking_metrics(SCORES, RELEVANT, ks=(1, 2, 3), ndcg_k=10,
                                                  per_query=True)
    assert set(per_query) == {"MAP", "MRR", "recall@1", "recall@2", "recall@3", "NDCG@10"}
    for name, values in per_query.items():
        assert values.shape == (3,) and values.dtype == np.float64
        assert np.mean(values) == summary[name]
    np.testing.assert_allclose(per_query["MAP"], [1 / 2, 1 / 2, 1])
    np.testing.assert_allclose(per_query["MRR"], [1 / 2, 1 / 2, 1])
    np.testing.assert_allclose(per_query["recall@2"], [1, 1 / 2, 1])
    assert summary["num_queries"] == 3
    # The default return is the summary dict alone.
    assert evaluate.ranking_metrics(SCORES, RELEVANT, ks=(1, 2, 3), ndcg_k=10) == summary


def test_blockwise_per_query_equals_whole_matrix():
    rng = np.random.default_rng(1)
    scores = rng.integers(0, 3, size=(23, 9)).astype(np.float32)
    relevant = [rng.choice(9, size=int(rng.integers(1, 4)), replace=False).tolist()
                for _ in range(23)]
    whole, whole_q = evaluate.ranking_metrics(scores, relevant, per_query=True)
    blocks, blocks_q = evaluate.evaluate_scores(lambda a, b: scores[a:b], relevant,
                                                block_size=5, per_query=True)
    assert blocks == whole
    for name, values in whole_q.items():
        np.testing.assert_array_equal(blocks_q[name], values, err_msg=name)
        assert np.mean(blocks_q[name]) == blocks[name]
    assert evaluate.evaluate_scores(lambda a, b: scores[a:b], relevant, block_size=5) == whole


def test_evaluate_embeddings_forwards_per_query_to_a_paired_bootstrap():
    rng = np.random.default_rng(4)
    entities = rng.standard_normal((30, 8))
    relevant = [[i % 30] for i in range(40)]
    good = entities[[r[0] for r in relevant]] + 0.3 * rng.standard_normal((40, 8))
    bad = rng.standard_normal((40, 8))
    s_good, q_good = evaluate.evaluate_embeddings(good, entities, relevant, per_query=True,
                                                  block_size=7)
    s_bad, q_bad = evaluate.evaluate_embeddings(bad, entities, relevant, per_query=True)
    assert q_good["MRR"].shape == (40,)
    interval = paired_bootstrap(q_good["MRR"], q_bad["MRR"], num_samples=2000)
    np.testing.assert_allclose(interval.mean_difference, s_good["MRR"] - s_bad["MRR"])
    assert interval.low > 0  # the near-copies of the entity vectors win clearly


def test_bad_cutoffs_are_rejected():
    with pytest.raises(ValueError, match="ks"):
        evaluate.ranking_metrics(SCORES, RELEVANT, ks=(0,))
    with pytest.raises(ValueError, match="ndcg_k"):
        evaluate.ranking_metrics(SCORES, RELEVANT, ndcg_k=0)
    with pytest.raises(ValueError, match="block_size"):
        evaluate.evaluate_scores(lambda a, b: SCORES[a:b], RELEVANT, block_size=0)
    with pytest.raises(ValueError, match="NaN"):
        evaluate.ranking_metrics([[np.nan, 1.0]], [[0]])


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


class _Letters(baselines.Encoder):
    """Sentence vector = [number of a's, number of b's]; counts encode calls and rows."""

    dim = 2

    def __init__(self):
        self.calls = []

    def _encode(self, texts, *, batch_size, show_progress_bar):
        self.calls.append(len(texts))
        return np.array([[t.count("a"), t.count("b")] for t in texts], np.float32)


@pytest.mark.parametrize("block_size", [1, 2, 5, 100])
def test_blocked_bag_of_sentences_equals_the_whole_matrix(block_size):
    """Entity 0: "a", "aab", "bbb" -> mean [1, 4/3]; entity 1: none -> 0; entity 2: "ab",
    "b" -> [1/2, 1]. Encoded ``block_size`` sentences per call into a running sum."""
    texts = ["a", "aab", "ab", "bbb", "b"]
    entity_of = np.array([0, 0, 2, 0, 2])
    encoder = _Letters()
    out = baselines.encode_bag_of_sentences(encoder, texts, entity_of, 3,
                                            block_size=block_size)
    want = baselines.bag_of_sentences(encoder.encode(texts), entity_of, 3)
    np.testing.assert_array_equal(out, want)
    np.testing.assert_allclose(out, [[1.0, 4 / 3], [0.0, 0.0], [0.5, 1.0]], rtol=1e-7)
    assert encoder.calls[:-1] == [min(block_size, 5 - i) for i in range(0, 5, block_size)]


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
