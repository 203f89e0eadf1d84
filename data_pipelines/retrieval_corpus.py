"""SQuAD (or question-passage pairs) as a retrieval task, split for testing by article or the
authors' seen-paragraph split (``docs/mrwe.md``)."""

from __future__ import annotations

import dataclasses
import json
import os

import numpy as np

from data_pipelines.squad import (
    SquadArticle,
    SquadParagraph,
    SquadQuestion,
    SquadSkips,
    read_squad,
    split_articles,
    split_seen_paragraphs,
)
from embedding_core.errors import DataError
from embedding_core.storage import storage

PAIR_FIELDS = (("question", "query"), ("passage", "positive"))
"""A pairs line's fields, each with the sentence-transformers-style name also accepted."""

SPLITS = ("articles", "seen_paragraphs")


@dataclasses.dataclass(frozen=True)
class RetrievalCorpus:
    """SQuAD as retrieval, one relevant paragraph per question: ``paragraph_ids``
    (``"{title}#{index}"``), ``paragraph_texts``, ``paragraph_article`` ``[n_p]``; ``question_ids``,
    ``question_texts``, ``question_paragraph`` ``[n_q]``; bool masks ``train_questions``,
    ``test_questions`` (disjoint), ``train_paragraphs``, ``test_pool`` (the test pool)."""

    paragraph_ids: list[str]
    paragraph_texts: list[str]
    paragraph_article: np.ndarray
    question_ids: list[str]
    question_texts: list[str]
    question_paragraph: np.ndarray
    train_questions: np.ndarray
    test_questions: np.ndarray
    train_paragraphs: np.ndarray
    test_pool: np.ndarray
    split: str
    source: str
    skips: SquadSkips

    def summary(self) -> str:
        return (f"{len(self.paragraph_ids)} paragraphs, {len(self.question_ids)} questions "
                f"({self.split} split: {int(self.train_questions.sum())} train / "
                f"{int(self.test_questions.sum())} test questions, "
                f"{int(self.train_paragraphs.sum())} train paragraphs, "
                f"{int(self.test_pool.sum())} test-pool paragraphs) from {self.source}")


def read_pairs(path: str | os.PathLike[str]) -> list[SquadArticle]:
    """``{"question", "passage"}`` (or ``{"query", "positive"}``) JSON Lines as articles, each
    distinct passage one (``p<k>``); FileNotFoundError; DataError: a bad line, no pair."""
    where = storage.as_path(path)
    if not where.is_file():
        raise FileNotFoundError(f"train_file {storage.display(path)} does not exist")
    by_passage: dict[str, list[SquadQuestion]] = {}
    for line_no, line in enumerate(where.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as err:
            raise DataError(path, line_no, None, f"invalid JSON ({err.msg})") from None
        if not isinstance(record, dict):
            raise DataError(path, line_no, None, "not a JSON object")
        texts = []
        for names in PAIR_FIELDS:
            name = next((n for n in names if n in record), names[0])
            value = record.get(name)
            if not isinstance(value, str) or not value.strip():
                raise DataError(path, line_no, name, "missing, empty or not a string")
            texts.append(value)
        by_passage.setdefault(texts[1], []).append(SquadQuestion(f"line{line_no}", texts[0]))
    if not by_passage:
        raise DataError(path, None, None, "no (question, passage) pair")
    return [SquadArticle(f"passage {k}", [SquadParagraph(f"p{k}", passage, questions)])
            for k, (passage, questions) in enumerate(by_passage.items())]


def load_corpus(path: str | os.PathLike[str] | None = None, *, split: str = "articles",
                test_fraction: float = 0.2, seed: int = 0, skip_invalid: bool = False,
                pairs_path: str | os.PathLike[str] | None = None) -> RetrievalCorpus:
    """A SQuAD v1.1 file (default shipped dev) or ``pairs_path``, questions split by
    ``"articles"`` or ``"seen_paragraphs"``. DataError; ValueError: unknown split, no train or test
    question; FileNotFoundError."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    if pairs_path:
        articles, skips, path = read_pairs(pairs_path), SquadSkips(), pairs_path
    else:
        articles, skips = read_squad(path, skip_invalid=skip_invalid)
    splitter = split_articles if split == "articles" else split_seen_paragraphs
    train_articles, test_articles = splitter(articles, test_fraction, seed)

    def qids(side) -> set[str]:
        return {q.qid for a in side for p in a.paragraphs for q in p.questions}

    train_qids, test_qids = qids(train_articles), qids(test_articles)
    train_pids = {p.paragraph_id for a in train_articles for p in a.paragraphs if p.questions}
    test_pids = {p.paragraph_id for a in test_articles for p in a.paragraphs}
    paragraph_ids, paragraph_texts, paragraph_article = [], [], []
    question_ids, question_texts, question_paragraph = [], [], []
    for a_index, article in enumerate(articles):
        for paragraph in article.paragraphs:
            p_index = len(paragraph_ids)
            paragraph_ids.append(paragraph.paragraph_id)
            paragraph_texts.append(paragraph.context)
            paragraph_article.append(a_index)
            for q in paragraph.questions:
                question_ids.append(q.qid)
                question_texts.append(q.question)
                question_paragraph.append(p_index)
    train_q = np.array([q in train_qids for q in question_ids], bool)
    test_q = np.array([q in test_qids for q in question_ids], bool)
    if not train_q.any() or not test_q.any():
        raise ValueError(f"the {split} split of {len(question_ids)} questions with "
                         f"test_fraction={test_fraction} leaves {int(train_q.sum())} train and "
                         f"{int(test_q.sum())} test questions; both must be non-empty")
    return RetrievalCorpus(
        paragraph_ids, paragraph_texts, np.asarray(paragraph_article, np.int64), question_ids,
        question_texts, np.asarray(question_paragraph, np.int64), train_q, test_q,
        train_paragraphs=np.array([p in train_pids for p in paragraph_ids], bool),
        test_pool=np.array([p in test_pids for p in paragraph_ids], bool), split=split,
        source=str(path) if path is not None else "shipped SQuAD v1.1 dev", skips=skips)

