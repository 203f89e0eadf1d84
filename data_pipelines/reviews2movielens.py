"""Reader for Reviews2Movielens, DocEnt's Amazon -> MovieLens movie mapping.

Zemlyanskiy et al., EACL 2021, section 4.2: a many-to-one mapping of Amazon product ids
(ASINs; editions of a movie) to MovieLens movies (71,077 ASINs, 28,918 MovieLens ids).
``Reviews2Movielens.csv`` (not shippable here) has the header
``asin,canon_asin,imdb_id,movielens_id,name,imdb_url``; ``canon_asin`` is the one ASIN
chosen to stand for all editions of the movie.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Container, Sequence
from typing import Literal

from data_pipelines.csv_reader import LINE_KEY, read_csv_records
from data_pipelines.errors import DataError

PathLike = str | os.PathLike[str]
COLUMNS = ("asin", "canon_asin", "imdb_id", "movielens_id", "name", "imdb_url")


@dataclasses.dataclass(frozen=True)
class MovieMapping:
    """One row: an ASIN, its canonical ASIN, and the movie it is (IMDb, MovieLens, name).

    ``imdb_id`` and ``imdb_url`` may be empty strings (our reading: the join key is
    ``movielens_id``). ``line`` is the row's 1-based line.
    """

    asin: str
    canon_asin: str
    imdb_id: str
    movielens_id: int
    name: str
    imdb_url: str
    line: int


@dataclasses.dataclass(frozen=True)
class MappingStats:
    """Rows read and rows skipped (``skip_invalid=True``) by :func:`read_reviews2movielens`."""

    rows: int
    unknown_movielens_ids: int
    unknown_asins: int


def read_reviews2movielens(
    path: PathLike,
    *,
    movie_ids: Container[int] | None = None,
    known_asins: Container[str] | None = None,
    asin_field: Literal["asin", "canon_asin"] = "asin",
    skip_invalid: bool = False,
) -> tuple[list[MovieMapping], MappingStats]:
    """Reads Reviews2Movielens and checks it against the movies and ASINs in use.

    Args:
      path: the CSV file.
      movie_ids: MovieLens ids that exist (e.g. from ``movies.csv``); None skips the check.
      known_asins: ASINs that exist (e.g. an :class:`~data_pipelines.amazon.EntityVocab`);
        None skips the check.
      asin_field: the column checked against ``known_asins``: ``"asin"`` for a vocabulary of
        raw ASINs, ``"canon_asin"`` for one of canonical (aggregated) ASINs.
      skip_invalid: drop (and count) rows with an unknown MovieLens id or ASIN instead of
        raising.

    Returns:
      ``(rows, stats)``: the kept rows in file order.

    Raises:
      DataError: see :func:`~data_pipelines.csv_reader.read_csv_records` (missing column,
        empty ``asin``, ``canon_asin``, ``movielens_id`` or ``name``, broken quoting); a
        non-integer ``movielens_id``; an ASIN on two rows; an unknown MovieLens id or ASIN
        unless ``skip_invalid``. Each names file, line and column.
    """
    rows: list[MovieMapping] = []
    records = read_csv_records(path, COLUMNS, allow_empty=("imdb_id", "imdb_url"))
    first_line: dict[str, int] = {}
    unknown_movies = unknown_asins = 0
    for r in records:
        line = r[LINE_KEY]
        try:
            movielens_id = int(r["movielens_id"])
        except ValueError:
            raise DataError(
                path, line, "movielens_id", f"expected an integer, got {r['movielens_id']!r}"
            ) from None
        if r["asin"] in first_line:
            raise DataError(
                path, line, "asin", f"ASIN already mapped on line {first_line[r['asin']]}"
            )
        first_line[r["asin"]] = line
        if movie_ids is not None and movielens_id not in movie_ids:
            if not skip_invalid:
                raise DataError(
                    path, line, "movielens_id",
                    f"MovieLens id {movielens_id} is not among the known movies; pass "
                    "skip_invalid=True to skip such rows",
                )
            unknown_movies += 1
            continue
        if known_asins is not None and r[asin_field] not in known_asins:
            if not skip_invalid:
                raise DataError(
                    path, line, asin_field,
                    f"ASIN {r[asin_field]!r} is not among the known ASINs; pass "
                    "skip_invalid=True to skip such rows",
                )
            unknown_asins += 1
            continue
        rows.append(
            MovieMapping(
                asin=r["asin"], canon_asin=r["canon_asin"], imdb_id=r["imdb_id"],
                movielens_id=movielens_id, name=r["name"], imdb_url=r["imdb_url"], line=line,
            )
        )
    return rows, MappingStats(
        rows=len(records), unknown_movielens_ids=unknown_movies, unknown_asins=unknown_asins
    )


def canonical_asins(rows: Sequence[MovieMapping]) -> dict[str, str]:
    """ASIN -> canonical ASIN: the ``entity_of`` that aggregates editions into one entity
    (for :func:`data_pipelines.amazon.select_entities`)."""
    return {r.asin: r.canon_asin for r in rows}


def canonical_names(rows: Sequence[MovieMapping]) -> dict[str, str]:
    """Canonical ASIN -> movie name (the first row's name), the ``names`` for name removal."""
    names: dict[str, str] = {}
    for r in rows:
        names.setdefault(r.canon_asin, r.name)
    return names


def canonical_movielens_ids(rows: Sequence[MovieMapping]) -> dict[str, int]:
    """Canonical ASIN -> MovieLens id.

    Raises:
      ValueError: one canonical ASIN mapped to two MovieLens ids (names both lines).
    """
    out: dict[str, tuple[int, int]] = {}
    for r in rows:
        prev = out.setdefault(r.canon_asin, (r.movielens_id, r.line))
        if prev[0] != r.movielens_id:
            raise ValueError(
                f"canonical ASIN {r.canon_asin!r} maps to MovieLens {prev[0]} (line {prev[1]}) "
                f"and {r.movielens_id} (line {r.line})"
            )
    return {k: v[0] for k, v in out.items()}
