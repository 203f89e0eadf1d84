"""Reader for DocEnt's Reddit Movie Suggestions (sec. 4.3; ``docs/data.md``)."""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping
from typing import Any

from data_pipelines.errors import DataError
from docent_jax.corpora import PathLike, decode_utf8
from docent_jax.corpora.amazon import EntityVocab
from embedding_core.storage import storage

QUERY_FIELDS = ("query_original", "query_full", "query_title")


@dataclasses.dataclass(frozen=True)
class RedditQuery:
    """One query (``record`` 0-based) with its known ``asins``, ``entity_ids``, ``scores``."""

    record: int
    query_original: str
    query_full: str
    query_title: str
    asins: tuple[str, ...]
    entity_ids: tuple[int, ...]
    scores: tuple[float, ...]


@dataclasses.dataclass(frozen=True)
class RedditStats:
    """What :func:`read_reddit_suggestions` skipped (``skip_invalid=True``)."""

    records: int  # in the file
    unknown_results: int  # recommendations of movies outside the vocabulary
    queries_without_results: int  # records left without a known recommendation (dropped)


def _load_records(path: os.PathLike) -> list[tuple[Any, int | None]]:
    """(record, line) pairs; line is None for records of a JSON list."""
    text = decode_utf8(path, path.read_bytes()).removeprefix("\ufeff")
    if text.lstrip().startswith("["):
        try:
            records = json.loads(text)
        except json.JSONDecodeError as err:
            raise DataError(path, err.lineno, None, f"invalid JSON: {err.msg}") from None
        return [(r, None) for r in records]
    out = []
    for line_no, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            out.append((json.loads(line), line_no))
        except json.JSONDecodeError as err:
            raise DataError(
                path, line_no, None,
                f"invalid JSON line: {err.msg} (expected a JSON list or one record per line)",
            ) from None
    return out


def read_reddit_suggestions(path: PathLike, vocab: EntityVocab, *,
                            entity_of: Mapping[str, str] | None = None,
                            skip_invalid: bool = False) -> tuple[list[RedditQuery], RedditStats]:
    """``(queries, stats)`` of the file, movies resolved in ``vocab`` (ASINs via ``entity_of``);
    ``skip_invalid`` drops unknown movies and empty records. DataError: invalid UTF-8 or JSON, a bad
    field (``field`` names it, e.g. ``record[12].response.result[3].asin``)."""
    path = storage.as_path(path)
    queries: list[RedditQuery] = []
    unknown = empty = 0
    records = _load_records(path)
    for index, (record, line) in enumerate(records):
        rec = f"record[{index}]"

        def fail(field: str, reason: str, line: int | None = line) -> DataError:
            return DataError(path, line, field, reason)

        if not isinstance(record, dict):
            raise fail(rec, "expected a JSON object")
        request, response = record.get("request"), record.get("response")
        if not isinstance(request, dict):
            raise fail(f"{rec}.request", "missing or not an object")
        texts = {}
        for key in QUERY_FIELDS:
            if not isinstance(request.get(key), str):
                raise fail(f"{rec}.request.{key}", "missing or not a string")
            texts[key] = request[key]
        if not texts["query_full"].strip():
            raise fail(f"{rec}.request.query_full", "empty query")
        if not isinstance(response, dict) or not isinstance(response.get("result"), list):
            raise fail(f"{rec}.response.result", "missing or not a list")
        asins, ids, scores = [], [], []
        for j, result in enumerate(response["result"]):
            res = f"{rec}.response.result[{j}]"
            if not isinstance(result, dict):
                raise fail(res, "expected a JSON object")
            asin, score = result.get("asin"), result.get("score")
            if not isinstance(asin, str) or not asin:
                raise fail(f"{res}.asin", "missing or not a non-empty string")
            if not isinstance(score, (int, float)) or isinstance(score, bool):
                raise fail(f"{res}.score", "missing or not a number")
            key = asin if entity_of is None else entity_of.get(asin)
            if key is None or key not in vocab:
                if not skip_invalid:
                    mapped = "" if entity_of is None else f" (mapped to {key!r})"
                    raise fail(
                        f"{res}.asin",
                        f"movie {asin!r}{mapped} is not in the entity vocabulary "
                        f"({len(vocab)} entities); pass skip_invalid=True to skip it",
                    )
                unknown += 1
                continue
            asins.append(asin)
            ids.append(vocab.id_of(key))
            scores.append(float(score))
        if not asins:
            if not skip_invalid:
                raise fail(f"{rec}.response.result", "no recommended movie")
            empty += 1
            continue
        queries.append(RedditQuery(record=index, asins=tuple(asins), entity_ids=tuple(ids),
                                   scores=tuple(scores), **texts))
    return queries, RedditStats(records=len(records), unknown_results=unknown,
                                queries_without_results=empty)
