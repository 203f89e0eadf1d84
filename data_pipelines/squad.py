"""SQuAD v1.1 reader, article/question splits and the Wikipedia entity corpus.

SQuAD v1.1 (Rajpurkar et al., EMNLP 2016; CC BY-SA 4.0) is one JSON object
``{"version": "1.1", "data": [article, ...]}`` with ``article = {"title": str, "paragraphs":
[{"context": str, "qas": [{"id": str, "question": str, "answers": [...]}, ...]}, ...]}``.
The project ships the dev set as ``data/squad/dev-v1.1.json.zip`` (48 articles, 2,067
paragraphs, 10,570 questions), read here straight from the zip.

Two users: multi-resolution retrieval (Cakaloglu & Xu, arXiv 1902.00663) ranks paragraphs for
each question; DocEnt-style entity learning (Zemlyanskiy et al. 2021) uses each article as an
entity described by its sentences, and its questions as entity-seeking queries.
"""

from __future__ import annotations

import dataclasses
import io
import json
import os
import zipfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from etils import epath

from data_pipelines.errors import DataError
from data_pipelines.paths import data_dir
from data_pipelines.records import lone_surrogate
from data_pipelines.text import remove_entity_name, split_sentences

SQUAD_DEV_ZIP = "squad/dev-v1.1.json.zip"
"""Path of the shipped dev set, relative to :func:`~data_pipelines.paths.data_dir`."""


@dataclasses.dataclass(frozen=True)
class SquadQuestion:
    """One SQuAD question (answers are not kept: the readers here serve retrieval).

    Attributes:
      qid: the question's id in the file (unique over the file).
      question: the question text.
    """

    qid: str
    question: str


@dataclasses.dataclass(frozen=True)
class SquadParagraph:
    """One context paragraph with the questions asked about it.

    Attributes:
      paragraph_id: ``f"{title}#{p_index}"`` with ``p_index`` the 0-based position of the
        paragraph in its article in the file (skipped paragraphs keep their number, so ids do
        not change when ``skip_invalid`` drops a neighbour).
      context: the paragraph text.
      questions: its questions, in file order.
    """

    paragraph_id: str
    context: str
    questions: list[SquadQuestion]


@dataclasses.dataclass(frozen=True)
class SquadArticle:
    """One Wikipedia article: its title as in the file (``"Super_Bowl_50"``) and paragraphs."""

    title: str
    paragraphs: list[SquadParagraph]


@dataclasses.dataclass(frozen=True)
class SquadSkips:
    """What ``read_squad(..., skip_invalid=True)`` dropped.

    Attributes:
      empty_contexts: paragraphs whose context is empty or whitespace-only.
      paragraphs_without_questions: paragraphs with an empty ``qas`` list.
      empty_questions: questions whose text is empty or whitespace-only.
      articles_without_paragraphs: articles left with no paragraph after the above.
    """

    empty_contexts: int = 0
    paragraphs_without_questions: int = 0
    empty_questions: int = 0
    articles_without_paragraphs: int = 0


@dataclasses.dataclass(frozen=True)
class EntityCorpus:
    """Entities with their describing sentences and entity-seeking queries.

    Attributes:
      entity_names: display name of each entity (``[n_entities]``), e.g. ``"Super Bowl 50"``.
      entity_ids: stable key of each entity (``[n_entities]``), e.g. the SQuAD title
        ``"Super_Bowl_50"``.
      sentences: ``(entity_index, sentence)`` pairs: the training documents of DocEnt.
      queries: ``(query_text, answer_entity_index)`` pairs: the evaluation queries.
    """

    entity_names: list[str]
    entity_ids: list[str]
    sentences: list[tuple[int, str]]
    queries: list[tuple[str, int]]


def squad_dev_path() -> Path:
    """Path of the shipped SQuAD v1.1 dev set (``data_dir()/squad/dev-v1.1.json.zip``).

    Raises:
      FileNotFoundError: the data folder or the file is missing.
    """
    path = data_dir() / SQUAD_DEV_ZIP
    if not path.is_file():
        raise FileNotFoundError(f"SQuAD dev file {path} is missing")
    return path


def _load_json(path: epath.Path) -> tuple[Any, str]:
    """Parses the JSON file or the single ``.json`` member of a zip; returns (object, where)."""
    # One read: on gs:// every open is a download.
    raw = path.read_bytes()
    if zipfile.is_zipfile(io.BytesIO(raw)):
        with zipfile.ZipFile(io.BytesIO(raw)) as archive:
            members = [n for n in archive.namelist() if n.endswith(".json")]
            if len(members) != 1:
                raise DataError(
                    path, None, None,
                    f"zip must hold exactly one .json file, found {members or 'none'}",
                )
            where = f"{path}!{members[0]}"
            raw = archive.read(members[0])
    else:
        where = str(path)
    try:
        text = raw.decode("utf-8").removeprefix("\ufeff")  # a BOM is not JSON
    except UnicodeDecodeError as err:
        line = raw[: err.start].count(b"\n") + 1
        raise DataError(where, line, None, f"invalid UTF-8: {err.reason}") from None
    try:
        return json.loads(text), where
    except json.JSONDecodeError as err:
        raise DataError(where, err.lineno, None, f"invalid JSON: {err.msg}") from None


def _get(obj: Any, key: str, kind: type, where: str, record: str) -> Any:
    if not isinstance(obj, dict) or key not in obj:
        raise DataError(where, None, f"{record}.{key}" if record else key, "missing field")
    value = obj[key]
    if not isinstance(value, kind):
        raise DataError(
            where, None, f"{record}.{key}" if record else key,
            f"expected a JSON {'string' if kind is str else 'list'}, got {type(value).__name__}",
        )
    if kind is str and "\x00" in value:
        # A tokenizer would drop it silently; the shipped sets hold none.
        raise DataError(where, None, f"{record}.{key}" if record else key,
                        "holds a NUL character (\\u0000)")
    surrogate = lone_surrogate(value) if kind is str else None
    if surrogate:
        raise DataError(where, None, f"{record}.{key}" if record else key, surrogate)
    return value


def read_squad(
    path: str | os.PathLike[str] | None = None,
    *,
    skip_invalid: bool = False,
) -> tuple[list[SquadArticle], SquadSkips]:
    """Reads a SQuAD v1.1 file strictly, plain JSON or zipped (read in memory, not extracted).

    Args:
      path: a ``.json`` file, or a zip holding exactly one ``.json`` member, local or
        ``gs://``; default the shipped dev set (:func:`squad_dev_path`).
      skip_invalid: drop (and count) paragraphs with an empty context or no questions, and
        questions with empty text, instead of raising.

    Returns:
      ``(articles, skips)``: the articles in file order; ``skips`` counts what was dropped
      (all zero when ``skip_invalid`` is False).

    Raises:
      DataError: invalid UTF-8 or JSON (with its line); a missing or mistyped field among
        ``data, title, paragraphs, context, qas, id, question``, or one holding a NUL or a
        lone surrogate (``field`` names the record, e.g.
        ``data[3] 'Nikola_Tesla'.paragraphs[5].qas[2] (id '5733...').question``); a
        duplicated question id; an empty context, a paragraph without questions or an empty
        question unless ``skip_invalid``. ``line`` is None for faults inside the JSON
        structure (the official files are a single line).
      FileNotFoundError: the file does not exist.
    """
    path = epath.Path(path) if path is not None else epath.Path(squad_dev_path())
    root, where = _load_json(path)
    data = _get(root, "data", list, where, "")
    articles: list[SquadArticle] = []
    seen_qids: dict[str, str] = {}
    counts = dict.fromkeys(
        ("empty_contexts", "paragraphs_without_questions", "empty_questions",
         "articles_without_paragraphs"), 0,
    )
    for a_index, article in enumerate(data):
        title = _get(article, "title", str, where, f"data[{a_index}]")
        article_rec = f"data[{a_index}] {title!r}"
        paragraphs: list[SquadParagraph] = []
        for p_index, paragraph in enumerate(_get(article, "paragraphs", list, where, article_rec)):
            p_rec = f"{article_rec}.paragraphs[{p_index}]"
            context = _get(paragraph, "context", str, where, p_rec)
            qas = _get(paragraph, "qas", list, where, p_rec)
            questions: list[SquadQuestion] = []
            for q_index, qa in enumerate(qas):
                q_rec = f"{p_rec}.qas[{q_index}]"
                qid = _get(qa, "id", str, where, q_rec)
                q_rec = f"{q_rec} (id {qid!r})"
                text = _get(qa, "question", str, where, q_rec)
                if qid in seen_qids:
                    raise DataError(
                        where, None, f"{q_rec}.id", f"question id already used by {seen_qids[qid]}"
                    )
                seen_qids[qid] = q_rec
                if not text.strip():
                    if not skip_invalid:
                        raise DataError(where, None, f"{q_rec}.question", "empty question")
                    counts["empty_questions"] += 1
                    continue
                questions.append(SquadQuestion(qid=qid, question=text))
            if not context.strip():
                if not skip_invalid:
                    raise DataError(where, None, f"{p_rec}.context", "empty context")
                counts["empty_contexts"] += 1
                continue
            if not questions:
                if not skip_invalid:
                    raise DataError(where, None, f"{p_rec}.qas", "paragraph has no questions")
                counts["paragraphs_without_questions"] += 1
                continue
            paragraphs.append(
                SquadParagraph(
                    paragraph_id=f"{title}#{p_index}", context=context, questions=questions
                )
            )
        if not paragraphs and skip_invalid:
            counts["articles_without_paragraphs"] += 1
            continue
        articles.append(SquadArticle(title=title, paragraphs=paragraphs))
    return articles, SquadSkips(**counts)


def _test_mask(n: int, test_fraction: float, seed: int) -> np.ndarray:
    if not 0.0 < test_fraction < 1.0:
        raise ValueError(f"test_fraction must be in (0, 1), got {test_fraction}")
    n_test = int(round(test_fraction * n))
    mask = np.zeros(n, dtype=bool)
    mask[np.random.default_rng(seed).permutation(n)[:n_test]] = True
    return mask


def split_articles(
    articles: Sequence[SquadArticle], test_fraction: float, seed: int
) -> tuple[list[SquadArticle], list[SquadArticle]]:
    """Article-level train/test split: test paragraphs and questions are never seen in training.

    ``round(test_fraction * n_articles)`` articles, chosen by
    ``np.random.default_rng(seed).permutation``, go to test. This is the project's protocol
    for retrieval evaluation (``docs/mrwe.md`` explains why the authors' seen-paragraph split
    is a departure not to copy; see :func:`split_seen_paragraphs`).

    Args:
      articles: the articles to split.
      test_fraction: share of articles for test, in (0, 1).
      seed: seed of the permutation; the same seed gives the same split.

    Returns:
      ``(train_articles, test_articles)``, each in the input order.

    Raises:
      ValueError: ``test_fraction`` outside (0, 1).
    """
    mask = _test_mask(len(articles), test_fraction, seed)
    return (
        [a for a, t in zip(articles, mask, strict=True) if not t],
        [a for a, t in zip(articles, mask, strict=True) if t],
    )


def split_seen_paragraphs(
    articles: Sequence[SquadArticle], test_fraction: float, seed: int
) -> tuple[list[SquadArticle], list[SquadArticle]]:
    """The authors' protocol (Cakaloglu & Xu code): split questions, keep every paragraph seen.

    For reproducing the authors' numbers only: test questions ask about paragraphs that
    training also sees (through other questions), a leak (``docs/mrwe.md``).
    ``round(test_fraction * n_questions)`` questions over the whole input, chosen by
    ``np.random.default_rng(seed).permutation`` of the questions in file order, go to test.

    Args:
      articles: the articles to split.
      test_fraction: share of questions for test, in (0, 1).
      seed: seed of the permutation.

    Returns:
      ``(train_articles, test_articles)``: both hold every article and every paragraph (the
      retrieval candidates), each paragraph with only the questions of that side, possibly
      none.

    Raises:
      ValueError: ``test_fraction`` outside (0, 1).
    """
    n_questions = sum(len(p.questions) for a in articles for p in a.paragraphs)
    mask = iter(_test_mask(n_questions, test_fraction, seed))
    train: list[SquadArticle] = []
    test: list[SquadArticle] = []
    for article in articles:
        train_paragraphs, test_paragraphs = [], []
        for paragraph in article.paragraphs:
            sides = [next(mask) for _ in paragraph.questions]
            for is_test, out in ((False, train_paragraphs), (True, test_paragraphs)):
                out.append(
                    dataclasses.replace(
                        paragraph,
                        questions=[
                            q for q, s in zip(paragraph.questions, sides, strict=True)
                            if s == is_test
                        ],
                    )
                )
        train.append(SquadArticle(article.title, train_paragraphs))
        test.append(SquadArticle(article.title, test_paragraphs))
    return train, test


def wikipedia_entity_corpus(
    articles: Sequence[SquadArticle],
    sentence_splitter: Callable[[str], list[str]] = split_sentences,
) -> EntityCorpus:
    """Turns SQuAD articles into a DocEnt-style entity corpus: one entity per article.

    Entity i is article i (id = its title, name = the title with underscores as spaces).
    Its documents are the sentences of its paragraphs (``sentence_splitter``), each with
    the article's own title removed by :func:`~data_pipelines.text.remove_entity_name`
    (DocEnt's name-removal rule; a trailing disambiguator also goes, "Sky (United Kingdom)"
    removes "Sky" too, and so does a comma qualifier, "Fresno,_California" removes "Fresno"
    too: our reading); sentences left empty are dropped. Its queries are the questions of
    its paragraphs, whose answer entity is the article.

    Args:
      articles: the articles, e.g. from :func:`read_squad`.
      sentence_splitter: text -> sentences; default pySBD (:func:`split_sentences`).

    Returns:
      An :class:`EntityCorpus` with entities in article order, sentences and queries in file
      order.

    Raises:
      ValueError: two articles share a title (entity ids must be unique).
    """
    entity_ids = [a.title for a in articles]
    if len(set(entity_ids)) != len(entity_ids):
        raise ValueError("article titles must be unique to serve as entity ids")
    entity_names = [" ".join(t.replace("_", " ").split()) for t in entity_ids]
    sentences: list[tuple[int, str]] = []
    queries: list[tuple[str, int]] = []
    for index, article in enumerate(articles):
        # "Fresno,_California": the text mostly says "Fresno"; the comma part qualifies.
        names = [article.title, article.title.split(",")[0]]
        for paragraph in article.paragraphs:
            for sentence in sentence_splitter(paragraph.context):
                cleaned = sentence
                for name in names:
                    cleaned = remove_entity_name(cleaned, name)
                if cleaned:
                    sentences.append((index, cleaned))
            queries.extend((q.question, index) for q in paragraph.questions)
    return EntityCorpus(
        entity_names=entity_names, entity_ids=entity_ids, sentences=sentences, queries=queries
    )
