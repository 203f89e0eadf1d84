"""SQuAD v1.1 reader, splits and Wikipedia entity corpus: shipped dev set and hand-made files."""

from __future__ import annotations

import copy
import json
import zipfile

import numpy as np
import pytest

from data_pipelines.errors import DataError
from data_pipelines.squad import (
    SquadSkips,
    read_squad,
    split_articles,
    split_seen_paragraphs,
    squad_dev_path,
    wikipedia_entity_corpus,
)

# Two articles in the exact SQuAD v1.1 layout (answers included, as in the official file).
TINY = {
    "version": "1.1",
    "data": [
        {
            "title": "Toy_Story",
            "paragraphs": [
                {
                    "context": "Toy Story is a 1995 film. It was made by Pixar. TOY STORY won.",
                    "qas": [
                        {"id": "q1", "question": "Who made it?",
                         "answers": [{"answer_start": 37, "text": "Pixar"}]},
                    ],
                },
                {
                    "context": "The sequel came in 1999.",
                    "qas": [{"id": "q2", "question": "When?", "answers": []}],
                },
            ],
        },
        {
            "title": "Fresno,_California",
            "paragraphs": [
                {
                    "context": "Fresno is a city. Fresno, California lies in the valley.",
                    "qas": [
                        {"id": "q3", "question": "What is Fresno?", "answers": []},
                        {"id": "q4", "question": "Where is it?", "answers": []},
                    ],
                },
            ],
        },
    ],
}


def _write(tmp_path, obj, name="tiny.json"):
    path = tmp_path / name
    path.write_text(json.dumps(obj), encoding="utf-8")
    return path


def _dot_splitter(text):
    return [s.strip() + "." for s in text.split(".") if s.strip()]


@pytest.fixture(scope="module")
def dev():
    articles, skips = read_squad()
    return articles, skips


def test_shipped_dev_counts(dev):
    articles, skips = dev
    assert len(articles) == 48
    assert sum(len(a.paragraphs) for a in articles) == 2067
    assert sum(len(p.questions) for a in articles for p in a.paragraphs) == 10570
    assert skips == SquadSkips()
    first = articles[0]
    assert first.title == "Super_Bowl_50"
    assert first.paragraphs[0].paragraph_id == "Super_Bowl_50#0"
    q = first.paragraphs[0].questions[0]
    assert (q.qid, q.question) == (
        "56be4db0acb8001400a502ec", "Which NFL team represented the AFC at Super Bowl 50?"
    )
    ids = [p.paragraph_id for a in articles for p in a.paragraphs]
    assert len(set(ids)) == len(ids)


def test_plain_json_and_zip_read_the_same(tmp_path):
    plain = _write(tmp_path, TINY)
    zipped = tmp_path / "tiny.json.zip"
    with zipfile.ZipFile(zipped, "w") as archive:
        archive.write(plain, "inner/tiny.json")
    from_plain, _ = read_squad(plain)
    from_zip, _ = read_squad(zipped)
    assert from_plain == from_zip
    assert [p.paragraph_id for p in from_plain[0].paragraphs] == ["Toy_Story#0", "Toy_Story#1"]
    assert [q.qid for q in from_plain[1].paragraphs[0].questions] == ["q3", "q4"]
    # The zip was read in memory: nothing was extracted next to it.
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tiny.json", "tiny.json.zip"]


def test_shipped_zip_matches_its_extracted_json(tmp_path, dev):
    with zipfile.ZipFile(squad_dev_path()) as archive:
        (tmp_path / "dev.json").write_bytes(archive.read("dev-v1.1.json"))
    assert read_squad(tmp_path / "dev.json")[0] == dev[0]


@pytest.mark.parametrize(
    ("mutate", "field"),
    [
        (lambda d: d.pop("data"), "data"),
        (lambda d: d["data"][1].pop("title"), "data[1].title"),
        (lambda d: d["data"][1].pop("paragraphs"), "data[1] 'Fresno,_California'.paragraphs"),
        (lambda d: d["data"][0]["paragraphs"][1].pop("context"),
         "data[0] 'Toy_Story'.paragraphs[1].context"),
        (lambda d: d["data"][0]["paragraphs"][1].pop("qas"),
         "data[0] 'Toy_Story'.paragraphs[1].qas"),
        (lambda d: d["data"][1]["paragraphs"][0]["qas"][1].pop("id"),
         "data[1] 'Fresno,_California'.paragraphs[0].qas[1].id"),
        (lambda d: d["data"][1]["paragraphs"][0]["qas"][1].pop("question"),
         "data[1] 'Fresno,_California'.paragraphs[0].qas[1] (id 'q4').question"),
    ],
)
def test_missing_field_names_the_record(tmp_path, mutate, field):
    bad = copy.deepcopy(TINY)
    mutate(bad)
    path = _write(tmp_path, bad)
    with pytest.raises(DataError) as info:
        read_squad(path)
    assert info.value.field == field
    assert info.value.path == str(path)
    assert str(info.value) == f"{path}: field '{field}': missing field"


def test_wrong_type_and_duplicate_id(tmp_path):
    bad = copy.deepcopy(TINY)
    bad["data"][0]["paragraphs"][0]["context"] = ["not", "text"]
    with pytest.raises(DataError, match="expected a JSON string, got list"):
        read_squad(_write(tmp_path, bad))
    dup = copy.deepcopy(TINY)
    dup["data"][1]["paragraphs"][0]["qas"][0]["id"] = "q1"
    with pytest.raises(DataError, match=r"already used by data\[0\]") as info:
        read_squad(_write(tmp_path, dup))
    assert info.value.field.endswith("qas[0] (id 'q1').id")


def test_lone_surrogate_names_the_field(tmp_path):
    bad = copy.deepcopy(TINY)
    bad["data"][0]["paragraphs"][1]["context"] = "half \ud83d of an emoji"
    path = _write(tmp_path, bad)
    with pytest.raises(DataError) as info:
        read_squad(path)
    assert str(info.value).startswith(
        f"{path}: field 'data[0] 'Toy_Story'.paragraphs[1].context': holds a lone surrogate "
        "\\ud83d at character 6")


def test_invalid_json_gives_its_line(tmp_path):
    path = tmp_path / "broken.json"
    path.write_text('{"data": [\n{"title": "A",\n "paragraphs": [}\n]}', encoding="utf-8")
    with pytest.raises(DataError) as info:
        read_squad(path)
    assert info.value.line == 3


def test_empty_context_and_no_questions_raise_or_are_counted(tmp_path):
    bad = copy.deepcopy(TINY)
    bad["data"][0]["paragraphs"][0]["context"] = "   "
    bad["data"][1]["paragraphs"][0]["qas"] = []
    path = _write(tmp_path, bad)
    with pytest.raises(DataError) as info:
        read_squad(path)
    assert (info.value.field, info.value.reason) == (
        "data[0] 'Toy_Story'.paragraphs[0].context", "empty context"
    )
    articles, skips = read_squad(path, skip_invalid=True)
    assert skips == SquadSkips(
        empty_contexts=1, paragraphs_without_questions=1, articles_without_paragraphs=1
    )
    # The Fresno article lost its only paragraph; Toy_Story keeps its second paragraph with
    # its original number.
    assert [a.title for a in articles] == ["Toy_Story"]
    assert [p.paragraph_id for p in articles[0].paragraphs] == ["Toy_Story#1"]

    no_q = copy.deepcopy(TINY)
    no_q["data"][1]["paragraphs"][0]["qas"] = []
    with pytest.raises(DataError, match="paragraph has no questions"):
        read_squad(_write(tmp_path, no_q))


def test_split_articles_is_article_level_and_seeded(dev):
    articles = dev[0]
    train, test = split_articles(articles, 0.2, seed=7)
    assert len(test) == round(0.2 * 48) == 10 and len(train) == 38
    titles_test = {a.title for a in test}
    assert titles_test.isdisjoint(a.title for a in train)
    assert titles_test | {a.title for a in train} == {a.title for a in articles}
    train_paragraphs = {p.paragraph_id for a in train for p in a.paragraphs}
    assert train_paragraphs.isdisjoint(p.paragraph_id for a in test for p in a.paragraphs)
    # Documented rule: the first 10 positions of default_rng(seed).permutation(48).
    expected = {articles[i].title for i in np.random.default_rng(7).permutation(48)[:10]}
    assert titles_test == expected
    assert split_articles(articles, 0.2, seed=7) == (train, test)
    assert {a.title for a in split_articles(articles, 0.2, seed=8)[1]} != titles_test
    with pytest.raises(ValueError):
        split_articles(articles, 1.0, seed=0)


def test_split_seen_paragraphs_is_the_authors_leaky_protocol(dev):
    articles = dev[0]
    train, test = split_seen_paragraphs(articles, 0.25, seed=3)
    paragraph_ids = [p.paragraph_id for a in articles for p in a.paragraphs]
    assert [p.paragraph_id for a in train for p in a.paragraphs] == paragraph_ids
    assert [p.paragraph_id for a in test for p in a.paragraphs] == paragraph_ids
    train_q = [q.qid for a in train for p in a.paragraphs for q in p.questions]
    test_q = [q.qid for a in test for p in a.paragraphs for q in p.questions]
    all_q = [q.qid for a in articles for p in a.paragraphs for q in p.questions]
    assert len(test_q) == round(0.25 * 10570)
    assert set(train_q).isdisjoint(test_q) and sorted(train_q + test_q) == sorted(all_q)
    # Most test questions ask about a paragraph that also has training questions.
    with_train = {p.paragraph_id for a in train for p in a.paragraphs if p.questions}
    seen = sum(
        p.paragraph_id in with_train for a in test for p in a.paragraphs for _ in p.questions
    )
    assert seen > 0.9 * len(test_q)


def test_entity_corpus_hand_worked(tmp_path):
    articles, _ = read_squad(_write(tmp_path, TINY))
    corpus = wikipedia_entity_corpus(articles, sentence_splitter=_dot_splitter)
    assert corpus.entity_ids == ["Toy_Story", "Fresno,_California"]
    assert corpus.entity_names == ["Toy Story", "Fresno, California"]
    assert corpus.sentences == [
        (0, "is a 1995 film."),
        (0, "It was made by Pixar."),
        (0, "won."),
        (0, "The sequel came in 1999."),
        (1, "is a city."),
        (1, "lies in the valley."),
    ]
    assert corpus.queries == [
        ("Who made it?", 0), ("When?", 0), ("What is Fresno?", 1), ("Where is it?", 1)
    ]


def test_entity_corpus_on_dev(dev):
    articles = dev[0]
    fast = wikipedia_entity_corpus(articles, sentence_splitter=_dot_splitter)
    assert len(fast.queries) == 10570
    assert fast.entity_ids == [a.title for a in articles]
    per_entity = np.bincount([e for _, e in fast.queries], minlength=48)
    assert per_entity.tolist() == [
        sum(len(p.questions) for p in a.paragraphs) for a in articles
    ]
    # pySBD on two real articles: the title is gone from every sentence.
    two = wikipedia_entity_corpus(articles[:2])
    assert len({e for e, _ in two.sentences}) == 2
    assert not any("super bowl 50" in s.lower() for e, s in two.sentences if e == 0)
    assert not any("warsaw" in s.lower() for e, s in two.sentences if e == 1)
    context = articles[0].paragraphs[0].context
    assert context.startswith("Super Bowl 50 was an American football game")
    assert two.sentences[0] == (
        0, "was an American football game to determine the champion of the National Football "
        "League (NFL) for the 2015 season."
    )
