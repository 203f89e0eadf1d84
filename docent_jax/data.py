"""DocEnt training data: (entity, sentence) token tables and the held-out query protocol.

Training examples are single sentences; the :class:`~data_pipelines.table.TokenTable` has one
field ``"sentence"`` whose ``text_ids`` entry is the sentence's *entity* index (not a text
identity), so the in-batch loss masks other sentences of the same entity through
``info_nce``'s ``key_ids`` and the full-softmax loss reads its targets from it.

The shipped zero-shot ranking task (our protocol; the paper's Reddit queries are not
shippable) uses the SQuAD v1.1 dev set: entity = Wikipedia article (48), documents = the
sentences of its paragraphs with the title removed, queries = the questions. Entities must
be seen in training, so the split is by *paragraph* inside each article
(:func:`paragraph_split`): the sentences of about 80% of each article's paragraphs train the
model, the questions of the other 20% are the held-out queries. Neither the held-out
paragraphs' sentences nor any question text is ever seen in training; baselines build their
entity representations from the same training sentences.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer

from data_pipelines import squad
from data_pipelines.errors import DataError
from data_pipelines.table import TokenTable, stack_fields
from data_pipelines.text import split_sentences
from data_pipelines.tokenization import TokenizedTexts, tokenize, tokenize_cached

TokenizerLike = Tokenizer | str | os.PathLike
"""A loaded ``tokenizers.Tokenizer`` (no cache) or a folder / tokenizer.json path (cached)."""

FIELD = "sentence"


@dataclasses.dataclass(frozen=True)
class EntityData:
    """Entities, their training sentences and held-out entity-seeking queries.

    Attributes:
      entity_ids: ``[num_entities]`` stable keys (row i of the table is entity_ids[i]).
      entity_names: ``[num_entities]`` display names.
      sentences: ``(entity_index, sentence)`` training documents.
      queries: ``(query_text, relevant_entity_indices)`` evaluation queries.
      description: one line saying where the data came from and how it was split.
    """

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
    """Splits every article's paragraphs into training and held-out ones.

    In article ``a`` (0-based position) with ``n`` paragraphs, ``round(heldout_fraction * n)``
    paragraphs, clipped to ``[1, n - 1]`` (so each article keeps training text and, with
    ``n >= 2``, held-out queries), chosen by ``np.random.default_rng([seed, a]).permutation``,
    are held out. Articles with one paragraph keep it for training.

    Args:
      articles: e.g. from :func:`data_pipelines.squad.read_squad`.
      heldout_fraction: share of each article's paragraphs held out, in (0, 1).
      seed: the same seed gives the same split.

    Returns:
      ``(train, heldout)``: the same articles in the same order, each with its training or
      its held-out paragraphs (file order kept); an article may have no held-out paragraph.

    Raises:
      ValueError: ``heldout_fraction`` outside (0, 1).
    """
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
    """The Wikipedia entity ranking task built from SQuAD (module docstring).

    Args:
      path: a SQuAD v1.1 file (JSON or zip); default the shipped dev set.
      heldout_fraction, seed: see :func:`paragraph_split`.
      sentence_splitter: text -> sentences (default pySBD).

    Returns:
      :class:`EntityData`: sentences of the training paragraphs (title removed), queries =
      the questions of the held-out paragraphs, each with its article as the one relevant
      entity. Cached per arguments within the process.

    Raises:
      DataError, FileNotFoundError: see :func:`data_pipelines.squad.read_squad`.
    """
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


def _tokenize(tokenizer: TokenizerLike, texts: Sequence[str], max_length: int
              ) -> TokenizedTexts:
    if isinstance(tokenizer, Tokenizer):
        return tokenize(tokenizer, texts, max_length)
    return tokenize_cached(tokenizer, texts, max_length)


def entity_sentence_table(
    sentences: Sequence[tuple[int, str]],
    num_entities: int,
    tokenizer: TokenizerLike,
    max_length: int,
) -> TokenTable:
    """Training table: one row per (entity, sentence) pair, field ``"sentence"``.

    Args:
      sentences: ``(entity_index, sentence)`` pairs.
      num_entities: entity indices must lie in ``[0, num_entities)``.
      tokenizer: a loaded tokenizer, or a tokenizer folder / file (then cached on disk).
      max_length: tokens per sentence including [CLS]/[SEP]; longer sentences are cut.

    Returns:
      TokenTable with ``input_ids [n, 1, max_length]`` and ``text_ids [n, 1]`` = the entity
      index of each sentence.

    Raises:
      ValueError: no sentences, an entity index out of range or a non-string / empty
        sentence (the pair's 0-based position is named).
    """
    if not sentences:
        raise ValueError("no training sentences")
    entities = np.empty(len(sentences), np.int64)
    texts = []
    for i, (entity, text) in enumerate(sentences):
        if isinstance(entity, bool) or not isinstance(entity, (int, np.integer)) or not (
                0 <= entity < num_entities):
            raise ValueError(f"sentence pair {i}: entity index {entity!r} is not in "
                             f"[0, {num_entities})")
        if not isinstance(text, str) or not text.strip():
            raise ValueError(f"sentence pair {i} (entity {entity}): empty or not a string")
        entities[i] = entity
        texts.append(text)
    tokens = _tokenize(tokenizer, texts, max_length)
    return stack_fields({FIELD: tokens}, {FIELD: entities.astype(np.int32)})


def write_entity_ids(path: str | os.PathLike, entity_ids: Sequence[str]) -> None:
    """Writes one id per line (UTF-8, line i = row i), atomically (temp file + os.replace).

    Raises:
      ValueError: an empty id, or one holding a line break.
    """
    for i, key in enumerate(entity_ids):
        if not key or "\n" in key or "\r" in key:
            raise ValueError(f"entity {i}: id {key!r} is empty or holds a line break")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name + ".", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as f:
            f.write("".join(f"{key}\n" for key in entity_ids))
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def read_entity_ids(path: str | os.PathLike) -> list[str]:
    """Reads a file written by :func:`write_entity_ids`.

    Raises:
      FileNotFoundError: no such file.
      DataError: invalid UTF-8, an empty line or a repeated id (with its 1-based line).
    """
    path = Path(path)
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
