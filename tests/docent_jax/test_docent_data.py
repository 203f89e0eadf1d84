"""The held-out paragraph protocol on real SQuAD dev, the training table and id files."""

import numpy as np
import pytest

from data_pipelines import squad
from data_pipelines.errors import DataError
from data_pipelines.tokenization import load_tokenizer
from docent_jax import corpus, data


@pytest.fixture(scope="module")
def articles():
    return squad.read_squad()[0]


def test_paragraph_split_is_a_seeded_partition_of_each_article(articles):
    train, held = corpus.paragraph_split(articles, 0.2, seed=0)
    assert [a.title for a in train] == [a.title for a in held] == [a.title for a in articles]
    for a, t, h in zip(articles, train, held, strict=True):
        ids = [p.paragraph_id for p in a.paragraphs]
        t_ids = [p.paragraph_id for p in t.paragraphs]
        h_ids = [p.paragraph_id for p in h.paragraphs]
        assert not set(t_ids) & set(h_ids)
        assert sorted(t_ids + h_ids) == sorted(ids)
        assert t_ids == [i for i in ids if i in set(t_ids)]  # file order kept
        n = len(ids)
        assert len(h_ids) == min(max(round(0.2 * n), 1), n - 1)
    again = corpus.paragraph_split(articles, 0.2, seed=0)[1]
    other = corpus.paragraph_split(articles, 0.2, seed=1)[1]
    key = lambda side: [[p.paragraph_id for p in a.paragraphs] for a in side]  # noqa: E731
    assert key(again) == key(held) != key(other)
    with pytest.raises(ValueError, match="heldout_fraction"):
        corpus.paragraph_split(articles, 1.0, seed=0)


def test_heldout_queries_are_the_questions_of_heldout_paragraphs_only(articles):
    # One "sentence" per paragraph keeps this fast; the protocol does not depend on pySBD.
    d = corpus.squad_entity_data(None, 0.2, 0, lambda text: [text])
    train, held = corpus.paragraph_split(articles, 0.2, seed=0)
    assert d.entity_ids == [a.title for a in articles]
    expected = [(q.question, (i,)) for i, a in enumerate(held)
                for p in a.paragraphs for q in p.questions]
    assert d.queries == expected
    assert len(d.sentences) == sum(len(a.paragraphs) for a in train)
    assert "SQuAD" in d.description and str(len(expected)) in d.description


def test_entity_sentence_table_carries_entity_ids(minilm_dir):
    tok = load_tokenizer(minilm_dir)
    table = data.entity_sentence_table([(2, "Paris is big."), (0, "x"), (2, "Hello there")],
                                       3, tok, 16)
    assert table.field_names == ("sentence",)
    np.testing.assert_array_equal(table.text_ids[:, 0], [2, 0, 2])
    assert table.input_ids.shape == (3, 1, 16)
    with pytest.raises(ValueError, match="sentence pair 1: entity index 3"):
        data.entity_sentence_table([(0, "a"), (3, "b")], 3, tok, 16)
    with pytest.raises(ValueError, match="sentence pair 0 .* empty"):
        data.entity_sentence_table([(0, "  ")], 3, tok, 16)


def test_entity_id_files_round_trip_and_name_bad_lines(tmp_path):
    path = tmp_path / "ids.txt"
    corpus.write_entity_ids(path, ["Super_Bowl_50", "Warsaw"])
    assert corpus.read_entity_ids(path) == ["Super_Bowl_50", "Warsaw"]
    path.write_text("a\n\nb\n")
    with pytest.raises(DataError, match=r"ids.txt:2: field 'entity_id': empty id"):
        corpus.read_entity_ids(path)
    path.write_text("a\nb\na\n")
    with pytest.raises(DataError, match=r":3: .*repeats line 1"):
        corpus.read_entity_ids(path)
    with pytest.raises(ValueError, match="line break"):
        corpus.write_entity_ids(path, ["a\nb"])
    with pytest.raises(FileNotFoundError, match="does not exist"):
        corpus.read_entity_ids(tmp_path / "missing.txt")


def test_batches_name_the_entity_column_entity_ids(minilm_dir):
    """The pipeline's ``text_ids`` column reaches the model as ``entity_ids`` ``[B]``, in
    the seeded order, resumable at any step."""
    import ml_collections

    tok = load_tokenizer(minilm_dir)
    sentences = [(e % 3, f"sentence {k} of entity {e % 3}") for k, e in enumerate(range(12))]
    table = data.entity_sentence_table(sentences, 3, tok, 16)
    config = ml_collections.ConfigDict({"batch_size": 4, "seed": 7, "pad_multiple": 8})
    it = data.make_batches(table, config, 0)
    first = [next(it) for _ in range(4)]
    for step, batch in enumerate(first):
        assert "text_ids" not in batch and int(batch["step"]) == step
        assert batch["entity_ids"].shape == (4,) and batch["entity_ids"].dtype == np.int32
        assert batch["input_ids"].shape[:2] == (4, 1)
        # Each row's entity is the one its sentence was given.
        for ids, entity in zip(batch["input_ids"][:, 0], batch["entity_ids"], strict=True):
            text = tok.decode([int(i) for i in ids if i])
            assert text.endswith(f"of entity {entity}"), (text, entity)
    resumed = next(data.make_batches(table, config, 2))
    np.testing.assert_array_equal(resumed["entity_ids"], first[2]["entity_ids"])
    np.testing.assert_array_equal(resumed["input_ids"], first[2]["input_ids"])


def test_entity_id_file_is_readable_by_others(tmp_path):
    import os
    import stat

    old = os.umask(0o022)
    try:
        corpus.write_entity_ids(tmp_path / "ids.txt", ["a", "b"])
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "ids.txt").stat().st_mode) == 0o644


def test_a_resume_whose_data_names_other_entities_is_refused(tmp_path):
    path = tmp_path / corpus.ENTITY_IDS_FILE
    corpus.keep_entity_ids(path, ["a", "b", "c"])  # first start: written
    corpus.keep_entity_ids(path, ["a", "b", "c"])  # same data: accepted
    with pytest.raises(ValueError, match="entities changed since this run started"):
        corpus.keep_entity_ids(path, ["a", "c"])
    assert corpus.read_entity_ids(path) == ["a", "b", "c"]  # nothing rewritten
