"""A user's own entity documents and ranking queries for DocEnt (``docs/data.md``).

* Documents: JSON Lines ``{"entity": "<id>", "text": "..."}`` (or CSV with the columns
  ``entity,text``), one document or sentence a line. An entity's documents are split into
  sentences with the same splitter as the shipped corpora
  (:func:`data_pipelines.text.split_sentences`, pySBD); a one-sentence line stays one
  sentence. The entity vocabulary is the distinct ids **sorted** (Python string order), so
  reordering or shuffling the file's lines keeps every entity's row.
* Queries: JSON Lines ``{"query": "...", "entities": ["<id>", ...]}``: the relevant entities
  of each query, which must be in the vocabulary.

Files are read by :func:`data_pipelines.records.read_records` (local path or ``gs://``;
errors name file, line and field).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping, Sequence

from data_pipelines.csv_reader import LINE_KEY
from data_pipelines.errors import DataError
from data_pipelines.records import read_records
from data_pipelines.text import split_sentences


@dataclasses.dataclass(frozen=True)
class EntityDocument:
    """One line of a documents file.

    Attributes:
      entity: the entity's id (a string; no line break).
      text: a document or a sentence about it.
      line: 1-based line in the file.
    """

    entity: str
    text: str
    line: int


def read_entity_documents(path: str | os.PathLike[str]) -> list[EntityDocument]:
    """Reads ``{"entity", "text"}`` records (JSON Lines, or CSV with those columns).

    Raises:
      FileNotFoundError: no such file.
      DataError: see :func:`~data_pipelines.records.read_records`; an entity id holding a
        line break (ids are written one a line with a run).
    """
    docs = []
    for r in read_records(path, ("entity", "text")):
        if "\n" in r["entity"] or "\r" in r["entity"]:
            raise DataError(path, r[LINE_KEY], "entity", "the id holds a line break")
        docs.append(EntityDocument(r["entity"], r["text"], r[LINE_KEY]))
    return docs


def entity_sentences(
    documents: Sequence[EntityDocument],
    sentence_splitter: Callable[[str], list[str]] = split_sentences,
) -> tuple[list[str], list[tuple[int, str]]]:
    """The entity vocabulary and the training sentences of a documents file.

    Args:
      documents: e.g. from :func:`read_entity_documents`.
      sentence_splitter: text -> sentences (default pySBD).

    Returns:
      ``(entity_ids, sentences)``: the distinct ids sorted; ``(entity index, sentence)``
      pairs in file order (a document's sentences in text order).
    """
    entity_ids = sorted({d.entity for d in documents})
    index = {e: i for i, e in enumerate(entity_ids)}
    sentences = [(index[d.entity], s) for d in documents for s in sentence_splitter(d.text)]
    return entity_ids, sentences


def read_entity_queries(
    path: str | os.PathLike[str], entity_index: Mapping[str, int]
) -> list[tuple[str, tuple[int, ...]]]:
    """Reads ``{"query", "entities"}`` records (JSON Lines) against an entity vocabulary.

    Args:
      path: the queries file, local or ``gs://``.
      entity_index: entity id -> its row (e.g. from the training documents).

    Returns:
      ``(query, relevant entity indices)`` in file order; an id listed twice counts once.

    Raises:
      FileNotFoundError: no such file.
      DataError: see :func:`~data_pipelines.records.read_records`; an entity id not in the
        vocabulary (line and ``entities[i]`` named).
    """
    queries = []
    for r in read_records(path, ("query", "entities"), list_fields=("entities",),
                          formats=("jsonl",)):
        relevant = []
        for i, entity in enumerate(r["entities"]):
            if entity not in entity_index:
                raise DataError(path, r[LINE_KEY], f"entities[{i}]",
                                f"entity {entity!r} is not among the {len(entity_index)} "
                                "entities of the training documents")
            relevant.append(entity_index[entity])
        queries.append((r["query"], tuple(dict.fromkeys(relevant))))
    return queries
