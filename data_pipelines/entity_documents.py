"""A user's own DocEnt data (docs/data.md, "Your own data"): documents ``{"entity", "text"}``,
queries ``{"query", "entities"}``."""

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
    """One line of a documents file: entity id, text and 1-based line."""

    entity: str
    text: str
    line: int


def read_entity_documents(path: str | os.PathLike[str]) -> list[EntityDocument]:
    """``{"entity", "text"}`` records; FileNotFoundError, DataError."""
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
    """``(sorted entity ids, (entity index, sentence) pairs)`` of the documents."""
    entity_ids = sorted({d.entity for d in documents})
    index = {e: i for i, e in enumerate(entity_ids)}
    sentences = [(index[d.entity], s) for d in documents for s in sentence_splitter(d.text)]
    return entity_ids, sentences


def read_entity_queries(
    path: str | os.PathLike[str], entity_index: Mapping[str, int]
) -> list[tuple[str, tuple[int, ...]]]:
    """``(query, entity indices)`` of queries JSON Lines; FileNotFoundError, DataError."""
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
