"""SQuAD retrieval corpus and splits, bad input, the feature cache (``data_pipelines``), and
``mrwe_jax.data``'s P x K batches."""

import json
from pathlib import Path

import ml_collections
import numpy as np
import pytest

from data_pipelines.errors import DataError
from data_pipelines.retrieval_corpus import load_corpus
from mrwe_jax import data
from mrwe_jax.features import cache as word_features
from mrwe_jax.features import sources as ws

WORDS = ("river city music king war film school church energy water law team army ship "
         "bird tree gold light stone north").split()


def squad_dict(num_articles=6, paragraphs=3, seed=0):
    """A SQuAD v1.1 object whose paragraphs have 1-3 questions sharing their words."""
    rng = np.random.default_rng(seed)
    data_ = []
    qn = 0
    for a in range(num_articles):
        paras = []
        for p in range(paragraphs):
            words = list(rng.choice(WORDS, size=12))
            qas = []
            for _ in range(1 + (a + p) % 3):
                qas.append({"id": f"q{qn}", "question": " ".join(rng.choice(words, 4)) + "?",
                            "answers": [{"text": words[0], "answer_start": 0}]})
                qn += 1
            paras.append({"context": " ".join(words) + ".", "qas": qas})
        data_.append({"title": f"Article_{a}", "paragraphs": paras})
    return {"version": "1.1", "data": data_}


def write(tmp_path, obj, name="squad.json"):
    path = tmp_path / name
    path.write_text(json.dumps(obj))
    return path


def test_article_split_keeps_test_paragraphs_unseen(tmp_path):
    path = write(tmp_path, squad_dict())
    c = load_corpus(path, split="articles", test_fraction=0.34, seed=1)
    assert len(c.paragraph_ids) == 18 and len(c.question_ids) == len(set(c.question_ids))
    # Every test question's paragraph is in the test pool and never a training paragraph.
    test_par = set(c.question_paragraph[c.test_questions].tolist())
    train_par = set(c.question_paragraph[c.train_questions].tolist())
    assert test_par.isdisjoint(train_par)
    assert test_par == set(np.flatnonzero(c.test_pool).tolist())
    assert not (c.train_paragraphs & c.test_pool).any()
    # Whole articles move: 2 of 6 articles are test.
    assert len(set(c.paragraph_article[c.test_pool].tolist())) == 2
    # Question i really asks about paragraph question_paragraph[i] (same file record).
    raw = squad_dict()
    flat = [(p["context"], q["id"]) for a in raw["data"] for p in a["paragraphs"]
            for q in p["qas"]]
    for (context, qid), pi, got in zip(flat, c.question_paragraph, c.question_ids, strict=True):
        assert got == qid and c.paragraph_texts[pi] == context


def test_seen_paragraph_split_is_the_authors_leak(tmp_path):
    c = load_corpus(write(tmp_path, squad_dict()), split="seen_paragraphs",
                         test_fraction=0.3, seed=0)
    assert c.test_pool.all()  # every paragraph is a candidate
    assert not (c.train_questions & c.test_questions).any()
    assert (c.train_questions | c.test_questions).all()
    test_par = set(c.question_paragraph[c.test_questions].tolist())
    assert test_par & set(c.question_paragraph[c.train_questions].tolist())  # seen in training


def test_missing_field_names_the_record(tmp_path):
    obj = squad_dict()
    del obj["data"][1]["paragraphs"][2]["qas"][0]["question"]
    with pytest.raises(DataError) as err:
        load_corpus(write(tmp_path, obj))
    assert "data[1] 'Article_1'.paragraphs[2].qas[0]" in str(err.value)
    assert "question" in err.value.field and "missing field" in str(err.value)


def test_question_without_paragraph_text_errors_or_is_counted(tmp_path):
    obj = squad_dict()
    obj["data"][0]["paragraphs"][1]["context"] = "   "  # questions with no paragraph
    path = write(tmp_path, obj)
    with pytest.raises(DataError, match=r"data\[0\] 'Article_0'.paragraphs\[1\].context"):
        load_corpus(path)
    c = load_corpus(path, skip_invalid=True)
    assert c.skips.empty_contexts == 1
    assert len(c.paragraph_ids) == 17 and "Article_0#1" not in c.paragraph_ids
    n_questions = sum(len(p["qas"]) for a in obj["data"] for p in a["paragraphs"])
    assert len(c.question_ids) == n_questions - len(obj["data"][0]["paragraphs"][1]["qas"])


def test_empty_paragraph_errors_or_is_counted(tmp_path):
    obj = squad_dict()
    obj["data"][2]["paragraphs"][0]["qas"] = []
    path = write(tmp_path, obj)
    with pytest.raises(DataError, match="paragraph has no questions"):
        load_corpus(path)
    c = load_corpus(path, skip_invalid=True)
    assert c.skips.paragraphs_without_questions == 1 and len(c.paragraph_ids) == 17


def test_cli_reports_the_bad_record(tmp_path, cli, monkeypatch):
    obj = squad_dict()
    del obj["data"][3]["paragraphs"][0]["context"]
    path = write(tmp_path, obj)
    monkeypatch.chdir(Path(__file__).parents[2])
    proc = cli("mrwe_jax.main", "train", f"--workdir={tmp_path / 'w'}",
               f"--config.squad_path={path}", "--config.sources=tfidf",
               env={"JAX_PLATFORMS": "cpu"})
    assert proc.returncode == 1
    assert "mrwe-jax train: error: " in proc.stderr and str(path) in proc.stderr
    assert "Traceback" not in proc.stderr
    assert "data[3] 'Article_3'.paragraphs[0].context': missing field" in proc.stderr


# --------------------------------------------------------------------------- features


class CountingSpec:
    """A hashed TF-IDF source that counts how often it is built."""

    def __init__(self, dim=8):
        self.builds = 0
        self.dim = dim

    def spec(self):
        def build():
            self.builds += 1
            return ws.HashedTfidfSource(self.dim, seed=3)

        return word_features.SourceSpec("tfidf", 1, (1.0,), f"tfidf|dim={self.dim}|seed=3", build)


def _config(**kw):
    c = ml_collections.ConfigDict(dict(
        sources="tfidf", layer_aggregate="sum", word_aggregate="average",
        source_aggregate="concatenate", source_weights="uniform"))
    c.update(kw)
    return c


def test_features_match_embed_texts_and_are_cached(tmp_path, monkeypatch):
    monkeypatch.setenv("EMBEDDING_JAX_CACHE", str(tmp_path / "cache"))
    corpus = load_corpus(write(tmp_path, squad_dict()), test_fraction=0.34)
    counting = CountingSpec()
    feats = data.build_features(_config(), corpus, specs=[counting.spec()])
    assert counting.builds == 1
    # The stored rows are embed_texts' rows, in input order.
    ref = data.embed_texts(corpus.question_texts, [ws.HashedTfidfSource(8, seed=3)],
                         ws.idf(corpus.paragraph_texts))
    q = feats.questions["tfidf"]
    for i in range(len(corpus.question_texts)):
        np.testing.assert_allclose(q.words[q.offsets[i]:q.offsets[i + 1]],
                                   ref.word_matrices[i], rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(q.vectors, ref.vectors, rtol=1e-6, atol=1e-7)
    # Second build: from the cache (no source built), same values, memory-mapped words.
    again = data.build_features(_config(), corpus, specs=[counting.spec()])
    assert counting.builds == 1
    assert isinstance(again.questions["tfidf"].words, np.memmap)
    np.testing.assert_array_equal(again.questions["tfidf"].words, q.words)
    entries = list((tmp_path / "cache" / "mrwe_features").iterdir())
    assert len(entries) == 2 and not any(e.name.startswith(".") for e in entries)
    # Different texts -> a different key -> computed again.
    corpus2 = load_corpus(write(tmp_path, squad_dict(seed=1), "b.json"),
                               test_fraction=0.34)
    data.build_features(_config(), corpus2, specs=[counting.spec()])
    assert counting.builds == 2


def test_balanced_source_weights_equalise_rms_norms():
    vecs = {"a": np.full((4, 2), 3.0), "b": np.full((4, 8), 0.5)}
    u = word_features.resolve_source_weights("balanced", ["a", "b"], vecs)
    rms = [np.sqrt(np.mean(np.sum(v * v, 1))) for v in vecs.values()]
    np.testing.assert_allclose(u[0] * rms[0], u[1] * rms[1], rtol=1e-6)
    np.testing.assert_allclose(u.sum(), 1.0, rtol=1e-6)
    np.testing.assert_allclose(word_features.resolve_source_weights("1,3", ["a", "b"], vecs),
                               [0.25, 0.75])
    with pytest.raises(ValueError, match="3 entries"):
        word_features.resolve_source_weights("1,2,3", ["a", "b"], vecs)


# --------------------------------------------------------------------------- batches


def _features(corpus, tmp_path, monkeypatch):
    monkeypatch.setenv("EMBEDDING_JAX_CACHE", str(tmp_path / "cache"))
    return data.build_features(_config(), corpus, specs=[CountingSpec().spec()])


def test_pk_batches_hold_paragraphs_and_their_questions(tmp_path, monkeypatch):
    corpus = load_corpus(write(tmp_path, squad_dict(num_articles=8)), test_fraction=0.25)
    feats = _features(corpus, tmp_path, monkeypatch)
    batches = data.PKBatches(feats, corpus.question_paragraph, corpus.train_questions,
                             P=4, K=2, seed=5, with_words=True)
    n_train_par = len(set(corpus.question_paragraph[corpus.train_questions].tolist()))
    assert batches.steps_per_epoch == n_train_par // 4
    seen = set()
    for step in range(batches.steps_per_epoch):
        b = batches.batch(step)
        assert b["q_label"].shape == (8,) and b["p_label"].shape == (4,)
        # Each group of K questions belongs to the paragraph at the same group position.
        np.testing.assert_array_equal(b["q_label"].reshape(4, 2), b["p_label"][:, None]
                                      .repeat(2, 1))
        assert len(set(b["p_label"].tolist())) == 4
        assert corpus.train_paragraphs[b["p_label"]].all()  # never a test paragraph
        seen |= set(b["p_label"].tolist())
        # Word matrices are the stored rows, masks the real lengths.
        q_idx = batches.question_indices(step)
        lengths = feats.lengths("questions")[q_idx]
        np.testing.assert_array_equal(b["q_mask"].sum(1), lengths)
        f = feats.questions["tfidf"]
        i = int(q_idx[1])
        np.testing.assert_array_equal(b["q_features"][1, :lengths[1]],
                                      f.words[f.offsets[i]:f.offsets[i + 1]])
        assert not b["q_features"][~b["q_mask"]].any()
        assert b["p_features"].shape[1] in (64, 128)
    assert len(seen) == 4 * batches.steps_per_epoch  # an epoch visits paragraphs once
    # Deterministic per (seed, step): a resumed iterator gives the same batches.
    it = batches.iterator(start_step=3)
    again = data.PKBatches(feats, corpus.question_paragraph, corpus.train_questions,
                           P=4, K=2, seed=5, with_words=True)
    for step in (3, 4):
        got = next(it)
        want = again.batch(step)
        assert int(got["step"]) == step
        for k in want:
            np.testing.assert_array_equal(got[k], want[k])
    # Without words: pooled vectors only.
    vb = data.PKBatches(feats, corpus.question_paragraph, corpus.train_questions,
                        P=4, K=2, seed=5, with_words=False).batch(0)
    assert "q_mask" not in vb and vb["q_features"].shape == (8, 8)
    np.testing.assert_array_equal(vb["p_features"],
                                  feats.paragraphs["tfidf"].vectors[vb["p_label"]])
