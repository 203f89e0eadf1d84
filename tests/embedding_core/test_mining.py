"""embedding-jax mine-hard-negatives equals sentence-transformers 6.3's mine_hard_negatives
on the same MiniLM embeddings of SQuAD questions and paragraphs, for each option and output
format; the CLI's files are read by sentence_jax's reader as they are."""

from __future__ import annotations

import hashlib
import json
import os

import numpy as np
import pytest

from embedding_core import main as cli_main
from embedding_core.serving import mining

N_QUESTIONS = 200


@pytest.fixture(scope="module")
def squad():
    """200 (question, paragraph) pairs, 6 questions with a second paragraph, a pair whose
    anchor is itself a corpus paragraph; 30 other paragraphs as an extra corpus."""
    from data_pipelines.squad import read_squad

    articles, _ = read_squad()
    pairs, extra = [], []
    for article in articles:
        for p in article.paragraphs:
            if len(pairs) < N_QUESTIONS:
                pairs.extend((q.question, p.context) for q in p.questions[:4])
            elif len(extra) < 30:
                extra.append(p.context)
    pairs = pairs[:N_QUESTIONS]
    paragraphs = list(dict.fromkeys(p for _, p in pairs))
    pairs += [(pairs[i][0], paragraphs[(i + 7) % len(paragraphs)]) for i in range(0, 60, 10)]
    pairs.append((paragraphs[0], paragraphs[1]))
    return [a for a, _ in pairs], [p for _, p in pairs], extra


@pytest.fixture(scope="module")
def st_model(minilm_dir):
    sentence_transformers = pytest.importorskip("sentence_transformers")
    model = sentence_transformers.SentenceTransformer(str(minilm_dir), device="cpu")
    model.max_seq_length = 64  # speed: both sides get the same (truncated) embeddings
    return model


@pytest.fixture(scope="module")
def embeddings(st_model, squad):
    """{text: MiniLM embedding (unit length)}, encoded once by sentence-transformers."""
    anchors, positives, extra = squad
    texts = list(dict.fromkeys(anchors + positives + extra))
    vectors = st_model.encode(texts, batch_size=64, normalize_embeddings=True,
                              convert_to_numpy=True)
    return dict(zip(texts, np.asarray(vectors, np.float32), strict=True))


def _lookup(embeddings):
    return lambda texts: np.stack([embeddings[t] for t in texts])


def st_mine(st_model, embeddings, tmp_path, anchors, positives, corpus=None, **kwargs):
    """sentence-transformers' rows, fed our embeddings through its cache files (their names
    hash the model name and the de-duplicated texts, as 6.3 computes them)."""
    from datasets import Dataset
    from sentence_transformers.util import mine_hard_negatives

    queries = list(dict.fromkeys(anchors))
    texts = list(dict.fromkeys(list(positives if corpus is None else corpus) + positives))
    name = st_model.model_card_data.base_model or ""
    for prefix, items in (("query", queries), ("corpus", texts)):
        digest = hashlib.sha256(repr((name, None, None, items)).encode()).hexdigest()
        np.save(tmp_path / f"{prefix}_embeddings_{digest}.npy", _lookup(embeddings)(items))
    dataset = Dataset.from_dict({"question": anchors, "context": positives})
    out = mine_hard_negatives(dataset, st_model, corpus=corpus, cache_folder=str(tmp_path),
                              verbose=False, **kwargs)
    return out.column_names, [tuple(row[c] for c in out.column_names) for row in out]


CASES = {
    "defaults": {},
    "range_ntuple": {"range_min": 2, "range_max": 12, "num_negatives": 4,
                     "output_format": "n-tuple"},
    "scores_labeled_pair": {"max_score": 0.6, "min_score": 0.25,
                            "output_format": "labeled-pair"},
    "absolute_labeled_list": {"absolute_margin": 0.05, "output_format": "labeled-list"},
    "relative_triplet": {"relative_margin": 0.1, "num_negatives": 2},
    "include_positives": {"include_positives": True, "num_negatives": 5},
    "min_score_ntuple": {"min_score": 0.3, "num_negatives": 3, "output_format": "n-tuple"},
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_top_equals_sentence_transformers(case, squad, st_model, embeddings, tmp_path):
    anchors, positives, _ = squad
    kwargs = CASES[case]
    columns, rows = st_mine(st_model, embeddings, tmp_path, anchors, positives, **kwargs)
    ours = mining.mine_hard_negatives(anchors, positives, _lookup(embeddings),
                                      _lookup(embeddings), names=("question", "context"),
                                      **kwargs)
    assert ours.columns == columns
    assert len(rows) > 10 and ours.rows == rows


def test_extra_corpus_equals_sentence_transformers(squad, st_model, embeddings, tmp_path):
    anchors, positives, extra = squad
    kwargs = {"num_negatives": 5, "output_format": "n-tuple", "range_min": 1}
    columns, rows = st_mine(st_model, embeddings, tmp_path, anchors, positives, corpus=extra,
                            **kwargs)
    ours = mining.mine_hard_negatives(anchors, positives, _lookup(embeddings),
                                      _lookup(embeddings), corpus=extra,
                                      names=("question", "context"), **kwargs)
    assert ours.columns == columns and ours.rows == rows


def test_random_sampling_draws_among_the_range(squad, embeddings):
    anchors, positives, _ = squad
    kwargs = {"range_max": 10, "num_negatives": 3, "output_format": "n-tuple"}
    top = mining.mine_hard_negatives(anchors, positives, _lookup(embeddings),
                                     _lookup(embeddings), **kwargs)
    drawn = mining.mine_hard_negatives(anchors, positives, _lookup(embeddings),
                                       _lookup(embeddings), sampling_strategy="random", seed=1,
                                       **kwargs)
    wide = mining.mine_hard_negatives(anchors, positives, _lookup(embeddings),
                                      _lookup(embeddings), **{**kwargs, "num_negatives": 10})
    allowed = {row[0]: set(row[2:]) for row in wide.rows}
    assert len(drawn.rows) == len(top.rows) and drawn.rows != top.rows
    assert all(set(row[2:]) <= allowed[row[0]] for row in drawn.rows if row[0] in allowed)


def test_bad_arguments_as_sentence_transformers(squad, embeddings):
    anchors, positives, _ = squad
    enc = _lookup(embeddings)
    for kwargs, message in (({"num_negatives": 0}, "num_negatives must be at least 1"),
                            ({"range_min": 5, "range_max": 5}, "range_min must be smaller"),
                            ({"range_max": 4, "num_negatives": 5}, "cannot mine 5"),
                            ({"output_format": "pairs"}, "output_format")):
        with pytest.raises(ValueError, match=message):
            mining.mine_hard_negatives(anchors, positives, enc, enc, **kwargs)


# ---- the command line: files sentence-jax reads as they are ----


@pytest.fixture(scope="module")
def pairs_file(tmp_path_factory, squad):
    anchors, positives, _ = squad
    path = tmp_path_factory.mktemp("pairs") / "pairs.jsonl"
    path.write_text("".join(json.dumps({"query": a, "answer": p}) + "\n"
                            for a, p in zip(anchors[:40], positives[:40], strict=True)))
    return path


@pytest.mark.parametrize("fmt,suffix,width", [("triplet", "csv", 3), ("n-tuple", "jsonl", 4),
                                              ("labeled-pair", "csv", 2)])
def test_cli_file_is_read_by_sentence_jax(fmt, suffix, width, pairs_file, tiny_bert_dir,
                                          tmp_path):
    from sentence_jax.data import read_columns

    out = tmp_path / f"mined.{suffix}"
    assert cli_main.main(["mine-hard-negatives", f"--model={tiny_bert_dir}",
                          f"--pairs={pairs_file}", f"--output={out}", f"--output_format={fmt}",
                          "--num_negatives=2"]) == 0
    columns = read_columns(out, min_columns=2)
    assert len(columns.names) == width and columns.names[:2] == ("query", "answer")
    assert len(columns) > 0 and (columns.labels is not None) == (fmt == "labeled-pair")


def test_cli_refuses_a_csv_of_lists_and_writes_nothing(pairs_file, tmp_path, capsys):
    out = tmp_path / "mined.csv"
    assert cli_main.main(["mine-hard-negatives", "--model=unused", f"--pairs={pairs_file}",
                          f"--output={out}", "--output_format=labeled-list"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and str(out) in err[0] and "write .jsonl" in err[0]
    assert not os.path.exists(out)


def test_sentence_jax_trains_on_the_mined_triplets_unchanged(pairs_file, tiny_bert_dir,
                                                             tmp_path):
    """The mined CSV as ``config.train_files``: 2 steps (tests/sentence_jax/test_training.py's
    settings, so the step comes from the compile cache), finite losses, 3 columns."""
    from sentence_jax import trainer
    from sentence_jax.configs import default

    out = tmp_path / "mined.csv"
    assert cli_main.main(["mine-hard-negatives", f"--model={tiny_bert_dir}",
                          f"--pairs={pairs_file}", f"--output={out}",
                          "--output_format=triplet"]) == 0
    config = default.get_config()
    config.model, config.train_files = str(tiny_bert_dir), str(out)
    config.update(batch_size=8, max_seq_length=16, num_train_steps=2, log_every=1,
                  checkpoint_every=2, dropout=False)
    assert int(trainer.train(config, tmp_path / "run").step) == 2
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text()
            .splitlines()]
    losses = [r["loss"] for r in rows if "loss" in r]
    assert len(losses) == 2 and np.isfinite(losses).all()
