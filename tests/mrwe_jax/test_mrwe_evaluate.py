"""mrwe_jax.evaluate: recall@k over a paragraph pool against a brute-force reference."""

import numpy as np
import pytest

from data_pipelines.retrieval_corpus import RetrievalCorpus
from data_pipelines.squad import SquadSkips
from mrwe_jax import data, evaluate
from mrwe_jax.features.cache import FeatureSet, TextFeatures
from mrwe_jax.features.sources import IdfTable

KS = (1, 2, 3, 5, 10)


def brute_force_recall(q_vecs, p_vecs, q_par, pool, ks):
    """Reference: cosines by Python loops; the target is put after every tie; rank by position."""
    out = {k: 0 for k in ks}
    for q, target in zip(q_vecs, q_par, strict=True):
        scored = []
        for p in pool:
            v = p_vecs[p]
            nq, nv = np.linalg.norm(q), np.linalg.norm(v)
            cos = 0.0 if nq == 0 or nv == 0 else float(np.dot(q, v) / (nq * nv))
            scored.append((cos, p == target, p))
        # Higher cosine first; among equal cosines the target goes last (pessimistic).
        scored.sort(key=lambda t: (-t[0], t[1]))
        rank = 1 + [t[2] for t in scored].index(target)
        for k in ks:
            out[k] += rank <= k
    return {k: v / len(q_vecs) for k, v in out.items()}


def _corpus(n_par, q_par, test_q, test_pool):
    n_q = len(q_par)
    return RetrievalCorpus(
        paragraph_ids=[f"p{i}" for i in range(n_par)], paragraph_texts=["x"] * n_par,
        paragraph_article=np.zeros(n_par, np.int64), question_ids=[f"q{i}" for i in range(n_q)],
        question_texts=["x"] * n_q, question_paragraph=np.asarray(q_par, np.int64),
        train_questions=~np.asarray(test_q), test_questions=np.asarray(test_q),
        train_paragraphs=~np.asarray(test_pool), test_pool=np.asarray(test_pool),
        split="articles", source="synthetic", skips=SquadSkips())


def _features(q_vecs, p_vecs):
    def tf(v):
        v = np.asarray(v, np.float32)
        return TextFeatures(words=v.copy(), offsets=np.arange(len(v) + 1),
                                 vectors=v)

    return FeatureSet(names=["glove"], questions={"glove": tf(q_vecs)},
                           paragraphs={"glove": tf(p_vecs)}, source_weights=np.ones(1, np.float32),
                           source_aggregate="concatenate", word_aggregate="average",
                           idf_table=IdfTable({}, 1))


def test_recall_equals_brute_force_with_ties_and_a_subset_pool():
    # Axis-aligned vectors: cosines are exactly 0, 1 or -1, so ties are exact.
    e = np.eye(3, dtype=np.float32)
    p_vecs = np.stack([e[0], 2 * e[0], e[1], e[2], 3 * e[1], -e[0], e[2], 5 * e[0]])
    # A non-contiguous test pool: paragraphs 0, 2, 3, 5, 6.
    test_pool = np.array([1, 0, 1, 1, 0, 1, 1, 0], bool)  # pool = [0, 2, 3, 5, 6]
    q_vecs = np.stack([e[0], e[1], e[2], np.zeros(3), e[2], -e[0], e[0] + e[1], e[1]])
    q_par = np.array([0, 2, 3, 0, 6, 5, 2, 4])
    test_q = np.array([1, 1, 1, 1, 1, 1, 1, 0], bool)  # the last asks about a train paragraph
    corpus = _corpus(len(p_vecs), q_par, test_q, test_pool)
    rows = evaluate.evaluate_retrieval(corpus, _features(q_vecs, p_vecs), pool="test", ks=KS,
                                       lexical=False)
    got = rows[evaluate.SOURCE_LABELS["glove"]]
    pool = np.flatnonzero(test_pool)
    want = brute_force_recall(q_vecs[test_q], p_vecs, q_par[test_q], pool, KS)
    assert got == pytest.approx(want, abs=1e-12)
    # Hand-worked ranks in the pool [0, 2, 3, 5, 6]: q0 target 0 ties with nothing -> 1;
    # q1 -> 1; q2 target 3 ties with 6 -> 2; q3 (zero vector) ties all -> 5; q4 target 6
    # ties with 3 -> 2; q5 -> 1; q6 (e0+e1) ties 0 and 2 -> 2.
    ranks = np.array([1, 1, 2, 5, 2, 1, 2])
    assert got == pytest.approx({k: float(np.mean(ranks <= k)) for k in KS})
    assert got[1] == pytest.approx(3 / 7) and got[2] == pytest.approx(6 / 7)
    # The "all" pool adds paragraphs 1, 4, 7 (2*e0, 3*e1, 5*e0: ties for q0, q1, q6).
    rows_all = evaluate.evaluate_retrieval(corpus, _features(q_vecs, p_vecs), pool="all",
                                           ks=KS, lexical=False)
    want_all = brute_force_recall(q_vecs[test_q], p_vecs, q_par[test_q], np.arange(8), KS)
    assert rows_all[evaluate.SOURCE_LABELS["glove"]] == pytest.approx(want_all, abs=1e-12)


def test_random_case_matches_brute_force_and_blocks_do_not_matter():
    rng = np.random.default_rng(0)
    # Small integer vectors: many exact ties.
    p_vecs = rng.integers(-1, 2, size=(30, 3)).astype(np.float32)
    q_par = rng.integers(0, 30, size=40)
    q_vecs = p_vecs[q_par] + rng.integers(-1, 2, size=(40, 3))
    pool = np.arange(30)
    targets = evaluate.targets_in_pool(q_par, pool)
    for block in (1, 7, 1024):
        ranks = evaluate.cosine_ranks(q_vecs, p_vecs, targets, block=block)
        got = {k: float(np.mean(ranks <= k)) for k in KS}
        assert got == pytest.approx(brute_force_recall(q_vecs, p_vecs, q_par, pool, KS))


def test_targets_outside_the_pool_are_an_error():
    with pytest.raises(ValueError, match="outside the pool"):
        evaluate.targets_in_pool(np.array([0, 3]), np.array([0, 1, 2]))
    np.testing.assert_array_equal(evaluate.targets_in_pool(np.array([7, 2]), np.array([2, 7])),
                                  [1, 0])


def test_ensemble_row_is_cosine_of_concatenated_weighted_vectors():
    rng = np.random.default_rng(1)
    qa, qb = rng.normal(size=(6, 2)), rng.normal(size=(6, 3))
    pa, pb = rng.normal(size=(5, 2)), rng.normal(size=(5, 3))

    def tf(v):
        v = np.asarray(v, np.float32)
        return TextFeatures(words=v, offsets=np.arange(len(v) + 1), vectors=v)

    feats = FeatureSet(
        names=["glove", "tfidf"], questions={"glove": tf(qa), "tfidf": tf(qb)},
        paragraphs={"glove": tf(pa), "tfidf": tf(pb)},
        source_weights=np.array([0.8, 0.2], np.float32), source_aggregate="concatenate",
        word_aggregate="average", idf_table=IdfTable({}, 1))
    np.testing.assert_allclose(data.ensemble_vectors(feats, "paragraphs"),
                               np.concatenate([0.8 * pa, 0.2 * pb], 1), rtol=1e-6)
    q_par = np.array([0, 1, 2, 3, 4, 0])
    corpus = _corpus(5, q_par, np.ones(6, bool), np.ones(5, bool))
    rows = evaluate.evaluate_retrieval(corpus, feats, pool="test", ks=KS, lexical=False)
    want = brute_force_recall(np.concatenate([0.8 * qa, 0.2 * qb], 1),
                              np.concatenate([0.8 * pa, 0.2 * pb], 1), q_par, range(5), KS)
    assert rows["multi-resolution ensemble (glove+tfidf)"] == pytest.approx(want)


def test_table_and_tsne_selection():
    rows = {"a": {1: 0.5, 10: 1.0}, "longer name": {1: 0.25, 10: 0.75}}
    table = evaluate.format_table(rows, "title")
    assert table.splitlines()[0] == "title"
    assert " 50.00 " in table and "100.00" in table and " 25.00" in table
    q_par = np.array([0, 1, 1, 2, 2, 2, 3, 3, 3])
    test_q = np.array([1, 1, 1, 1, 1, 1, 0, 0, 0], bool)  # paragraph 3 is not a test one
    corpus = _corpus(4, q_par, test_q, np.array([1, 1, 1, 0], bool))
    sel, labels = evaluate.tsne_selection(corpus, 2)
    np.testing.assert_array_equal(sel, [1, 2, 3, 4, 5])
    np.testing.assert_array_equal(labels, [1, 1, 2, 2, 2])
