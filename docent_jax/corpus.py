"""DocEnt's entity corpus, the SQuAD task's paragraph split, the run's ``entity_ids.txt``."""

from __future__ import annotations

import dataclasses
import functools
import os
from collections.abc import Callable, Sequence

import numpy as np

from data_pipelines import entity_documents, squad
from data_pipelines.errors import DataError
from data_pipelines.text import split_sentences
from embedding_core.storage import storage
from embedding_core.storage.files import write_lines

ENTITY_IDS_FILE = "entity_ids.txt"
"""The run file naming the table's rows (line i = entity of row i)."""


@dataclasses.dataclass(frozen=True)
class EntityData:
    """``entity_ids`` (row i of the table), ``(entity_index, sentence)`` training ``sentences``,
    ``(query_text, relevant_entity_indices)`` ``queries``."""

    entity_ids: list[str]
    entity_names: list[str]
    sentences: list[tuple[int, str]]
    queries: list[tuple[str, tuple[int, ...]]]
    description: str

    @property
    def num_entities(self) -> int:
        return len(self.entity_ids)


def paragraph_split(
    articles: Sequence[squad.SquadArticle], heldout_fraction: float, seed: int
) -> tuple[list[squad.SquadArticle], list[squad.SquadArticle]]:
    """``(train, heldout)`` articles: article ``a`` with ``n >= 2`` paragraphs holds out
    ``round(heldout_fraction * n)`` in ``[1, n - 1]`` of ``default_rng([seed, a]).permutation``;
    ValueError: fraction not in (0, 1)."""
    if not 0.0 < heldout_fraction < 1.0:
        raise ValueError(f"heldout_fraction must be in (0, 1), got {heldout_fraction}")
    train, heldout = [], []
    for index, article in enumerate(articles):
        n = len(article.paragraphs)
        k = min(max(int(round(heldout_fraction * n)), 1), n - 1) if n >= 2 else 0
        held = set(np.random.default_rng([seed, index]).permutation(n)[:k].tolist())
        train.append(squad.SquadArticle(
            article.title, [p for i, p in enumerate(article.paragraphs) if i not in held]))
        heldout.append(squad.SquadArticle(
            article.title, [p for i, p in enumerate(article.paragraphs) if i in held]))
    return train, heldout


@functools.lru_cache(maxsize=4)
def squad_entity_data(
    path: str | None = None,
    heldout_fraction: float = 0.2,
    seed: int = 0,
    sentence_splitter: Callable[[str], list[str]] = split_sentences,
) -> EntityData:
    """The SQuAD entity ranking task (cached); DataError, FileNotFoundError."""
    articles, _ = squad.read_squad(path)
    train, heldout = paragraph_split(articles, heldout_fraction, seed)
    corpus = squad.wikipedia_entity_corpus(train, sentence_splitter)
    # Only the questions are needed from the held-out side: skip its sentence splitting.
    held = squad.wikipedia_entity_corpus(heldout, lambda text: [])
    queries = [(text, (entity,)) for text, entity in held.queries]
    n_train_p = sum(len(a.paragraphs) for a in train)
    n_held_p = sum(len(a.paragraphs) for a in heldout)
    description = (
        f"SQuAD v1.1 {'dev (shipped)' if path is None else path}: {len(corpus.entity_ids)} "
        f"article entities; training sentences from {n_train_p} paragraphs, held-out "
        f"queries = the {len(queries)} questions of {n_held_p} other paragraphs "
        f"(heldout_fraction={heldout_fraction}, seed={seed})")
    return EntityData(corpus.entity_ids, corpus.entity_names, corpus.sentences, queries,
                      description)


def own_entity_data(path: str) -> EntityData:
    """``train_file``'s entities, sentences, no queries; FileNotFoundError, DataError."""
    docs = entity_documents.read_entity_documents(path)
    entity_ids, sentences = entity_documents.entity_sentences(docs)
    description = (f"{path}: {len(docs)} documents of {len(entity_ids)} entities (ids "
                   f"sorted), {len(sentences)} sentences")
    return EntityData(entity_ids, list(entity_ids), sentences, [], description)


def with_queries_file(data: EntityData, path: str) -> EntityData:
    """``data`` with ``config.eval_queries_file``'s queries; FileNotFoundError, DataError."""
    index = {e: i for i, e in enumerate(data.entity_ids)}
    queries = entity_documents.read_entity_queries(path, index)
    return dataclasses.replace(
        data, queries=queries,
        description=f"{data.description}; ranking queries: the {len(queries)} of {path}")


def check_entity_ids(entity_ids: Sequence[str]) -> None:
    """Raises ValueError for an empty id or one holding a line break (it names entity i)."""
    for i, key in enumerate(entity_ids):
        if not key or "\n" in key or "\r" in key:
            raise ValueError(f"entity {i}: id {key!r} is empty or holds a line break")


def write_entity_ids(path: str | os.PathLike, entity_ids: Sequence[str]) -> None:
    """One id per line (line i = row i), atomically; ValueError as :func:`check_entity_ids`."""
    check_entity_ids(entity_ids)
    write_lines(path, entity_ids)


def keep_entity_ids(path: str | os.PathLike, entity_ids: Sequence[str]) -> None:
    """Writes ``entity_ids.txt`` once; on a resume ValueError if it names other entities."""
    path = storage.as_path(path)
    if not path.is_file():
        write_entity_ids(path, entity_ids)
        return
    saved = read_entity_ids(path)
    if saved != list(entity_ids):
        changed = sorted(set(saved) ^ set(entity_ids))
        raise ValueError(
            f"{path}: the data's entities changed since this run started ({len(saved)} "
            f"saved, {len(entity_ids)} now; e.g. {changed[:3]}); resuming would give the "
            "trained rows other entities' ids: restore the data files or use a new "
            "--workdir")


def read_entity_ids(path: str | os.PathLike) -> list[str]:
    """:func:`write_entity_ids`'s file; FileNotFoundError, DataError (1-based line)."""
    path = storage.as_path(path)
    if not path.is_file():
        raise FileNotFoundError(f"entity id file {path} does not exist")
    lines = path.read_bytes().split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    ids: list[str] = []
    seen: dict[str, int] = {}
    for lineno, raw in enumerate(lines, start=1):
        try:
            key = raw.decode("utf-8").rstrip("\r")
        except UnicodeDecodeError as err:
            raise DataError(path, lineno, "entity_id", f"invalid UTF-8 ({err.reason})") from None
        if not key:
            raise DataError(path, lineno, "entity_id", "empty id")
        if key in seen:
            raise DataError(path, lineno, "entity_id", f"id {key!r} repeats line {seen[key]}")
        seen[key] = lineno
        ids.append(key)
    if not ids:
        raise DataError(path, None, "entity_id", "no entity ids in file")
    return ids
