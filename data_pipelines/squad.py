"""SQuAD v1.1 reader (``{"data": [{"title", "paragraphs": [{"context", "qas"}]}]}``, CC BY-SA
4.0), article/question splits and the Wikipedia entity corpus."""

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
    """One SQuAD question (``qid`` unique over the file); answers are not kept."""

    qid: str
    question: str


@dataclasses.dataclass(frozen=True)
class SquadParagraph:
    """A paragraph and its questions; ``paragraph_id`` ``"{title}#{p_index}"`` (stable)."""

    paragraph_id: str
    context: str
    questions: list[SquadQuestion]


@dataclasses.dataclass(frozen=True)
class SquadArticle:
    """One Wikipedia article: its title as in the file and its paragraphs."""

    title: str
    paragraphs: list[SquadParagraph]


@dataclasses.dataclass(frozen=True)
class SquadSkips:
    """What ``read_squad(..., skip_invalid=True)`` dropped."""

    empty_contexts: int = 0
    paragraphs_without_questions: int = 0
    empty_questions: int = 0
    articles_without_paragraphs: int = 0


@dataclasses.dataclass(frozen=True)
class EntityCorpus:
    """Entities with ``(entity, sentence)`` documents and ``(query, entity)`` queries."""

    entity_names: list[str]
    entity_ids: list[str]
    sentences: list[tuple[int, str]]
    queries: list[tuple[str, int]]


def squad_dev_path() -> Path:
    """The shipped dev set. Raises FileNotFoundError: the data folder or the file is missing."""
    path = data_dir() / SQUAD_DEV_ZIP
    if not path.is_file():
        raise FileNotFoundError(f"SQuAD dev file {path} is missing")
    return path


def _load_json(path: epath.Path) -> tuple[Any, str]:
    """The parsed JSON file or single ``.json`` zip member, and where it was read."""
    # One read: on gs:// every open is a download.
    raw = path.read_bytes()
    if zipfile.is_zipfile(io.BytesIO(raw)):
        with zipfile.ZipFile(io.BytesIO(raw)) as archive:
            members = [n for n in archive.namelist() if n.endswith(".json")]
            if len(members) != 1:
                raise DataError(path, None, None, "zip must hold exactly one .json file, "
                                f"found {members or 'none'}")
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
    field = f"{record}.{key}" if record else key
    if not isinstance(obj, dict) or key not in obj:
        raise DataError(where, None, field, "missing field")
    value = obj[key]
    if not isinstance(value, kind):
        raise DataError(where, None, field, f"expected a JSON "
                        f"{'string' if kind is str else 'list'}, got {type(value).__name__}")
    if kind is str and "\x00" in value:  # a tokenizer would drop it silently
        raise DataError(where, None, field, "holds a NUL character (\\u0000)")
    surrogate = lone_surrogate(value) if kind is str else None
    if surrogate:
        raise DataError(where, None, field, surrogate)
    return value


def read_squad(path: str | os.PathLike[str] | None = None, *, skip_invalid: bool = False
               ) -> tuple[list[SquadArticle], SquadSkips]:
    """``(articles, skips)`` of a SQuAD v1.1 file, JSON or a one-file zip (default shipped dev);
    ``skip_invalid`` drops empty ones. DataError: bad UTF-8 or JSON, a bad field (named, e.g.
    ``data[3] 'Nikola_Tesla'.paragraphs[5].qas[2] (id '5733...').question``), a repeated id."""
    path = epath.Path(path) if path is not None else epath.Path(squad_dev_path())
    root, where = _load_json(path)
    data = _get(root, "data", list, where, "")
    articles: list[SquadArticle] = []
    seen_qids: dict[str, str] = {}
    counts = {f.name: 0 for f in dataclasses.fields(SquadSkips)}
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
                    raise DataError(where, None, f"{q_rec}.id",
                                    f"question id already used by {seen_qids[qid]}")
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
            paragraphs.append(SquadParagraph(f"{title}#{p_index}", context, questions))
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


def split_articles(articles: Sequence[SquadArticle], test_fraction: float, seed: int
                   ) -> tuple[list[SquadArticle], list[SquadArticle]]:
    """``(train_articles, test_articles)``: ``round(test_fraction * n)`` articles of
    ``default_rng(seed).permutation`` to test (``docs/mrwe.md``); ValueError: fraction not in (0,
    1)."""
    mask = _test_mask(len(articles), test_fraction, seed)
    return ([a for a, t in zip(articles, mask, strict=True) if not t],
            [a for a, t in zip(articles, mask, strict=True) if t])


def split_seen_paragraphs(articles: Sequence[SquadArticle], test_fraction: float, seed: int
                          ) -> tuple[list[SquadArticle], list[SquadArticle]]:
    """The authors' leaking split (``docs/mrwe.md``): questions to test by
    ``default_rng(seed).permutation``; ValueError: fraction not in (0, 1)."""
    n_questions = sum(len(p.questions) for a in articles for p in a.paragraphs)
    mask = iter(_test_mask(n_questions, test_fraction, seed))
    train: list[SquadArticle] = []
    test: list[SquadArticle] = []
    for article in articles:
        sides = {False: [], True: []}
        for paragraph in article.paragraphs:
            is_test = [next(mask) for _ in paragraph.questions]
            for side, out in sides.items():
                out.append(dataclasses.replace(paragraph, questions=[
                    q for q, t in zip(paragraph.questions, is_test, strict=True) if t == side]))
        train.append(SquadArticle(article.title, sides[False]))
        test.append(SquadArticle(article.title, sides[True]))
    return train, test


def wikipedia_entity_corpus(articles: Sequence[SquadArticle],
                            sentence_splitter: Callable[[str], list[str]] = split_sentences
                            ) -> EntityCorpus:
    """One entity per article: sentences without the title, questions as queries; ValueError: a
    repeated title."""
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
    return EntityCorpus(entity_names, entity_ids, sentences, queries)
